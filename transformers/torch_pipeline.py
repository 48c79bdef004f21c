"""Write and remove torch pipeline sync points: ``pipe_split()`` calls in a model's forward.

:class:`InsertPipeSplitsCommand` carries out a plan: it inserts
``pipe_split()`` after the planned statements of the forward, splitting a loop
over a layer container into loops over slices of it where a sync point falls
between two iterations, and schedules the import. It never decides where: a
planned site that is missing or ambiguous is a warning and no change.

:class:`RemovePipeSplitsCommand` undoes exactly that: it removes the sync
lines syncpass wrote (recognised by their ``# syncpass sync`` comment), merges
the loops it split, and drops the import when nothing uses it any more.
Hand-written ``pipe_split()`` calls are left alone.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

from syncpass.frontend.analysis import (
    ContainerLoop,
    SequentialCall,
    match_container_loop,
    match_sequential_call,
)
from syncpass.transformers.common import (
    SYNC_COMMENT_PREFIX,
    SYNC_TRAILER,
    SyncSite,
    add_import,
    sync_comment,
)

__all__ = [
    "PIPE_SPLIT",
    "PIPE_SPLIT_IMPORT",
    "PIPE_SPLIT_MODULE",
    "SYNC_COMMENT_PREFIX",
    "InsertPipeSplitsCommand",
    "Module",
    "RemovePipeSplitsCommand",
    "SyncSite",
    "insert_pipe_splits",
    "remove_pipe_splits",
    "strips_back_to",
]

PIPE_SPLIT_MODULE = "torch.distributed.pipelining"
PIPE_SPLIT = "pipe_split"
PIPE_SPLIT_IMPORT = ImportItem(PIPE_SPLIT_MODULE, PIPE_SPLIT)


def _site_order(site: SyncSite) -> tuple[int, int]:
    return site.statement, -1 if site.split_after is None else site.split_after


_SYNC_LINE = m.SimpleStatementLine(
    body=[m.Expr(m.Call(func=m.Name(PIPE_SPLIT) | m.Attribute(attr=m.Name(PIPE_SPLIT)), args=[]))],
    trailing_whitespace=SYNC_TRAILER,
)


def _is_sync_line(statement: cst.CSTNode) -> bool:
    """A line syncpass wrote: ``pipe_split()  # syncpass sync ...``."""
    return m.matches(statement, _SYNC_LINE)


def _model_forward(
    module: cst.Module, class_name: str
) -> tuple[int, cst.ClassDef, int, cst.FunctionDef] | None:
    matches = []
    for class_index, statement in enumerate(module.body):
        if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
            for method_index, member in enumerate(statement.body.body):
                if isinstance(member, cst.FunctionDef) and member.name.value == "forward":
                    matches.append((class_index, statement, method_index, member))
    return matches[0] if len(matches) == 1 else None


def _replace_forward(
    module: cst.Module, class_name: str, new_body: Sequence[cst.BaseStatement]
) -> cst.Module:
    found = _model_forward(module, class_name)
    assert found is not None
    class_index, classdef, method_index, forward = found
    assert isinstance(forward.body, cst.IndentedBlock)
    new_forward = forward.with_changes(body=forward.body.with_changes(body=tuple(new_body)))
    members = list(classdef.body.body)
    members[method_index] = new_forward
    new_class = classdef.with_changes(body=classdef.body.with_changes(body=tuple(members)))
    body = list(module.body)
    body[class_index] = new_class
    return module.with_changes(body=tuple(body))


class InsertPipeSplitsCommand(VisitorBasedCodemodCommand):
    """Insert ``pipe_split()`` at planned sites of ``class_name.forward``."""

    DESCRIPTION = "Insert torch.distributed.pipelining.pipe_split() at planned sync points."

    def __init__(self, context: CodemodContext, class_name: str, sites: Sequence[SyncSite]) -> None:
        super().__init__(context)
        self.class_name = class_name
        self.sites = tuple(sorted(sites, key=_site_order))

    @property
    def title(self) -> str:
        """The function the sync points go in, for messages."""
        return f"{self.class_name}.forward"

    def find_function(self, tree: cst.Module) -> cst.FunctionDef | None:
        """The one function whose body gets the sync points, or ``None``."""
        found = _model_forward(tree, self.class_name)
        return None if found is None else found[3]

    def replace_body(self, tree: cst.Module, new_body: Sequence[cst.BaseStatement]) -> cst.Module:
        """``tree`` with the body of :meth:`find_function` replaced."""
        return _replace_forward(tree, self.class_name, new_body)

    def schedule_import(self) -> None:
        """Run as a codemod (libcst.tool, a pipeline), the framework adds the import."""
        AddImportsVisitor.add_needed_import(self.context, PIPE_SPLIT_MODULE, PIPE_SPLIT)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if not self.sites:
            return tree
        forward = self.find_function(tree)
        if forward is None:
            self.warn(f"no single {self.title} to place sync points in; nothing changed")
            return tree
        if not isinstance(forward.body, cst.IndentedBlock):
            self.warn(f"{self.title} has no indented body; nothing changed")
            return tree
        statements = list(forward.body.body)
        by_statement: dict[int, list[SyncSite]] = {}
        for site in self.sites:
            if not 0 <= site.statement < len(statements):
                self.warn(f"planned site {site} is outside the forward; nothing changed")
                return tree
            by_statement.setdefault(site.statement, []).append(site)
        new_body: list[cst.BaseStatement] = []
        for index, statement in enumerate(statements):
            sites = by_statement.get(index, [])
            splits = [site for site in sites if site.split_after is not None]
            after = [site for site in sites if site.split_after is None]
            if splits:
                pieces = self._split_loop(statement, splits, tree)
                if pieces is None:
                    return tree
                new_body.extend(pieces)
            else:
                new_body.append(statement)
            if len(after) > 1:
                self.warn(f"two sync points planned after statement {index}; nothing changed")
                return tree
            new_body.extend(self._sync_line(site, tree) for site in after)
        self.schedule_import()
        return self.replace_body(tree, new_body)

    def _sync_line(self, site: SyncSite, tree: cst.Module) -> cst.SimpleStatementLine:
        code = f"{PIPE_SPLIT}()  {sync_comment(site.comment)}\n"
        line = cst.parse_statement(code, config=tree.config_for_parsing)
        assert isinstance(line, cst.SimpleStatementLine)
        return line

    def _split_loop(
        self, statement: cst.BaseStatement, sites: Sequence[SyncSite], tree: cst.Module
    ) -> list[cst.BaseStatement] | None:
        sequential = match_sequential_call(statement)
        if sequential is not None:
            return self._split_call(statement, sequential, sites, tree)
        loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
        if loop is None:
            self.warn("a sync point is planned inside a loop that is not over a layer container")
            return None
        assert isinstance(statement, cst.For)
        bounds = [
            loop.start,
            *(site.split_after + 1 for site in sites if site.split_after is not None),
            loop.stop,
        ]
        pieces: list[cst.BaseStatement] = []
        for position, (start, stop) in enumerate(itertools.pairwise(bounds)):
            if position:
                pieces.append(self._sync_line(sites[position - 1], tree))
            piece = statement.with_changes(iter=_slice_iter(statement.iter, loop, start, stop))
            if position:
                piece = piece.with_changes(leading_lines=())
            pieces.append(piece)
        return pieces

    def _split_call(
        self,
        statement: cst.BaseStatement,
        call: SequentialCall,
        sites: Sequence[SyncSite],
        tree: cst.Module,
    ) -> list[cst.BaseStatement]:
        """``h = self.seq(x)`` -> ``h = self.seq[:k](x)``, sync, ``h = self.seq[k:](h)``."""
        assert isinstance(statement, cst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        bounds = [
            call.start,
            *(site.split_after + 1 for site in sites if site.split_after is not None),
            call.stop,
        ]
        pieces: list[cst.BaseStatement] = []
        for position, (start, stop) in enumerate(itertools.pairwise(bounds)):
            value = assign.value.with_changes(func=_sliced(assign.value.func, start, stop))
            if position:
                pieces.append(self._sync_line(sites[position - 1], tree))
                argument = value.args[0].with_changes(value=cst.Name(call.target))
                value = value.with_changes(args=[argument, *value.args[1:]])
            piece = statement.with_changes(body=[assign.with_changes(value=value)])
            if position:
                piece = piece.with_changes(leading_lines=())
            pieces.append(piece)
        return pieces


def _container_expr(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """``self.blocks`` from ``self.blocks`` or ``self.blocks[a:b]``."""
    if isinstance(iterable, cst.Subscript):
        return iterable.value
    return iterable


def _bound(value: int | None) -> cst.Integer | None:
    return None if value is None else cst.Integer(str(value))


def _sliced(
    iterable: cst.BaseExpression, start: int | None, stop: int | None
) -> cst.BaseExpression:
    base = _container_expr(iterable)
    if start is None and stop is None:
        return base
    return cst.Subscript(
        value=base, slice=[cst.SubscriptElement(cst.Slice(lower=_bound(start), upper=_bound(stop)))]
    )


def _slice_iter(
    iterable: cst.BaseExpression, loop: ContainerLoop, start: int | None, stop: int | None
) -> cst.BaseExpression:
    if loop.index_name is None:
        return _sliced(iterable, start, stop)
    assert isinstance(iterable, cst.Call)
    inner = _sliced(iterable.args[0].value, start, stop)
    # The index must go on counting where the previous piece stopped.
    offset = (start or 0) - (loop.start or 0)
    if len(iterable.args) == 2:  # enumerate(..., 1) or enumerate(..., start=1): keep its form
        counted = iterable.args[1]
        assert isinstance(counted.value, cst.Integer)
        if offset:
            first = int(counted.value.evaluated_value)
            counted = counted.with_changes(value=cst.Integer(str(first + offset)))
        return iterable.with_changes(args=[iterable.args[0].with_changes(value=inner), counted])
    args = [iterable.args[0].with_changes(value=inner, comma=cst.MaybeSentinel.DEFAULT)]
    if offset:
        args.append(
            cst.Arg(
                value=cst.Integer(str(offset)),
                keyword=cst.Name("start"),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        )
    return iterable.with_changes(args=args)


class RemovePipeSplitsCommand(VisitorBasedCodemodCommand):
    """Remove the sync points syncpass wrote into ``class_name.forward``."""

    DESCRIPTION = "Remove syncpass's pipe_split() sync points and merge the loops it split."

    def __init__(
        self,
        context: CodemodContext,
        class_name: str | None = None,
        source_text: str | None = None,
    ) -> None:
        super().__init__(context)
        self.class_name = class_name
        self.source_text = source_text  # lets the unused-import check skip a tree walk
        self.removed = 0

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        classes = [
            statement.name.value
            for statement in tree.body
            if isinstance(statement, cst.ClassDef)
            and (self.class_name is None or statement.name.value == self.class_name)
        ]
        for class_name in classes:
            found = _model_forward(tree, class_name)
            if found is None or not isinstance(found[3].body, cst.IndentedBlock):
                continue
            statements = list(found[3].body.body)
            if not any(self.is_sync_line(statement) for statement in statements):
                continue
            tree = _replace_forward(tree, class_name, self.merge(statements))
        if self.removed and not self._still_used(tree):
            tree = _drop_import(tree)
        return tree

    def is_sync_line(self, statement: cst.CSTNode) -> bool:
        """A sync line this backend writes."""
        return _is_sync_line(statement)

    def _still_used(self, tree: cst.Module) -> bool:
        if self.source_text is not None:
            # Each removed line and the import held one `pipe_split` each: any other
            # mention (a call, a comment) keeps the import, erring on the safe side.
            mentions = len(re.findall(rf"\b{PIPE_SPLIT}\b", self.source_text))
            return mentions > self.removed + 1
        return _uses_name(tree, PIPE_SPLIT)

    def merge(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """``statements`` without the sync lines, with the loops and calls they split joined."""
        kept: list[cst.BaseStatement] = []
        pending_merge = False
        for statement in statements:
            if self.is_sync_line(statement):
                self.removed += 1
                pending_merge = True
                continue
            if pending_merge and kept and _mergeable(kept[-1], statement):
                previous = kept[-1]
                assert isinstance(previous, cst.For) and isinstance(statement, cst.For)
                kept[-1] = previous.with_changes(iter=_joined_iter(previous.iter, statement.iter))
            elif pending_merge and kept and _calls_mergeable(kept[-1], statement):
                kept[-1] = _joined_call(kept[-1], statement)
            else:
                kept.append(statement)
            pending_merge = False
        return kept


def _slice_bounds(
    iterable: cst.BaseExpression,
) -> tuple[cst.BaseExpression, int | None, int | None] | None:
    if isinstance(iterable, cst.Call):  # enumerate(...)
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Subscript) and isinstance(iterable.slice[0].slice, cst.Slice):
        part = iterable.slice[0].slice
        lower = int(part.lower.evaluated_value) if isinstance(part.lower, cst.Integer) else None
        upper = int(part.upper.evaluated_value) if isinstance(part.upper, cst.Integer) else None
        return iterable.value, lower, upper
    return None


def _mergeable(first: cst.BaseStatement, second: cst.BaseStatement) -> bool:
    """Two pieces of one split loop: same target and body, adjacent slices."""
    if not (isinstance(first, cst.For) and isinstance(second, cst.For)):
        return False
    if isinstance(first.iter, cst.Call) != isinstance(second.iter, cst.Call):
        return False
    if not (first.target.deep_equals(second.target) and first.body.deep_equals(second.body)):
        return False
    one, two = _slice_bounds(first.iter), _slice_bounds(second.iter)
    return (
        one is not None
        and two is not None
        and one[0].deep_equals(two[0])
        and one[2] is not None
        and one[2] == two[1]
    )


def _calls_mergeable(first: cst.BaseStatement, second: cst.BaseStatement) -> bool:
    """Two pieces of one split sequential call: ``h = s[a:b](x)`` then ``h = s[b:c](h)``."""
    one, two = match_sequential_call(first), match_sequential_call(second)
    if one is None or two is None or one.target != two.target or two.argument != one.target:
        return False
    assert isinstance(first, cst.SimpleStatementLine) and isinstance(
        second, cst.SimpleStatementLine
    )
    if not first.trailing_whitespace.deep_equals(second.trailing_whitespace):
        return False
    first_call, second_call = _call_of(first), _call_of(second)
    bounds_one, bounds_two = _slice_bounds(first_call.func), _slice_bounds(second_call.func)
    return (
        bounds_one is not None
        and bounds_two is not None
        and bounds_one[0].deep_equals(bounds_two[0])
        and bounds_one[2] is not None
        and bounds_one[2] == bounds_two[1]
    )


def _call_of(statement: cst.SimpleStatementLine) -> cst.Call:
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
    return assign.value


def _joined_call(first: cst.BaseStatement, second: cst.BaseStatement) -> cst.BaseStatement:
    assert isinstance(first, cst.SimpleStatementLine) and isinstance(
        second, cst.SimpleStatementLine
    )
    first_call, second_call = _call_of(first), _call_of(second)
    bounds_first, bounds_second = _slice_bounds(first_call.func), _slice_bounds(second_call.func)
    assert bounds_first is not None and bounds_second is not None
    func = _sliced(first_call.func, bounds_first[1], bounds_second[2])
    assign = first.body[0]
    assert isinstance(assign, cst.Assign)
    return first.with_changes(body=[assign.with_changes(value=first_call.with_changes(func=func))])


def _joined_iter(first: cst.BaseExpression, second: cst.BaseExpression) -> cst.BaseExpression:
    bounds_first, bounds_second = _slice_bounds(first), _slice_bounds(second)
    assert bounds_first is not None and bounds_second is not None
    start, stop = bounds_first[1], bounds_second[2]
    if isinstance(first, cst.Call):
        inner = _sliced(first.args[0].value, start, stop)
        args = [first.args[0].with_changes(value=inner), *first.args[1:]]
        if len(args) == 1:
            args[0] = args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return first.with_changes(args=args)
    return _sliced(first, start, stop)


class _FindNameVisitor(cst.CSTVisitor):
    """Whether a name is used outside imports (stops descending once found)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found = False

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found or isinstance(node, (cst.Import, cst.ImportFrom)):
            return False
        if isinstance(node, cst.Name) and node.value == self.name:
            self.found = True
        return True


def _uses_name(tree: cst.Module, name: str) -> bool:
    """Whether ``name`` is used anywhere outside import statements."""
    finder = _FindNameVisitor(name)
    tree.visit(finder)
    return finder.found


def _drop_import(tree: cst.Module) -> cst.Module:
    """Remove ``from torch.distributed.pipelining import pipe_split`` (the alias, or the line)."""
    body: list[cst.BaseStatement] = []
    for statement in tree.body:
        if m.matches(
            statement,
            m.SimpleStatementLine(
                body=[
                    m.ImportFrom(
                        module=m.Attribute(
                            value=m.Attribute(value=m.Name("torch"), attr=m.Name("distributed")),
                            attr=m.Name("pipelining"),
                        )
                    )
                ]
            ),
        ):
            assert isinstance(statement, cst.SimpleStatementLine)
            imported = statement.body[0]
            assert isinstance(imported, cst.ImportFrom)
            if not isinstance(imported.names, cst.ImportStar):
                names = [
                    alias
                    for alias in imported.names
                    if not m.matches(alias, m.ImportAlias(name=m.Name(PIPE_SPLIT), asname=None))
                ]
                if not names:
                    continue
                if len(names) != len(imported.names):
                    names[-1] = names[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                    statement = statement.with_changes(body=[imported.with_changes(names=names)])
        body.append(statement)
    return tree.with_changes(body=body)


def insert_pipe_splits(
    module: cst.Module, class_name: str, sites: Sequence[SyncSite], filename: str
) -> tuple[cst.Module, tuple[str, ...]]:
    """Carry out :class:`InsertPipeSplitsCommand`; the new module and its warnings.

    The command needs no metadata, so it runs without the codemod framework's
    metadata wrapper (a deep copy of the whole module), and the import is
    scheduled with ``AddImportsVisitor`` on the module's leading statements
    only: a model file of thousands of lines is not walked twice.
    """
    context = CodemodContext(filename=filename)
    command = InsertPipeSplitsCommand(context, class_name, sites)
    rewritten = command.transform_module_impl(module)
    if rewritten is not module:
        rewritten = add_import(rewritten, context, PIPE_SPLIT_IMPORT)
    return rewritten, tuple(context.warnings)


def remove_pipe_splits(
    module: cst.Module, class_name: str | None, filename: str, source_text: str | None = None
) -> cst.Module:
    """Carry out :class:`RemovePipeSplitsCommand` (no metadata needed, so no wrapper)."""
    context = CodemodContext(filename=filename)
    return RemovePipeSplitsCommand(context, class_name, source_text).transform_module_impl(module)


#: The tree type, for callers that must not import libcst themselves.
Module = cst.Module


def strips_back_to(
    rewritten: cst.Module, rewritten_text: str, original: str, class_name: str, filename: str
) -> bool:
    """Whether removing syncpass's sync points from ``rewritten`` gives ``original`` back."""
    stripped: str = remove_pipe_splits(rewritten, class_name, filename, rewritten_text).code
    return stripped == original

"""What every backend's sync-point transformer shares, whatever its sync statement.

A plan reaches a transformer as :class:`SyncSite` values: after which statement
of the model's function a sync point goes, or between which two iterations of a
loop over a layer container. Every line syncpass writes ends with a comment
that starts with :data:`SYNC_COMMENT_PREFIX`, by which it is found and removed
again (:data:`SYNC_TRAILER`).

:class:`InsertSyncPointsCommand` walks the function's statements, splits loops
and sequential calls at the sites between iterations, and puts one sync line
per site; :class:`RemoveSyncPointsCommand` drops those lines and joins what
they split. A backend subclasses both and supplies the few hooks that differ:
which function, which sync statement (``pipe_split()``, ``jax.device_put``),
which import, and how to recognise its own lines.
"""

from __future__ import annotations

import itertools
import re
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

from syncpass.frontend.analysis import (
    STACK_SLICE,
    ContainerLoop,
    SequentialCall,
    dict_view,
    match_container_loop,
    match_scan_call,
    match_sequential_call,
    scan_parts,
)

#: Every sync line syncpass writes carries a comment with this prefix.
SYNC_COMMENT_PREFIX = "# syncpass sync"
_SYNC_COMMENT = re.compile(r"^#\s*syncpass sync\b")


def is_sync_comment(text: str) -> bool:
    """Whether a comment (``# syncpass sync 1/2: ...``) marks its line as syncpass's."""
    return bool(_SYNC_COMMENT.match(text))


#: The end of a line syncpass wrote, for matchers of a backend's sync lines.
SYNC_TRAILER = m.TrailingWhitespace(comment=m.Comment(value=m.MatchIfTrue(is_sync_comment)))


#: The widest line syncpass writes: black's and ruff's default. A line it breaks up ends its
#: items with a comma (the "magic trailing comma"), so that a formatter with this or a
#: wider line length leaves what syncpass wrote as it is.
LINE_WIDTH = 88


def body_column(tree: cst.Module, function: cst.FunctionDef) -> int:
    """The column ``function``'s own statements start at in ``tree`` (0 if not found)."""

    def find(node: cst.CSTNode, column: int) -> int | None:
        if isinstance(node, cst.IndentedBlock):
            column += len(tree.default_indent if node.indent is None else node.indent)
        if node is function:
            assert isinstance(function.body, cst.IndentedBlock)
            body = function.body.indent
            return column + len(tree.default_indent if body is None else body)
        for child in node.children:
            # A function is a statement: only blocks and the clauses that hold them are
            # walked, never a line's expressions (most of a large file's nodes).
            if isinstance(child, _HOLDS_STATEMENTS):
                found = find(child, column)
                if found is not None:
                    return found
        return None

    return find(tree, 0) or 0


#: The nodes a statement can be inside of (:func:`body_column` walks only them).
_HOLDS_STATEMENTS = (
    cst.IndentedBlock,
    cst.BaseCompoundStatement,
    cst.Else,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.MatchCase,
)


def sync_comment(text: str) -> str:
    """The comment on a sync line: ``# syncpass sync`` and the site's own text."""
    return f"{SYNC_COMMENT_PREFIX} {text}"


@dataclass(frozen=True)
class SyncSite:
    """Where one sync call goes in the forward.

    ``statement`` indexes the forward's top-level statements. With
    ``split_after`` set, the statement is a loop over a layer container and
    the sync goes between iterations ``split_after`` and ``split_after + 1``
    (absolute container indices); otherwise it goes after the statement.
    ``comment`` is the text after ``# syncpass sync``. ``values`` (the names
    live across the sync point) and ``stage`` (the stage it opens) are for
    backends whose sync call names what it moves and where (JAX). ``written``
    marks a sync point the user wrote by hand (a ``pipe_split()`` already
    there): a backend whose sync statement it is writes nothing there, a
    backend that writes stages still cuts there.
    """

    statement: int
    split_after: int | None
    comment: str
    values: tuple[str, ...] = ()
    stage: int = 0
    written: bool = False
    kinds: tuple[tuple[str, str], ...] = ()  # live values that were not tensors when profiled
    recomputed: tuple[str, ...] = ()  # live values the stage after computes again, not receives
    # Inside item ``split_after`` of a sequential call, a nested nn.Sequential: the place of
    # the child after which the sync goes, below it (``(0,)``: after ``blocks.1.0`` for
    # ``split_after`` 1). Empty: after the whole item.
    split_inside: tuple[int, ...] = ()
    # With ``split_inside``: the length of each container along the way (the call's own,
    # then each nested one's), so that no piece runs an empty slice.
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class CheckpointSite:
    """One op a stage recomputes in its backward (activation checkpointing), where it is
    in the forward: ``statement`` indexes the forward's top-level statements and, for an
    iteration of a loop over a layer container, ``iteration`` is its absolute index in the
    container (``None``: the statement itself). ``op`` is the op's id, ``stage`` the stage
    that runs it (from 0), ``frees_bytes`` and ``cost_s`` what recomputing it frees on
    that stage and costs a step, for the line's comment."""

    statement: int
    iteration: int | None
    op: str
    stage: int
    frees_bytes: float
    cost_s: float

    def __post_init__(self) -> None:
        if self.statement < 0 or self.stage < 0 or (self.iteration or 0) < 0:
            raise ValueError(f"checkpoint site of {self.op!r}: indices must be >= 0")


def slice_loop(
    statement: cst.For, loop: ContainerLoop, start: int | None, stop: int | None
) -> cst.For:
    """``statement`` (a loop over a layer container, ``loop``) over ``[start:stop]`` of the
    container instead, its index (if enumerated) counting on from ``start``."""
    return statement.with_changes(iter=_slice_iter(statement.iter, loop, start, stop))


def _site_order(site: SyncSite) -> tuple[int, tuple[int, ...]]:
    """Sites in the order they cut the forward: by statement, then by where each starts the
    next piece (after child ``(1, 0)`` of a nested call is at ``(1, 1)``, before the end of
    child 1, ``(2,)``)."""
    if site.split_after is None:
        return site.statement, (-1,)
    place = (site.split_after, *site.split_inside)
    return site.statement, (*place[:-1], place[-1] + 1)


def add_import(module: cst.Module, context: CodemodContext, item: ImportItem) -> cst.Module:
    """Add ``item`` where AddImportsVisitor puts it, looking only at the module's leading imports.

    A model file of thousands of lines is not walked again for one import. The visitor
    sees only the last run of imports among the leading simple statements, so the import
    goes after it: shown a docstring or code above the imports (``VERSION = 2`` above
    ``import torch``), it would put the import above that code and space the code down,
    which removing the import could not undo.
    """

    def is_import(statement: cst.BaseStatement) -> bool:
        return isinstance(statement, cst.SimpleStatementLine) and any(
            isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
        )

    cut = 0
    for index, statement in enumerate(module.body):
        if not isinstance(statement, cst.SimpleStatementLine):
            break
        if is_import(statement):
            cut = index + 1
    start = cut
    while start > 0 and is_import(module.body[start - 1]):
        start -= 1
    head = module.with_changes(body=module.body[start:cut])
    visitor = AddImportsVisitor(context, [item])
    new_head = head.visit(visitor)
    return module.with_changes(
        header=new_head.header, body=(*module.body[:start], *new_head.body, *module.body[cut:])
    )


def _imported_module(statement: cst.BaseStatement) -> str | None:
    """The module of a one-import ``from MODULE import ...`` line (absolute), else None."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.ImportFrom) or small.relative or small.module is None:
        return None
    return cst.Module([]).code_for_node(small.module)


def import_in_order(module: cst.Module, name: str) -> cst.Module:
    """``module`` with its ``from NAME import ...`` line moved up, within the run of import
    lines it ends (no blank line between them), before the first ``from`` import of a module
    that sorts after ``NAME``: where isort and ruff keep it among the ``from`` imports of a
    sorted section (``from syncpass... import`` above ``from torch import nn``). Left where
    it is when no such line is above it."""
    body = list(module.body)
    at = next((i for i, s in enumerate(body) if _imported_module(s) == name), None)
    if at is None:
        return module
    start = at
    while start > 0 and not body[start].leading_lines:
        previous = body[start - 1]
        if not (
            isinstance(previous, cst.SimpleStatementLine)
            and all(isinstance(small, cst.Import | cst.ImportFrom) for small in previous.body)
        ):
            break
        start -= 1
    target = next(
        (
            i
            for i in range(start, at)
            if (other := _imported_module(body[i])) is not None
            and other != "__future__"
            and other > name
        ),
        None,
    )
    if target is None:
        return module
    moved, displaced = body[at], body[target]
    body[at : at + 1] = []
    body[target] = displaced.with_changes(leading_lines=())
    body.insert(target, moved.with_changes(leading_lines=displaced.leading_lines))
    return module.with_changes(body=body)


class InsertSyncPointsCommand(VisitorBasedCodemodCommand):
    """Insert a backend's sync statement at the planned sites of one function.

    The walk is the same for every backend; a subclass says which function
    (:meth:`find_function`, :meth:`replace_body`, :attr:`title`), which
    statement (:meth:`sync_statement`) and which import (:meth:`schedule_import`).
    """

    DESCRIPTION = "Insert sync points at the planned sites of a model's function."

    #: Whether the sync points the user wrote get a line too (they already have one).
    WRITE_HAND_WRITTEN = False

    def __init__(self, context: CodemodContext, sites: Sequence[SyncSite]) -> None:
        super().__init__(context)
        wanted = (site for site in sites if self.WRITE_HAND_WRITTEN or not site.written)
        self.sites = tuple(sorted(wanted, key=_site_order))
        #: The column the sync lines start at (the forward's body), for a backend that lays a
        #: long line out as a formatter would.
        self.column = 0
        #: The widest line the project's formatter keeps (its line length).
        self.width = LINE_WIDTH

    @property
    @abstractmethod
    def title(self) -> str:
        """The function the sync points go in, for messages."""

    @abstractmethod
    def find_function(self, tree: cst.Module) -> cst.FunctionDef | None:
        """The one function whose body gets the sync points, or ``None``."""

    @abstractmethod
    def replace_body(self, tree: cst.Module, new_body: Sequence[cst.BaseStatement]) -> cst.Module:
        """``tree`` with the body of :meth:`find_function` replaced."""

    @abstractmethod
    def schedule_import(self) -> None:
        """Schedule the import the sync statements need (AddImportsVisitor)."""

    @abstractmethod
    def sync_statement(self, site: SyncSite) -> str:
        """The code of the sync statement at ``site``, without its comment."""

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        if not self.sites:
            return tree
        forward = self.find_function(tree)
        if forward is None:
            self.warn(f"no single {self.title} to place sync points in; nothing changed")
            return tree
        self.column = body_column(tree, forward)
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
        code = f"{self.sync_statement(site)}  {sync_comment(site.comment)}\n"
        line = cst.parse_statement(code, config=tree.config_for_parsing)
        assert isinstance(line, cst.SimpleStatementLine)
        return line

    def split_other(
        self, statement: cst.BaseStatement, sites: Sequence[SyncSite], tree: cst.Module
    ) -> list[cst.BaseStatement] | None:
        """A backend's own splittable statement, split at ``sites`` (``None``: not one)."""
        return None

    def _split_loop(
        self, statement: cst.BaseStatement, sites: Sequence[SyncSite], tree: cst.Module
    ) -> list[cst.BaseStatement] | None:
        own = self.split_other(statement, sites, tree)
        if own is not None:
            return own
        sequential = match_sequential_call(statement)
        if sequential is not None and any(site.split_inside for site in sites):
            return self._split_nested_call(statement, sequential, sites, tree)
        if sequential is not None:
            return self._split_call(statement, sequential, sites, tree)
        loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
        if loop is None:
            self.warn("a sync point is planned inside a loop that is not over a layer container")
            return None
        assert isinstance(statement, cst.For)
        return self.split_pieces(
            loop.start,
            loop.stop,
            sites,
            tree,
            lambda _, start, stop: statement.with_changes(
                iter=_slice_iter(statement.iter, loop, start, stop)
            ),
        )

    def split_pieces(
        self,
        start: int | None,
        stop: int | None,
        sites: Sequence[SyncSite],
        tree: cst.Module,
        piece: Callable[[int, int | None, int | None], cst.BaseStatement],
    ) -> list[cst.BaseStatement]:
        """The pieces of a statement over ``[start:stop]`` split at ``sites`` (between items
        ``split_after`` and the next), a sync line between each two: ``piece(position,
        start, stop)`` makes each (the later ones lose the statement's leading lines)."""
        bounds = [
            start,
            *(site.split_after + 1 for site in sites if site.split_after is not None),
            stop,
        ]
        pieces: list[cst.BaseStatement] = []
        for position, (low, high) in enumerate(itertools.pairwise(bounds)):
            made = piece(position, low, high)
            if position:
                pieces.append(self._sync_line(sites[position - 1], tree))
                made = made.with_changes(leading_lines=())
            pieces.append(made)
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
        value = assign.value

        def piece(position: int, start: int | None, stop: int | None) -> cst.BaseStatement:
            sliced = value.with_changes(func=_sliced(value.func, start, stop))
            if position:
                argument = sliced.args[0].with_changes(value=cst.Name(call.target))
                sliced = sliced.with_changes(args=[argument, *sliced.args[1:]])
            return statement.with_changes(body=[assign.with_changes(value=sliced)])

        return self.split_pieces(call.start, call.stop, sites, tree, piece)

    def _split_nested_call(
        self,
        statement: cst.BaseStatement,
        call: SequentialCall,
        sites: Sequence[SyncSite],
        tree: cst.Module,
    ) -> list[cst.BaseStatement]:
        """``h = self.seq(x)`` split inside nested ``nn.Sequential`` children: each piece
        runs its children one slice a statement, ``h = self.seq[:1](x)``, ``h =
        self.seq[1][:2](h)``, sync, ``h = self.seq[1][2:](h)``, ``h = self.seq[2:](h)``."""
        assert isinstance(statement, cst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        value = assign.value
        # Where each piece starts and ends, as places below the call's container: the sync
        # after child (1, 0) is at (1, 1), inside item 1 before its child 1.
        bounds: list[tuple[int, ...]] = [()]
        sizes: dict[tuple[int, ...], int] = {}
        for site in sites:
            assert site.split_after is not None
            place = (site.split_after, *site.split_inside)
            bounds.append((*place[:-1], place[-1] + 1))
            sizes.update((place[:depth], size) for depth, size in enumerate(site.sizes))
        bounds.append(())

        def empty(prefix: tuple[int, ...], start: int | None, stop: int | None) -> bool:
            first = start if start is not None else (call.start or 0) if not prefix else 0
            last = stop if stop is not None else call.stop if not prefix else None
            last = sizes.get(prefix) if last is None else last
            return last is not None and first >= last

        made: list[cst.BaseStatement] = []
        for position, (low, high) in enumerate(itertools.pairwise(bounds)):
            if position:
                made.append(self._sync_line(sites[position - 1], tree))
            segments = [segment for segment in _segments((), low, high) if not empty(*segment)]
            for number, (prefix, start, stop) in enumerate(segments):
                if prefix:
                    func: cst.BaseExpression = _container_expr(value.func)
                    for index in prefix:
                        func = cst.Subscript(
                            value=func,
                            slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(index))))],
                        )
                    func = cst.Subscript(
                        value=func,
                        slice=[
                            cst.SubscriptElement(cst.Slice(lower=_bound(start), upper=_bound(stop)))
                        ],
                    )
                else:
                    func = _sliced(
                        value.func,
                        call.start if start is None else start,
                        call.stop if stop is None else stop,
                    )
                sliced = value.with_changes(func=func)
                first = position == 0 and number == 0
                if not first:
                    argument = sliced.args[0].with_changes(value=cst.Name(call.target))
                    sliced = sliced.with_changes(args=[argument, *sliced.args[1:]])
                piece = statement.with_changes(body=[assign.with_changes(value=sliced)])
                made.append(piece if first else piece.with_changes(leading_lines=()))
        return made


def _segments(
    prefix: tuple[int, ...], low: tuple[int, ...], high: tuple[int, ...]
) -> list[tuple[tuple[int, ...], int | None, int | None]]:
    """The calls that run the children of the container at ``prefix`` (places below the
    sequential call's container) from place ``low`` to place ``high`` (``()``: its start,
    its end), each a slice ``(prefix, start, stop)`` of one container (``None``: from its
    start, to its end), in order."""
    if low and high and low[0] == high[0]:  # both inside one child: its children
        return _segments((*prefix, low[0]), low[1:], high[1:])
    found: list[tuple[tuple[int, ...], int | None, int | None]] = []
    start = low[0] if low else None
    if len(low) > 1:  # the rest of the child the piece starts inside
        found += _segments((*prefix, low[0]), low[1:], ())
        start = low[0] + 1
    found.append((prefix, start, high[0] if high else None))  # empty ones are the caller's
    if len(high) > 1:  # the start of the child the piece ends inside
        found += _segments((*prefix, high[0]), (), high[1:])
    return found


def _container_expr(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """``self.blocks`` from ``self.blocks`` or ``self.blocks[a:b]`` (``params["layers"]`` from
    ``params["layers"]`` or ``params["layers"][a:b]``)."""
    if (
        isinstance(iterable, cst.Subscript)
        and len(iterable.slice) == 1
        and isinstance(iterable.slice[0].slice, cst.Slice)
    ):
        return iterable.value
    return iterable


def _bound(value: int | None) -> cst.BaseExpression | None:
    if value is None:
        return None
    if value < 0:  # counted from the end, as the user wrote it (self.layers[:-1])
        return cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer(str(-value)))
    return cst.Integer(str(value))


def _int_bound(node: cst.BaseExpression | None) -> int | None:
    """The integer a slice bound holds (``3``, ``-1``), or ``None``."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return -int(node.expression.evaluated_value)
    return None


def _sliced(
    iterable: cst.BaseExpression, start: int | None, stop: int | None
) -> cst.BaseExpression:
    base = _container_expr(iterable)
    view = dict_view(base)
    if view is not None:  # a ModuleDict's view: sliced as a list, whole as the user wrote it
        if start is None and stop is None:
            return view
        base = cst.Call(func=cst.Name("list"), args=[cst.Arg(view)])
    if start is None and stop is None:
        return base
    return cst.Subscript(
        value=base, slice=[cst.SubscriptElement(cst.Slice(lower=_bound(start), upper=_bound(stop)))]
    )


def _sliced_zip(call: cst.Call, start: int | None, stop: int | None) -> cst.Call:
    """``zip(self.layers[start:stop], self.norms[start:stop])``: each sequence sliced alike."""
    args = [
        arg.with_changes(value=_sliced(arg.value, start, stop)) if arg.keyword is None else arg
        for arg in call.args
    ]
    return call.with_changes(args=args)


def _slice_iter(
    iterable: cst.BaseExpression, loop: ContainerLoop, start: int | None, stop: int | None
) -> cst.BaseExpression:
    if loop.recorded:
        # Iteration i runs layer i (as profiled): the iterations of [start:stop], the
        # iterable's items listed first (``list(enumerate(zip(*layer_variables)))[2:4]``).
        if start is None and stop is None:
            return iterable
        listed = cst.Call(func=cst.Name("list"), args=[cst.Arg(iterable)])
        return cst.Subscript(
            value=listed,
            slice=[cst.SubscriptElement(cst.Slice(lower=_bound(start), upper=_bound(stop)))],
        )
    if loop.zipped and loop.index_name is None:
        assert isinstance(iterable, cst.Call)
        return _sliced_zip(iterable, start, stop)
    if loop.index_name is None:
        return _sliced(iterable, start, stop)
    assert isinstance(iterable, cst.Call)
    if loop.zipped:  # enumerate(zip(...)): the zip sliced, the index counted on
        zipped = iterable.args[0].value
        assert isinstance(zipped, cst.Call)
        inner: cst.BaseExpression = _sliced_zip(zipped, start, stop)
    else:
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


class RemoveSyncPointsCommand(VisitorBasedCodemodCommand):
    """Remove a backend's sync lines from a function body and join what they split.

    A subclass recognises its own lines (:meth:`is_sync_line`), finds the
    function, and drops the import it added; :meth:`merge` does the rest.
    """

    DESCRIPTION = "Remove syncpass's sync points and merge the loops it split."

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.removed = 0

    @abstractmethod
    def is_sync_line(self, statement: cst.CSTNode) -> bool:
        """A sync line this backend writes."""

    def join_other(
        self, first: cst.BaseStatement, second: cst.BaseStatement
    ) -> cst.BaseStatement | None:
        """Two pieces of a backend's own split statement, joined (``None``: not such pieces)."""
        return None

    def merge(self, statements: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """``statements`` without the sync lines, with the loops and calls they split joined."""
        kept: list[cst.BaseStatement] = []
        pending_merge = False
        for statement in statements:
            if self.is_sync_line(statement):
                self.removed += 1
                pending_merge = True
                continue
            joined = self.join_other(kept[-1], statement) if pending_merge and kept else None
            if joined is not None:
                kept[-1] = joined
            elif pending_merge and kept and (loop := joined_loop(kept[-1], statement)):
                kept[-1] = loop
            elif pending_merge and kept and _calls_mergeable(kept[-1], statement):
                kept[-1] = _joined_call(kept[-1], statement)
            else:
                kept.append(statement)
            pending_merge = False
        return kept


def _is_enumerate(iterable: cst.BaseExpression) -> bool:
    return m.matches(iterable, m.Call(func=m.Name("enumerate")))


def _is_zip(iterable: cst.BaseExpression) -> bool:
    return m.matches(iterable, m.Call(func=m.Name("zip")))


def _slice_bounds(
    iterable: cst.BaseExpression,
) -> tuple[cst.BaseExpression, int | None, int | None] | None:
    if _is_enumerate(iterable) or _is_zip(iterable):
        assert isinstance(iterable, cst.Call)
        iterable = iterable.args[0].value
    if _is_zip(iterable):  # enumerate(zip(...))
        assert isinstance(iterable, cst.Call)
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Subscript) and isinstance(iterable.slice[0].slice, cst.Slice):
        part = iterable.slice[0].slice
        return iterable.value, _int_bound(part.lower), _int_bound(part.upper)
    return None


def joined_loop(first: cst.BaseStatement, second: cst.BaseStatement) -> cst.For | None:
    """Two pieces of one split loop (the same target and body over adjacent slices of one
    container) as one loop, or ``None`` if they are not such pieces."""
    if not _mergeable(first, second):
        return None
    assert isinstance(first, cst.For) and isinstance(second, cst.For)
    return first.with_changes(iter=_joined_iter(first.iter, second.iter))


def _mergeable(first: cst.BaseStatement, second: cst.BaseStatement) -> bool:
    """Two pieces of one split loop: same target and body, adjacent slices."""
    if not (isinstance(first, cst.For) and isinstance(second, cst.For)):
        return False
    if _is_enumerate(first.iter) != _is_enumerate(second.iter):
        return False
    if _is_zip(first.iter) != _is_zip(second.iter):
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
    if _is_zip(first):
        assert isinstance(first, cst.Call)
        return _sliced_zip(first, start, stop)
    if _is_enumerate(first):
        assert isinstance(first, cst.Call)
        within = first.args[0].value
        inner = (
            _sliced_zip(within, start, stop)
            if isinstance(within, cst.Call) and _is_zip(within)
            else _sliced(within, start, stop)
        )
        args = [first.args[0].with_changes(value=inner), *first.args[1:]]
        if len(args) == 1:
            args[0] = args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return first.with_changes(args=args)
    return _sliced(first, start, stop)


def imports_laid_out(code: str, modules: Sequence[str], width: int = 100) -> str:
    """``code`` with each one-line ``from MODULE import a, b, ...`` of ``modules`` longer than
    ``width`` laid out one name a line, in parentheses, as black and ruff lay it out."""
    lines = code.splitlines(keepends=True)
    for index, line in enumerate(lines):
        for module in set(modules):
            head = f"from {module} import "
            body = line.rstrip("\r\n")
            if not body.startswith(head) or len(body) <= width or "(" in body or "#" in body:
                continue
            newline = line[len(body) :]
            names = [name.strip() for name in body[len(head) :].split(",")]
            inner = "".join(f"    {name},{newline}" for name in names)
            lines[index] = f"{head}({newline}{inner}){newline}"
    return "".join(lines)


def divided_by_tp_size(value: cst.BaseExpression) -> cst.BinaryOperation:
    """``value // tp_size()``, parenthesised where its precedence asks (a product divides
    as written: ``4 * width // tp_size()`` is ``(4 * width) // tp_size()``)."""
    plain = isinstance(value, cst.Name | cst.Attribute | cst.Integer | cst.Subscript | cst.Call)
    product = isinstance(value, cst.BinaryOperation) and isinstance(
        value.operator, cst.Multiply | cst.FloorDivide
    )
    wrapped = (
        value
        if plain or product
        else value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    )
    return cst.BinaryOperation(
        left=wrapped, operator=cst.FloorDivide(), right=cst.Call(func=cst.Name("tp_size"))
    )


def with_footer(module: cst.Module, footer: str) -> cst.Module:
    """``module`` with the statements of ``footer`` after its last one (the footer's
    leading comments kept with its first statement)."""
    if not footer:
        return module
    parsed = cst.parse_module(footer)
    body = list(parsed.body)
    if body:
        body[0] = body[0].with_changes(leading_lines=(*parsed.header, *body[0].leading_lines))
    return module.with_changes(body=(*module.body, *body))


def find_function(
    tree: cst.Module, name: str, is_function: bool, method: str
) -> tuple[int, int | None, cst.FunctionDef] | None:
    """(index in the module, index in the class or None, the function) of the model: the
    top-level function ``name``, or the method ``method`` of the top-level class ``name``."""
    found = [
        place
        for place in every_function(tree)
        if (place[2].name.value == name if is_function else place[3] == name)
        and (is_function or place[2].name.value == method)
    ]
    return found[0][:3] if len(found) == 1 else None


def every_function(
    tree: cst.Module,
) -> list[tuple[int, int | None, cst.FunctionDef, str | None]]:
    """Every top-level function and every method of a top-level class: (index in the module,
    index in the class or None, the function, the class's name or None)."""
    found: list[tuple[int, int | None, cst.FunctionDef, str | None]] = []
    for index, statement in enumerate(tree.body):
        if isinstance(statement, cst.FunctionDef):
            found.append((index, None, statement, None))
        if isinstance(statement, cst.ClassDef):
            for member_index, member in enumerate(statement.body.body):
                if isinstance(member, cst.FunctionDef):
                    found.append((index, member_index, member, statement.name.value))
    return found


def replace_function(
    tree: cst.Module, index: int, member_index: int | None, new_function: cst.FunctionDef
) -> cst.Module:
    """``tree`` with ``new_function`` in the place :func:`every_function` gave."""
    body = list(tree.body)
    if member_index is None:
        body[index] = new_function
    else:
        classdef = body[index]
        assert isinstance(classdef, cst.ClassDef)
        members = list(classdef.body.body)
        members[member_index] = new_function
        body[index] = classdef.with_changes(body=classdef.body.with_changes(body=tuple(members)))
    return tree.with_changes(body=tuple(body))


def imports_module(tree: cst.Module, name: str) -> bool:
    """Whether ``tree`` binds the module ``name`` at its top, unaliased (``import jax``)."""
    plain = m.Import(
        names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name(name), asname=None), m.ZeroOrMore()]
    )
    return any(m.matches(statement, m.SimpleStatementLine(body=[plain])) for statement in tree.body)


def scan_call_of(statement: cst.BaseStatement) -> cst.Call:
    """The ``jax.lax.scan`` call of a statement :func:`match_scan_call` matched."""
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    value = assign.value
    if isinstance(value, cst.Subscript):  # carry = jax.lax.scan(...)[0]
        value = value.value
    assert isinstance(value, cst.Call)
    return value


#: The comment that opens a scan piece syncpass laid out one argument a line (its slice
#: was too wide for one), so that joining the pieces gives the user's one line back.
SLICE_COMMENT_PREFIX = "# syncpass slice"


def _scan_slice_comment(lower: str, upper: str) -> str:
    return f"{SLICE_COMMENT_PREFIX} [{lower}:{upper}] of the stacked layers"


def _on_one_line(call: cst.Call) -> cst.Call:
    """``call`` with the layout a formatter gives a call that fits on one line."""
    last = len(call.args) - 1
    return call.with_changes(
        whitespace_before_args=cst.SimpleWhitespace(""),
        args=[
            arg.with_changes(
                comma=cst.MaybeSentinel.DEFAULT
                if index == last
                else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
            for index, arg in enumerate(call.args)
        ],
    )


def _laid_out_by_syncpass(call: cst.Call) -> bool:
    """Whether ``call`` is a scan piece syncpass laid out one argument a line."""
    opening = call.whitespace_before_args
    return (
        isinstance(opening, cst.ParenthesizedWhitespace)
        and opening.first_line.comment is not None
        and opening.first_line.comment.value.startswith(SLICE_COMMENT_PREFIX)
    )


def slice_scan(
    statement: cst.BaseStatement,
    start: int | None,
    stop: int | None,
    init: str | None,
    column: int | None = None,
    width: int = LINE_WIDTH,
) -> cst.BaseStatement:
    """The scan ``statement`` over ``[start:stop]`` of its stack (the whole stack, as the user
    wrote it, for ``[None:None]``), starting from ``init`` when given.

    A slice of a scan the user wrote on one line, as a formatter would, that does not fit
    in ``width`` columns from ``column`` is laid out one argument a line, its opening line
    commented (``# syncpass slice [:4] of the stacked layers``). A piece so laid out keeps
    the layout while it is a slice, and the whole stack gets the user's one line back."""
    call = scan_call_of(statement)
    parts = scan_parts(call)
    assert parts is not None
    stack = parts[1]
    xs: cst.BaseExpression = stack
    lower = "" if start is None else str(start)
    upper = "" if stop is None else str(stop)
    sliced = start is not None or stop is not None
    if sliced:
        wrapper = cst.parse_expression(f"{STACK_SLICE}(lambda w: w[{lower}:{upper}], stack)")
        assert isinstance(wrapper, cst.Call)
        xs = wrapper.with_changes(args=[wrapper.args[0], wrapper.args[1].with_changes(value=stack)])
    args = list(call.args)
    args[2] = args[2].with_changes(value=xs)
    if init is not None:
        args[1] = args[1].with_changes(value=cst.Name(init))
    new_call = call.with_changes(args=args)
    ours = _laid_out_by_syncpass(call)
    if ours:
        new_call = _on_one_line(new_call)
    if sliced and (ours or (column is not None and _too_wide(statement, new_call, column, width))):
        new_call = one_argument_a_line(new_call, _scan_slice_comment(lower, upper))
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    value: cst.BaseExpression = new_call
    if isinstance(assign.value, cst.Subscript):
        value = assign.value.with_changes(value=new_call)
    return statement.with_changes(body=[assign.with_changes(value=value)])


def _too_wide(statement: cst.BaseStatement, piece: cst.Call, column: int, width: int) -> bool:
    """Whether the scan ``statement``, written on one line as a formatter lays it out, would
    be wider than ``width`` from ``column`` with ``piece`` for its call."""
    assert isinstance(statement, cst.SimpleStatementLine)
    code = cst.Module([]).code_for_node
    line = code(statement.with_changes(leading_lines=())).rstrip("\n")
    call = scan_call_of(statement)
    if "\n" in line or code(_on_one_line(call)) != code(call):
        return False  # the user's own layout: kept
    return column + len(line) + len(code(piece)) - len(code(call)) > width


def one_argument_a_line(call: cst.Call, comment: str | None = None) -> cst.Call:
    """``call`` laid out one argument a line with the magic trailing comma, as a formatter
    lays out a call too wide for one line and then leaves it; ``comment`` ends the line
    that opens it."""
    item = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace("    "))
    close = cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(""))
    last = len(call.args) - 1
    laid = [
        arg.with_changes(comma=cst.Comma(whitespace_after=close if position == last else item))
        for position, arg in enumerate(call.args)
    ]
    opening = item
    if comment is not None:
        opening = item.with_changes(
            first_line=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment)
            )
        )
    return call.with_changes(args=laid, whitespace_before_args=opening)


def joined_scan(first: cst.BaseStatement, second: cst.BaseStatement) -> cst.BaseStatement | None:
    """Two pieces of a split scan as one (the same step over adjacent slices of the same
    stack, the second starting from the first's carry), or ``None`` if they are not."""
    one, two = match_scan_call(first), match_scan_call(second)
    if one is None or two is None or (one.root, one.container) != (two.root, two.container):
        return None
    if two.target != one.target or two.init != one.target or one.stop is None:
        return None
    if one.stop != two.start:
        return None
    first_call, second_call = scan_call_of(first), scan_call_of(second)
    if not first_call.args[0].value.deep_equals(second_call.args[0].value):
        return None
    return slice_scan(first, one.start, two.stop, None)

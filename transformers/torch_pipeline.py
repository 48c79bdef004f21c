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

Both subclass the backend-neutral commands of :mod:`syncpass.transformers.common`,
which walk the forward and split and join the loops; this module supplies the
``pipe_split()`` line, the forward it goes in, and the import.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

from syncpass.transformers.common import (
    SYNC_COMMENT_PREFIX,
    SYNC_TRAILER,
    InsertSyncPointsCommand,
    RemoveSyncPointsCommand,
    SyncSite,
    add_import,
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


class InsertPipeSplitsCommand(InsertSyncPointsCommand):
    """Insert ``pipe_split()`` at planned sites of ``class_name.forward``."""

    DESCRIPTION = "Insert torch.distributed.pipelining.pipe_split() at planned sync points."

    def __init__(self, context: CodemodContext, class_name: str, sites: Sequence[SyncSite]) -> None:
        super().__init__(context, sites)
        self.class_name = class_name

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

    def sync_statement(self, site: SyncSite) -> str:
        """``pipe_split()``: the stage boundary names nothing, the tracer finds the values."""
        return f"{PIPE_SPLIT}()"


class RemovePipeSplitsCommand(RemoveSyncPointsCommand):
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

"""Write and remove JAX sync points: explicit ``jax.device_put`` transfers between stages.

:class:`InsertDevicePutsCommand` carries out a plan in a JAX function
(``def forward(params, x)``) or a Flax module's ``__call__``: after each
planned statement it moves the values live across the sync point to the
device of the next stage, one line per sync point::

    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/2: 8 KiB, 61 us/step predicted

(several live values move together: ``h, x = jax.device_put((h, x), ...)``).
A sync point between two iterations of a loop over a list of Flax submodules
splits the loop over slices of the list, as for torch; one between two steps of
a ``jax.lax.scan`` over stacked layer weights splits it into scans over slices
of the stack (``jax.tree.map(lambda w: w[2:4], params["layers"])``). The command
writes into one function; the backend runs it once per function its sync points
fall in (a Flax submodule's ``__call__`` among them). ``import jax`` is added
when the file lacks it, marked as syncpass's own::

    import jax  # syncpass sync: imported for the transfers

The weights are not moved here: each stage's weights are placed on its device
once, and each stage is compiled with ``jax.jit``, by
:func:`syncpass.backends.jax.pipeline.pipeline`, which splits the traced computation at
these transfers (as ``torch.distributed.pipelining`` builds its stages from
``pipe_split()`` calls). Run eagerly, the rewritten function computes what the
original does, its later ops running on the device their inputs were moved to.

:class:`RemoveDevicePutsCommand` undoes exactly that, in every function and method
of the file, recognising the lines by their ``# syncpass sync`` comment, and the
``import jax`` it marked. Hand-written
``jax.device_put`` lines and a user's own ``import jax`` (even one that only
those lines use) stay.

:class:`RetargetDevicePutsCommand` points every transfer to a device in the
model at one device (``jax.devices()[0]``): the profiler's copy of a file
traces on one device, hand-written transfers included.

The insert and remove commands subclass the backend-neutral ones of
:mod:`syncpass.transformers.common`, as the torch transformer's do.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

from syncpass.frontend.analysis import match_scan_call
from syncpass.transformers.common import (
    LINE_WIDTH,
    SYNC_COMMENT_PREFIX,
    SYNC_TRAILER,
    InsertSyncPointsCommand,
    RemoveSyncPointsCommand,
    SyncSite,
    add_import,
    every_function,
    find_function,
    imports_module,
    joined_scan,
    replace_function,
    slice_scan,
    sync_comment,
)

FLAX_METHOD = "__call__"
JAX_IMPORT = ImportItem("jax")
#: The comment on an ``import jax`` syncpass adds, by which stripping tells it from a user's.
ADDED_IMPORT_NOTE = "imported for the transfers"


def names_a_device(call: cst.Call) -> bool:
    """Whether a ``jax.device_put`` call gives a device: a second positional argument or
    ``device=``, other than ``None``."""
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    given = [arg for arg in call.args if arg.keyword is not None and arg.keyword.value == "device"]
    device = given[0] if given else positional[1] if len(positional) > 1 else None
    return device is not None and not m.matches(device.value, m.Name("None"))


def device_expression(stage: int) -> str:
    """The device of stage ``stage`` in the rewritten code."""
    return f"jax.devices()[{stage}]"


def transfer_code(
    values: Sequence[str],
    stage: int,
    column: int | None = None,
    comment: str = "",
    width: int = LINE_WIDTH,
) -> str:
    """``h = jax.device_put(h, jax.devices()[1])``, or a tuple of several values. Given the
    ``column`` it starts at and the ``comment`` it ends with, one argument a line where it
    would not fit in ``width`` columns, as black and ruff lay out such a call."""
    if not values:
        raise ValueError("a transfer needs at least one value")
    names = ", ".join(values)
    moved = values[0] if len(values) == 1 else f"({names})"
    arguments = ", ".join([moved, device_expression(stage)])
    one_line = f"{names} = jax.device_put({arguments})"
    if column is None or column + len(one_line) + len(f"  {comment}".rstrip()) <= width:
        return one_line
    # One argument a line, with the trailing comma that keeps a formatter from joining them
    # again at a wider line length.
    return f"{names} = jax.device_put(\n    {moved},\n    {device_expression(stage)},\n)"


def _replace_body(
    tree: cst.Module,
    name: str,
    is_function: bool,
    new_body: Sequence[cst.BaseStatement],
    method: str = FLAX_METHOD,
) -> cst.Module:
    found = find_function(tree, name, is_function, method)
    assert found is not None
    index, member_index, function = found
    assert isinstance(function.body, cst.IndentedBlock)
    new_function = function.with_changes(body=function.body.with_changes(body=tuple(new_body)))
    return replace_function(tree, index, member_index, new_function)


_TRANSFER_LINE = m.SimpleStatementLine(
    body=[m.Assign(value=m.Call(func=m.Attribute(attr=m.Name("device_put"))))],
    trailing_whitespace=SYNC_TRAILER,
)


def is_transfer_line(statement: cst.CSTNode) -> bool:
    """A line syncpass wrote: ``names = jax.device_put(...)  # syncpass sync ...``."""
    return m.matches(statement, _TRANSFER_LINE)


class InsertDevicePutsCommand(InsertSyncPointsCommand):
    """Insert ``jax.device_put`` transfers at the planned sites of a JAX function or Flax module."""

    DESCRIPTION = (
        "Insert jax.device_put transfers to the next stage's device at planned sync points."
    )

    def __init__(
        self,
        context: CodemodContext,
        name: str,
        is_function: bool,
        sites: Sequence[SyncSite],
        method: str = FLAX_METHOD,
    ) -> None:
        super().__init__(context, sites)
        self.name = name
        self.is_function = is_function
        self.method = method

    @property
    def title(self) -> str:
        return self.name if self.is_function else f"{self.name}.{self.method}"

    def find_function(self, tree: cst.Module) -> cst.FunctionDef | None:
        found = find_function(tree, self.name, self.is_function, self.method)
        return None if found is None else found[2]

    def replace_body(self, tree: cst.Module, new_body: Sequence[cst.BaseStatement]) -> cst.Module:
        return _replace_body(tree, self.name, self.is_function, new_body, self.method)

    def schedule_import(self) -> None:
        AddImportsVisitor.add_needed_import(self.context, JAX_IMPORT.module)

    def sync_statement(self, site: SyncSite) -> str:
        comment = sync_comment(site.comment)
        return transfer_code(site.values, site.stage, self.column, comment, self.width)

    def split_other(
        self, statement: cst.BaseStatement, sites: Sequence[SyncSite], tree: cst.Module
    ) -> list[cst.BaseStatement] | None:
        """``x, _ = jax.lax.scan(step, x, params["layers"])`` -> a scan over
        ``jax.tree.map(lambda w: w[:k], params["layers"])``, the sync line, and a scan over
        the rest starting from ``x``."""
        scan = match_scan_call(statement)
        if scan is None:
            return None
        return self.split_pieces(
            scan.start,
            scan.stop,
            sites,
            tree,
            lambda position, start, stop: slice_scan(
                statement, start, stop, scan.target if position else None, self.column, self.width
            ),
        )


class RemoveDevicePutsCommand(RemoveSyncPointsCommand):
    """Remove the transfers syncpass wrote, merge the loops it split, and the ``import jax``
    it added (recognised by its comment; a user's ``import jax`` always stays).

    Every top-level function and every method of a top-level class is cleaned: the
    transfers of a sync point inside a submodule's call are in that submodule's method.
    """

    DESCRIPTION = "Remove syncpass's jax.device_put sync points and merge the loops it split."

    def is_sync_line(self, statement: cst.CSTNode) -> bool:
        return is_transfer_line(statement)

    def join_other(
        self, first: cst.BaseStatement, second: cst.BaseStatement
    ) -> cst.BaseStatement | None:
        """Two pieces of a split scan (:func:`~syncpass.transformers.common.joined_scan`)."""
        return joined_scan(first, second)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        for index, member_index, function, _ in every_function(tree):
            if not isinstance(function.body, cst.IndentedBlock):
                continue
            statements = list(function.body.body)
            if not any(self.is_sync_line(statement) for statement in statements):
                continue
            body = function.body.with_changes(body=tuple(self.merge(statements)))
            tree = replace_function(tree, index, member_index, function.with_changes(body=body))
        return _drop_added_import(tree)


class _RetargetCallsTransformer(cst.CSTTransformer):
    """Replace the device of every ``device_put(value, device)`` call with ``device``."""

    def __init__(self, device: cst.BaseExpression) -> None:
        super().__init__()
        self.device = device
        self.changed = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        transfer = m.Attribute(attr=m.Name("device_put")) | m.Name("device_put")
        if not m.matches(updated_node.func, transfer) or not names_a_device(updated_node):
            return updated_node
        args = list(updated_node.args)
        keyword = [
            index
            for index, arg in enumerate(args)
            if arg.keyword is not None and arg.keyword.value == "device"
        ]
        positional = [
            index for index, arg in enumerate(args) if arg.keyword is None and not arg.star
        ]
        index = keyword[0] if keyword else positional[1]
        args[index] = args[index].with_changes(value=self.device)
        self.changed += 1
        return updated_node.with_changes(args=args)


class RetargetDevicePutsCommand(Codemod):
    """Point every ``jax.device_put`` to a device, in every function and method of the file,
    at stage ``stage``'s device."""

    DESCRIPTION = "Make every jax.device_put in a JAX model transfer to one device."

    def __init__(self, context: CodemodContext, stage: int) -> None:
        super().__init__(context)
        self.stage = stage

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        device = cst.parse_expression(device_expression(self.stage))
        changed = False
        for index, member_index, function, _ in every_function(tree):
            retarget = _RetargetCallsTransformer(device)
            new_function = function.visit(retarget)
            if retarget.changed:
                assert isinstance(new_function, cst.FunctionDef)
                tree = replace_function(tree, index, member_index, new_function)
                changed = True
        if not changed:
            return tree
        return tree if imports_module(tree, "jax") else add_import(tree, self.context, JAX_IMPORT)


def retarget_device_puts(module: cst.Module, stage: int, filename: str) -> cst.Module:
    """Carry out :class:`RetargetDevicePutsCommand`."""
    context = CodemodContext(filename=filename)
    return RetargetDevicePutsCommand(context, stage).transform_module_impl(module)


_ADDED_IMPORT = m.SimpleStatementLine(
    body=[m.Import(names=[m.ImportAlias(name=m.Name("jax"))])], trailing_whitespace=SYNC_TRAILER
)


def _is_added_import(statement: cst.CSTNode) -> bool:
    """``import jax  # syncpass sync: ...``: the import syncpass added, never the user's own."""
    return m.matches(statement, _ADDED_IMPORT)


def _drop_added_import(tree: cst.Module) -> cst.Module:
    """Remove the ``import jax`` line syncpass marked as its own (a user's stays)."""
    body = [statement for statement in tree.body if not _is_added_import(statement)]
    return tree if len(body) == len(tree.body) else tree.with_changes(body=body)


def _mark_added_import(tree: cst.Module) -> cst.Module:
    """Give the ``import jax`` just added its comment, so that stripping knows it is syncpass's."""
    plain = m.SimpleStatementLine(
        body=[m.Import(names=[m.ImportAlias(name=m.Name("jax"), asname=None)])],
        trailing_whitespace=m.TrailingWhitespace(comment=None),
    )
    body = list(tree.body)
    for index, statement in enumerate(body):
        if m.matches(statement, plain):
            assert isinstance(statement, cst.SimpleStatementLine)
            comment = cst.Comment(f"{SYNC_COMMENT_PREFIX}: {ADDED_IMPORT_NOTE}")
            body[index] = statement.with_changes(
                trailing_whitespace=statement.trailing_whitespace.with_changes(
                    whitespace=cst.SimpleWhitespace("  "), comment=comment
                )
            )
            return tree.with_changes(body=body)
    return tree


def insert_device_puts(
    module: cst.Module,
    name: str,
    is_function: bool,
    sites: Sequence[SyncSite],
    filename: str,
    method: str = FLAX_METHOD,
    width: int = LINE_WIDTH,
) -> tuple[cst.Module, tuple[str, ...]]:
    """Carry out :class:`InsertDevicePutsCommand` in the function ``name`` (or the method
    ``method`` of the class ``name``), a transfer longer than ``width`` columns (the
    project formatter's line length) laid out as the formatter would; the new module and
    its warnings."""
    context = CodemodContext(filename=filename)
    for site in sites:
        if not site.values:
            context.warnings.append(
                f"nothing crosses the sync point {site.comment.split(':')[0]}; nothing changed"
            )
            return module, tuple(context.warnings)
    command = InsertDevicePutsCommand(context, name, is_function, sites, method)
    command.width = width
    rewritten = command.transform_module_impl(module)
    if rewritten is not module and not imports_module(rewritten, "jax"):
        rewritten = _mark_added_import(add_import(rewritten, context, JAX_IMPORT))
    return rewritten, tuple(context.warnings)


def remove_device_puts(module: cst.Module, filename: str) -> cst.Module:
    """Carry out :class:`RemoveDevicePutsCommand`."""
    context = CodemodContext(filename=filename)
    return RemoveDevicePutsCommand(context).transform_module_impl(module)

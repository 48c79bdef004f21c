"""Write and remove JAX rematerialisation: the blocks a plan recomputes in the backward.

``rewrite --backend jax --recompute`` has some ops recompute their forward in the
backward instead of keeping what it saves. In a Flax module's ``__call__`` such an op is
a submodule's call, and goes through Flax's lifted ``remat`` (``jax.checkpoint`` cannot
take a bound module), as a function of the module::

    for block in self.blocks[2:4]:
        # syncpass recompute: blocks.2, blocks.3; frees 1.89 MiB, costs 7.93 ms/step
        x = nn.remat(lambda block, x: block(x))(block, x)

(``nn`` is the name the file binds ``flax.linen`` to). The call itself stays as written
inside the function. What it passes is closed over, so that a Python value
(``deterministic=True``, which Hugging Face's blocks branch on) stays a constant of the
trace (remat's own arguments are traced), but for the names the loop binds on each
iteration (``x``), which the function takes as arguments: closing over a loop's variable
is what linters flag (ruff's B023). In a plain JAX function the op is a call of a function
by its name, ``h = jax.checkpoint(layer)(p, h)`` (``jax.checkpoint(lambda: layer(p, h,
training=True))()`` where it passes keywords or constants), or the steps of a scan over
stacked layer weights, ``jax.lax.scan(jax.checkpoint(step), x, ...)``. A loop of which
only some blocks recompute is split into sub-slices
(:mod:`syncpass.transformers.checkpoints`). Each form computes what the call computes,
forward and gradients; the comment on each line says what it frees and costs. The forms
keep the call's own layout, and a wrapped line wider than the formatter's stays on its
line (a formatter may lay it out); its comment then goes above it.

:func:`remove_remat` gives the user's lines back byte for byte (the call inside each
form is the user's, its function put back): it unwraps every line that carries a
``# syncpass recompute`` comment and joins the loop slices they split.

Nothing here imports jax.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import libcst as cst
import libcst.matchers as m

from syncpass.frontend.analysis import match_scan_call
from syncpass.transformers.checkpoints import (
    CheckpointForm,
    CheckpointRefused,
    checkpoint_piece,
    checkpoint_runs,
    commented,
    is_recompute_comment,
    is_self_path,
    recompute_comment,
)
from syncpass.transformers.common import (
    CheckpointSite,
    body_column,
    every_function,
    find_function,
    imports_module,
    joined_loop,
    joined_scan,
    replace_function,
    scan_call_of,
    slice_scan,
)

#: JAX's own: the checkpointed function of a plain JAX model.
JAX_CHECKPOINT = "jax.checkpoint"


def flax_linen_name(module: cst.Module) -> str | None:
    """The name ``module`` binds ``flax.linen`` to at its top (``nn`` for ``import
    flax.linen as nn`` or ``from flax import linen as nn``), or ``None``."""
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = cst.Module([]).code_for_node(alias.name)
                    bound = alias.evaluated_alias
                    if dotted == "flax.linen":
                        return bound or "flax.linen"
                    if dotted == "flax" and bound is None:
                        return "flax.linen"
            if (
                isinstance(small, cst.ImportFrom)
                and isinstance(small.module, cst.Name)
                and small.module.value == "flax"
                and not isinstance(small.names, cst.ImportStar)
            ):
                for alias in small.names:
                    if m.matches(alias.name, m.Name("linen")):
                        return alias.evaluated_alias or "linen"
    return None


def _flax_remat(linen: str) -> CheckpointForm:
    """``linen.remat(lambda block, x: block(x, training=True))(block, x)``: Flax's lifted
    ``remat`` of a function of the bound submodule (``jax.checkpoint`` cannot take a bound
    module). The call stays as written inside the function, under the module's parameter:
    its Python values are closed over, constants of the trace, where remat's arguments
    would be traced and fail a Python ``if``; the names ``rebound`` in its loop are the
    function's arguments."""

    def wrap(call: cst.Call, exploded: bool, rebound: frozenset[str]) -> cst.Call:
        module = call.func
        parameter = cst.Name(_parameter_name(module, call))
        passed = _passed(call, rebound)
        function = _function_of(call.with_changes(func=parameter), [parameter.value, *passed])
        remat = cst.Call(func=cst.parse_expression(f"{linen}.remat"), args=[cst.Arg(function)])
        return cst.Call(func=remat, args=_arguments([module, *map(cst.Name, passed)]))

    return CheckpointForm(
        "the JAX rewrite rematerialises",
        wrap,
        is_self_path,
        "one submodule's call (self.name(...))",
    )


def _parameter_name(module: cst.BaseExpression, call: cst.Call) -> str:
    """The name the remat'd function calls the module by: its own (``block``, ``mlp`` of
    ``self.mlp``), or ``module`` where that is not a name; ``_`` added while the call's
    arguments read it."""
    name = "module"
    if isinstance(module, cst.Name):
        name = module.value
    elif isinstance(module, cst.Attribute):
        name = module.attr.value
    read = {
        node.value
        for arg in call.args
        for node in m.findall(arg, m.Name())
        if isinstance(node, cst.Name)
    }
    while name in read:
        name += "_"
    return name


def _jax_checkpoint(call: cst.Call, exploded: bool, rebound: frozenset[str]) -> cst.Call:
    """``jax.checkpoint(f)(*args)`` of ``f(*args)``; ``jax.checkpoint(lambda: f(...))()``
    where the call passes keywords or constants (Python values, which ``jax.checkpoint``
    would trace as its arguments: closed over, they stay constants)."""
    wrapper = cst.parse_expression(f"{JAX_CHECKPOINT}(f)")
    assert isinstance(wrapper, cst.Call)
    if all(arg.keyword is None and not _constant(arg.value) for arg in call.args):
        return call.with_changes(func=wrapper.with_changes(args=[cst.Arg(call.func)]))
    passed = _passed(call, rebound)
    function = _function_of(call, passed)
    return cst.Call(
        func=wrapper.with_changes(args=[cst.Arg(function)]),
        args=_arguments([cst.Name(name) for name in passed]),
    )


def _passed(call: cst.Call, rebound: frozenset[str]) -> list[str]:
    """The names ``call``'s arguments read that its loop binds on each iteration, in order:
    a function made in the loop takes them as its own arguments (closed over, they would be
    the loop's variables, which a linter rightly flags, ruff's B023)."""
    read = [
        node.value
        for arg in call.args
        for node in m.findall(arg, m.Name())
        if isinstance(node, cst.Name) and node.value in rebound
    ]
    return list(dict.fromkeys(read))


def _function_of(body: cst.Call, parameters: Sequence[str]) -> cst.Lambda:
    """``lambda a, b: body``."""
    params = [cst.Param(cst.Name(name)) for name in parameters]
    return cst.Lambda(params=cst.Parameters(params=params), body=body)


def _arguments(values: Sequence[cst.BaseExpression]) -> list[cst.Arg]:
    return [cst.Arg(value) for value in values]


def _constant(value: cst.BaseExpression) -> bool:
    """A literal: a number, a string, ``True``, ``False`` or ``None``."""
    return isinstance(value, cst.BaseNumber | cst.BaseString) or m.matches(
        value, m.Name("True") | m.Name("False") | m.Name("None")
    )


def _split_scan(
    statement: cst.BaseStatement,
    sites: Mapping[int | None, CheckpointSite],
    sizes: Mapping[str, int],
    module: cst.Module,
    column: int,
) -> list[cst.BaseStatement] | None:
    """A scan over stacked layer weights (or a slice of one) as scans over sub-slices, each
    recomputing its steps or not: ``jax.lax.scan(jax.checkpoint(step), x, ...)``, the later
    ones starting from the carry, as sync points split it; ``None`` for another statement."""
    scan = match_scan_call(statement)
    if scan is None:
        return None
    first = next(iter(sites.values()))
    size = sizes.get(scan.container)
    if size is None:
        raise CheckpointRefused(f"{first.op}: the length of {scan.container} is not known")
    runs = checkpoint_runs(scan.iterations(size), sites, scan.start, scan.stop)
    out: list[cst.BaseStatement] = []
    for position, (recomputed, items, start, stop) in enumerate(runs):
        piece = statement
        if len(runs) > 1:
            piece = slice_scan(statement, start, stop, scan.target if position else None, column)
        if position:
            piece = piece.with_changes(leading_lines=())
        if recomputed:
            call = scan_call_of(piece)
            step = call.args[0].with_changes(
                value=cst.Call(
                    func=cst.parse_expression(JAX_CHECKPOINT),
                    args=[cst.Arg(call.args[0].value)],
                )
            )
            stepped = call.with_changes(args=[step, *call.args[1:]])
            changed = piece.visit(_Replaced(call, stepped))
            assert isinstance(changed, cst.SimpleStatementLine)
            piece = commented(changed, recompute_comment([sites[i] for i in items]), module, column)
        out.append(piece)
    return out


class _Replaced(cst.CSTTransformer):
    """The tree with the call ``old`` (itself, not an equal one) replaced by ``new``."""

    def __init__(self, old: cst.Call, new: cst.Call) -> None:
        super().__init__()
        self.old, self.new = old, new

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        return self.new if original_node is self.old else updated_node


#: A plain JAX function: a call of a function by its name, and the steps of a scan over
#: stacked layer weights.
JAX_FUNCTION = CheckpointForm(
    "the JAX rewrite rematerialises",
    _jax_checkpoint,
    lambda func: isinstance(func, cst.Name),
    "one function by its name (f(...))",
    split_other=_split_scan,
)


def insert_remat(
    module: cst.Module,
    planned: cst.Module,
    name: str,
    is_function: bool,
    method: str,
    sites: Sequence[CheckpointSite],
    sizes: Mapping[str, int],
) -> cst.Module:
    """``module`` with the ops of ``sites`` recomputing, in the function ``name`` (or the
    method ``method`` of the class ``name``). ``planned`` is the module the sites index
    the statements of (``module`` before its sync points were written); ``sizes`` the
    lengths of the function's layer containers. Raises :class:`CheckpointRefused`."""
    if not sites:
        return module
    if is_function:
        form = JAX_FUNCTION
        if not imports_module(module, "jax"):
            raise CheckpointRefused(
                f"{sites[0].op}: the file does not import jax, whose checkpoint the JAX "
                "rewrite recomputes a function's call with (import jax)"
            )
    else:
        linen = flax_linen_name(module)
        if linen is None:
            raise CheckpointRefused(
                f"{sites[0].op}: the file does not import flax.linen, whose remat the JAX "
                "rewrite recomputes a Flax submodule's call with"
            )
        form = _flax_remat(linen)
    original = find_function(planned, name, is_function, method)
    found = find_function(module, name, is_function, method)
    if original is None or found is None:
        raise CheckpointRefused(f"{sites[0].op}: no single function {name} to recompute in")
    index, member_index, function = found
    assert isinstance(function.body, cst.IndentedBlock)
    assert isinstance(original[2].body, cst.IndentedBlock)
    column = body_column(module, function)
    body = checkpoint_piece(
        function.body.body, original[2].body.body, sites, sizes, module, column, form
    )
    new_function = function.with_changes(body=function.body.with_changes(body=tuple(body)))
    return replace_function(module, index, member_index, new_function)


def remove_remat(module: cst.Module) -> cst.Module:
    """``module`` without the rematerialisation syncpass wrote, in every function and method:
    each line with a ``# syncpass recompute`` comment unwrapped, the comment gone, and the
    loop slices those lines split joined again."""
    for index, member_index, function, _ in every_function(module):
        if not isinstance(function.body, cst.IndentedBlock):
            continue
        statements, touched = _unwrapped(function.body.body)
        if not touched:
            continue
        body = function.body.with_changes(body=tuple(_joined(statements, touched)))
        module = replace_function(module, index, member_index, function.with_changes(body=body))
    return module


def _unwrapped(
    statements: Sequence[cst.BaseStatement],
) -> tuple[list[cst.BaseStatement], set[int]]:
    """``statements`` with their recompute lines unwrapped (those of a loop's body too), and
    the positions of the statements that held one."""
    out: list[cst.BaseStatement] = []
    touched: set[int] = set()
    for position, statement in enumerate(statements):
        if isinstance(statement, cst.For) and isinstance(statement.body, cst.IndentedBlock):
            inner, changed = _unwrapped(statement.body.body)
            if changed:
                statement = statement.with_changes(
                    body=statement.body.with_changes(body=tuple(inner))
                )
                touched.add(position)
        elif _is_recompute_line(statement):
            assert isinstance(statement, cst.SimpleStatementLine)
            statement = _plain_line(statement)
            touched.add(position)
        out.append(statement)
    return out, touched


def _joined(statements: Sequence[cst.BaseStatement], touched: set[int]) -> list[cst.BaseStatement]:
    """Adjacent slices of one loop joined, where one of them held a recompute line."""
    kept: list[cst.BaseStatement] = []
    joins_next = False  # the last kept statement held a recompute line (or was joined)
    for position, statement in enumerate(statements):
        ours = position in touched
        loop = None
        if kept and (joins_next or ours):
            loop = joined_loop(kept[-1], statement) or joined_scan(kept[-1], statement)
        if loop is not None:
            kept[-1] = loop
            joins_next = True
            continue
        kept.append(statement)
        joins_next = ours
    return kept


def _is_recompute_line(statement: cst.BaseStatement) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    trailing = statement.trailing_whitespace.comment
    above = [line.comment for line in statement.leading_lines if line.comment is not None]
    return any(
        comment is not None and is_recompute_comment(comment.value)
        for comment in [trailing, *above]
    )


def _plain_line(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """A recompute line as the user wrote it: its calls unwrapped, the comment gone."""
    unwrapped = statement.visit(_UnwrapCalls())
    assert isinstance(unwrapped, cst.SimpleStatementLine)
    leading = [
        line
        for line in unwrapped.leading_lines
        if line.comment is None or not is_recompute_comment(line.comment.value)
    ]
    trailing = unwrapped.trailing_whitespace
    if trailing.comment is not None and is_recompute_comment(trailing.comment.value):
        trailing = cst.TrailingWhitespace(newline=trailing.newline)
    return unwrapped.with_changes(leading_lines=leading, trailing_whitespace=trailing)


_REMAT_OF_CALL = m.Call(
    func=m.Call(
        func=m.Attribute(attr=m.Name("remat")) | m.Name("remat"),
        args=[m.Arg(value=m.Lambda(body=m.Call(func=m.Name())), keyword=None)],
    ),
    args=[m.Arg(keyword=None, star=""), m.ZeroOrMore(m.Arg(value=m.Name(), keyword=None))],
)
_SCAN = m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("lax")), attr=m.Name("scan"))
_JAX_CHECKPOINT_OF = m.Call(
    func=m.Attribute(value=m.Name("jax"), attr=m.Name("checkpoint")),
    args=[m.Arg(keyword=None, star="")],
)


class _UnwrapCalls(cst.CSTTransformer):
    """``remat(lambda block, x: block(x, ...))(block, x)``, ``jax.checkpoint(f)(*args)`` and
    ``jax.checkpoint(lambda x: f(x, ...))(x)`` back to ``block(x, ...)``, ``f(...)``."""

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        func = updated_node.func
        if m.matches(updated_node, _REMAT_OF_CALL):
            assert isinstance(func, cst.Call) and isinstance(func.args[0].value, cst.Lambda)
            inner = func.args[0].value.body
            assert isinstance(inner, cst.Call)
            return inner.with_changes(func=updated_node.args[0].value)
        if m.matches(func, _JAX_CHECKPOINT_OF):
            assert isinstance(func, cst.Call)
            wrapped = func.args[0].value
            if isinstance(wrapped, cst.Lambda):
                return wrapped.body
            return updated_node.with_changes(func=wrapped)
        if m.matches(func, _SCAN) and updated_node.args:
            step = updated_node.args[0]
            if m.matches(step.value, _JAX_CHECKPOINT_OF):
                assert isinstance(step.value, cst.Call)
                unwrapped = step.with_changes(value=step.value.args[0].value)
                return updated_node.with_changes(args=[unwrapped, *updated_node.args[1:]])
        return updated_node

"""Build the op graph of a JAX model from its source: a function of parameters, or a Flax module.

Two forms of model are read, both statically (nothing runs):

* a **JAX function** at the top level of the file, ``def forward(params, x)``,
  whose first parameter holds the weights (any pytree) and whose other
  parameters are the inputs. Each statement of its body is one op. An op is
  named after the first weight it reads with a constant key
  (``h = jax.nn.gelu(x @ params["w1"] + params["b1"])`` is op ``w1``), else
  after its outermost call, as for torch (``jax.numpy.tanh@L42``). The weights
  are no value of the data flow: each stage holds its own, so they never
  cross a sync point.
* a **Flax module** (``flax.linen``) whose ``__call__`` computes the model,
  with its submodules built in ``setup``. It is read exactly as a torch
  ``forward``: ``x = self.embed(x)`` is op ``embed``, and a loop over a list of
  submodules (``for block in self.blocks``) is planned per iteration. A
  ``@nn.compact`` ``__call__`` is read too; its inline submodules
  (``nn.Dense(64)(x)``) are named by their call (``flax.linen.Dense@L30``).

The op graph is :class:`syncpass.contracts.graph.OpGraph`, with the same ids, edges and
cuts as for torch, so cost files, plan files, strategies and the optimiser
work unchanged. A hand-written ``x = jax.device_put(x, device)`` statement in
the body (a device given: a second argument or ``device=``) is a sync point the
user placed (pinned), as ``pipe_split()`` is for torch.

Only arrays cross a sync point. A value the trace keeps as a Python value (a
size such as ``b, t, d = x.shape``, a ``train: bool`` argument, a submodule
built inline, a function; see :mod:`syncpass.frontend.numbers`) is left out
of the cuts' live values: moved with ``jax.device_put`` it would become an
array and break the trace. A cut across which no array is live is no sync
point (its transfer would have nothing to move), unless the user pinned it.

The example convention of the JAX commands (``syncpass profile/rewrite/run
--backend jax``): ``--example`` names a zero-argument function returning
``(model, params, args)`` or ``(model, params, args, target, loss_fn)``, where
``model`` is the JAX function (called ``model(params, *args)``) or a Flax module
instance (called ``model.apply(params, *args)``), ``params`` its weights (for
Flax, the variables of ``model.init``), ``args`` a tuple of inputs for one batch
whose first dimension is the batch, and ``loss_fn(output, target)`` a scalar.
Without a loss, the loss is the mean of the squared outputs.

This module imports libcst, never jax.
"""

from __future__ import annotations

import dataclasses

import libcst as cst
import libcst.matchers as m

from syncpass.contracts.graph import OpGraph
from syncpass.core.errors import NoModelError, SyncpassError
from syncpass.frontend.analysis import (
    ContainerSizes,
    FunctionSite,
    StatementFacts,
    StatementLabel,
    _line,
    _lines_before,
    analyse_method,
    build_op_graph,
    find_forward,
    match_container_loop,
)
from syncpass.frontend.match import pick_model, sizes_from_ids
from syncpass.frontend.numbers import JAX_RULES, host_values, module_numbers
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.common import SYNC_COMMENT_PREFIX
from syncpass.transformers.jax_transfer import names_a_device, remove_device_puts

#: The method of a Flax module that computes the model.
FLAX_METHOD = "__call__"
#: The function a JAX model file is looked up by when no name is given.
DEFAULT_FUNCTION = "forward"
DEVICE_PUT = "jax.device_put"


def _functions(module: cst.Module) -> dict[str, cst.FunctionDef]:
    return {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, cst.FunctionDef)
    }


def flax_class_names(module: cst.Module) -> list[str]:
    """Top-level classes that define ``__call__``, in file order."""
    return [
        statement.name.value
        for statement in module.body
        if isinstance(statement, cst.ClassDef)
        and any(
            isinstance(member, cst.FunctionDef) and member.name.value == FLAX_METHOD
            for member in statement.body.body
        )
    ]


def jax_model_names(module: cst.Module) -> list[str]:
    """What ``--model`` may name: a top-level ``forward`` function, then Flax module classes."""
    names = [DEFAULT_FUNCTION] if DEFAULT_FUNCTION in _functions(module) else []
    return names + flax_class_names(module)


def resolve_jax_model(module: cst.Module, name: str | None, path: str) -> tuple[str, bool]:
    """The model's name and whether it is a plain function (else a Flax module class).

    Without ``name``: the top-level function ``forward`` if there is one, else
    the only class with a ``__call__``.
    """
    functions = _functions(module)
    classes = flax_class_names(module)
    if name is None:
        if DEFAULT_FUNCTION in functions:
            return DEFAULT_FUNCTION, True
        if len(classes) == 1:
            return classes[0], False
        if not classes:
            raise NoModelError(
                "no JAX model: no top-level function forward(params, ...) and no class with "
                "a __call__ method",
                path,
            )
        raise SyncpassError(
            f"several Flax module classes ({', '.join(classes)}); choose one with --model NAME",
            path,
        )
    if name in classes:
        return name, False
    if name in functions:
        return name, True
    known = jax_model_names(module)
    hint = f"; models here: {', '.join(known)}" if known else ""
    raise SyncpassError(
        f"no top-level function or Flax module class named {name!r}{hint}",
        path,
    )


def _reduced_function_module(module: cst.Module, function: cst.FunctionDef) -> cst.Module:
    imports = [
        statement
        for statement in module.body
        if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
    ]
    return module.with_changes(body=[*imports, function])


def _weights_key(params: str) -> StatementLabel:
    """A labeller: the first constant key a statement reads from ``params``."""

    def label(statement: cst.BaseStatement) -> str | None:
        found = m.findall(
            statement,
            m.Subscript(
                value=m.Name(params),
                slice=[m.SubscriptElement(slice=m.Index(value=m.SimpleString()))],
            ),
        )
        for node in found:
            assert isinstance(node, cst.Subscript)
            index = node.slice[0].slice
            assert isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)
            key = index.value.evaluated_value
            if isinstance(key, str) and key:
                return key
        return None

    return label


def is_device_put_sync(statement: cst.BaseStatement, facts: StatementFacts) -> bool:
    """A statement ``names = jax.device_put(values, device)`` (or a bare call): a hand-written
    sync point. Without a device (``jax.device_put(x)``) it moves nothing between stages."""
    if not m.matches(
        statement,
        m.SimpleStatementLine(body=[m.Assign(value=m.Call()) | m.Expr(value=m.Call())]),
    ):
        return False
    outermost = [call for call in facts.calls if call.depth == 0]
    if len(outermost) != 1 or outermost[0].function != DEVICE_PUT:
        return False
    assert isinstance(statement, cst.SimpleStatementLine)
    small = statement.body[0]
    assert isinstance(small, (cst.Assign, cst.Expr)) and isinstance(small.value, cst.Call)
    return names_a_device(small.value)


def _array_cuts(graph: OpGraph, host: frozenset[str]) -> OpGraph:
    """``graph`` with host values out of the cuts' live values, and without the cuts across
    which no array is live (a pinned one stays)."""
    cuts = []
    for cut in graph.cuts:
        live = tuple(name for name in cut.live if name not in host)
        if live or cut.pinned:
            cuts.append(dataclasses.replace(cut, live=live))
    return dataclasses.replace(graph, cuts=tuple(cuts))


def host_names(module: cst.Module, function: cst.FunctionDef) -> frozenset[str]:
    """The names of ``function`` that hold Python values in a trace, never arrays."""
    return host_values(function, module, module_numbers(module), rules=JAX_RULES).names


def analyse_jax_model(
    module: cst.Module,
    path: str,
    name: str | None = None,
    sizes: ContainerSizes | None = None,
    text: str | None = None,
) -> OpGraph:
    """The op graph of the JAX function or Flax module ``name`` (see the module docstring).

    ``sizes`` gives the length of each list of submodules a Flax ``__call__``
    loops over (``{"blocks": 4}``). The graph's ``model_class`` is the
    function's or the class's name.
    """
    name, is_function = resolve_jax_model(module, name, path)
    if not is_function:
        graph = analyse_method(
            module, path, name, sizes, text, method=FLAX_METHOD, sync_point=is_device_put_sync
        )
        call = find_forward(module, name, path, FLAX_METHOD).forward
        return _array_cuts(graph, host_names(module, call))
    function = _functions(module)[name]
    parameters = [*function.params.posonly_params, *function.params.params]
    if len(parameters) < 2:
        raise SyncpassError(
            f"{name} must take the weights first and then the inputs: def {name}(params, x)",
            f"{path}:{_line(module, function)}",
        )
    if not isinstance(function.body, cst.IndentedBlock):
        raise SyncpassError(
            f"{name} is written on one line; nothing can be placed inside it",
            f"{path}:{_line(module, function)}",
        )
    weights = parameters[0].name.value
    reduced = _reduced_function_module(module, function)
    site = FunctionSite(
        module=module,
        path=path,
        name=name,
        function=function,
        reduced=reduced,
        offset=_lines_before(module, function) - _lines_before(reduced, function),
        hidden=frozenset({weights}),
        sync_point=is_device_put_sync,
        label=_weights_key(weights),
    )
    return _array_cuts(build_op_graph(site, sizes), host_names(module, function))


def jax_loop_containers(module: cst.Module, name: str | None, path: str) -> tuple[str, ...]:
    """Lists a model loops over, per item: of submodules in a Flax ``__call__`` (``blocks`` for
    ``for block in self.blocks``), of weight dicts in a JAX function (``layers`` for ``for
    layer in params["layers"]``; ``decoder.layers`` for ``params["decoder"]["layers"]``)."""
    name, is_function = resolve_jax_model(module, name, path)
    if is_function:
        function = _functions(module)[name]
        parameters = [*function.params.posonly_params, *function.params.params]
        root = parameters[0].name.value if parameters else None
    else:
        function = find_forward(module, name, path, FLAX_METHOD).forward
        root = "self"
    if not isinstance(function.body, cst.IndentedBlock):
        return ()
    names = []
    for statement in function.body.body:
        if isinstance(statement, cst.For):
            loop = match_container_loop(statement)
            if loop is not None and loop.root == root:
                names.append(loop.container)
    return tuple(dict.fromkeys(names))


def analyse(text: str, path: str, known: KnownOps, name: str | None) -> ModelSource:
    """The JAX model of ``text`` (a function, or a Flax module's ``__call__``) and its op graph.

    ``name`` is the function or Flax module class (default: the one ``known``
    names when the file has it, else :func:`resolve_jax_model`'s choice).
    """
    module = parse_source(text, path)
    model, is_function = resolve_jax_model(
        module, pick_model(jax_model_names(module), known.model, name), path
    )
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_device_puts(module, model, is_function, path)
        base = module.code
    sizes = sizes_from_ids(known.ids, jax_loop_containers(module, model, path))
    graph = analyse_jax_model(module, path, model, sizes, base)
    return ModelSource(
        text=text, base=base, module=module, graph=graph, handle=(model, is_function)
    )

"""The cost file of a model, estimated from its source: :func:`estimate_costs`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncpass.backends.torch.analysis import analyse_model, loop_containers
from syncpass.backends.torch.analysis import sequential_calls as find_sequential_calls
from syncpass.backends.torch.estimate.forward import ForwardRun, resolve_path
from syncpass.backends.torch.estimate.inputs import bind_inputs
from syncpass.backends.torch.estimate.interpreter import Interpreter
from syncpass.backends.torch.estimate.layers import layer_parameters
from syncpass.backends.torch.estimate.values import (
    MODULES,
    Container,
    Instance,
    Layer,
    Tensor,
    Unsized,
    numel,
)
from syncpass.backends.torch.rewrite import strip_sync_points
from syncpass.contracts.costs import Costs, CutCost, Hardware, OpCost
from syncpass.contracts.graph import OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.frontend import find_forward, model_class_names, parse_source

#: The compute rate assumed when the hardware gives none (a few CPU cores' worth).
DEFAULT_FLOPS_PER_S = 50e9
#: Weights, gradients and two Adam moments per parameter byte (as ``syncpass profile``).
TRAINING_MEMORY_MULTIPLIER = 4


@dataclass(frozen=True)
class UnsizedOp:
    """An op the estimate could not size, which got the fallback figures."""

    op_id: str
    location: str  # "file:line"
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.op_id}: {self.reason}"


@dataclass(frozen=True)
class StaticEstimate:
    """A cost file estimated from source, and the ops that got the fallback."""

    costs: Costs
    unsized: tuple[UnsizedOp, ...]

    def __post_init__(self) -> None:
        known = {op.id for op in self.costs.ops}
        for op in self.unsized:
            if op.op_id not in known:
                raise ValueError(f"unsized op {op.op_id!r} is not an op of the cost file")


def estimate_costs(
    text: str,
    path: str,
    class_name: str | None,
    input_shapes: Sequence[tuple[int, ...]],
    hardware: Hardware,
    *,
    training: bool = True,
    dtype_bytes: int = 4,
    depth: int = 1,
    input_dtypes: Sequence[str] | None = None,
) -> StaticEstimate:
    """Estimate the cost file of ``class_name`` (or the file's only model) from ``text``.

    ``input_shapes`` are the shapes of the forward's positional inputs, in
    order; ``input_dtypes`` says which are ``"float"`` and which ``"int"``
    (token ids), by default int when an input is first passed to an
    ``nn.Embedding``. ``depth`` 2 plans calls of ``nn.Sequential`` submodules
    per child, as ``syncpass profile --depth 2`` does. The op ids are exactly
    those of :func:`syncpass.frontend.analyse_model` for the same source, so
    ``syncpass rewrite --costs`` accepts the result. Raises
    :class:`SyncpassError` for a file it cannot analyse or inputs that do not
    fit the forward.
    """
    if not input_shapes:
        raise SyncpassError("give the shape of at least one forward input (--input-shape)")
    for shape in input_shapes:
        if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise SyncpassError(
                f"input shape {shape!r} must be one or more whole sizes >= 1 (e.g. 8x128)"
            )
    if dtype_bytes < 1 or depth < 1:
        raise SyncpassError("dtype_bytes and depth must be at least 1")
    text = strip_sync_points(text, path)
    module = parse_source(text, path)
    model_def = find_forward(module, class_name or _root_model_class(module), path)
    name = model_def.class_name
    interp = Interpreter(module, path, training)
    try:
        model = interp.instantiate(model_def.classdef, [], {}, f"{name}()")
    except Unsized as error:
        raise SyncpassError(
            f"cannot build {name}() from its source: its constructor {error.reason}; "
            "profile it with --example (or --meta) instead",
            path,
        ) from None

    sizes: dict[str, int] = {}
    for container in loop_containers(module, name, path):
        value = resolve_path(model, container)
        if isinstance(value, Container):
            sizes[container] = len(value.children)
    expand: dict[str, int] = {}
    if depth >= 2:
        for container in find_sequential_calls(module, name, path):
            value = resolve_path(model, container)
            if isinstance(value, Container) and value.kind == "Sequential":
                expand[container] = len(value.children)
    graph = analyse_model(module, path, name, sizes, text, expand)

    frame = bind_inputs(interp, model, model_def.forward, graph, input_shapes, input_dtypes)
    figures = ForwardRun(interp, model, graph, model_def.forward, frame, dtype_bytes).run()
    params = _attributed_parameters(model, graph, dtype_bytes)
    reads_grad = _reads_gradient(model, graph)

    rate = hardware.flops_per_s or DEFAULT_FLOPS_PER_S
    sized = [figure for figure in figures if figure.unsized is None]
    median_forward = statistics.median(f.forward_flops for f in sized) if sized else 0.0
    median_backward = statistics.median(f.backward_flops for f in sized) if sized else 0.0
    ops = []
    unsized = []
    for op, figure, param_bytes, needs in zip(graph.ops, figures, params, reads_grad, strict=True):
        forward_flops, backward_flops = figure.forward_flops, figure.backward_flops
        input_flops: float | None = backward_flops - figure.weight_backward_flops
        if figure.unsized is not None:
            forward_flops, backward_flops, input_flops = median_forward, median_backward, None
            unsized.append(UnsizedOp(op.id, str(op.location), figure.unsized))
        if not needs:
            input_flops = 0.0
        ops.append(
            OpCost(
                id=op.id,
                compute_s=forward_flops / rate,
                backward_s=backward_flops / rate,
                backward_input_s=(
                    None if input_flops is None else min(input_flops, backward_flops) / rate
                ),
                param_bytes=param_bytes,
                out_bytes=figure.out_bytes,
                flops=forward_flops,
                source=str(op.location),
            )
        )
    by_id = {op.id: figure for op, figure in zip(graph.ops, figures, strict=True)}
    cuts = tuple(
        CutCost(after=cut.after, live_bytes=by_id[cut.after].live_bytes, pinned=cut.pinned)
        for cut in graph.cuts
    )
    notes = [_summary_note(hardware, rate, input_shapes, unsized)]
    if hardware.flops_per_s is None:
        hardware = dataclasses.replace(hardware, flops_per_s=rate)
    costs = Costs(
        batch_size=input_shapes[0][0],
        training=training,
        memory_multiplier=TRAINING_MEMORY_MULTIPLIER if training else 1,
        hardware=hardware,
        ops=tuple(ops),
        cuts=cuts,
        model=name,
        edges=graph.edges,
        notes=tuple(notes),
        containers=graph.containers,
    )
    return StaticEstimate(costs, tuple(unsized))


def _root_model_class(module: cst.Module) -> str | None:
    """The file's model class that no other class of the file builds (directly or through
    the file's functions), when exactly one is: ``TransformerLM`` beside its ``Block``.
    Otherwise ``None``, and the analysis asks for ``--model``."""
    names = model_class_names(module)
    defined = {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef))
    }
    refs = {
        name: {node.value for node in m.findall(statement, m.Name()) if isinstance(node, cst.Name)}
        & set(defined)
        for name, statement in defined.items()
    }
    used: set[str] = set()
    for name in names:
        stack, seen = list(refs[name] - {name}), {name}
        while stack:
            other = stack.pop()
            if other in seen:
                continue
            seen.add(other)
            used.add(other)
            if isinstance(defined[other], cst.FunctionDef):
                stack.extend(refs[other])
    roots = [name for name in names if name not in used]
    return roots[0] if len(roots) == 1 else None


def _summary_note(
    hardware: Hardware, rate: float, shapes: Sequence[tuple[int, ...]], unsized: list[UnsizedOp]
) -> str:
    source = (
        "the hardware's rate"
        if hardware.flops_per_s is not None
        else "syncpass's default: the hardware gives no FLOP/s"
    )
    inputs = ", ".join("x".join(map(str, shape)) for shape in shapes)
    if unsized:
        named = ", ".join(op.op_id for op in unsized[:5]) + (", ..." if len(unsized) > 5 else "")
        sizing = (
            f"{len(unsized)} op(s) unsized ({named}): they got the median compute of the "
            "others and their input's shape"
        )
    else:
        sizing = "0 ops unsized"
    return (
        f"static estimate from source, not measured: FLOP counts at {rate:.3g} FLOP/s "
        f"({source}), inputs {inputs}; {sizing}"
    )


def _attributed_parameters(model: Instance, graph: OpGraph, dtype_bytes: int) -> list[float]:
    """Bytes of the parameters of the submodules each op calls, each once at its first use
    (what :func:`syncpass.backends.torch.measure.parameter_bytes` measures)."""
    seen: set[int] = set()
    result = []
    for op in graph.ops:
        total = 0
        for call in op.calls:
            if not call.startswith("self."):
                continue
            target = resolve_path(model, call.removeprefix("self."))
            if not isinstance(target, (*MODULES, Tensor)):
                continue
            found: dict[int, int] = {}
            _parameters(target, found)
            for identity, count in found.items():
                if identity not in seen:
                    seen.add(identity)
                    total += count
        result.append(float(total * dtype_bytes))
    return result


def _reads_gradient(model: Instance, graph: OpGraph) -> list[bool]:
    """Per op, whether a name it reads holds a value that needs a gradient.

    The forward's inputs need none (training data; token ids). What an op writes
    needs one when a name it reads does or it calls a submodule with parameters (an
    embedding of token ids): the same rule autograd follows, by name and not by value.
    """
    needing: set[str] = set()
    result = []
    for op in graph.ops:
        needs = any(name in needing for name in op.reads)
        result.append(needs)
        weighted = False
        for call in op.calls:
            target = (
                resolve_path(model, call.removeprefix("self."))
                if call.startswith("self.")
                else None
            )
            found: dict[int, int] = {}
            if isinstance(target, (*MODULES, Tensor)):
                _parameters(target, found)
            weighted = weighted or any(count > 0 for count in found.values())
        if needs or weighted:
            needing.update(op.writes)
        else:
            needing.difference_update(op.writes)
    return result


def _parameters(value: object, found: dict[int, int], seen: set[int] | None = None) -> None:
    """Parameter counts of ``value`` and everything it holds, by identity (shared once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Layer):
        try:
            found[id(value)] = layer_parameters(value)
        except Unsized:
            found[id(value)] = 0
    elif isinstance(value, Tensor) and value.parameter:
        found[id(value)] = numel(value.shape)
    elif isinstance(value, Container):
        for child in value.children:
            _parameters(child, found, seen)
    elif isinstance(value, Instance):
        for attr in value.attrs.values():
            _parameters(attr, found, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _parameters(item, found, seen)

"""Record a built torch model's tensor graph (:mod:`syncpass.contracts.tensor`) by running it.

One forward of the example runs under forward hooks on the leaf modules syncpass knows
(``nn.Linear``, a Conv1D-style weight, ``nn.Embedding``, norms, dropout, activations,
softmax) and a ``TorchFunctionMode`` that sees every functional op outside them
(``F.scaled_dot_product_attention``, ``x @ self.w``, ``+``, views, ``F.cross_entropy``).
Each becomes a :class:`TensorOp`; it reads the ops that made its tensor arguments, found
by the tensors' identity (every tensor seen is kept alive until the end, so no identity
is reused). Tensors the forward makes from nothing it was given (``torch.arange``, a
mask) are constants: a module reading one reads an ``input`` op made for it, a
functional op ignores it, and an op that reads only constants is not recorded.

Sizes are the tensors' own; ``compute_s`` is the op's forward wall-clock time in this
run (or, with ``flops_per_s``, its FLOPs at that rate for the ops whose FLOPs are known),
and ``backward_s`` twice that for an op with weights, the same for the rest: an
estimate, as the docs say.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from syncpass.contracts.tensor import TensorGraph, TensorOp

if TYPE_CHECKING:
    from syncpass.backends.torch.example import Example
    from syncpass.contracts.costs import Costs

#: Functional ops by what they are to the planner.
_ADD = {"add", "__add__", "__radd__", "__iadd__", "add_"}
_RESHAPE = {
    "view",
    "reshape",
    "transpose",
    "permute",
    "contiguous",
    "split",
    "chunk",
    "unbind",
    "__getitem__",
    "unflatten",
    "flatten",
    "squeeze",
    "unsqueeze",
    "view_as",
    "narrow",
    "clone",
    "to",
    "float",
    "half",
    "bfloat16",
    "type_as",
}
_ELEMENTWISE = {
    "mul",
    "__mul__",
    "__rmul__",
    "__imul__",
    "mul_",
    "div",
    "__truediv__",
    "sub",
    "__sub__",
    "__rsub__",
    "neg",
    "__neg__",
    "gelu",
    "silu",
    "relu",
    "tanh",
    "sigmoid",
    "dropout",
    "pow",
    "__pow__",
    "exp",
    "rsqrt",
    "sqrt",
    "masked_fill",
    "where",
    # Joins: element-wise to a split on another dimension (OpShape.joined_dim says which).
    "cat",
    "concat",
    "concatenate",
}
_JOINS = {"cat", "concat", "concatenate"}
_NORM = {"layer_norm", "rms_norm", "group_norm"}
_LINEAR = {"linear", "matmul", "__matmul__", "einsum", "mm", "bmm"}
_LOSS = {"cross_entropy", "nll_loss"}


#: The reshapes whose first argument sizes the pieces along ``dim`` (a fused weight's chunks).
_CUTS = {"split", "chunk"}


@dataclass(frozen=True)
class OpShape:
    """What the rewrite needs to know of one recorded op beyond the tensor graph, for a
    group of ``tp`` ranks: the function it called (``view``, ``split``, ``gelu``; a module's
    class name), how many dimensions its first output has, and, for a reshape, where a
    block split of its input lands: ``moves`` pairs an input dimension that splits into
    ``tp`` equal blocks with the output dimension the blocks end up on (a dimension absent
    from it does not survive the reshape as a block split). ``cut_dim`` is the dimension a
    ``split``/``chunk`` cuts; ``constants`` says it reads a tensor no op made (a mask).
    ``inferred`` are the output dimensions a ``view``/``reshape`` asked as ``-1`` (a split
    there needs no size divided); ``broadcast`` gives, by what made it (``""``: a tensor no
    op made), the output dimensions along which an input is broadcast (size 1 there, or
    fewer dimensions): a split of such a dimension needs no slice of that input.
    ``chunk_sizes`` are a ``split``/``chunk``'s outputs' sizes on the dimension it cuts;
    ``joined_dim`` the dimension a ``cat`` joins on (a split there is not element-wise)."""

    op: str
    function: str
    out_ndim: int
    outputs: int = 1
    moves: tuple[tuple[int, int], ...] = ()
    cut_dim: int | None = None
    constants: bool = False
    inferred: tuple[int, ...] = ()
    broadcast: tuple[tuple[str, tuple[int, ...]], ...] = ()
    chunk_sizes: tuple[int, ...] = ()  # a split/chunk's outputs' sizes on ``cut_dim``
    joined_dim: int | None = None  # the dimension a ``cat`` joins its inputs on


def _blocks_along(tensor: torch.Tensor, dim: int, tp: int) -> bool:
    """Whether ``tensor`` is the block index of its ``dim`` (``tp`` equal blocks) everywhere."""
    size = tensor.shape[dim]
    if size < tp or size % tp:
        return False
    shape = [-1 if axis == dim else 1 for axis in range(tensor.dim())]
    expected = (torch.arange(size) // (size // tp)).reshape(shape).to(tensor.dtype)
    return bool(torch.equal(tensor, expected.expand_as(tensor)))


def _moves(
    func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], tp: int
) -> tuple[tuple[int, int], ...]:
    """Where a block split of each dimension of the first argument lands, found by running
    ``func`` on a tensor holding each element's block index."""
    first = args[0]
    found = []
    for dim in range(first.dim()):
        size = first.shape[dim]
        if size < tp or size % tp:
            continue
        shape = [-1 if axis == dim else 1 for axis in range(first.dim())]
        marker = (torch.arange(size) // (size // tp)).reshape(shape).float().expand(first.shape)
        try:
            out = list(_tensors(func(marker.contiguous(), *args[1:], **kwargs)))
        except Exception:  # a function the marker cannot stand in for: no move known
            continue
        if not out:
            continue
        lands = [
            next((axis for axis in range(o.dim()) if _blocks_along(o, axis, tp)), None) for o in out
        ]
        if lands[0] is not None and all(axis == lands[0] for axis in lands):
            if _func_name(func) in _INDEXING and not _runs_on_slices(
                func, args, kwargs, dim, lands[0], tp
            ):
                continue
            found.append((dim, lands[0]))
    return tuple(found)


#: Reshapes whose arguments are indices, not sizes: where a split survives one, each rank's
#: slice indexed as written must give its slice of the whole result.
_INDEXING = {"__getitem__", "narrow"}


def _func_name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", "")


def _runs_on_slices(
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    dim: int,
    lands: int,
    tp: int,
) -> bool:
    """Whether ``func`` run on each rank's slice of its first argument (``tp`` blocks of
    ``dim``) gives that rank's block (on ``lands``) of its result on the whole: an index
    that leaves the split dimension whole (``x[..., :half]`` over heads) does, one that
    cuts it (``x[:, 2:6]``) does not."""
    try:
        whole = func(*args, **kwargs)
        blocks = whole.chunk(tp, dim=lands)
        parts = args[0].chunk(tp, dim=dim)
        return all(
            torch.equal(func(part, *args[1:], **kwargs), block)
            for part, block in zip(parts, blocks, strict=True)
        )
    except Exception:  # an index that does not apply to a slice
        return False


def _inferred(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[int, ...]:
    """The output dimensions a ``view``/``reshape`` call asks as ``-1``."""
    if name not in ("view", "reshape"):
        return ()
    sizes: Any = kwargs.get("size", kwargs.get("shape", args[1:]))
    if len(sizes) == 1 and isinstance(sizes[0], tuple | list | torch.Size):
        sizes = sizes[0]
    if not all(isinstance(size, int) for size in sizes):
        return ()  # view(dtype), view_as: no sizes
    return tuple(index for index, size in enumerate(sizes) if size == -1)


def _broadcast(
    made: Mapping[int, str], args: Any, kwargs: Mapping[str, Any], out: torch.Tensor
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Each input of an element-wise op, by the op that made it (``""``: none), with the
    output dimensions it is broadcast along (the dimensions every tensor so made shares)."""
    found: dict[str, set[int]] = {}
    for tensor in _tensors((args, kwargs)):
        lead = out.dim() - tensor.dim()
        dims = {
            axis
            for axis in range(out.dim())
            if out.shape[axis] != 1 and (axis < lead or tensor.shape[axis - lead] == 1)
        }
        key = made.get(id(tensor), "")
        found[key] = found[key] & dims if key in found else dims
    return tuple((key, tuple(sorted(dims))) for key, dims in found.items())


def _chunk_sizes(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any], outputs: Sequence[torch.Tensor]
) -> tuple[int, ...]:
    dim = _cut_dim(name, args, kwargs)
    if dim is None:
        return ()
    return tuple(int(out.shape[dim]) for out in outputs if out.dim() > dim)


def _joined_dim(
    name: str, args: Sequence[Any], kwargs: Mapping[str, Any], out: torch.Tensor
) -> int | None:
    if name not in _JOINS:
        return None
    dim = kwargs.get("dim", kwargs.get("axis", args[1] if len(args) > 1 else 0))
    return int(dim) % out.dim() if isinstance(dim, int) and out.dim() else None


def _cut_dim(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> int | None:
    if name not in _CUTS or not isinstance(args[0], torch.Tensor):
        return None
    dim = kwargs.get("dim", args[2] if len(args) > 2 else 0)
    return int(dim) % args[0].dim() if isinstance(dim, int) else None


def _module_kind(module: nn.Module) -> str | None:
    """What a leaf module is to the planner, or ``None`` to record the ops inside it."""
    name = type(module).__name__
    if isinstance(module, nn.Linear):
        return "linear"
    if name == "Conv1D" and getattr(module, "weight", None) is not None:
        return "linear"  # GPT-2's Conv1D: y = x @ W + b, W of (in, out)
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, nn.LayerNorm | nn.RMSNorm) or name.endswith(("RMSNorm", "LayerNorm")):
        return "norm"
    if isinstance(module, nn.Dropout | nn.GELU | nn.ReLU | nn.SiLU | nn.Tanh | nn.Sigmoid):
        return "elementwise"
    if name.endswith(("GELUActivation", "Activation")) and not list(module.children()):
        return "elementwise"
    if isinstance(module, nn.Softmax):
        return "softmax"
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in a (nested) argument or result."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from _tensors(getattr(value, name))


def _nbytes(tensors: Sequence[torch.Tensor]) -> float:
    return float(sum(tensor.numel() * tensor.element_size() for tensor in tensors))


def _caller_source() -> str | None:
    """``file:line`` of the innermost frame of the user's code (outside torch and syncpass)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/torch/" not in name and "/syncpass/" not in name and not name.startswith("<"):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


class _Recorder(TorchFunctionMode):
    """Collects the ops of one forward."""

    def __init__(self, flops_per_s: float | None, tp: int | None = None) -> None:
        super().__init__()
        self.flops_per_s = flops_per_s
        self.tp = tp  # with a group size: note each op's shape facts (OpShape)
        self.shapes: dict[str, OpShape] = {}
        self.ops: list[TensorOp] = []
        self.made: dict[int, str] = {}  # id(tensor) -> op id
        self.kept: list[torch.Tensor] = []  # every tensor seen, so no id() is reused
        self.names: dict[str, int] = {}
        self.inside = 0  # depth of hooked leaf modules being run
        self.started: list[float] = []
        self.scope: list[str] = []  # qualified names of the modules running

    def unique(self, base: str) -> str:
        count = self.names.get(base, 0)
        self.names[base] = count + 1
        return base if count == 0 else f"{base}#{count + 1}"

    def track(self, op_id: str, result: Any) -> list[torch.Tensor]:
        outputs = list(_tensors(result))
        for tensor in outputs:
            self.made[id(tensor)] = op_id
            self.kept.append(tensor)
        return outputs

    def add_input(self, name: str, tensor: torch.Tensor) -> str:
        op_id = self.unique(name)
        self.ops.append(
            TensorOp(
                op_id,
                "input",
                out_bytes=_nbytes([tensor]),
                tokens=tensor.dim() >= 1,
                grad=tensor.is_floating_point(),
            )
        )
        self.track(op_id, tensor)
        return op_id

    def sources(self, args: Any, kwargs: Mapping[str, Any] | None) -> list[str]:
        found = []
        for tensor in _tensors((args, kwargs or {})):
            op_id = self.made.get(id(tensor))
            if op_id is not None and op_id not in found:
                found.append(op_id)
        return found

    def append(
        self,
        op_id: str,
        kind: str,
        sources: Sequence[str],
        outputs: Sequence[torch.Tensor],
        compute: float,
        params: float,
        **extra: Any,
    ) -> None:
        """Record one op: its backward twice its forward when it holds weights (their
        gradient and its input's), once otherwise."""
        self.ops.append(
            TensorOp(
                op_id,
                kind,
                tuple(sources),
                out_bytes=_nbytes(outputs),
                compute_s=compute,
                backward_s=2 * compute if params else compute,
                param_bytes=params,
                tokens=bool(outputs) and outputs[0].dim() >= 2,
                source=_caller_source(),
                **extra,
            )
        )

    def time_of(self, elapsed: float, flops: float | None) -> float:
        if self.flops_per_s is not None and flops is not None:
            return flops / self.flops_per_s
        return elapsed

    # -- functional ops ------------------------------------------------------------

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        start = time.perf_counter()
        result = func(*args, **kwargs)
        elapsed = time.perf_counter() - start
        if self.inside:
            return result
        name = getattr(func, "__name__", "")
        outputs = list(_tensors(result))
        sources = self.sources(args, kwargs)
        if not outputs or not sources or name == "__get__":
            return result
        kind, extra = self.classify(name, args, kwargs, outputs)
        if kind == "add" and sum(isinstance(arg, torch.Tensor) for arg in args) < 2:
            kind = "elementwise"  # x + 1
        if kind in ("norm", "softmax", "reshape", "linear") and len(sources) > 1:
            sources = sources[:1]
        if kind == "attention" and len(sources) not in (1, 3):
            kind, extra = "other", {}
        if kind == "loss":
            sources = sources[:2]
        if kind == "add" and len(sources) < 2:
            kind = "elementwise"
        scope = self.scope[-1] if self.scope else ""
        op_id = self.unique(f"{scope}.{name.strip('_')}" if scope else name.strip("_"))
        compute = self.time_of(elapsed, extra.pop("flops", None))
        params = float(extra.pop("param_bytes", 0.0))
        self.append(op_id, kind, sources, outputs, compute, params, **extra)
        constants = any(id(t) not in self.made for t in _tensors((args, kwargs)))
        broadcast = (
            _broadcast(self.made, args, kwargs, outputs[0])
            if kind == "elementwise" and self.tp is not None
            else ()
        )
        self.track(op_id, result)
        if self.tp is not None:
            self.shapes[op_id] = OpShape(
                op_id,
                name.strip("_"),
                outputs[0].dim(),
                len(outputs),
                _moves(func, args, kwargs, self.tp)
                if kind == "reshape" and isinstance(args[0], torch.Tensor)
                else (),
                _cut_dim(name, args, kwargs),
                constants,
                _inferred(name, args, kwargs) if kind == "reshape" else (),
                broadcast,
                _chunk_sizes(name, args, kwargs, outputs),
                _joined_dim(name, args, kwargs, outputs[0]),
            )
        return result

    def classify(
        self,
        name: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        outputs: Sequence[torch.Tensor],
    ) -> tuple[str, dict[str, Any]]:
        if name == "scaled_dot_product_attention":
            q, k = args[0], args[1]
            return "attention", {
                "heads": int(q.shape[-3]),
                "kv_heads": int(k.shape[-3]),
                "flops": 4.0 * q.shape[:-1].numel() * k.shape[-2] * q.shape[-1],
            }
        if name in _LINEAR:
            weights = [arg for arg in (*args, *kwargs.values()) if isinstance(arg, nn.Parameter)]
            if weights and weights[0].dim() == 2:
                weight = weights[0]
                shape = tuple(weight.shape)
                in_f, out_f = (shape[1], shape[0]) if name == "linear" else shape
                tokens = outputs[0].numel() // out_f
                return "linear", {
                    "in_features": int(in_f),
                    "out_features": int(out_f),
                    "param_bytes": _nbytes(weights),
                    "flops": 2.0 * tokens * in_f * out_f,
                }
            return "other", {}
        if name in _ADD:
            return "add", {}
        if name in _RESHAPE:
            return "reshape", {}
        if name in _ELEMENTWISE:
            return "elementwise", {}
        if name in _NORM:
            return "norm", {}
        if name == "softmax":
            return "softmax", {}
        if name in _LOSS:
            return "loss", {"in_features": int(args[0].shape[-1])}
        return "other", {}

    # -- leaf modules --------------------------------------------------------------

    def before(self, qualified: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any) -> None:
            self.scope.append(qualified)
            if _module_kind(module) is not None:
                self.inside += 1
                self.started.append(time.perf_counter())

        return hook

    def after(self, qualified: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, result: Any) -> None:
            self.scope.pop()
            kind = _module_kind(module)
            if kind is None:
                return
            self.inside -= 1
            elapsed = time.perf_counter() - self.started.pop()
            if self.inside:
                return
            self.record_module(qualified, module, kind, args, result, elapsed)

        return hook

    def record_module(
        self, qualified: str, module: nn.Module, kind: str, args: Any, result: Any, elapsed: float
    ) -> None:
        op_id = self.unique(qualified)
        sources = []
        for position, tensor in enumerate(_tensors(args)):
            known = self.made.get(id(tensor))
            sources.append(
                known if known is not None else self.add_input(f"{op_id}:in{position}", tensor)
            )
        sources = sources[:1]
        outputs = list(_tensors(result))
        params = _nbytes([p for p in module.parameters(recurse=False)])
        extra: dict[str, Any] = {}
        flops: float | None = None
        weight = getattr(module, "weight", None)
        if kind == "linear" and isinstance(weight, torch.Tensor):
            in_f, out_f = (
                (weight.shape[1], weight.shape[0])
                if isinstance(module, nn.Linear)
                else (weight.shape[0], weight.shape[1])
            )
            extra = {"in_features": int(in_f), "out_features": int(out_f)}
            flops = 2.0 * (outputs[0].numel() // out_f) * in_f * out_f
        elif kind == "embedding" and isinstance(module, nn.Embedding):
            extra = {"in_features": module.num_embeddings, "out_features": module.embedding_dim}
        compute = self.time_of(elapsed, flops)
        self.append(op_id, kind, sources, outputs, compute, params, module=qualified, **extra)
        self.track(op_id, result)
        if self.tp is not None:
            self.shapes[op_id] = OpShape(
                op_id, type(module).__name__, outputs[0].dim() if outputs else 0, len(outputs)
            )


def record_tensor_graph(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    loss: Callable[[Any, Any], Any] | None = None,
    targets: Any = None,
    flops_per_s: float | None = None,
) -> TensorGraph:
    """Run ``model(*args, **kwargs)`` once (and ``loss(output, targets)`` when given) and
    return the tensor graph it ran. The forward returns what the model (or the loss)
    returns; the batch is the first dimension of the first tensor argument."""
    graph, _ = _record(model, args, kwargs, loss, targets, flops_per_s, None)
    return graph


def record_tensor_shapes(
    model: nn.Module,
    args: Sequence[Any],
    tp: int,
    *,
    loss: Callable[[Any, Any], Any] | None = None,
    targets: Any = None,
    flops_per_s: float | None = None,
) -> tuple[TensorGraph, dict[str, OpShape]]:
    """:func:`record_tensor_graph`, and each op's :class:`OpShape` for ``tp`` ranks (what
    the tensor-parallel rewrite reads: where a split lands after each reshape)."""
    return _record(model, args, None, loss, targets, flops_per_s, tp)


def _record(
    model: nn.Module,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    loss: Callable[[Any, Any], Any] | None,
    targets: Any,
    flops_per_s: float | None,
    tp: int | None,
) -> tuple[TensorGraph, dict[str, OpShape]]:
    recorder = _Recorder(flops_per_s, tp)
    for position, tensor in enumerate(_tensors((tuple(args), dict(kwargs or {})))):
        recorder.add_input(f"input{position}" if position else "input", tensor)
    handles = []
    for qualified, module in model.named_modules():
        if not qualified:
            continue
        handles.append(module.register_forward_pre_hook(recorder.before(qualified)))
        handles.append(module.register_forward_hook(recorder.after(qualified)))
    try:
        with torch.no_grad(), recorder:
            result = model(*args, **(kwargs or {}))
            if loss is not None:
                for tensor in _tensors(targets):
                    if id(tensor) not in recorder.made:
                        recorder.add_input("targets", tensor)
                result = loss(result, targets)
    finally:
        for handle in handles:
            handle.remove()
    outputs = tuple(
        dict.fromkeys(
            recorder.made[id(tensor)] for tensor in _tensors(result) if id(tensor) in recorder.made
        )
    )
    first = next(_tensors(tuple(args)), None)
    batch = int(first.shape[0]) if first is not None and first.dim() >= 1 else 1
    graph = TensorGraph(
        tuple(recorder.ops),
        outputs,
        batch_size=batch,
        notes=(
            "recorded from one forward: compute is "
            + ("FLOPs at the given rate where known, else " if flops_per_s else "")
            + "this machine's forward wall-clock time, backward estimated as twice the forward "
            "for ops with weights and once for the rest",
        ),
    )
    return graph, recorder.shapes


def record_into_costs(costs: Costs, example: Example, flops_per_s: float | None) -> Costs:
    """``costs`` with the tensor graph of the example's model (``$.tensor``), recorded from
    one forward (the profile's last step of work: it times nothing again). A model the
    recorder cannot follow keeps its pipeline costs, with a note saying why it has no
    tensor graph."""
    try:
        graph = record_tensor_graph(
            example.model,
            example.args,
            loss=example.loss_fn,
            targets=example.target,
            flops_per_s=flops_per_s,
        )
        if graph.batch_size != costs.batch_size:
            graph = dataclasses.replace(graph, batch_size=costs.batch_size)
    except Exception as error:  # any construct the recorder does not follow
        text = " ".join(str(error).split())[:200]
        note = (
            "no tensor graph was recorded (plan --strategy tensor needs one): the recorder "
            f"failed on this model: {type(error).__name__}: {text}"
        )
        return dataclasses.replace(costs, notes=(*costs.notes, note))
    return dataclasses.replace(costs, tensor=graph)

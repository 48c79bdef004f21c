"""What tensor-parallel code that ``syncpass rewrite --strategy tensor`` writes imports.

The public import path for generated code and for users is
``syncpass.backends.torch.tensor_parallel``. It holds Megatron-LM's conjugate autograd
functions, built on ``torch.distributed`` over the default process group (or the group
given to :func:`set_tensor_parallel_group`), and :func:`shard_module`, which slices each
split weight of a built model:

=========================================  ===================  =========================
function                                   forward              backward
=========================================  ===================  =========================
:func:`copy_to_tensor_parallel_region`     identity             all-reduce (Megatron's f)
:func:`reduce_from_tensor_parallel_region` all-reduce           identity (Megatron's g)
:func:`gather_from_tensor_parallel_region` all-gather on a dim  keep this rank's slice
:func:`scatter_to_tensor_parallel_region`  keep this rank's     all-gather on the dim
                                           slice
=========================================  ===================  =========================

The forward all-reduce is not ``torch.distributed.nn.functional.all_reduce``: its
backward all-reduces the gradient again, which multiplies a replicated loss's gradient
by the group's size.

With no process group (or a group of one) every function is the identity and
:func:`tp_size` is 1, so a rewritten model runs alone exactly as the original did.

Each collective a rank issues is counted (:func:`collective_counts`, by
``"forward all-reduce"``, ``"backward all-gather"``, ...), so ``syncpass run --tp``
checks that a step ran the plan's collectives.
"""

from __future__ import annotations

import collections
import contextlib
import fnmatch
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "collective_counts",
    "copy_to_tensor_parallel_region",
    "gather_from_tensor_parallel_region",
    "parse_layout",
    "reduce_from_tensor_parallel_region",
    "reset_collective_counts",
    "running_alone",
    "scatter_to_tensor_parallel_region",
    "set_tensor_parallel_group",
    "shard_module",
    "split_parameters",
    "tp_rank",
    "tp_size",
]

_group: Any = None
_counts: collections.Counter[str] = collections.Counter()
_alone = False  # running_alone(): every function the identity, tp_size() 1


def set_tensor_parallel_group(group: Any) -> None:
    """Use ``group`` (a ``torch.distributed`` process group) instead of the default one."""
    global _group
    _group = group


@contextlib.contextmanager
def running_alone() -> Iterator[None]:
    """Within it, the model runs unsplit on this rank: ``tp_size()`` is 1 and every
    collective the identity (``syncpass run --verify``'s reference)."""
    global _alone
    was, _alone = _alone, True
    try:
        yield
    finally:
        _alone = was


def tp_size() -> int:
    """The ranks of the tensor-parallel group; 1 when no process group is initialised."""
    if _alone or not dist.is_available() or not dist.is_initialized():
        return 1
    return int(dist.get_world_size(_group))


def tp_rank() -> int:
    """This rank's index in the tensor-parallel group; 0 when running alone."""
    if _alone or not dist.is_available() or not dist.is_initialized():
        return 0
    return int(dist.get_rank(_group))


def collective_counts() -> dict[str, int]:
    """The collectives this process issued since the last reset, by direction and kind."""
    return dict(_counts)


def reset_collective_counts() -> None:
    """Start counting collectives afresh."""
    _counts.clear()


def _all_reduce(tensor: torch.Tensor, direction: str) -> torch.Tensor:
    _counts[f"{direction} all-reduce"] += 1
    tensor = tensor.contiguous().clone()
    dist.all_reduce(tensor, group=_group)
    return tensor


def _all_gather(tensor: torch.Tensor, dim: int, direction: str) -> torch.Tensor:
    _counts[f"{direction} all-gather"] += 1
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(tp_size())]
    dist.all_gather(parts, tensor, group=_group)
    return torch.cat(parts, dim=dim)


def _own_slice(tensor: torch.Tensor, dim: int) -> torch.Tensor:
    size = tp_size()
    if tensor.shape[dim] % size:
        raise ValueError(
            f"dimension {dim} of a {tuple(tensor.shape)} tensor does not split over {size} ranks"
        )
    return tensor.chunk(size, dim=dim)[tp_rank()].contiguous()


class _CopyToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _all_reduce(grad, "backward")


class _ReduceFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        return _all_reduce(tensor, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _GatherFromRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim = dim
        return _all_gather(tensor, dim, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _own_slice(grad, ctx.dim), None


class _ScatterToRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        ctx.dim = dim
        return _own_slice(tensor, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather(grad, ctx.dim, "backward"), None


def copy_to_tensor_parallel_region(tensor: torch.Tensor) -> torch.Tensor:
    """Identity forward; backward, all-reduce the gradient: the input of column-split
    layers, whose gradients each rank computes only in part."""
    if tp_size() == 1:
        return tensor
    result: torch.Tensor = _CopyToRegion.apply(tensor)  # type: ignore[no-untyped-call]
    return result


def reduce_from_tensor_parallel_region(tensor: torch.Tensor) -> torch.Tensor:
    """All-reduce forward (the partial sums of a row-split layer); identity backward."""
    if tp_size() == 1:
        return tensor
    result: torch.Tensor = _ReduceFromRegion.apply(tensor)  # type: ignore[no-untyped-call]
    return result


def gather_from_tensor_parallel_region(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """All-gather the ranks' slices on ``dim`` forward; backward, keep this rank's slice."""
    if tp_size() == 1:
        return tensor
    result: torch.Tensor = _GatherFromRegion.apply(tensor, dim % tensor.dim())  # type: ignore[no-untyped-call]
    return result


def scatter_to_tensor_parallel_region(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Keep this rank's slice on ``dim`` forward; backward, all-gather the gradient."""
    if tp_size() == 1:
        return tensor
    result: torch.Tensor = _ScatterToRegion.apply(tensor, dim % tensor.dim())  # type: ignore[no-untyped-call]
    return result


# --- weights ----------------------------------------------------------------------------

#: How a split module's weight is sliced: ``column`` keeps ``1/world`` of the output
#: features (``nn.Linear`` weight rows and bias), ``row`` of the input features (weight
#: columns; the bias is a parameter on rank 0 only, so the all-reduce adds it once: the
#: other ranks hold zeros as an untrained buffer, for forwards that add it unconditionally,
#: Hugging Face's ``Conv1D``'s ``addmm``), ``width`` an
#: embedding's columns. ``column:K`` is a fused weight of ``K`` equal chunks (q, k, v in
#: one linear), each sliced; ``column:A+B+C`` one of chunks of those sizes (grouped-query
#: attention's q, k, v). A trailing ``transposed`` says the weight is stored
#: ``(in, out)`` (Hugging Face's ``Conv1D``, GPT-2's linear): its other dimension is sliced.
LAYOUTS = ("column", "row", "width")
TRANSPOSED = " transposed"


#: A fused weight's chunks: how many equal ones, or their sizes.
Chunks = int | tuple[int, ...]


def parse_layout(text: str) -> tuple[str, Chunks, bool]:
    """``"column:3"`` -> ``("column", 3, False)``; ``"column:32+16+16"`` -> ``("column",
    (32, 16, 16), False)``; ``"row transposed"`` -> ``("row", 1, True)``."""
    transposed = text.endswith(TRANSPOSED)
    kind, _, chunks = text.removesuffix(TRANSPOSED).partition(":")
    sizes = chunks.split("+") if chunks else ["1"]
    if kind not in LAYOUTS or not all(size.isdigit() and int(size) > 0 for size in sizes):
        raise ValueError(
            f"unknown tensor-parallel layout {text!r}: use one of {', '.join(LAYOUTS)} "
            f"(column:K for K equal fused chunks, column:A+B+C for chunks of those sizes; "
            f"'{TRANSPOSED.strip()}' after it for a weight stored (in, out))"
        )
    if len(sizes) > 1:
        return kind, tuple(int(size) for size in sizes), transposed
    return kind, int(sizes[0]), transposed


def _chunked(tensor: torch.Tensor, chunks: Chunks, dim: int) -> tuple[torch.Tensor, ...]:
    if isinstance(chunks, tuple):
        return tuple(torch.split(tensor, list(chunks), dim=dim))
    return tuple(tensor.chunk(chunks, dim=dim))


def _slice(tensor: torch.Tensor, dim: int, chunks: Chunks, rank: int, world: int) -> torch.Tensor:
    """This rank's part of ``tensor`` on ``dim``: of each of ``chunks`` (equal ones, or of
    the sizes given), its ``1/world`` slice, concatenated."""
    parts = _chunked(tensor, chunks, dim)
    for part in parts:
        if part.shape[dim] % world:
            raise ValueError(
                f"a chunk of {part.shape[dim]} on dimension {dim} does not split over {world} ranks"
            )
    return torch.cat([part.chunk(world, dim=dim)[rank] for part in parts], dim=dim).contiguous()


def split_parameters(
    layouts: Mapping[str, str], model: nn.Module
) -> dict[str, tuple[str, int, Chunks]]:
    """Each split parameter of ``model`` by name: ``(layout, dim, chunks)``, from
    ``layouts`` (module names or ``fnmatch`` patterns such as ``blocks.*.mlp.fc``)."""
    found: dict[str, tuple[str, int, Chunks]] = {}
    for name, module in model.named_modules():
        layout = next(
            (value for key, value in layouts.items() if fnmatch.fnmatchcase(name, key)), None
        )
        if layout is None:
            continue
        kind, chunks, transposed = parse_layout(layout)
        for pname, _ in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            weight = pname == "weight"
            if kind == "column":
                found[full] = (kind, 1 if transposed and weight else 0, chunks)
            elif kind == "width" or weight:
                found[full] = (kind, 0 if transposed and kind == "row" else 1, chunks)
            else:  # a row-split layer's bias: whole, on rank 0 only
                found[full] = (kind, -1, chunks)
    return found


def shard_module(
    model: nn.Module, layouts: Mapping[str, str], rank: int | None = None, world: int | None = None
) -> nn.Module:
    """Slice, in place, each weight ``layouts`` splits to this rank's part, and return
    ``model``. Call it after building the model or loading a checkpoint, before making the
    optimizer; ``rank`` and ``world`` default to the tensor-parallel group's.

    ``layouts`` maps module names (or ``fnmatch`` patterns) to ``column``, ``column:K``,
    ``row`` or ``width`` (see :data:`LAYOUTS`); the rewritten file defines it as
    ``TENSOR_PARALLEL_LAYOUT``. A column-split layer's output-features attribute
    (:data:`OUTPUT_FEATURES`) is divided with its weight.
    """
    rank = tp_rank() if rank is None else rank
    world = tp_size() if world is None else world
    if world == 1:
        return model
    split = split_parameters(layouts, model)
    modules = dict(model.named_modules())
    for full, (kind, dim, chunks) in split.items():
        owner_name, _, pname = full.rpartition(".")
        owner = modules[owner_name]
        parameter = getattr(owner, pname)
        if dim < 0:
            if rank != 0:  # zeros, not trained: a forward that adds its bias (Conv1D's addmm)
                del owner._parameters[pname]
                owner.register_buffer(pname, torch.zeros_like(parameter.detach()), False)
            continue
        with torch.no_grad():
            local = _slice(parameter.detach(), dim, chunks, rank, world)
        setattr(owner, pname, nn.Parameter(local, requires_grad=parameter.requires_grad))
        if kind == "column" and pname == "weight":
            _output_features_divided(owner, parameter.shape[dim], world)
    return model


#: Attributes that hold a layer's output features: ``nn.Linear``'s, and Hugging Face's
#: ``Conv1D``'s ``nf``, which its forward reshapes its output with.
OUTPUT_FEATURES = ("out_features", "nf")


def _output_features_divided(module: nn.Module, whole: int, world: int) -> None:
    """A column-split layer's attributes of its output features, as its slice has them."""
    for name in OUTPUT_FEATURES:
        if getattr(module, name, None) == whole:
            setattr(module, name, whole // world)


def gather_parameter_grad(grad: torch.Tensor, dim: int, chunks: Chunks, world: int) -> torch.Tensor:
    """The whole gradient of a split parameter from every rank's part (every rank calls it):
    the inverse of :func:`shard_module`'s slicing."""
    local = grad.contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=_group)
    local_chunks = tuple(size // world for size in chunks) if isinstance(chunks, tuple) else chunks
    pieces = [_chunked(part, local_chunks, dim) for part in parts]
    count = len(chunks) if isinstance(chunks, tuple) else chunks
    return torch.cat(
        [torch.cat([pieces[r][c] for r in range(world)], dim=dim) for c in range(count)], dim=dim
    )

"""Shape rules that operators, layers and tensor functions share: broadcasting,
sliding windows, flattening and reshaping."""

from __future__ import annotations

from collections.abc import Sequence

from syncpass.backends.torch.estimate.values import (
    Tensor,
    Unsized,
    as_dim,
    as_int,
    as_ints,
    numel,
    shape_text,
)


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of an elementwise result, by torch's broadcasting rules."""
    rank = max((len(shape) for shape in shapes), default=0)
    result = []
    for position in range(rank):
        sizes = {
            shape[len(shape) - rank + position]
            for shape in shapes
            if len(shape) - rank + position >= 0
        }
        sizes.discard(1)
        if len(sizes) > 1:
            shown = " and ".join(shape_text(shape) for shape in shapes)
            raise Unsized(f"cannot broadcast shapes {shown} together")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def window_output(
    size: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool
) -> int:
    """Positions of a sliding window (a convolution or a pool) along one dimension."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + padding:
        out -= 1  # the last window must start inside the input (torch's rule)
    if out < 1:
        raise Unsized(f"a window of {kernel} does not fit an input of size {size}")
    return out


def pooled(
    spatial: tuple[int, ...],
    kernel: object,
    stride: object,
    padding: object,
    dilation: object,
    ceil: bool,
) -> tuple[int, ...]:
    """The spatial sizes after pooling ``spatial``; ``stride`` ``None`` is the kernel size."""
    rank = len(spatial)
    kernels = as_ints(kernel, rank, "kernel_size")
    strides = kernels if stride is None else as_ints(stride, rank, "stride")
    paddings = as_ints(padding, rank, "padding")
    dilations = as_ints(dilation, rank, "dilation")
    return tuple(
        window_output(size, k, s, p, d, ceil)
        for size, k, s, p, d in zip(spatial, kernels, strides, paddings, dilations, strict=True)
    )


def flatten(x: Tensor, start: object, end: object) -> Tensor:
    """``x`` with its dimensions ``start`` to ``end`` (inclusive) merged into one."""
    shape = x.shape
    if not shape:
        return Tensor((1,), x.kind)
    first, last = as_dim(start, len(shape)), as_dim(end, len(shape))
    if first > last:
        raise Unsized("flattens with start_dim after end_dim")
    merged = numel(shape[first : last + 1])
    return Tensor((*shape[:first], merged, *shape[last + 1 :]), x.kind)


def as_sizes(args: Sequence[object]) -> list[object]:
    """``view(2, 3)`` and ``view((2, 3))`` alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return list(args[0])
    return list(args)


def reshape(x: Tensor, sizes: list[object]) -> Tensor:
    """``x`` viewed as ``sizes``, one of which may be ``-1``."""
    dims = [as_int(size, "a size") for size in sizes]
    total = numel(x.shape)
    if dims.count(-1) > 1:
        raise Unsized("has more than one -1 size")
    if -1 in dims:
        known = numel([dim for dim in dims if dim != -1])
        if known == 0 or total % known:
            raise Unsized(f"cannot reshape {shape_text(x.shape)} to {shape_text(dims)}")
        dims[dims.index(-1)] = total // known
    if numel(dims) != total:
        raise Unsized(f"reshapes {shape_text(x.shape)} ({total} elements) to {shape_text(dims)}")
    return Tensor(tuple(dims), x.kind)


def unflatten(x: Tensor, dim: object, sizes: object) -> Tensor:
    """``x`` with its dimension ``dim`` split into ``sizes`` (one of which may be ``-1``)."""
    at = as_dim(dim, len(x.shape))
    part = reshape(Tensor(x.shape[at : at + 1]), as_sizes([sizes]))
    return Tensor((*x.shape[:at], *part.shape, *x.shape[at + 1 :]), x.kind)

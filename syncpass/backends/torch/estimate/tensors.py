"""Tensor functions and methods (``torch.*``, ``torch.nn.functional.*``, ``Tensor.*``),
looked up by name in a table, and what Python's operators, indexing and attributes do to
a tensor.

A tensor function takes the FLOP counter of the op being sized, the call's
arguments (``args[0]`` is the tensor for a method) and keywords; it gives the
output (a :class:`~syncpass.backends.torch.estimate.values.Tensor`, a number
or a tuple of them) and adds its FLOPs to the counter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from syncpass.backends.torch.estimate.flops import (
    ELEMENTWISE_BACKWARD,
    MATMUL_BACKWARD,
    NORMALISE_FLOPS,
    WEIGHT_SHARE,
    Counter,
)
from syncpass.backends.torch.estimate.layers import LAYERS, REQUIRED, Signature, bind, pool, resize
from syncpass.backends.torch.estimate.shapes import (
    as_sizes,
    broadcast,
    flatten,
    reshape,
    unflatten,
)
from syncpass.backends.torch.estimate.values import (
    Layer,
    Library,
    Method,
    Opaque,
    Tensor,
    Unsized,
    argument,
    as_dim,
    as_int,
    as_number,
    as_tensor,
    describe,
    numel,
    shape_text,
)

#: A tensor function: the FLOP counter of the op, the call's arguments and keywords.
TensorHandler = Callable[[Counter, list[object], dict[str, object]], object]
#: The tensor functions the estimate knows, by name (``relu`` is ``torch.relu``,
#: ``F.relu`` and ``x.relu()`` alike).
_FUNCTIONS: dict[str, TensorHandler] = {}


def _handles(*names: str) -> Callable[[TensorHandler], TensorHandler]:
    """Register the decorated function as the tensor function of each of ``names``."""

    def register(handler: TensorHandler) -> TensorHandler:
        for name in names:
            _FUNCTIONS[name] = handler
        return handler

    return register


def call_tensor_function(
    name: str, args: list[object], kwargs: dict[str, object], qualified: str, counter: Counter
) -> object:
    """``torch.<name>``, ``torch.nn.functional.<name>`` or the tensor method ``name``
    (``args[0]`` is then the tensor)."""
    handler = _FUNCTIONS.get(name)
    if handler is None:
        raise Unsized(f"calls {qualified}, whose output shape syncpass does not know")
    try:
        return handler(counter, args, kwargs)
    except Unsized as error:
        raise Unsized(f"calls {qualified}, which {error.reason}") from None
    except (IndexError, KeyError):
        raise Unsized(f"calls {qualified} with arguments syncpass cannot read") from None


# --- shared rules -----------------------------------------------------------------------


def matmul(a: Tensor, b: Tensor, counter: Counter) -> Tensor:
    """``a @ b``, as ``torch.matmul`` broadcasts it."""
    left, right = a.shape, b.shape
    if not left or not right:
        raise Unsized("multiplies a scalar tensor as a matrix")
    lhs = (1, *left) if len(left) == 1 else left
    rhs = (*right, 1) if len(right) == 1 else right
    if lhs[-1] != rhs[-2]:
        raise Unsized(f"multiplies {shape_text(left)} by {shape_text(right)}: inner sizes differ")
    batch = broadcast(lhs[:-2], rhs[:-2])
    counter.add(2 * numel(batch) * lhs[-2] * lhs[-1] * rhs[-1], MATMUL_BACKWARD)
    shape = (*batch, lhs[-2], rhs[-1])
    if len(left) == 1:
        shape = (*batch, rhs[-1])
    if len(right) == 1:
        shape = shape[:-1]
    return Tensor(shape, a.kind)


def elementwise(
    args: list[object], kwargs: dict[str, object], flops: int, backward: float, counter: Counter
) -> Tensor:
    """An elementwise function of the tensors among ``args``: ``flops`` per output element."""
    tensors = [arg for arg in (*args, *kwargs.values()) if isinstance(arg, Tensor)]
    if not tensors:
        raise Unsized("gets no tensor")
    shape = broadcast(*(tensor.shape for tensor in tensors))
    counter.add(flops * numel(shape), backward)
    return Tensor(shape, tensors[0].kind)


def _dtype_kind(value: object, default: str) -> str:
    if isinstance(value, Library):
        short = value.name.rsplit(".", 1)[-1]
        if short in _DTYPES:
            return _DTYPES[short]
    return default


_DTYPES = {
    "float": "float",
    "float16": "float",
    "float32": "float",
    "float64": "float",
    "bfloat16": "float",
    "half": "float",
    "double": "float",
    "long": "int",
    "int": "int",
    "int64": "int",
    "int32": "int",
    "int16": "int",
    "int8": "int",
    "uint8": "int",
    "bool": "bool",
}


# --- Python's operators, indexing and attributes on tensors -----------------------------


def apply_operator(name: str, left: object, right: object, counter: Counter) -> Tensor:
    """``left <name> right`` where either side is a tensor (``name`` is libcst's: ``Add``)."""
    if name == "MatrixMultiply":
        return matmul(as_tensor(left, "@"), as_tensor(right, "@"), counter)
    shapes = [side.shape for side in (left, right) if isinstance(side, Tensor)]
    for side in (left, right):
        if not isinstance(side, (Tensor, int, float, bool)):
            raise Unsized(f"combines a tensor with {describe(side)}")
    shape = broadcast(*shapes)
    counter.add(numel(shape), ELEMENTWISE_BACKWARD)
    return Tensor(shape, _result_kind(left, right, name))


def _result_kind(left: object, right: object, name: str) -> str:
    kinds = {
        side.kind if isinstance(side, Tensor) else "float" if isinstance(side, float) else ""
        for side in (left, right)
    }
    if name == "Divide" or "float" in kinds:
        return "float"
    return "int" if "int" in kinds else "bool"


def apply_unary(value: Tensor, counter: Counter) -> Tensor:
    """``-x``, ``+x`` or ``~x`` of a tensor."""
    counter.add(numel(value.shape), ELEMENTWISE_BACKWARD)
    return Tensor(value.shape, value.kind)


def compare_tensors(left: object, right: object, counter: Counter) -> Tensor:
    """``left < right`` and the like where either side is a tensor: a boolean tensor."""
    shapes = [side.shape for side in (left, right) if isinstance(side, Tensor)]
    shape = broadcast(*shapes)
    counter.add(numel(shape), 0.0)
    return Tensor(shape, "bool")


def index_tensor(tensor: Tensor, index: object) -> Tensor:
    """``tensor[index]``: ``index`` holds ints, slices, ``None``, ``...`` and lists of ints."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(item is Ellipsis for item in items) > 1:
        raise Unsized("indexes with more than one ...")
    consuming = [item for item in items if item is not None and item is not Ellipsis]
    if len(consuming) > len(tensor.shape):
        raise Unsized(f"indexes a tensor of rank {len(tensor.shape)} with {len(consuming)}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (len(tensor.shape) - len(consuming))
    shape: list[int] = []
    dim = 0
    for item in items:
        if item is None:
            shape.append(1)
            continue
        size = tensor.shape[dim]
        dim += 1
        if isinstance(item, slice):
            shape.append(len(range(*item.indices(size))))
        elif isinstance(item, list) and all(isinstance(i, int) for i in item):
            shape.append(len(item))  # x[:, [-1], :] keeps the dimension
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -size <= item < size:
                raise Unsized(f"index {item} is out of range of a dimension of {size}")
        else:
            raise Unsized(f"indexes a tensor with {describe(item)}")
    shape.extend(tensor.shape[dim:])
    return Tensor(tuple(shape), tensor.kind)


def tensor_attribute(value: Tensor, name: str) -> object:
    """``x.<name>``: its shape, rank or transpose; a method to call for any other name."""
    if name == "shape":
        return value.shape
    if name == "ndim":
        return len(value.shape)
    if name in ("T", "mT"):
        shape = value.shape
        if name == "T":
            return Tensor(tuple(reversed(shape)), value.kind)
        return Tensor((*shape[:-2], shape[-1], shape[-2]), value.kind)
    if name in ("dtype", "device", "is_cuda", "requires_grad"):
        return Opaque(f"a tensor's {name}")
    return Method(value, name)


# --- elementwise functions and normalisations -------------------------------------------


@_handles(
    "relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs",
    "neg", "sin", "cos", "dropout", "leaky_relu", "elu", "softplus", "mish", "hardswish",
    "hardtanh", "relu6", "erf", "clamp", "clip", "square", "reciprocal", "sign", "masked_fill",
    "tril", "triu", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "where", "lerp",
    "masked_fill_", "add_", "mul_", "clamp_", "dropout1d", "dropout2d", "floor", "ceil", "round",
)  # fmt: skip
def _elementwise(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    return elementwise(args, kwargs, 1, ELEMENTWISE_BACKWARD, counter)


@_handles(
    "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "rms_norm",
    "instance_norm", "normalize",
)  # fmt: skip
def _normalising(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0] if args else kwargs.get("input"), "the input")
    counter.add(NORMALISE_FLOPS * numel(x.shape), MATMUL_BACKWARD)
    return Tensor(x.shape, x.kind)


# --- conversions ------------------------------------------------------------------------


@_handles("contiguous", "detach", "to", "requires_grad_", "cpu", "cuda", "type_as")
def _same(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the tensor")
    if len(args) > 1 and isinstance(args[1], Tensor):  # x.to(other) / x.type_as(other)
        return Tensor(x.shape, args[1].kind)
    wanted = _dtype_kind(kwargs.get("dtype", args[1] if len(args) > 1 else None), x.kind)
    return x if wanted == x.kind else Tensor(x.shape, wanted)


def _conversion(kind: str | None) -> TensorHandler:
    def convert(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        x = as_tensor(args[0], "the tensor")
        return Tensor(x.shape, kind or x.kind)

    return convert


for _name, _kind in (
    ("clone", None),
    ("float", "float"),
    ("half", "float"),
    ("double", "float"),
    ("bfloat16", "float"),
    ("long", "int"),
    ("int", "int"),
    ("bool", "bool"),
):
    _FUNCTIONS[_name] = _conversion(_kind)


# --- shapes and views -------------------------------------------------------------------


@_handles("view", "reshape")
def _view(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the tensor")
    sizes = as_sizes(args[1:]) if len(args) > 1 else as_sizes([kwargs.get("shape", ())])
    return reshape(x, sizes)


@_handles("view_as", "reshape_as", "expand_as")
def _like_other(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x, other = as_tensor(args[0], "the tensor"), as_tensor(args[1], "the other tensor")
    return Tensor(other.shape, x.kind)


@_handles("flatten")
def _flatten_call(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    return flatten(
        x, argument(args, kwargs, 1, "start_dim", 0), argument(args, kwargs, 2, "end_dim", -1)
    )


@_handles("unflatten")
def _unflatten(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    return unflatten(
        x, argument(args, kwargs, 1, "dim", None), argument(args, kwargs, 2, "sizes", ())
    )


@_handles("transpose", "swapaxes", "swapdims")
def _transpose(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    shape = list(x.shape)
    first = as_dim(argument(args, kwargs, 1, "dim0", None), len(shape))
    second = as_dim(argument(args, kwargs, 2, "dim1", None), len(shape))
    shape[first], shape[second] = shape[second], shape[first]
    return Tensor(tuple(shape), x.kind)


@_handles("t")
def _t(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    return Tensor(tuple(reversed(x.shape)), x.kind)


@_handles("permute")
def _permute(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    dims = [as_dim(dim, len(x.shape)) for dim in as_sizes(args[1:] or [kwargs.get("dims", ())])]
    if sorted(dims) != list(range(len(x.shape))):
        raise Unsized(f"permutes {shape_text(x.shape)} by {dims}")
    return Tensor(tuple(x.shape[dim] for dim in dims), x.kind)


@_handles("unsqueeze")
def _unsqueeze(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    dim = as_dim(argument(args, kwargs, 1, "dim", None), len(x.shape) + 1)
    return Tensor((*x.shape[:dim], 1, *x.shape[dim:]), x.kind)


@_handles("squeeze")
def _squeeze(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    dim = argument(args, kwargs, 1, "dim", None)
    if dim is None:
        return Tensor(tuple(size for size in x.shape if size != 1), x.kind)
    at = as_dim(dim, len(x.shape))
    if x.shape[at] != 1:
        return x
    return Tensor((*x.shape[:at], *x.shape[at + 1 :]), x.kind)


@_handles("expand")
def _expand(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    sizes = [as_int(size, "a size") for size in as_sizes(args[1:])]
    padded = (1,) * (len(sizes) - len(x.shape)) + x.shape
    if len(padded) != len(sizes):
        raise Unsized(f"gets {len(sizes)} sizes for a tensor of rank {len(x.shape)}")
    shape = tuple(have if size == -1 else size for have, size in zip(padded, sizes, strict=True))
    return Tensor(shape, x.kind)


@_handles("repeat")
def _repeat(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    times = [as_int(size, "a count") for size in as_sizes(args[1:])]
    padded = (1,) * (len(times) - len(x.shape)) + x.shape
    if len(padded) != len(times):
        raise Unsized(f"gets {len(times)} counts for a tensor of rank {len(x.shape)}")
    return Tensor(tuple(have * count for have, count in zip(padded, times, strict=True)), x.kind)


@_handles("size")
def _size(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the tensor")
    dim = argument(args, kwargs, 1, "dim", None)
    return x.shape if dim is None else x.shape[as_dim(dim, len(x.shape))]


@_handles("dim", "ndimension")
def _rank(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    return len(as_tensor(args[0], "the tensor").shape)


@_handles("numel")
def _count(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    return numel(as_tensor(args[0], "the tensor").shape)


# --- reductions, splits and joins -------------------------------------------------------


def _reduce_by(name: str) -> TensorHandler:
    def reduce(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        x = as_tensor(args[0], "the input")
        if len(args) > 1 and isinstance(args[1], Tensor):  # torch.max(a, b): elementwise
            return elementwise(args, kwargs, 1, ELEMENTWISE_BACKWARD, counter)
        dim = argument(args, kwargs, 1, "dim", None)
        keep = bool(argument(args, kwargs, 2, "keepdim", False))
        counter.add(numel(x.shape), ELEMENTWISE_BACKWARD)
        shape: tuple[int, ...] = ()
        if dim is not None:
            listed = dim if isinstance(dim, (tuple, list)) else [dim]
            dims = {as_dim(item, len(x.shape)) for item in listed}
            shape = tuple(
                1 if position in dims else size
                for position, size in enumerate(x.shape)
                if keep or position not in dims
            )
        if name in ("argmax", "argmin"):
            return Tensor(shape, "int")
        if name in ("max", "min") and dim is not None:
            return (Tensor(shape, x.kind), Tensor(shape, "int"))  # values, indices
        return Tensor(shape, x.kind)

    return reduce


for _name in (
    "mean", "sum", "amax", "amin", "std", "var", "norm", "logsumexp", "prod", "argmax",
    "argmin", "max", "min",
):  # fmt: skip
    _FUNCTIONS[_name] = _reduce_by(_name)


def _split_by(kind: str) -> TensorHandler:
    def split(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        x = as_tensor(args[0], "the input")
        if kind == "unbind":
            dim = as_dim(argument(args, kwargs, 1, "dim", 0), len(x.shape))
            rest = (*x.shape[:dim], *x.shape[dim + 1 :])
            return tuple(Tensor(rest, x.kind) for _ in range(x.shape[dim]))
        how = argument(
            args, kwargs, 1, "split_size_or_sections" if kind == "split" else "chunks", None
        )
        dim = as_dim(argument(args, kwargs, 2, "dim", 0), len(x.shape))
        size = x.shape[dim]
        if isinstance(how, (list, tuple)):
            pieces = [as_int(piece, "a section") for piece in how]
            if sum(pieces) != size:
                raise Unsized(f"splits a dimension of {size} into {pieces}")
        else:
            count = as_int(how, "the split size")
            if count < 1:
                raise Unsized("splits into pieces of size 0")
            step = count if kind == "split" else -(-size // count)
            pieces = [min(step, size - start) for start in range(0, size, step)]
        return tuple(
            Tensor((*x.shape[:dim], piece, *x.shape[dim + 1 :]), x.kind) for piece in pieces
        )

    return split


for _name in ("split", "chunk", "unbind"):
    _FUNCTIONS[_name] = _split_by(_name)


def _join_by(kind: str) -> TensorHandler:
    def join(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        parts = argument(args, kwargs, 0, "tensors", None)
        if not isinstance(parts, (list, tuple)) or not parts:
            raise Unsized(f"gets {describe(parts)} instead of a list of tensors")
        tensors = [as_tensor(part, "each piece") for part in parts]
        first = tensors[0].shape
        if kind == "stack":
            dim = as_dim(argument(args, kwargs, 1, "dim", 0), len(first) + 1)
            if any(tensor.shape != first for tensor in tensors):
                raise Unsized("stacks tensors of different shapes")
            return Tensor((*first[:dim], len(tensors), *first[dim:]), tensors[0].kind)
        dim = as_dim(argument(args, kwargs, 1, "dim", 0), len(first))
        for tensor in tensors:
            if len(tensor.shape) != len(first) or any(
                a != b for i, (a, b) in enumerate(zip(tensor.shape, first, strict=True)) if i != dim
            ):
                shown = ", ".join(shape_text(t.shape) for t in tensors)
                raise Unsized(f"joins tensors whose shapes differ off dim {dim}: {shown}")
        total = sum(tensor.shape[dim] for tensor in tensors)
        return Tensor((*first[:dim], total, *first[dim + 1 :]), tensors[0].kind)

    return join


for _name in ("cat", "concat", "concatenate", "stack"):
    _FUNCTIONS[_name] = _join_by(_name)


# --- matrix products, embedding and attention -------------------------------------------


@_handles("matmul", "mm", "bmm")
def _matmul(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    return matmul(as_tensor(args[0], "the left operand"), as_tensor(args[1], "the right"), counter)


@_handles("linear")
def _linear(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    weight = as_tensor(argument(args, kwargs, 1, "weight", None), "the weight")
    if len(weight.shape) != 2 or not x.shape or x.shape[-1] != weight.shape[1]:
        raise Unsized(f"applies a weight {shape_text(weight.shape)} to {shape_text(x.shape)}")
    counter.add(2 * numel(x.shape) * weight.shape[0], MATMUL_BACKWARD, WEIGHT_SHARE)
    return Tensor((*x.shape[:-1], weight.shape[0]))


@_handles("embedding")
def _embedding(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    ids = as_tensor(args[0], "the ids")
    weight = as_tensor(argument(args, kwargs, 1, "weight", None), "the weight")
    return Tensor((*ids.shape, weight.shape[-1]))


@_handles("scaled_dot_product_attention")
def _attention(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    query = as_tensor(argument(args, kwargs, 0, "query", None), "the query")
    key = as_tensor(argument(args, kwargs, 1, "key", None), "the key")
    value = as_tensor(argument(args, kwargs, 2, "value", None), "the value")
    if len(query.shape) < 2 or len(key.shape) < 2 or len(value.shape) < 2:
        raise Unsized("gets a query, key or value of rank below 2")
    rows = numel(query.shape[:-1])
    source = key.shape[-2]
    # Q K^T and the weighted sum of V, as torch.utils.flop_counter counts attention.
    counter.add(2 * rows * source * (query.shape[-1] + value.shape[-1]), MATMUL_BACKWARD)
    counter.add(NORMALISE_FLOPS * rows * source, MATMUL_BACKWARD)
    return Tensor((*query.shape[:-1], value.shape[-1]), query.kind)


# --- pooling, resizing and padding ------------------------------------------------------


#: ``F.max_pool1d/2d``: the functional form orders ``ceil_mode`` before ``return_indices``.
_MAX_POOL_FUNCTION: Signature = (
    ("kernel_size", REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("dilation", 1),
    ("ceil_mode", False),
    ("return_indices", False),
)


def _pool_by(name: str) -> TensorHandler:
    kind = ("MaxPool" if name.startswith("max") else "AvgPool") + name[-2:]
    signature = _MAX_POOL_FUNCTION if kind.startswith("MaxPool") else LAYERS[kind].signature

    def apply(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        layer_args = bind(signature, args[1:], kwargs, name)
        return pool(Layer(kind, layer_args, name), as_tensor(args[0], "the input"), counter)

    return apply


def _adaptive_pool(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    size = argument(args, kwargs, 1, "output_size", None)
    layer = Layer("AdaptiveAvgPool2d", {"output_size": size}, "adaptive_avg_pool2d")
    return pool(layer, as_tensor(args[0], "the input"), counter)


for _name in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
    _FUNCTIONS[_name] = _pool_by(_name)
_FUNCTIONS["adaptive_avg_pool2d"] = _adaptive_pool
_FUNCTIONS["adaptive_max_pool2d"] = _adaptive_pool


@_handles("interpolate", "upsample")
def _interpolate(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    return resize(
        x,
        argument(args, kwargs, 1, "size", None),
        argument(args, kwargs, 2, "scale_factor", None),
        counter,
    )


@_handles("pad")
def _pad(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    pads = [as_int(p, "a padding") for p in as_sizes([argument(args, kwargs, 1, "pad", ())])]
    shape = list(x.shape)
    for position in range(len(pads) // 2):
        shape[-1 - position] += pads[2 * position] + pads[2 * position + 1]
    return Tensor(tuple(shape), x.kind)


# --- losses -----------------------------------------------------------------------------


@_handles(
    "cross_entropy", "mse_loss", "l1_loss", "nll_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "smooth_l1_loss", "kl_div",
)  # fmt: skip
def _loss(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the input")
    counter.add(NORMALISE_FLOPS * numel(x.shape), ELEMENTWISE_BACKWARD)
    reduction = kwargs.get("reduction", "mean")
    return Tensor(x.shape[:1] if reduction == "none" else ())


# --- new tensors ------------------------------------------------------------------------


@_handles("arange")
def _arange(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    bounds = [as_number(arg) for arg in args[:3]]
    if not bounds and "end" in kwargs:
        bounds = [as_number(kwargs["end"])]
    start, end, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds, 1.0)[:3]
    if step == 0:
        raise Unsized("steps by 0")
    count = max(0, math.ceil((end - start) / step))
    integral = all(isinstance(arg, int) for arg in args[:3])
    kind = _dtype_kind(kwargs.get("dtype"), "int" if integral else "float")
    return Tensor((count,), kind)


def _creator(default_kind: str) -> TensorHandler:
    def create(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
        sizes = as_sizes(args) if args else as_sizes([kwargs.get("size", ())])
        shape = tuple(as_int(size, "a size") for size in sizes)
        return Tensor(shape, _dtype_kind(kwargs.get("dtype"), default_kind))

    return create


def _full(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    shape = tuple(
        as_int(size, "a size") for size in as_sizes([argument(args, kwargs, 0, "size", ())])
    )
    return Tensor(shape, _dtype_kind(kwargs.get("dtype"), "float"))


def _randint(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    size = kwargs.get("size", args[-1] if args else ())
    return Tensor(tuple(as_int(s, "a size") for s in as_sizes([size])), "int")


def _like(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    x = as_tensor(args[0], "the tensor")
    return Tensor(x.shape, _dtype_kind(kwargs.get("dtype"), x.kind))


for _name in ("zeros", "ones", "empty", "randn", "rand"):
    _FUNCTIONS[_name] = _creator("float")
_FUNCTIONS["full"] = _full
_FUNCTIONS["randint"] = _randint
for _name in ("zeros_like", "ones_like", "empty_like", "randn_like", "rand_like", "full_like"):
    _FUNCTIONS[_name] = _like


def _new_creator(counter: Counter, args: list[object], kwargs: dict[str, object]) -> object:
    tensor = as_tensor(args[0], "the tensor")
    sizes = as_sizes(args[1:])
    return Tensor(tuple(as_int(size, "a size") for size in sizes), tensor.kind)


for _name in ("new_zeros", "new_ones", "new_empty"):
    _FUNCTIONS[_name] = _new_creator

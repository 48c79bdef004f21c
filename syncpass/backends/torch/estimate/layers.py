"""The standard torch layers the estimate knows, looked up by name in :data:`LAYERS`.

Each layer has a :class:`LayerRule`: its constructor's signature (arguments by
name, with torch's defaults), its parameter count from the bound arguments,
the shapes of its ``weight`` and ``bias`` where they are known, and its
forward, which gives the output and adds the layer's FLOPs to a
:class:`~syncpass.backends.torch.estimate.flops.Counter`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from syncpass.backends.torch.estimate.flops import (
    ELEMENTWISE_BACKWARD,
    MATMUL_BACKWARD,
    NORMALISE_FLOPS,
    WEIGHT_SHARE,
    Counter,
)
from syncpass.backends.torch.estimate.shapes import flatten, pooled, unflatten, window_output
from syncpass.backends.torch.estimate.values import (
    Layer,
    Opaque,
    Tensor,
    Unsized,
    as_int,
    as_ints,
    as_number,
    as_tensor,
    numel,
    shape_text,
)

#: The default of an argument the constructor requires.
REQUIRED = Opaque("a required argument")
#: A constructor's arguments in order, each with its default.
Signature = tuple[tuple[str, object], ...]
#: A forward: the layer, the call's arguments and keywords, the tally of the op.
Forward = Callable[[Layer, list[object], dict[str, object], Counter], object]
#: A forward of one input tensor.
InputForward = Callable[[Layer, Tensor, Counter], object]


def _no_parameters(layer: Layer) -> int:
    return 0


@dataclass(frozen=True)
class LayerRule:
    """What the estimate knows of one standard layer."""

    signature: Signature
    forward: Forward
    parameters: Callable[[Layer], int] = _no_parameters
    #: The shapes of the ``weight`` and ``bias`` tensors, from the bound arguments.
    weights: Callable[[Mapping[str, object]], dict[str, tuple[int, ...]]] | None = None
    #: Takes any arguments and ignores them (activations, ``nn.Identity``).
    loose: bool = False


def construct_layer(
    kind: str, args: Sequence[object], kwargs: Mapping[str, object], text: str
) -> Layer:
    """The layer ``nn.<kind>(*args, **kwargs)``, written ``text`` in the source."""
    rule = LAYERS[kind]
    if rule.loose:
        return Layer(kind, {}, text)
    layer = Layer(kind, bind(rule.signature, args, kwargs, text), text)
    layer_parameters(layer)  # arguments of the wrong type show here, not at first use
    return layer


def layer_parameters(layer: Layer) -> int:
    """Number of parameters of a standard layer."""
    rule = LAYERS.get(layer.kind)
    return 0 if rule is None else rule.parameters(layer)


def layer_weight(layer: Layer, name: str) -> object:
    """``layer.weight`` or ``layer.bias``: a tensor where its shape is known."""
    rule = LAYERS.get(layer.kind)
    shapes = {} if rule is None or rule.weights is None else rule.weights(layer.args)
    if name in shapes:
        return Tensor(shapes[name])
    return Opaque(f"the {name} of {layer.text}")


def apply_layer(
    layer: Layer, args: list[object], kwargs: dict[str, object], counter: Counter
) -> object:
    """Run ``layer``'s forward on ``args``: its output; its FLOPs go to ``counter``."""
    rule = LAYERS.get(layer.kind)
    if rule is None:
        raise Unsized(f"{layer.text} is a layer syncpass cannot size")
    return rule.forward(layer, args, kwargs, counter)


def bind(
    signature: Signature, args: Sequence[object], kwargs: Mapping[str, object], what: str
) -> dict[str, object]:
    """Arguments by name; keywords outside the signature (``device=``) are ignored."""
    if len(args) > len(signature):
        raise Unsized(f"{what} takes at most {len(signature)} positional argument(s)")
    bound = {name: default for name, default in signature}
    for (name, _), value in zip(signature, args, strict=False):
        bound[name] = value
    for name, value in kwargs.items():
        if name in bound:
            bound[name] = value
    for name, value in bound.items():
        if value is REQUIRED:
            raise Unsized(f"{what} is missing its argument {name!r}")
        if isinstance(value, Opaque):
            raise Unsized(f"{what}: {name} is unknown ({value.reason})")
    return bound


def _of_input(forward: InputForward) -> Forward:
    """A forward of the call's first argument, which must be a tensor."""

    def apply(
        layer: Layer, args: list[object], kwargs: dict[str, object], counter: Counter
    ) -> object:
        if not args:
            raise Unsized(f"calls {layer.text} without an input")
        return forward(layer, as_tensor(args[0], f"the input of {layer.text}"), counter)

    return apply


def _spatial_rank(kind: str) -> int:
    return 3 if kind.endswith("3d") else 1 if kind.endswith("1d") else 2


# --- nn.Linear and nn.Embedding ---------------------------------------------------------

_LINEAR: Signature = (("in_features", REQUIRED), ("out_features", REQUIRED), ("bias", True))
_EMBEDDING: Signature = (
    ("num_embeddings", REQUIRED),
    ("embedding_dim", REQUIRED),
    ("padding_idx", None),
)


def _linear_parameters(layer: Layer) -> int:
    a = layer.args
    inputs, outputs = as_int(a["in_features"], "in_features"), as_int(a["out_features"], "")
    return inputs * outputs + (outputs if a["bias"] else 0)


def _linear_weights(a: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    out = as_int(a["out_features"], "out_features")
    return {"weight": (out, as_int(a["in_features"], "in_features")), "bias": (out,)}


def _linear(layer: Layer, x: Tensor, counter: Counter) -> object:
    a, shape = layer.args, x.shape
    inputs, outputs = as_int(a["in_features"], ""), as_int(a["out_features"], "")
    if not shape or shape[-1] != inputs:
        raise Unsized(
            f"{layer.text} expects a last dimension of {inputs}, gets {shape_text(shape)}"
        )
    counter.add(2 * numel(shape[:-1]) * inputs * outputs, MATMUL_BACKWARD, WEIGHT_SHARE)
    return Tensor((*shape[:-1], outputs))


def _embedding_parameters(layer: Layer) -> int:
    a = layer.args
    return as_int(a["num_embeddings"], "num_embeddings") * as_int(a["embedding_dim"], "")


def _embedding_weights(a: Mapping[str, object]) -> dict[str, tuple[int, ...]]:
    return {"weight": (as_int(a["num_embeddings"], ""), as_int(a["embedding_dim"], ""))}


def _embedding(layer: Layer, x: Tensor, counter: Counter) -> object:
    return Tensor((*x.shape, as_int(layer.args["embedding_dim"], "")))  # a lookup: 0 FLOPs


# --- convolutions -----------------------------------------------------------------------

_CONV: Signature = (
    ("in_channels", REQUIRED),
    ("out_channels", REQUIRED),
    ("kernel_size", REQUIRED),
    ("stride", 1),
    ("padding", 0),
    ("dilation", 1),
    ("groups", 1),
    ("bias", True),
)
_CONV_TRANSPOSE: Signature = (
    ("in_channels", REQUIRED),
    ("out_channels", REQUIRED),
    ("kernel_size", REQUIRED),
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("bias", True),
    ("dilation", 1),
)


def _convolution_parameters(layer: Layer) -> int:
    a = layer.args
    inputs, outputs = as_int(a["in_channels"], ""), as_int(a["out_channels"], "")
    groups = as_int(a["groups"], "groups")
    kernel = numel(as_ints(a["kernel_size"], _spatial_rank(layer.kind), "kernel_size"))
    if layer.kind.startswith("ConvTranspose"):
        weights = inputs * (outputs // groups) * kernel
    else:
        weights = outputs * (inputs // groups) * kernel
    return weights + (outputs if a["bias"] else 0)


def _convolution(layer: Layer, x: Tensor, counter: Counter) -> object:
    a = layer.args
    rank = _spatial_rank(layer.kind)
    shape = x.shape
    if len(shape) not in (rank + 1, rank + 2):
        raise Unsized(f"{layer.text} expects {rank + 2} dimensions, gets {shape_text(shape)}")
    inputs, outputs = as_int(a["in_channels"], ""), as_int(a["out_channels"], "")
    groups = as_int(a["groups"], "groups")
    channel = len(shape) - rank - 1
    if shape[channel] != inputs:
        raise Unsized(f"{layer.text} expects {inputs} channels, gets {shape_text(shape)}")
    kernel = as_ints(a["kernel_size"], rank, "kernel_size")
    stride = as_ints(a["stride"], rank, "stride")
    dilation = as_ints(a["dilation"], rank, "dilation")
    spatial = shape[channel + 1 :]
    batch = numel(shape[:channel])
    if layer.kind.startswith("ConvTranspose"):
        padding = as_ints(a["padding"], rank, "padding")
        extra = as_ints(a["output_padding"], rank, "output_padding")
        out = tuple(
            (size - 1) * s - 2 * p + d * (k - 1) + e + 1
            for size, s, p, d, k, e in zip(
                spatial, stride, padding, dilation, kernel, extra, strict=True
            )
        )
        flops = 2 * batch * inputs * numel(spatial) * (outputs // groups) * numel(kernel)
    else:
        if a["padding"] == "same":
            out = spatial
        else:
            padding = (
                (0,) * rank if a["padding"] == "valid" else as_ints(a["padding"], rank, "padding")
            )
            out = tuple(
                window_output(size, k, s, p, d, False)
                for size, k, s, p, d in zip(spatial, kernel, stride, padding, dilation, strict=True)
            )
        flops = 2 * batch * outputs * numel(out) * (inputs // groups) * numel(kernel)
    counter.add(flops, MATMUL_BACKWARD, WEIGHT_SHARE)
    return Tensor((*shape[:channel], outputs, *out))


# --- normalisations and softmax ---------------------------------------------------------

_LAYER_NORM: Signature = (
    ("normalized_shape", REQUIRED),
    ("eps", 1e-5),
    ("elementwise_affine", True),
    ("bias", True),
)
_RMS_NORM: Signature = (("normalized_shape", REQUIRED), ("eps", None), ("elementwise_affine", True))
_BATCH_NORM: Signature = (
    ("num_features", REQUIRED),
    ("eps", 1e-5),
    ("momentum", 0.1),
    ("affine", True),
    ("track_running_stats", True),
)
_GROUP_NORM: Signature = (
    ("num_groups", REQUIRED),
    ("num_channels", REQUIRED),
    ("eps", 1e-5),
    ("affine", True),
)
_SOFTMAX: Signature = (("dim", None),)


def _normalized_size(a: Mapping[str, object]) -> int:
    """Elements of ``normalized_shape`` (an int or a sequence), 0 without an affine."""
    if not a["elementwise_affine"]:
        return 0
    value = a["normalized_shape"]
    if isinstance(value, (tuple, list)):
        return numel(tuple(as_int(item, "a size") for item in value))
    return as_int(value, "a size")


def _layer_norm_parameters(layer: Layer) -> int:
    return _normalized_size(layer.args) * (2 if layer.args["bias"] else 1)  # weight and bias


def _rms_norm_parameters(layer: Layer) -> int:
    return _normalized_size(layer.args)  # a weight only


def _batch_norm_parameters(layer: Layer) -> int:
    a = layer.args
    return 2 * as_int(a["num_features"], "num_features") if a["affine"] else 0


def _group_norm_parameters(layer: Layer) -> int:
    a = layer.args
    return 2 * as_int(a["num_channels"], "num_channels") if a["affine"] else 0


def _normalise(layer: Layer, x: Tensor, counter: Counter) -> object:
    counter.add(NORMALISE_FLOPS * numel(x.shape), MATMUL_BACKWARD)
    return Tensor(x.shape, x.kind)


# --- activations, dropout and nn.Identity -----------------------------------------------

_ACTIVATIONS = (
    "ReLU",
    "ReLU6",
    "GELU",
    "SiLU",
    "Tanh",
    "Sigmoid",
    "LeakyReLU",
    "ELU",
    "Mish",
    "Hardswish",
    "Hardtanh",
    "Softplus",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
)


def _activation(layer: Layer, x: Tensor, counter: Counter) -> object:
    counter.add(numel(x.shape), ELEMENTWISE_BACKWARD)
    return Tensor(x.shape, x.kind)


def _identity(layer: Layer, x: Tensor, counter: Counter) -> object:
    return x  # the same tensor: its bytes count once


# --- pooling ----------------------------------------------------------------------------

_MAX_POOL: Signature = (
    ("kernel_size", REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("dilation", 1),
    ("return_indices", False),
    ("ceil_mode", False),
)
_AVG_POOL: Signature = (
    ("kernel_size", REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("ceil_mode", False),
    ("count_include_pad", True),
    ("divisor_override", None),
)
_ADAPTIVE_POOL: Signature = (("output_size", REQUIRED),)


def pool(layer: Layer, x: Tensor, counter: Counter) -> object:
    """A pooling layer's forward (also ``F.max_pool2d`` and the like, as a :class:`Layer`)."""
    a = layer.args
    rank = _spatial_rank(layer.kind)
    shape = x.shape
    if len(shape) < rank + 1:
        raise Unsized(f"{layer.text} gets too few dimensions: {shape_text(shape)}")
    spatial = shape[len(shape) - rank :]
    if layer.kind.startswith("Adaptive"):
        wanted = a["output_size"]
        sizes = list(wanted) if isinstance(wanted, (tuple, list)) else [wanted] * rank
        out = tuple(
            size if want is None else as_int(want, "output_size")
            for size, want in zip(spatial, sizes, strict=True)
        )
        counter.add(numel(shape), ELEMENTWISE_BACKWARD)
    else:
        out = pooled(
            spatial,
            a["kernel_size"],
            a["stride"],
            a["padding"],
            a.get("dilation", 1),
            bool(a["ceil_mode"]),
        )
        kernel = numel(as_ints(a["kernel_size"], rank, "kernel_size"))
        counter.add(numel(shape[: len(shape) - rank]) * numel(out) * kernel, 1.0)
    result = Tensor((*shape[: len(shape) - rank], *out), x.kind)
    if a.get("return_indices"):
        return (result, Tensor(result.shape, "int"))
    return result


# --- reshaping and resizing -------------------------------------------------------------

_FLATTEN: Signature = (("start_dim", 1), ("end_dim", -1))
_UNFLATTEN: Signature = (("dim", REQUIRED), ("unflattened_size", REQUIRED))
_UPSAMPLE: Signature = (("size", None), ("scale_factor", None), ("mode", "nearest"))


def _flatten(layer: Layer, x: Tensor, counter: Counter) -> object:
    return flatten(x, layer.args["start_dim"], layer.args["end_dim"])


def _unflatten(layer: Layer, x: Tensor, counter: Counter) -> object:
    return unflatten(x, layer.args["dim"], layer.args["unflattened_size"])


def resize(x: Tensor, size: object, scale: object, counter: Counter) -> Tensor:
    """``nn.Upsample`` and ``F.interpolate``: ``x``'s spatial dimensions to ``size``, or
    scaled by ``scale``."""
    spatial_rank = len(x.shape) - 2
    if spatial_rank < 1:
        raise Unsized(f"resizes a tensor of shape {shape_text(x.shape)}")
    if size is not None:
        out = as_ints(size, spatial_rank, "size")
    elif scale is not None:
        factors = list(scale) if isinstance(scale, (tuple, list)) else [scale] * spatial_rank
        out = tuple(
            math.floor(length * as_number(factor))
            for length, factor in zip(x.shape[2:], factors, strict=True)
        )
    else:
        raise Unsized("resizes without a size or a scale factor")
    result = Tensor((*x.shape[:2], *out), x.kind)
    counter.add(numel(result.shape), ELEMENTWISE_BACKWARD)
    return result


def _upsample(layer: Layer, x: Tensor, counter: Counter) -> object:
    return resize(x, layer.args["size"], layer.args["scale_factor"], counter)


# --- nn.MultiheadAttention --------------------------------------------------------------

_MULTIHEAD_ATTENTION: Signature = (
    ("embed_dim", REQUIRED),
    ("num_heads", REQUIRED),
    ("dropout", 0.0),
    ("bias", True),
    ("add_bias_kv", False),
    ("add_zero_attn", False),
    ("kdim", None),
    ("vdim", None),
    ("batch_first", False),
)


def _multihead_attention_parameters(layer: Layer) -> int:
    a = layer.args
    embed = as_int(a["embed_dim"], "embed_dim")
    kdim = embed if a["kdim"] is None else as_int(a["kdim"], "kdim")
    vdim = embed if a["vdim"] is None else as_int(a["vdim"], "vdim")
    total = embed * (embed + kdim + vdim) + embed * embed  # in and out projections
    if a["bias"]:
        total += 3 * embed + embed
    if a["add_bias_kv"]:
        total += 2 * embed
    return total


def _multihead_attention(
    layer: Layer, args: list[object], kwargs: dict[str, object], counter: Counter
) -> object:
    names = ("query", "key", "value", "key_padding_mask", "need_weights")
    bound = dict(zip(names, args, strict=False))
    bound.update({key: value for key, value in kwargs.items() if key in names})
    if not all(name in bound for name in names[:3]):
        raise Unsized(f"calls {layer.text} without query, key and value")
    query = as_tensor(bound["query"], "the query")
    key = as_tensor(bound["key"], "the key")
    a = layer.args
    embed, heads = as_int(a["embed_dim"], ""), as_int(a["num_heads"], "")
    kdim = embed if a["kdim"] is None else as_int(a["kdim"], "")
    vdim = embed if a["vdim"] is None else as_int(a["vdim"], "")
    if len(query.shape) == 2:
        batch, target, source = 1, query.shape[0], key.shape[0]
    elif len(query.shape) == 3:
        first = bool(a["batch_first"])
        batch = query.shape[0] if first else query.shape[1]
        target = query.shape[1] if first else query.shape[0]
        source = key.shape[1] if first else key.shape[0]
    else:
        raise Unsized(f"{layer.text} gets a query of shape {shape_text(query.shape)}")
    projections = 2 * batch * (target * embed * embed + source * (kdim + vdim) * embed)
    attention = 4 * batch * target * source * embed
    output = 2 * batch * target * embed * embed
    counter.add(projections + output, MATMUL_BACKWARD, WEIGHT_SHARE)
    counter.add(attention, MATMUL_BACKWARD)
    counter.add(NORMALISE_FLOPS * batch * heads * target * source, MATMUL_BACKWARD)
    out = Tensor(query.shape)
    need = bound.get("need_weights", True)
    if need is False:
        return (out, None)
    weights = (batch, target, source) if len(query.shape) == 3 else (target, source)
    return (out, Tensor(weights))


# --- the table --------------------------------------------------------------------------

_CONVOLUTION = LayerRule(_CONV, _of_input(_convolution), _convolution_parameters)
_TRANSPOSED_CONVOLUTION = LayerRule(
    _CONV_TRANSPOSE, _of_input(_convolution), _convolution_parameters
)
_BATCH_NORMALISATION = LayerRule(_BATCH_NORM, _of_input(_normalise), _batch_norm_parameters)
_SOFTMAX_RULE = LayerRule(_SOFTMAX, _of_input(_normalise))
_ACTIVATION = LayerRule((), _of_input(_activation), loose=True)

#: The standard layers the estimate knows, by their name in ``torch.nn``.
LAYERS: dict[str, LayerRule] = {
    "Linear": LayerRule(_LINEAR, _of_input(_linear), _linear_parameters, _linear_weights),
    "Embedding": LayerRule(
        _EMBEDDING, _of_input(_embedding), _embedding_parameters, _embedding_weights
    ),
    "Conv1d": _CONVOLUTION,
    "Conv2d": _CONVOLUTION,
    "Conv3d": _CONVOLUTION,
    "ConvTranspose1d": _TRANSPOSED_CONVOLUTION,
    "ConvTranspose2d": _TRANSPOSED_CONVOLUTION,
    "LayerNorm": LayerRule(_LAYER_NORM, _of_input(_normalise), _layer_norm_parameters),
    "RMSNorm": LayerRule(_RMS_NORM, _of_input(_normalise), _rms_norm_parameters),
    "BatchNorm1d": _BATCH_NORMALISATION,
    "BatchNorm2d": _BATCH_NORMALISATION,
    "GroupNorm": LayerRule(_GROUP_NORM, _of_input(_normalise), _group_norm_parameters),
    **dict.fromkeys(_ACTIVATIONS, _ACTIVATION),
    "Identity": LayerRule((), _of_input(_identity), loose=True),
    "Softmax": _SOFTMAX_RULE,
    "LogSoftmax": _SOFTMAX_RULE,
    "MaxPool1d": LayerRule(_MAX_POOL, _of_input(pool)),
    "MaxPool2d": LayerRule(_MAX_POOL, _of_input(pool)),
    "AvgPool1d": LayerRule(_AVG_POOL, _of_input(pool)),
    "AvgPool2d": LayerRule(_AVG_POOL, _of_input(pool)),
    "AdaptiveAvgPool1d": LayerRule(_ADAPTIVE_POOL, _of_input(pool)),
    "AdaptiveAvgPool2d": LayerRule(_ADAPTIVE_POOL, _of_input(pool)),
    "AdaptiveMaxPool2d": LayerRule((*_ADAPTIVE_POOL, ("return_indices", False)), _of_input(pool)),
    "Flatten": LayerRule(_FLATTEN, _of_input(_flatten)),
    "Unflatten": LayerRule(_UNFLATTEN, _of_input(_unflatten)),
    "Upsample": LayerRule(_UPSAMPLE, _of_input(_upsample)),
    "MultiheadAttention": LayerRule(
        _MULTIHEAD_ATTENTION, _multihead_attention, _multihead_attention_parameters
    ),
}

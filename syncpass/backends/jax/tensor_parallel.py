"""Tensor parallelism for JAX models, as ``syncpass rewrite --backend jax --strategy tensor``
writes it: the collectives a rewritten Flax module calls, and the weights' split.

The model runs inside :func:`jax.shard_map` over one mesh axis (``"tp"`` by default;
:func:`set_tensor_parallel_axis` names another). Each device holds its slice of the split
weights, and the forward calls three functions where values change state:

==========================================  ==============================  ========================
function                                    forward                         backward (JAX's transpose)
==========================================  ==============================  ========================
``copy_to_tensor_parallel_region(x)``       identity (``pcast`` to varying)  all-reduce (``psum``)
``reduce_from_tensor_parallel_region(x)``   all-reduce (``psum``)           identity
``gather_from_tensor_parallel_region(x)``   all-gather of the last axis     this device's slice
==========================================  ==============================  ========================

These are Megatron-LM's conjugate pair and its gather, in JAX's own terms: a replicated
value read by a split weight's op becomes *varying* over the axis (its gradient a partial
sum on each device, summed by the backward's ``psum``), a partial sum is summed by
``psum`` into a replicated value (its gradient replicated), and a gathered value is
replicated. Outside a ``shard_map`` over the axis every function is the identity and
:func:`tp_size` is 1, so the rewritten file runs alone as the original did.

Weights: :func:`shard_variables` gives the model's variables as global arrays and the
:class:`~jax.sharding.PartitionSpec` of each (``in_specs`` of the ``shard_map``): a
column-split ``Dense`` is sharded on its output features (kernel and bias; a ``DenseGeneral``
of attention heads on its heads), a row-split one on its input features, with its bias on
the first device only (zeros on the others:
the all-reduce after it adds it once). Gradients come back in the same global form; a
row-split bias's gradient is its first block (:func:`unshard_gradients`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

AXIS = "tp"
#: A layout's suffix for a layer whose kernel is stored ``(out, in)`` (HF's ``FlaxConv1D``).
TRANSPOSED = " transposed"
_axis = [AXIS]


def set_tensor_parallel_axis(name: str) -> None:
    """The mesh axis the collectives run over (default ``"tp"``)."""
    _axis[0] = name


def tensor_parallel_axis() -> str:
    """The mesh axis the collectives run over."""
    return _axis[0]


def tp_size() -> int:
    """The number of devices on the tensor-parallel axis; 1 outside a ``shard_map`` over it."""
    import jax

    try:
        return int(jax.lax.axis_size(_axis[0]))
    except NameError:
        return 1


def _varies(x: Any) -> bool:
    """``x`` is typed as varying over the axis (JAX 0.10: ``manual_axis_type.varying``;
    before: ``vma``)."""
    import jax

    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    varying = getattr(manual, "varying", None) if manual is not None else getattr(aval, "vma", ())
    return _axis[0] in (varying or ())


def copy_to_tensor_parallel_region(x: Any) -> Any:
    """Identity forward; the gradient summed over the devices backward (Megatron's ``f``)."""
    import jax

    if tp_size() == 1 or _varies(x):
        return x
    lax: Any = jax.lax
    if hasattr(lax, "pcast"):
        return lax.pcast(x, _axis[0], to="varying")
    return lax.pvary(x, _axis[0])  # JAX before 0.8.2


def reduce_from_tensor_parallel_region(x: Any) -> Any:
    """Sum of the devices' partial sums forward; identity backward (Megatron's ``g``)."""
    import jax

    lax: Any = jax.lax
    if tp_size() == 1:
        return x
    return lax.psum(x, _axis[0])


def gather_from_tensor_parallel_region(x: Any, axis: int = -1) -> Any:
    """The devices' slices joined on ``axis`` forward, replicated; this device's slice of
    the gradient backward."""
    import jax

    if tp_size() == 1:
        return x
    lax: Any = jax.lax
    axis = axis % x.ndim
    try:
        return lax.all_gather(x, _axis[0], axis=axis, tiled=True, to="invarying")
    except TypeError:  # JAX before the ``to`` argument
        return lax.all_gather_invariant(x, _axis[0], axis=axis, tiled=True)


def _path_name(path: tuple[Any, ...]) -> tuple[str, str]:
    """A variable's module (``blocks_0.fc``) and its own name (``kernel``)."""
    keys = [str(getattr(key, "key", getattr(key, "name", key))) for key in path]
    return ".".join(keys[1:-1]), keys[-1]


def layout_of(module: str, layout: Mapping[str, str]) -> str | None:
    """What ``layout`` splits ``module`` as (its name or a pattern), or ``None``."""
    for pattern, kind in layout.items():
        if fnmatch.fnmatchcase(module, pattern):
            return kind
    return None


def shard_variables(variables: Any, layout: Mapping[str, str], tp: int) -> tuple[Any, Any]:
    """``variables`` as the global arrays a ``shard_map`` over ``tp`` devices slices, and
    each one's ``PartitionSpec``: split ones on the axis :func:`tensor_parallel_axis`, the
    rest replicated. ``layout`` maps module names (``blocks_0.fc``, or patterns such as
    ``blocks_*.fc``) to ``column`` or ``row`` (``column transposed``, ``row transposed``: of a
    kernel stored ``(out, in)``)."""
    import jax
    import jax.numpy as jnp
    from jax import sharding

    spec: Any = sharding.PartitionSpec
    axis = _axis[0]

    def one(path: tuple[Any, ...], leaf: Any) -> tuple[Any, Any]:
        module, name = _path_name(path)
        kind = layout_of(module, layout)
        if kind is None or leaf.ndim == 0:
            return leaf, spec()
        column = kind.startswith("column")
        kernel = name == "kernel" and leaf.ndim >= 2
        if column:  # the first output axis: a kernel's second (first when stored (out, in))
            split = (0 if kind.endswith(TRANSPOSED) else 1) if kernel else 0
            return leaf, spec(*(axis if i == split else None for i in range(leaf.ndim)))
        if not kernel:  # a row-split layer adds its bias on the first device only
            zeros = jnp.zeros((tp - 1) * leaf.shape[0], leaf.dtype)
            return jnp.concatenate([leaf, zeros]), spec(axis)
        split = 1 if kind.endswith(TRANSPOSED) else 0  # the input axis
        return leaf, spec(*(axis if i == split else None for i in range(leaf.ndim)))

    pairs = jax.tree_util.tree_map_with_path(one, variables)
    is_pair = lambda x: isinstance(x, tuple) and len(x) == 2  # noqa: E731
    arrays = jax.tree_util.tree_map(lambda pair: pair[0], pairs, is_leaf=is_pair)
    specs = jax.tree_util.tree_map(lambda pair: pair[1], pairs, is_leaf=is_pair)
    return arrays, specs


def unshard_gradients(gradients: Any, layout: Mapping[str, str], tp: int) -> Any:
    """Gradients of :func:`shard_variables`' arrays as gradients of the unsplit variables:
    a row-split bias's is its first block, the rest are already whole."""
    import jax

    def one(path: tuple[Any, ...], leaf: Any) -> Any:
        module, name = _path_name(path)
        if (layout_of(module, layout) or "").startswith("row") and name == "bias":
            return leaf[: leaf.shape[0] // tp]
        return leaf

    return jax.tree_util.tree_map_with_path(one, gradients)


__all__ = [
    "AXIS",
    "copy_to_tensor_parallel_region",
    "gather_from_tensor_parallel_region",
    "layout_of",
    "reduce_from_tensor_parallel_region",
    "set_tensor_parallel_axis",
    "shard_variables",
    "tensor_parallel_axis",
    "tp_size",
    "unshard_gradients",
]

"""Record a Flax model's tensor graph from its traced program (``jax.make_jaxpr``).

One forward of the example is traced while :func:`flax.linen.intercept_methods` notes each
module called: its path, its class and the class of the module that owns it. Each
equation of the program carries the module path it ran in (its name stack) and the line
of the model's file that called it (its traceback). From those:

* a call of a module of a known class is one op (all the equations under its path):
  ``Dense`` and ``DenseGeneral`` a ``linear`` (``in_features`` and ``out_features`` the
  products of its kernel's input and output axes); ``Embed`` an ``embedding``;
  ``LayerNorm``, ``RMSNorm``, ``GroupNorm`` a ``norm``;
* an attention module (:data:`ATTENTION_CLASSES`) is its projections (``Dense``-like ops
  of their own) and one ``attention`` op, with its ``num_heads``, for the work between
  them;
* a module of another class that holds weights of its own and calls no module is one op:
  a ``linear`` when its work is one matrix product of its input's last dimension with a
  2-D weight (Hugging Face's ``FlaxConv1D``; one stored ``(out, in)`` is noted in
  :attr:`JaxTensorRecording.transposed`), else ``other``;
* every other equation is an op of its own: ``add`` a sum; a point-wise primitive or a
  jitted activation (``gelu``, ``silu``, ...) reading only values of its own shape (and
  scalars) ``elementwise``; ``softmax`` a softmax; anything else ``other``;
* an equation that reads nothing the forward was given nor a weight (``iota``, a causal
  mask) is a constant, not an op; weights are not values (an op reading a weight owns it).

A module's op is placed at the innermost line of the model's file outside its own class's
methods: the line that calls it.

Data flow is exact: it is the program's own variables. Sizes are the program's shapes.
Compute is priced, not timed: a ``linear`` by its FLOPs at the hardware's rate, every
other op by the bytes it reads and writes at :data:`MEMORY_BYTES_PER_S` (backward twice
the forward for ops with weights, once for the rest, as the torch recorder estimates).
The loss of the example (``loss_fn(logits, targets)``) is one ``loss`` op after the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.backends.jax.example import JaxExample
from syncpass.contracts.tensor import TensorGraph, TensorOp
from syncpass.core.errors import SyncpassError

#: Bytes a second an op that computes little moves on a CPU core (a streaming read).
MEMORY_BYTES_PER_S = 1e10
_LEAF_KINDS = {
    "Dense": "linear",
    "DenseGeneral": "linear",
    "Embed": "embedding",
    "LayerNorm": "norm",
    "RMSNorm": "norm",
    "GroupNorm": "norm",
}
#: Flax's attention modules: their projections (``query``, ``key``, ``value``, ``out``) are
#: ops of their own, and what the module computes between them is one ``attention`` op.
ATTENTION_CLASSES = frozenset(
    {"MultiHeadDotProductAttention", "MultiHeadAttention", "SelfAttention"}
)
_POINTWISE = {
    "abs", "add", "add_any", "convert_element_type", "cos", "div", "erf", "exp", "exp2",
    "integer_pow", "log", "log1p", "logistic", "max", "min", "mul", "neg", "pow", "rsqrt",
    "select_n", "sign", "sin", "sqrt", "square", "sub", "tanh",
}  # fmt: skip
_ACTIVATIONS = {"gelu", "silu", "swish", "relu", "relu6", "sigmoid", "elu", "celu", "selu",
                "leaky_relu", "soft_sign", "softplus", "tanh", "hard_tanh", "mish"}  # fmt: skip
_SOFTMAX = {"softmax", "_softmax", "log_softmax"}


@dataclass(frozen=True)
class ModuleCall:
    """A module the forward called: its path (``blocks_0.fc``), class, and the class of
    the module that owns it (where its construction and its call are in the source)."""

    path: str
    cls: str
    owner_cls: str | None
    out_dims: int = 1  # a DenseGeneral's output axes (its ``features``)
    heads: int | None = None  # an attention module's ``num_heads``


@dataclass(frozen=True)
class JaxTensorRecording:
    """The tensor graph and the modules behind its ops (by module path)."""

    graph: TensorGraph
    modules: tuple[ModuleCall, ...]
    model_file: str
    # Linear layers of no known class whose kernel is stored (out, in) (HF's FlaxConv1D).
    transposed: frozenset[str] = frozenset()

    def module(self, path: str) -> ModuleCall | None:
        return next((call for call in self.modules if call.path == path), None)


def _nbytes(aval: Any) -> int:
    size = 1
    for dim in aval.shape:
        size *= int(dim)
    return int(size * aval.dtype.itemsize)


def _product(dims: Sequence[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def _weight_matmul(equations: Sequence[Any], weights: Sequence[Any]) -> bool | None:
    """Whether a layer's work is one matrix product of its input's last dimension with a
    2-D weight of its own: ``False`` for a weight stored ``(in, out)``, ``True`` for one
    stored ``(out, in)``; ``None`` when it is not."""
    products = [eq for eq in equations if eq.primitive.name == "dot_general"]
    if len(products) != 1:
        return None
    product = products[0]
    lhs, rhs = product.invars[:2]
    (lhs_contract, rhs_contract), (lhs_batch, _) = product.params["dimension_numbers"]
    if rhs.aval.ndim != 2 or lhs_batch or tuple(lhs_contract) != (lhs.aval.ndim - 1,):
        return None
    # The weight may reach the product through a transpose or a cast (``kernel.T``).
    made = {var: eq for eq in equations for var in eq.outvars}
    flipped = False
    while rhs not in weights and rhs in made:
        step = made[rhs]
        if step.primitive.name == "transpose" and tuple(step.params["permutation"]) == (1, 0):
            flipped = not flipped
        elif step.primitive.name != "convert_element_type":
            return None
        rhs = step.invars[0]
    if rhs not in weights:
        return None
    return (tuple(rhs_contract) == (1,)) != flipped


def _is_var(atom: Any) -> bool:
    return not hasattr(atom, "val")  # a Literal has .val


def _jit_name(equation: Any) -> str:
    name = str(equation.params.get("name", ""))
    return name.lstrip("_") if name.lstrip("_") in _ACTIVATIONS else name


def _line(equation: Any, model_file: Path, inside: str | None = None) -> int | None:
    """The line of ``model_file`` that made ``equation``, the innermost one outside the
    methods of class ``inside`` (a module's own code: its call is the line wanted)."""
    traceback = equation.source_info.traceback
    if traceback is None:
        return None
    for frame in traceback.frames:
        if Path(frame.file_name).resolve() != model_file:
            continue
        if inside is not None and str(frame.function_name).startswith(f"{inside}."):
            continue
        return int(frame.line_num)
    return None


def record_jax_tensor_graph(
    example: JaxExample, model_file: Path, flops_per_s: float | None
) -> JaxTensorRecording:
    """The tensor graph of ``example``'s Flax model, traced once; ``model_file`` is the
    file whose lines ops are placed at."""
    import flax.linen as nn
    import jax

    if example.is_function:
        raise SyncpassError(
            "--backend jax --strategy tensor splits a Flax module's Dense layers; "
            f"{example.name} is a function: write it as a flax.linen Module",
            example.origin,
        )
    rate = flops_per_s or 5e10
    modules: dict[str, ModuleCall] = {}

    def note(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if context.method_name == "__call__":
            path = ".".join(module.path)
            owner = module.parent if isinstance(module.parent, nn.Module) else None
            features = getattr(module, "features", None)
            heads = getattr(module, "num_heads", None)
            modules.setdefault(
                path,
                ModuleCall(
                    path,
                    type(module).__name__,
                    type(owner).__name__ if owner else None,
                    len(features) if isinstance(features, tuple | list) else 1,
                    heads if isinstance(heads, int) else None,
                ),
            )
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(note):
        closed = jax.make_jaxpr(lambda variables, *args: example.apply(variables, *args))(
            example.params, *example.args
        )
    jaxpr = closed.jaxpr
    params = len(jax.tree_util.tree_leaves(example.params))
    root = type(example.model).__name__
    model_file = model_file.resolve()
    holders = {
        ".".join(str(getattr(key, "key", key)) for key in path[1:-1])
        for path, _ in jax.tree_util.tree_flatten_with_path(example.params)[0]
    }
    builder = _Builder(modules, root, model_file, rate, frozenset(holders))
    for position, var in enumerate(jaxpr.invars[params:]):
        builder.input(var, f"input.{position}")
    for var in jaxpr.invars[:params]:
        builder.weights.add(var)
    for equation in jaxpr.eqns:
        builder.equation(equation)
    builder.close()
    outputs = [
        builder.producer[var] for var in jaxpr.outvars if _is_var(var) and var in builder.producer
    ]
    if not outputs:
        raise SyncpassError("the model returns nothing computed from its inputs", example.origin)
    graph_outputs = builder.finish(outputs, example)
    graph = TensorGraph(tuple(builder.ops), tuple(graph_outputs), _batch(example))
    return JaxTensorRecording(
        graph, tuple(modules.values()), str(model_file), frozenset(builder.transposed)
    )


def _batch(example: JaxExample) -> int:
    leaves = [leaf for leaf in example.args if getattr(leaf, "ndim", 0) >= 1]
    return int(leaves[0].shape[0]) if leaves else 1


class _Builder:
    """Turns the program's equations into tensor ops, in order."""

    def __init__(
        self,
        modules: dict[str, ModuleCall],
        root: str,
        model_file: Path,
        flops_per_s: float,
        holders: frozenset[str],
    ) -> None:
        self.modules = modules
        self.holders = holders  # the modules that hold weights of their own
        self.transposed: set[str] = set()
        self.root = root
        self.model_file = model_file
        self.flops_per_s = flops_per_s
        self.ops: list[TensorOp] = []
        self.producer: dict[Any, str] = {}  # a data value -> the op that made it
        self.weights: set[Any] = set()
        self.open: tuple[str, str, list[Any]] | None = None  # the module call being gathered
        self.names: dict[str, int] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}  # each op's output shape

    def input(self, var: Any, name: str) -> None:
        grad = var.aval.dtype.kind == "f"
        self.ops.append(
            TensorOp(
                name, "input", out_bytes=_nbytes(var.aval), tokens=var.aval.ndim >= 2, grad=grad
            )
        )
        self.producer[var] = name
        self.shapes[name] = tuple(var.aval.shape)

    def _unique(self, name: str) -> str:
        count = self.names.get(name, 0) + 1
        self.names[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _owner(self, equation: Any) -> str | None:
        """The outermost module of a known class the equation ran in."""
        parts = [part for part in str(equation.source_info.name_stack).split("/") if part]
        if parts and parts[0] == self.root:
            parts = parts[1:]
        for end in range(1, len(parts) + 1):
            call = self.modules.get(".".join(parts[:end]))
            if call is not None and call.cls in _LEAF_KINDS:
                return call.path
            if call is not None and call.cls in ATTENTION_CLASSES:
                child = self.modules.get(".".join(parts[: end + 1])) if end < len(parts) else None
                if child is None:
                    return call.path  # the attention module's own work, between its projections
            if call is not None and self._holds_weights_alone(call.path):
                return call.path  # a layer of a class of its own: a linear if it is one matmul
        return None

    def _holds_weights_alone(self, path: str) -> bool:
        """``path`` holds weights of its own and calls no module: a layer."""
        return path in self.holders and not any(
            other.startswith(path + ".") for other in self.modules
        )

    def _scope(self, equation: Any) -> str:
        parts = [part for part in str(equation.source_info.name_stack).split("/") if part]
        if parts and parts[0] == self.root:
            parts = parts[1:]
        path = ""
        for part in parts:
            candidate = f"{path}.{part}" if path else part
            if candidate not in self.modules:
                break
            path = candidate
        return path

    def equation(self, equation: Any) -> None:
        reads_data = any(
            _is_var(atom) and (atom in self.producer or atom in self.weights)
            for atom in equation.invars
        )
        owner = self._owner(equation)
        if owner is not None and self.open is not None and self.open[0] == owner:
            self._gather(equation)
            return
        if not reads_data:
            return  # a constant: made from nothing the forward was given
        self.close()
        if owner is not None:
            self.open = (owner, self._unique(owner), [])
            self._gather(equation)
            return
        self._primitive(equation)

    def _gather(self, equation: Any) -> None:
        assert self.open is not None
        self.open[2].append(equation)
        for var in equation.outvars:
            self.producer[var] = self.open[1]

    def close(self) -> None:
        """End the module call being gathered: its op."""
        if self.open is None:
            return
        path, op_id, equations = self.open
        self.open = None
        self._module_op(path, op_id, equations)

    def _reads(self, equations: Sequence[Any]) -> tuple[list[str], list[Any], list[Any]]:
        """The ops whose values ``equations`` read, the weights they read, and the
        non-data values (constants) they read."""
        made = {var for equation in equations for var in equation.outvars}
        inputs: list[str] = []
        weights: list[Any] = []
        constants: list[Any] = []
        for equation in equations:
            for atom in equation.invars:
                if not _is_var(atom) or atom in made:
                    continue
                if atom in self.producer:
                    if self.producer[atom] not in (*inputs, *self._making(equations)):
                        inputs.append(self.producer[atom])
                elif atom in self.weights:
                    weights.append(atom)
                else:
                    constants.append(atom)
        return inputs, weights, constants

    def _making(self, equations: Sequence[Any]) -> tuple[str, ...]:
        """The op id the open module call is gathered under, when ``equations`` are it."""
        if self.open is not None and equations is self.open[2]:
            return (self.open[1],)
        return ()

    def _source(self, equations: Sequence[Any], inside: str | None = None) -> str | None:
        for equation in equations:
            line = _line(equation, self.model_file, inside)
            if line is not None:
                return f"{self.model_file}:{line}"
        return None

    def _add(self, op: TensorOp, equations: Sequence[Any]) -> None:
        self.ops.append(op)
        self.shapes[op.id] = tuple(equations[-1].outvars[0].aval.shape)
        for equation in equations:
            for var in equation.outvars:
                self.producer[var] = op.id

    def _module_op(self, path: str, op_id: str, equations: Sequence[Any]) -> None:
        call = self.modules[path]
        inputs, weights, _ = self._reads(equations)
        if call.cls in ATTENTION_CLASSES:
            kind = "attention"
        elif call.cls in _LEAF_KINDS:
            kind = _LEAF_KINDS[call.cls]
        else:  # a class of its own: a linear when its work is one matmul with its weight
            kind = "other"
            oriented = _weight_matmul(equations, weights)
            if oriented is not None:
                kind = "linear"
                if oriented:
                    self.transposed.add(path)
        out = equations[-1].outvars[0].aval
        param_bytes = float(sum(_nbytes(var.aval) for var in weights))
        fields: dict[str, Any] = {}
        # The kernel is the largest weight (a bias has the output's shape, a scale one axis).
        largest = max(weights, key=lambda var: (var.aval.ndim, _nbytes(var.aval)), default=None)
        kernels = [largest.aval.shape] if largest is not None and largest.aval.ndim >= 2 else []
        if kind == "linear":
            if len(kernels) != 1 or not 1 <= call.out_dims < len(kernels[0]):
                kind = "other"
            else:
                kernel = [int(dim) for dim in kernels[0]]
                if path in self.transposed:  # stored (out, in)
                    kernel.reverse()
                cut = len(kernel) - call.out_dims
                fields = {
                    "in_features": _product(kernel[:cut]),
                    "out_features": _product(kernel[cut:]),
                }
        if kind == "attention":
            if len(inputs) != 3 or call.heads is None:
                kind = "other"
            else:
                fields = {"heads": call.heads}
        if kind == "embedding":
            if len(kernels) != 1:
                kind = "other"
            else:
                fields = {"in_features": int(kernels[0][0]), "out_features": int(kernels[0][1])}
        if kind in ("norm", "linear") and len(inputs) != 1:
            kind = "other"
        if kind == "embedding" and len(inputs) != 1:
            kind = "other"
            fields = {}
        moved = float(_nbytes(out)) + param_bytes
        for equation in equations:
            moved += sum(_nbytes(atom.aval) for atom in equation.invars if _is_var(atom)) / len(
                equations
            )
        flops = 0.0
        if kind == "linear":
            tokens = _nbytes(out) // out.dtype.itemsize // fields["out_features"]
            flops = 2.0 * tokens * fields["in_features"] * fields["out_features"]
        forward = max(flops / self.flops_per_s, moved / MEMORY_BYTES_PER_S)
        self._add(
            TensorOp(
                op_id,
                kind,
                tuple(inputs),
                out_bytes=float(_nbytes(out)),
                compute_s=forward,
                backward_s=(2.0 if param_bytes else 1.0) * forward,
                param_bytes=param_bytes,
                tokens=out.ndim >= 3,
                grad=out.dtype.kind == "f",
                source=self._source(equations, call.cls),
                module=path,
                **fields,
            ),
            equations,
        )

    def _primitive(self, equation: Any) -> None:
        inputs, weights, constants = self._reads([equation])
        out = equation.outvars[0].aval
        name = equation.primitive.name
        if name in ("jit", "pjit"):
            name = _jit_name(equation)
        shaped = (
            all(self._shape_of(op_id) == out.shape for op_id in inputs)
            and all(atom.aval.ndim == 0 for atom in constants)
            and not weights
        )
        if name in ("add", "add_any") and len(inputs) >= 2 and shaped:
            kind = "add"
        elif (name in _POINTWISE or name in _ACTIVATIONS) and shaped:
            kind = "elementwise"
        elif name in _SOFTMAX and len(inputs) == 1 and shaped:
            kind = "softmax"
        else:
            kind = "other"
        moved = float(_nbytes(out)) + sum(
            _nbytes(atom.aval) for atom in equation.invars if _is_var(atom)
        )
        forward = moved / MEMORY_BYTES_PER_S
        scope = self._scope(equation)
        base = f"{scope}.{name}" if scope else name
        self._add(
            TensorOp(
                self._unique(base),
                kind,
                tuple(inputs),
                out_bytes=float(_nbytes(out)),
                compute_s=forward,
                backward_s=forward,
                param_bytes=float(sum(_nbytes(var.aval) for var in weights)),
                tokens=out.ndim >= 3,
                grad=out.dtype.kind == "f",
                source=self._source([equation]),
            ),
            [equation],
        )

    def _shape_of(self, op_id: str) -> tuple[int, ...] | None:
        return self.shapes.get(op_id)

    def finish(self, outputs: list[str], example: JaxExample) -> list[str]:
        """Add the loss op when the model returns one array of
        logits and the example has targets. The graph's outputs."""
        outputs = list(dict.fromkeys(outputs))
        target = example.target
        if len(outputs) != 1 or target is None or not hasattr(target, "shape"):
            return outputs
        logits = self.ops[-1] if self.ops[-1].id == outputs[0] else None
        classes = self._shape_of(outputs[0])
        if logits is None or not classes:
            return outputs
        self.ops.append(
            TensorOp(
                "targets",
                "input",
                out_bytes=float(target.size * target.dtype.itemsize),
                tokens=False,
                grad=False,
            )
        )
        forward = 2 * logits.out_bytes / MEMORY_BYTES_PER_S
        self.ops.append(
            dataclasses.replace(
                TensorOp("loss", "loss", (outputs[0], "targets")),
                out_bytes=4.0,
                compute_s=forward,
                backward_s=forward,
                in_features=int(classes[-1]),
                tokens=False,
            )
        )
        return ["loss"]


__all__ = ["MEMORY_BYTES_PER_S", "JaxTensorRecording", "ModuleCall", "record_jax_tensor_graph"]

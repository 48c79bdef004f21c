"""The tensor graph: what a tensor-parallel plan needs to know about a model's forward.

A pipeline plan cuts the forward between statements; a tensor-parallel plan splits the
weights *inside* them, so it needs a finer graph: every linear-like op (``nn.Linear``,
``nn.Embedding``, a Conv1D-style weight, ``x @ self.w``, an einsum with a weight) with
its in and out features, and every op between them that decides which layouts can meet
(element-wise ops, norms, softmax, attention, reshapes), joined by the values they pass.

Where the figures come from (``docs/tensor.md``):

* ``syncpass.backends.torch.tensor_record`` runs the built model once on its example
  under forward hooks on the leaf modules and a ``TorchFunctionMode``: each leaf module
  call and each functional op on the data path is a :class:`TensorOp`, joined to the ops
  that made its inputs by tensor identity. Sizes are the tensors' own (bytes of the
  output activation at the profiled batch, the weight's shape); compute is timed or
  estimated from FLOPs at the device's rate.
* :class:`TensorGraphBuilder` builds the same contract from a description (shapes and a
  FLOP rate), for planning a model at sizes no machine here can run, and for tests.

Each op makes one value, named by the op's id; a graph input (token ids, a mask) is an
op of kind ``input``. All bytes are of the whole, unsplit tensor; the planner divides.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

#: What an op is, for the rules of which layouts it can run in
#: (:mod:`syncpass.plan.tensor_rules`):
#:
#: ``input``       a value the forward is given (no inputs, replicated);
#: ``linear``      ``y = x W (+ b)`` over the last dimension: ``in_features -> out_features``;
#: ``embedding``   a lookup table of ``in_features`` rows (the vocabulary) of ``out_features``;
#: ``elementwise`` a point-wise function of its inputs (GELU, dropout, ``gate * up``);
#: ``add``         a sum of its inputs (a residual connection): linear, so partial sums add;
#: ``norm``        a normalisation over the last dimension (LayerNorm, RMSNorm);
#: ``softmax``     a softmax over the last dimension;
#: ``attention``   scaled dot-product attention of (q, k, v) or of one fused qkv value,
#:                 with ``heads`` query heads and ``kv_heads`` key/value heads;
#: ``reshape``     a view, transpose, split or contiguous copy: moves data, computes nothing;
#: ``loss``        a cross-entropy over the last dimension of its first input (the logits,
#:                 ``in_features`` classes) against its second (the targets);
#: ``other``       anything else: it runs replicated.
TENSOR_KINDS = (
    "input",
    "linear",
    "embedding",
    "elementwise",
    "add",
    "norm",
    "softmax",
    "attention",
    "reshape",
    "loss",
    "other",
)

#: How many inputs each kind takes (least, most; ``None``: no bound).
_ARITY: dict[str, tuple[int, int | None]] = {
    "input": (0, 0),
    "linear": (1, 1),
    "embedding": (1, 1),
    "elementwise": (1, None),
    "add": (2, None),
    "norm": (1, 1),
    "softmax": (1, 1),
    "attention": (1, 3),
    "reshape": (1, 1),
    "loss": (1, 2),
    "other": (0, None),
}


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


@dataclass(frozen=True)
class TensorOp:
    """One op of the tensor graph and the value it makes.

    ``inputs`` are the ids of the ops whose values it reads, in argument order
    (attention: ``(q, k, v)`` or the one fused ``(qkv,)``). ``out_bytes`` is the size of
    its output at the profiled batch, whole; ``compute_s`` and ``backward_s`` its time on
    one device, whole; ``param_bytes`` its weights' bytes. ``in_features`` and
    ``out_features`` give a ``linear`` its weight's shape, an ``embedding`` its
    vocabulary and width, a ``loss`` its classes. ``tokens`` says its output has a
    sequence dimension that sequence parallelism may split (false for a loss, a scalar,
    a mask without one). ``grad`` is false for a value no gradient flows to (token ids).
    ``source`` is ``"file:line"`` when the op has one; ``module`` the submodule's
    qualified name in the model (``transformer.h.0.attn.c_attn``) when it is one.
    """

    id: str
    kind: str
    inputs: tuple[str, ...] = ()
    out_bytes: float = 0.0
    compute_s: float = 0.0
    backward_s: float = 0.0
    param_bytes: float = 0.0
    in_features: int | None = None
    out_features: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    tokens: bool = True
    grad: bool = True
    source: str | None = None
    module: str | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a tensor op needs a non-empty id")
        if self.kind not in TENSOR_KINDS:
            raise ValueError(
                f"op {self.id!r}: kind {self.kind!r} is not one of {', '.join(TENSOR_KINDS)}"
            )
        least, most = _ARITY[self.kind]
        if len(self.inputs) < least or (most is not None and len(self.inputs) > most):
            bound = f"{least}" if least == most else f"{least} to {most if most else 'any'}"
            raise ValueError(
                f"op {self.id!r}: a {self.kind} op reads {bound} input(s), got {len(self.inputs)}"
            )
        for name in ("out_bytes", "compute_s", "backward_s", "param_bytes"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"op {self.id!r}: {name} must be a finite number >= 0")
        for name in ("in_features", "out_features", "heads", "kv_heads"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, int) and not isinstance(value, bool) and value >= 1
            ):
                raise ValueError(f"op {self.id!r}: {name} must be a whole number >= 1")
        if self.kind in ("linear", "embedding") and (
            self.in_features is None or self.out_features is None
        ):
            raise ValueError(
                f"op {self.id!r}: a {self.kind} op needs in_features and out_features "
                "(its weight's shape)"
            )
        if self.kind == "attention":
            if self.heads is None:
                raise ValueError(f"op {self.id!r}: an attention op needs its number of heads")
            kv = self.kv_heads if self.kv_heads is not None else self.heads
            if self.heads % kv:
                raise ValueError(
                    f"op {self.id!r}: {self.heads} query heads do not share "
                    f"{kv} key/value heads evenly"
                )

    @property
    def key_value_heads(self) -> int | None:
        """The key/value heads of an attention op (its query heads unless grouped)."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    def where(self) -> str:
        """Where a person finds the op: its source line, else its id."""
        return self.source or self.id


@dataclass(frozen=True)
class TensorGraph:
    """The ops of one forward in execution order, and the values it returns.

    ``outputs`` are the ids of the ops whose values the forward returns (the loss, or
    the logits); every device ends with them whole. ``batch_size`` is the batch the
    sizes and times are for.
    """

    ops: tuple[TensorOp, ...]
    outputs: tuple[str, ...]
    batch_size: int = 1
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.ops:
            raise ValueError("a tensor graph needs at least one op")
        seen: dict[str, int] = {}
        for index, op in enumerate(self.ops):
            if op.id in seen:
                raise ValueError(f"op id {op.id!r} appears twice; op ids must be unique")
            for name in op.inputs:
                if name not in seen:
                    raise ValueError(
                        f"op {op.id!r} reads {name!r}, which is no earlier op; list ops "
                        "in execution order"
                    )
            seen[op.id] = index
        if not self.outputs:
            raise ValueError("a tensor graph returns at least one value (outputs)")
        for name in self.outputs:
            if name not in seen:
                raise ValueError(f"output {name!r} names no op")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise ValueError("batch_size must be a whole number")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")

    @cached_property
    def index(self) -> dict[str, int]:
        """Each op's position in execution order."""
        return {op.id: position for position, op in enumerate(self.ops)}

    def op(self, op_id: str) -> TensorOp:
        """The op called ``op_id``."""
        return self.ops[self.index[op_id]]

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        """The ops that read each op's value, in order (an op reading it twice once)."""
        found: dict[str, list[str]] = {op.id: [] for op in self.ops}
        for op in self.ops:
            for name in dict.fromkeys(op.inputs):
                found[name].append(op.id)
        return {name: tuple(users) for name, users in found.items()}


class TensorGraphBuilder:
    """Builds a :class:`TensorGraph` from shapes: bytes from the shapes and the element
    size, compute from FLOPs at ``flops_per_s`` (backward twice the forward for ops with
    weights, as two matrix products; the same as the forward for the rest), and a floor
    of ``memory_bytes_per_s`` for ops that move more than they compute.

    ``tokens`` is the number of token positions of the batch (batch size times sequence
    length); every activation is ``tokens x width`` unless said otherwise.
    """

    def __init__(
        self,
        tokens: int,
        *,
        element_bytes: int = 2,
        flops_per_s: float = 4e14,
        memory_bytes_per_s: float = 2e12,
        batch_size: int = 1,
    ) -> None:
        self.tokens = tokens
        self.element_bytes = element_bytes
        self.flops_per_s = flops_per_s
        self.memory_bytes_per_s = memory_bytes_per_s
        self.batch_size = batch_size
        self._ops: list[TensorOp] = []
        self._width: dict[str, int] = {}

    def _time(self, flops: float, moved_bytes: float) -> float:
        return max(flops / self.flops_per_s, moved_bytes / self.memory_bytes_per_s)

    def _add(self, op: TensorOp, width: int) -> str:
        self._ops.append(op)
        self._width[op.id] = width
        return op.id

    def activation_bytes(self, width: int) -> float:
        """Bytes of a ``tokens x width`` activation."""
        return float(self.tokens * width * self.element_bytes)

    def input(self, name: str, width: int = 1, *, grad: bool = False) -> str:
        """A graph input (token ids by default: one per position, no gradient)."""
        return self._add(
            TensorOp(name, "input", out_bytes=self.tokens * width * 8.0, grad=grad), width
        )

    def linear(self, name: str, x: str, out_features: int, *, bias: bool = True) -> str:
        """``x @ W`` with ``W`` of ``width(x) x out_features``."""
        in_features = self._width[x]
        flops = 2.0 * self.tokens * in_features * out_features
        params = (in_features * out_features + (out_features if bias else 0)) * self.element_bytes
        out = self.activation_bytes(out_features)
        forward = self._time(flops, params + self.activation_bytes(in_features) + out)
        return self._add(
            TensorOp(
                name,
                "linear",
                (x,),
                out_bytes=out,
                compute_s=forward,
                backward_s=2 * forward,
                param_bytes=float(params),
                in_features=in_features,
                out_features=out_features,
                module=name,
            ),
            out_features,
        )

    def embedding(self, name: str, ids: str, vocab: int, width: int) -> str:
        """A table lookup: ``vocab`` rows of ``width``."""
        out = self.activation_bytes(width)
        return self._add(
            TensorOp(
                name,
                "embedding",
                (ids,),
                out_bytes=out,
                compute_s=self._time(0, 2 * out),
                backward_s=self._time(0, 2 * out),
                param_bytes=float(vocab * width * self.element_bytes),
                in_features=vocab,
                out_features=width,
                module=name,
            ),
            width,
        )

    def _pointwise(
        self, name: str, kind: str, inputs: Sequence[str], flops_per_element: float, params: int
    ) -> str:
        width = self._width[inputs[0]]
        out = self.activation_bytes(width)
        moved = out * (len(inputs) + 1)
        forward = self._time(flops_per_element * self.tokens * width, moved)
        return self._add(
            TensorOp(
                name,
                kind,
                tuple(inputs),
                out_bytes=out,
                compute_s=forward,
                backward_s=2 * forward,
                param_bytes=float(params * self.element_bytes),
                module=name if params else None,
            ),
            width,
        )

    def elementwise(self, name: str, *inputs: str, flops_per_element: float = 8) -> str:
        """A point-wise op (GELU by default; dropout, a product of two branches)."""
        return self._pointwise(name, "elementwise", inputs, flops_per_element, 0)

    def add(self, name: str, *inputs: str) -> str:
        """A sum (a residual connection)."""
        return self._pointwise(name, "add", inputs, len(inputs) - 1, 0)

    def norm(self, name: str, x: str, *, affine: bool = True) -> str:
        """A LayerNorm over the last dimension (weight and bias when ``affine``)."""
        width = self._width[x]
        return self._pointwise(name, "norm", (x,), 8, 2 * width if affine else 0)

    def softmax(self, name: str, x: str) -> str:
        """A softmax over the last dimension."""
        return self._pointwise(name, "softmax", (x,), 5, 0)

    def attention(
        self,
        name: str,
        *qkv: str,
        heads: int,
        kv_heads: int | None = None,
        sequence: int,
        width: int | None = None,
    ) -> str:
        """Causal scaled dot-product attention over sequences of ``sequence`` tokens:
        ``4 * tokens * sequence * width / 2`` FLOPs forward (scores and the weighted sum,
        half of them masked), output ``width`` wide (the query's by default)."""
        width = width if width is not None else self._width[qkv[0]] // (3 if len(qkv) == 1 else 1)
        out = self.activation_bytes(width)
        flops = 2.0 * self.tokens * sequence * width
        forward = self._time(flops, out * 4)
        return self._add(
            TensorOp(
                name,
                "attention",
                tuple(qkv),
                out_bytes=out,
                compute_s=forward,
                backward_s=2.5 * forward,
                heads=heads,
                kv_heads=kv_heads,
            ),
            width,
        )

    def loss(self, name: str, logits: str, targets: str) -> str:
        """Cross-entropy of ``logits`` against ``targets``, averaged to one number."""
        classes = self._width[logits]
        forward = self._time(5.0 * self.tokens * classes, 2 * self.activation_bytes(classes))
        return self._add(
            TensorOp(
                name,
                "loss",
                (logits, targets),
                out_bytes=4.0,
                compute_s=forward,
                backward_s=forward,
                in_features=classes,
                tokens=False,
            ),
            1,
        )

    def width(self, name: str) -> int:
        """The last dimension of a value built so far."""
        return self._width[name]

    def build(self, outputs: Sequence[str], notes: Sequence[str] = ()) -> TensorGraph:
        """The graph of the ops added so far, returning ``outputs``."""
        return TensorGraph(tuple(self._ops), tuple(outputs), self.batch_size, tuple(notes))


@dataclass(frozen=True)
class TransformerShape:
    """A GPT-style decoder: what :func:`transformer_graph` builds."""

    layers: int = 1
    width: int = 4096
    heads: int = 32
    kv_heads: int | None = None
    sequence: int = 2048
    batch_size: int = 1
    vocab: int = 50304
    mlp_ratio: int = 4
    element_bytes: int = 2
    embedding: bool = True
    head: bool = True


def transformer_graph(
    shape: TransformerShape, *, flops_per_s: float = 4e14, memory_bytes_per_s: float = 2e12
) -> TensorGraph:
    """A GPT block stack (pre-norm, separate q, k, v projections, GELU MLP, residuals),
    with the token embedding and the head with its loss when the shape asks for them."""
    tokens = shape.batch_size * shape.sequence
    b = TensorGraphBuilder(
        tokens,
        element_bytes=shape.element_bytes,
        flops_per_s=flops_per_s,
        memory_bytes_per_s=memory_bytes_per_s,
        batch_size=shape.batch_size,
    )
    head_dim = shape.width // shape.heads
    kv_width = head_dim * (shape.kv_heads or shape.heads)
    if shape.embedding:
        ids = b.input("idx")
        x = b.embedding("wte", ids, shape.vocab, shape.width)
    else:
        x = b.input("x", shape.width, grad=True)
    for layer in range(shape.layers):
        p = f"h.{layer}"
        h = b.norm(f"{p}.ln_1", x)
        q = b.linear(f"{p}.attn.q_proj", h, shape.width)
        k = b.linear(f"{p}.attn.k_proj", h, kv_width)
        v = b.linear(f"{p}.attn.v_proj", h, kv_width)
        a = b.attention(
            f"{p}.attn.sdpa",
            q,
            k,
            v,
            heads=shape.heads,
            kv_heads=shape.kv_heads,
            sequence=shape.sequence,
            width=shape.width,
        )
        o = b.linear(f"{p}.attn.c_proj", a, shape.width)
        o = b.elementwise(f"{p}.attn.dropout", o, flops_per_element=2)
        x = b.add(f"{p}.add_1", x, o)
        h = b.norm(f"{p}.ln_2", x)
        f = b.linear(f"{p}.mlp.c_fc", h, shape.mlp_ratio * shape.width)
        f = b.elementwise(f"{p}.mlp.gelu", f)
        f = b.linear(f"{p}.mlp.c_proj", f, shape.width)
        f = b.elementwise(f"{p}.mlp.dropout", f, flops_per_element=2)
        x = b.add(f"{p}.add_2", x, f)
    if not shape.head:
        return b.build((x,))
    x = b.norm("ln_f", x)
    logits = b.linear("lm_head", x, shape.vocab, bias=False)
    targets = b.input("targets")
    return b.build((b.loss("loss", logits, targets),))


# --- JSON: the cost file's "tensor" field -------------------------------------------

_OP_FIELDS = (
    "id",
    "kind",
    "inputs",
    "out_bytes",
    "compute_s",
    "backward_s",
    "param_bytes",
    "in_features",
    "out_features",
    "heads",
    "kv_heads",
    "tokens",
    "grad",
    "source",
    "module",
)
_DEFAULTS = TensorOp("default", "other")


def tensor_graph_to_json(graph: TensorGraph) -> dict[str, Any]:
    """The graph as the cost file's ``tensor`` object (fields at their default left out)."""
    ops = []
    for op in graph.ops:
        item: dict[str, Any] = {"id": op.id, "kind": op.kind}
        for name in _OP_FIELDS[2:]:
            value = getattr(op, name)
            if value != getattr(_DEFAULTS, name):
                item[name] = list(value) if isinstance(value, tuple) else value
        ops.append(item)
    data: dict[str, Any] = {
        "batch_size": graph.batch_size,
        "outputs": list(graph.outputs),
        "ops": ops,
    }
    if graph.notes:
        data["notes"] = list(graph.notes)
    return data


def parse_tensor_graph(data: Any, where: str) -> TensorGraph:
    """The cost file's ``tensor`` object; ``where`` is ``FILE:$.tensor``. Errors name the
    JSON path of the field at fault (raised as ``ValueError``, with that path first)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: must be an object of batch_size, outputs and ops")
    unknown = sorted(set(data) - {"batch_size", "outputs", "ops", "notes"})
    if unknown:
        raise ValueError(
            f"{where}: unknown field {', '.join(map(repr, unknown))}; known fields are "
            "batch_size, outputs, ops, notes"
        )
    items = data.get("ops")
    if not isinstance(items, list):
        raise ValueError(f"{where}.ops: must be an array of ops")
    ops = []
    for index, item in enumerate(items):
        at = f"{where}.ops[{index}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{at}: must be an object")
        unknown = sorted(set(item) - set(_OP_FIELDS))
        if unknown:
            raise ValueError(
                f"{at}: unknown field {', '.join(map(repr, unknown))}; known fields are "
                f"{', '.join(_OP_FIELDS)}"
            )
        fields = dict(item)
        if not isinstance(fields.get("inputs", []), list):
            raise ValueError(f"{at}.inputs: must be an array of op ids")
        fields["inputs"] = tuple(fields.get("inputs", ()))
        for name in ("tokens", "grad"):
            if not isinstance(fields.get(name, True), bool):
                raise ValueError(f"{at}.{name}: must be true or false")
        try:
            ops.append(TensorOp(**fields))
        except (TypeError, ValueError) as error:
            raise ValueError(f"{at}: {error}") from None
    outputs = data.get("outputs")
    if not isinstance(outputs, list) or not all(isinstance(name, str) for name in outputs):
        raise ValueError(f"{where}.outputs: must be an array of op ids")
    notes = data.get("notes", [])
    if not isinstance(notes, list):
        raise ValueError(f"{where}.notes: must be an array of strings")
    try:
        return TensorGraph(
            tuple(ops), tuple(outputs), data.get("batch_size", 1), tuple(map(str, notes))
        )
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None

"""Which layouts each op of a tensor graph can run in, and what each costs a device.

A value between ops is in one of four **states** on the ``N`` devices of the group:

* ``R`` replicated: every device holds it whole;
* ``C`` split on its last dimension (features, or heads on head boundaries);
* ``P`` a partial sum: the value is the sum of the devices' tensors;
* ``S`` split on the sequence dimension (sequence parallelism).

An op's **mode** says which state it reads each input in, which state its output is
in, and by how much its compute and weights divide. A linear ``y = x W`` runs
``replicated`` (``R -> R``), ``column`` (output features split: ``R -> C``; the gradient of
its input is then a partial sum on each device), ``row`` (input features split:
``C -> P``), or ``sequence`` (whole weights over ``1/N`` of the tokens: ``S -> S``; its
weights' gradients are summed over the devices). An embedding splits by ``vocab``
(``R -> P``: rows outside a device's slice look up zeros) or by ``width`` (``R -> C``).
Point-wise ops keep whatever split their inputs share; a sum also adds partial sums,
and runs split where both its inputs are, except on the residual stream (a sum whose
value a norm reads, directly or through other sums): splitting that is what sequence
parallelism means, and without it the stream stays whole as in Megatron-LM (a split sum
there saves only its own time, between a gather and a norm);
norms and softmax reduce over the last dimension, so they run ``R`` or ``S``; attention
runs whole, or by ``heads`` when q, k, v are split on head boundaries (``query-heads``:
only q split, k and v whole, when the key/value heads do not divide). A loss runs whole
or ``vocab``-parallel on split logits (Megatron's cross-entropy: three all-reduces of one
number per token). Anything else runs replicated.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from syncpass.contracts.tensor import TensorGraph, TensorOp

STATES = ("R", "C", "P", "S")
#: What each state is called in reports.
STATE_NAMES = {
    "R": "replicated",
    "C": "split on the last dimension",
    "P": "partial sum",
    "S": "split on the sequence",
}


@dataclass(frozen=True)
class Use:
    """How a mode reads one input: in ``state``; ``partial_grad`` when it reads it whole
    but computes only its own part, so the input's gradient is a partial sum on each
    device (a column-split linear reading a replicated input)."""

    state: str
    partial_grad: bool = False


@dataclass(frozen=True)
class Mode:
    """One way an op can run on the group.

    ``compute_divisor`` divides its compute, ``param_divisor`` its weights (and their
    gradients and optimizer state). ``grad_reduce_bytes`` are weight-gradient bytes the
    devices must sum once per step (whole weights over a split sequence).
    ``internal_all_reduce_bytes`` are bytes the op all-reduces forward within itself
    (the vocabulary-parallel loss's per-token statistics), one all-reduce each.
    """

    layout: str
    inputs: tuple[Use, ...]
    output: str
    compute_divisor: int = 1
    param_divisor: int = 1
    grad_reduce_bytes: float = 0.0
    internal_all_reduce_bytes: tuple[float, ...] = ()
    why: str = ""


def _same(op: TensorOp, layout: str, state: str, divisor: int, why: str = "") -> Mode:
    return Mode(layout, tuple(Use(state) for _ in op.inputs), state, divisor, why=why)


def _sequence(op: TensorOp, graph_tokens: Mapping[str, bool], tp: int) -> Mode | None:
    """The op on ``1/N`` of the tokens, whole weights: every token-wise input split on the
    sequence (the others whole), the weights' gradients summed over the group."""
    if not op.tokens or not any(graph_tokens[name] for name in op.inputs):
        return None
    return Mode(
        "sequence",
        tuple(Use("S" if graph_tokens[name] else "R") for name in op.inputs),
        "S",
        compute_divisor=tp,
        grad_reduce_bytes=op.param_bytes,
        why="runs on its device's part of the sequence",
    )


def op_modes(
    op: TensorOp,
    tp: int,
    tokens: Mapping[str, bool],
    sizes: Mapping[str, float],
    sequence_parallel: bool,
    residual: bool,
) -> tuple[Mode, ...]:
    """Every mode ``op`` can run in on ``tp`` devices; ``tokens`` says which values have a
    sequence dimension, ``sizes`` their bytes; ``sequence`` modes only when
    ``sequence_parallel``; ``residual``: ``op`` is a sum on the residual stream."""
    n = tp
    modes: list[Mode] = []
    if op.kind == "input":
        return (Mode("replicated", (), "R"),)
    if op.kind == "other":
        return (_same(op, "replicated", "R", 1),)
    if op.kind == "linear":
        assert op.in_features is not None and op.out_features is not None
        modes.append(_same(op, "replicated", "R", 1))
        if n > 1 and op.out_features % n == 0:
            modes.append(
                Mode(
                    "column",
                    (Use("R", partial_grad=True),),
                    "C",
                    n,
                    n,
                    why="output features split",
                )
            )
        if n > 1 and op.in_features % n == 0:
            modes.append(Mode("row", (Use("C"),), "P", n, n, why="input features split"))
    elif op.kind == "embedding":
        assert op.in_features is not None and op.out_features is not None
        modes.append(_same(op, "replicated", "R", 1))
        if n > 1 and op.in_features % n == 0:
            modes.append(Mode("vocab", (Use("R"),), "P", n, n, why="vocabulary split"))
        if n > 1 and op.out_features % n == 0:
            modes.append(Mode("width", (Use("R"),), "C", n, n, why="width split"))
    elif op.kind in ("elementwise", "reshape"):
        modes.append(_same(op, "replicated", "R", 1))
        if n > 1:
            modes.append(_same(op, "split", "C", n, "point-wise on its device's features"))
        if op.kind == "reshape":
            modes.append(_same(op, "partial", "P", 1, "moves the partial sums as they are"))
    elif op.kind == "add":
        modes.append(_same(op, "replicated", "R", 1))
        # A sum of two split values (both halves of a rotary embedding) runs split; one on
        # the residual stream only under sequence parallelism (residual_adds).
        if n > 1 and (sequence_parallel or not residual):
            modes.append(_same(op, "split", "C", n, "adds its device's features"))
        if n > 1:
            modes.append(_same(op, "partial", "P", 1, "adds partial sums"))
    elif op.kind in ("norm", "softmax"):
        modes.append(_same(op, "replicated", "R", 1))
    elif op.kind == "attention":
        modes.append(_same(op, "replicated", "R", 1))
        heads, kv = op.heads, op.key_value_heads
        assert heads is not None and kv is not None
        if n > 1 and heads % n == 0 and kv % n == 0:
            modes.append(_same(op, "heads", "C", n, f"{heads // n} of {heads} heads per device"))
        elif n > 1 and heads % n == 0 and len(op.inputs) == 3:
            modes.append(
                Mode(
                    "query-heads",
                    (Use("C"), Use("R"), Use("R")),
                    "C",
                    n,
                    why=f"{heads // n} of {heads} query heads per device; the {kv} key/value "
                    f"heads do not divide by {n}, so k and v stay whole",
                )
            )
    elif op.kind == "loss":
        modes.append(_same(op, "replicated", "R", 1))
        if n > 1 and op.in_features is not None and op.in_features % n == 0:
            # One number per token position for each statistic (max, sum of exponentials,
            # the target's logit): the logits' bytes over their classes.
            rows = sizes[op.inputs[0]] / op.in_features
            modes.append(
                Mode(
                    "vocab",
                    (Use("C"), *(Use("R") for _ in op.inputs[1:])),
                    "R",
                    n,
                    internal_all_reduce_bytes=(rows, rows, rows),
                    why="vocabulary-parallel cross-entropy",
                )
            )
    if sequence_parallel and n > 1 and op.kind not in ("attention", "loss"):
        mode = _sequence(op, tokens, n)
        if mode is not None:
            modes.append(mode)
    return tuple(modes)


#: States a value in one state can be turned into (forward): slicing a whole value is
#: free, a split one is gathered (then sliced), a partial sum all-reduced or
#: reduce-scattered.
REACHABLE = {
    "R": frozenset({"R", "C", "S"}),
    "C": frozenset({"C", "R", "S"}),
    "S": frozenset({"S", "R", "C"}),
    "P": frozenset({"P", "R", "C", "S"}),
}
#: Without sequence parallelism no value is split again after it was whole or summed:
#: a split comes only from an op whose weights are split (Megatron-LM's regions), and
#: what runs between the split layers (norms, residual sums, dropout) runs whole.
REACHABLE_WHOLE = {
    "R": frozenset({"R"}),
    "C": frozenset({"C", "R"}),
    "S": frozenset({"S", "R"}),
    "P": frozenset({"P", "R"}),
}


def residual_adds(graph: TensorGraph) -> frozenset[str]:
    """The sums on the residual stream: those whose value a norm reads, directly or through
    other such sums."""
    consumers = graph.consumers
    kinds = {op.id: op.kind for op in graph.ops}
    found: set[str] = set()
    for op in reversed(graph.ops):
        if op.kind == "add" and any(
            kinds[reader] == "norm" or reader in found for reader in consumers[op.id]
        ):
            found.add(op.id)
    return frozenset(found)


def reachable(made: str, resplit: bool) -> frozenset[str]:
    """The states a value made in ``made`` can be read in; ``resplit`` (sequence
    parallelism) lets a whole or summed value be split again."""
    return (REACHABLE if resplit else REACHABLE_WHOLE)[made]


def contribution(produced: str, use: Use) -> str:
    """What the gradient one reader sends back is, as the producer needs it summed.

    A producer in ``R`` or ``P`` needs its gradient whole (``R``); in ``C`` or ``S`` its own
    part. The reader's gradient is ``R`` (whole and equal on every device: nothing to do),
    ``P`` (a partial sum to reduce), ``C`` or ``S`` (parts to gather).
    """
    t = use.state
    if produced in ("R", "P"):
        if t == "R":
            return "P" if use.partial_grad else "R"
        if t == "P":
            return "R"  # the gradient of a partial sum is the whole gradient
        return t  # C or S: each device holds its part of the gradient
    # produced C or S: the producer needs its own part of the gradient
    if t == produced:
        return "R"
    if t == "R":
        return "P" if use.partial_grad else "R"
    return "P"  # read in the other split, through a gather: a reduce-scatter back

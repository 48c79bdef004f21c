"""The tensor-parallel optimiser is exact: it agrees with exhaustive search on random small
graphs, and its cost model gives the collectives of a hand-worked Megatron MLP."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncpass.contracts.tensor import TensorGraph, TensorOp
from syncpass.plan.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_s
from syncpass.plan.tensor_optimizer import (
    Evaluation,
    Link,
    NoTensorPlan,
    TensorProblem,
    evaluate,
    layouts,
    solve,
)

ALPHA, BETA = 1e-5, 1e11


def test_ring_collectives_follow_the_alpha_beta_model() -> None:
    size = 8e6
    step = ALPHA + size / 4 / BETA  # one of the N - 1 steps of a ring over 4 devices
    assert collective_s(ALL_GATHER, size, 4, ALPHA, BETA) == pytest.approx(3 * step)
    assert collective_s(REDUCE_SCATTER, size, 4, ALPHA, BETA) == pytest.approx(3 * step)
    assert collective_s(ALL_REDUCE, size, 4, ALPHA, BETA) == pytest.approx(6 * step)
    assert collective_s(ALL_REDUCE, size, 1, ALPHA, BETA) == 0.0


def _mlp() -> TensorGraph:
    """x -> fc1 (8 -> 32) -> gelu -> fc2 (32 -> 8) -> + x."""
    return TensorGraph(
        (
            TensorOp("x", "input", out_bytes=1000, grad=True),
            TensorOp(
                "fc1", "linear", ("x",), 4000, 1e-3, 2e-3, 512, in_features=8, out_features=32
            ),
            TensorOp("gelu", "elementwise", ("fc1",), 4000, 1e-4, 1e-4),
            TensorOp(
                "fc2", "linear", ("gelu",), 1000, 1e-3, 2e-3, 512, in_features=32, out_features=8
            ),
            TensorOp("res", "add", ("x", "fc2"), 1000, 1e-5, 1e-5),
        ),
        outputs=("res",),
    )


def test_megatron_mlp_costs_one_all_reduce_each_way() -> None:
    problem = TensorProblem(_mlp(), 4, Link(ALPHA, BETA), sequence_parallel=False)
    megatron = evaluate(problem, layouts(problem, {"fc1": "column", "gelu": "split", "fc2": "row"}))
    kinds = sorted((item.value, item.kind, item.direction) for item in megatron.collectives)
    # fc2's partial sums are reduced before the residual sum; x's gradient, a partial sum
    # from the column-split fc1, is reduced in the backward.
    assert kinds == [("fc2", ALL_REDUCE, "forward"), ("x", ALL_REDUCE, "backward")]
    all_reduce = collective_s(ALL_REDUCE, 1000, 4, ALPHA, BETA)
    assert megatron.comm_s == pytest.approx(2 * all_reduce)
    compute = (3e-3 + 2e-4 + 3e-3) / 4 + 2e-5
    assert megatron.compute_s == pytest.approx(compute)
    assert megatron.step_s == pytest.approx(compute + 2 * all_reduce)
    # Inference pays the forward all-reduce only.
    forward = TensorProblem(_mlp(), 4, Link(ALPHA, BETA), training=False, sequence_parallel=False)
    assert evaluate(forward, megatron.modes).comm_s == pytest.approx(all_reduce)


def _rotary_block() -> TensorGraph:
    """x -> q (column-able) -> two point-wise halves summed (a rotary embedding) -> o ->
    + x -> norm: the first sum adds two values of one split; the second is the residual
    stream, which a norm reads."""
    return TensorGraph(
        (
            TensorOp("x", "input", out_bytes=1000, grad=True),
            TensorOp("q", "linear", ("x",), 1000, 1e-3, 2e-3, 512, in_features=8, out_features=8),
            TensorOp("cos", "elementwise", ("q",), 1000, 1e-3, 1e-3),
            TensorOp("sin", "elementwise", ("q",), 1000, 1e-3, 1e-3),
            TensorOp("rotary", "add", ("cos", "sin"), 1000, 1e-3, 1e-3),
            TensorOp(
                "o", "linear", ("rotary",), 1000, 1e-3, 2e-3, 512, in_features=8, out_features=8
            ),
            TensorOp("res", "add", ("x", "o"), 1000, 1e-3, 1e-3),
            TensorOp("norm", "norm", ("res",), 1000, 1e-4, 1e-4),
        ),
        outputs=("norm",),
    )


def test_a_sum_of_split_values_runs_split_and_the_residual_stream_stays_whole() -> None:
    problem = TensorProblem(_rotary_block(), 2, Link(ALPHA, BETA), sequence_parallel=False)
    chosen = solve(problem).modes
    found = {op.id: mode.layout for op, mode in zip(problem.graph.ops, chosen, strict=True)}
    # Between q (column) and o (row) every op runs on its device's features, the sum of
    # the two halves included: one all-reduce forward, after o, as Megatron's attention.
    assert (found["q"], found["rotary"], found["o"]) == ("column", "split", "row")
    assert found["res"] in ("replicated", "partial")
    layouts_of = {mode.layout for mode in problem.modes[problem.graph.index["res"]]}
    assert "split" not in layouts_of  # a norm reads it: only sequence parallelism splits it
    parallel = TensorProblem(_rotary_block(), 2, Link(ALPHA, BETA), sequence_parallel=True)
    assert "split" in {mode.layout for mode in parallel.modes[parallel.graph.index["res"]]}


def test_memory_divides_split_weights_and_activations() -> None:
    problem = TensorProblem(_mlp(), 4, Link(ALPHA, BETA), memory_multiplier=4.0)
    whole = evaluate(problem, layouts(problem, {}))
    split = evaluate(problem, layouts(problem, {"fc1": "column", "gelu": "split", "fc2": "row"}))
    activations = 1000 + 4000 + 4000 + 1000 + 1000
    assert whole.memory_bytes == pytest.approx(4 * 1024 + activations)
    # fc1's and gelu's outputs are split; fc2's partial sums are whole on each device.
    assert split.memory_bytes == pytest.approx(4 * 1024 / 4 + 1000 + 1000 + 1000 + 2000)


def test_a_memory_limit_forces_the_split() -> None:
    link = Link(1.0, BETA, memory_bytes=4 * 1024 / 4 + 6000)  # a latency no split pays back
    problem = TensorProblem(_mlp(), 4, link, sequence_parallel=False)
    best = solve(problem)
    assert best.fits
    assert [mode.layout for mode in best.modes[1:4]] == ["column", "split", "row"]
    free = solve(TensorProblem(_mlp(), 4, Link(1.0, BETA), sequence_parallel=False))
    assert all(mode.layout == "replicated" for mode in free.modes)
    with pytest.raises(NoTensorPlan):
        solve(TensorProblem(_mlp(), 4, Link(1.0, BETA, memory_bytes=1000)))


# --- exhaustive search on random graphs ------------------------------------------------

FEATURES = (2, 3, 4, 6, 8, 12)
KINDS = ("linear", "elementwise", "add", "norm", "softmax", "attention", "reshape", "other")


@st.composite
def graphs(draw: st.DrawFn) -> TensorGraph:
    size = st.floats(0, 1e4)
    time = st.floats(0, 1e-3)
    ops: list[TensorOp] = [TensorOp("in0", "input", out_bytes=draw(size), grad=draw(st.booleans()))]
    if draw(st.booleans()):
        ops.append(
            TensorOp(
                "emb",
                "embedding",
                ("in0",),
                draw(size),
                draw(time),
                draw(time),
                draw(size),
                in_features=draw(st.sampled_from(FEATURES)),
                out_features=draw(st.sampled_from(FEATURES)),
            )
        )
    count = draw(st.integers(1, 5 - len(ops) + 1))
    for index in range(count):
        kind = draw(st.sampled_from(KINDS))
        earlier = [op.id for op in ops]
        pick = st.sampled_from(earlier)
        name = f"op{index}"
        common = dict(
            out_bytes=draw(size),
            compute_s=draw(time),
            backward_s=draw(time),
            tokens=draw(st.booleans()) or kind != "elementwise",
        )
        if kind == "linear":
            op = TensorOp(
                name,
                kind,
                (draw(pick),),
                param_bytes=draw(size),
                in_features=draw(st.sampled_from(FEATURES)),
                out_features=draw(st.sampled_from(FEATURES)),
                **common,
            )
        elif kind == "attention":
            heads = draw(st.sampled_from((2, 4, 6, 12)))
            kv = draw(st.sampled_from([k for k in (1, 2, 3, 4, 6, 12) if heads % k == 0]))
            arity = draw(st.sampled_from((1, 3)))
            inputs = tuple(draw(pick) for _ in range(arity))
            op = TensorOp(name, kind, inputs, heads=heads, kv_heads=kv, **common)
        elif kind in ("add",):
            op = TensorOp(name, kind, (draw(pick), draw(pick)), **common)
        elif kind == "elementwise":
            inputs = tuple(draw(pick) for _ in range(draw(st.integers(1, 2))))
            op = TensorOp(name, kind, inputs, **common)
        elif kind == "norm":
            op = TensorOp(name, kind, (draw(pick),), param_bytes=draw(size), **common)
        elif kind == "other":
            op = TensorOp(name, kind, (draw(pick),), **common)
        else:
            op = TensorOp(name, kind, (draw(pick),), **common)
        ops.append(op)
    if draw(st.booleans()):
        logits = draw(st.sampled_from([op.id for op in ops]))
        ops.append(
            TensorOp(
                "loss",
                "loss",
                (logits, "in0"),
                out_bytes=4,
                compute_s=draw(time),
                in_features=draw(st.sampled_from(FEATURES)),
                tokens=False,
            )
        )
    names = [op.id for op in ops]
    outputs = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    return TensorGraph(tuple(ops), tuple(outputs))


def exhaustive(problem: TensorProblem) -> Evaluation | None:
    """The least step over every assignment of modes that is legal and fits."""
    best: Evaluation | None = None
    for modes in itertools.product(*problem.modes):
        try:
            scored = evaluate(problem, modes)
        except ValueError:  # an input read in a state it cannot be turned into
            continue
        if scored.fits and (best is None or scored.step_s < best.step_s):
            best = scored
    return best


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=graphs(),
    tp=st.sampled_from((2, 3, 4)),
    alpha=st.sampled_from((0.0, 1e-6, 1e-4)),
    beta=st.sampled_from((1e6, 1e8, 1e10)),
    training=st.booleans(),
    sequence_parallel=st.booleans(),
    memory=st.one_of(st.none(), st.floats(0, 1e5)),
)
def test_the_dynamic_program_equals_exhaustive_search(
    graph: TensorGraph,
    tp: int,
    alpha: float,
    beta: float,
    training: bool,
    sequence_parallel: bool,
    memory: float | None,
) -> None:
    problem = TensorProblem(
        graph,
        tp,
        Link(alpha, beta, memory_bytes=None if memory is None else max(memory, 1e-9)),
        training=training,
        sequence_parallel=sequence_parallel,
    )
    expected = exhaustive(problem)
    if expected is None:
        with pytest.raises(NoTensorPlan):
            solve(problem)
        return
    found = solve(problem)
    assert found.fits
    assert math.isclose(found.step_s, expected.step_s, rel_tol=1e-9, abs_tol=1e-15)
    # What the optimiser reports is what its assignment scores.
    again = evaluate(problem, found.modes)
    assert again.step_s == pytest.approx(found.step_s, rel=1e-12, abs=1e-18)

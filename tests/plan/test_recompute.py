"""The optimiser that also chooses which ops recompute their activations is exact: it
agrees with exhaustive search over every plan and every store-or-recompute choice on
random small instances, and recomputes nothing when memory does not bind."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.plan.optimizer import Infeasible, Problem, solve
from syncpass.plan.recompute import (
    RecomputeProblem,
    RecomputeSolution,
    in_flight_counts,
    score_recompute,
    solve_recompute,
)

INF = math.inf

# Dyadic figures keep every sum exact in floating point, so "equal" means equal.
quarter = st.integers(0, 8).map(lambda k: k / 4)
eighth = st.integers(0, 8).map(lambda k: k / 8)
positive = st.integers(1, 8).map(lambda k: k / 4)  # recomputing takes time


def _ratio(comm: float, compute: float) -> float:
    if comm == 0:
        return 0.0
    return INF if compute <= 0 else comm / compute


def _subsets(ops: list[int]) -> list[frozenset[int]]:
    return [
        frozenset(chosen)
        for size in range(len(ops) + 1)
        for chosen in itertools.combinations(ops, size)
    ]


def joint_plans(problem: RecomputeProblem) -> list[tuple[float, tuple[float, float, float]]]:
    """Every legal (cuts, recompute choice) but the threshold: (max ratio, (bottleneck,
    communication, time recomputed)). Enumerated independently of the optimiser."""
    base = problem.base
    n, stages = base.num_ops, problem.stages
    admissible = [j for j in range(1, n) if base.admissible[j]]
    pinned = {j for j in range(1, n) if base.pinned[j]}
    found = []
    for cuts in itertools.combinations(admissible, stages - 1):
        if not pinned <= set(cuts):
            continue
        pairs = list(itertools.pairwise((0, *cuts, n)))
        if any(end - start < base.min_ops for start, end in pairs):
            continue
        if base.last_use is not None and any(base.last_use[start] > end for start, end in pairs):
            continue
        ratio = max(
            [
                _ratio(float(base.cut_comm[end]), base.stage_compute(start, end))
                for start, end in pairs[:-1]
            ],
            default=0.0,
        )
        comm = 0.0
        for cut in cuts:
            comm += float(base.cut_comm[cut])
        choices = [
            _subsets([t for t in range(start, end) if problem.candidate[t]]) for start, end in pairs
        ]
        for chosen in itertools.product(*choices):
            if any(
                problem.stage_memory(start, end, place, chosen[place]) > base.memory_limit
                for place, (start, end) in enumerate(pairs)
            ):
                continue
            times, recomputed = [], 0.0
            for (start, end), ops in zip(pairs, chosen, strict=True):
                extra = 0.0
                for t in sorted(ops):
                    extra += float(problem.recompute_s[t])
                times.append(base.stage_time(start, end) + extra)
                recomputed += extra
            found.append((ratio, (max(times), comm, recomputed)))
    return found


@st.composite
def instances(draw: st.DrawFn) -> tuple[RecomputeProblem, float, bool]:
    n = draw(st.integers(1, 6))
    stages = draw(st.integers(1, min(n, 3)))
    ops = st.lists(quarter, min_size=n, max_size=n)
    admissible = np.array(
        [
            False,
            *draw(st.lists(st.sampled_from([True, True, False]), min_size=n - 1, max_size=n - 1)),
            False,
        ]
    )
    comm = np.array([0.0, *draw(st.lists(eighth, min_size=n - 1, max_size=n - 1)), 0.0])
    pinned = admissible & np.array(
        draw(st.lists(st.sampled_from([False] * 6 + [True]), min_size=n + 1, max_size=n + 1))
    )
    last_use = None
    if draw(st.booleans()):
        furthest = [draw(st.integers(p, n + 1)) for p in range(n + 1)]
        last_use = np.maximum.accumulate(np.array(furthest, dtype=np.int64))
    base = Problem(
        op_compute=np.array(draw(ops)),
        op_memory=np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), float),
        cut_comm=np.where(admissible, comm, 0.0),
        admissible=admissible,
        pinned=pinned,
        min_ops=draw(st.integers(1, 2)),
        memory_limit=draw(st.sampled_from([INF, 8.0, 12.0, 16.0, 24.0, 32.0])),
        last_use=last_use,
    )
    activation = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), float)
    kept = np.minimum(
        activation, np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), float)
    )
    schedule = draw(st.sampled_from(["1f1b", "gpipe"]))
    problem = RecomputeProblem(
        base=base,
        activation=activation,
        kept=kept,
        recompute_s=np.array(draw(st.lists(positive, min_size=n, max_size=n))),
        candidate=np.array(
            draw(st.lists(st.sampled_from([True, True, False]), min_size=n, max_size=n))
        ),
        in_flight=np.array(in_flight_counts(schedule, stages, draw(st.integers(1, 3)))),
    )
    threshold = draw(st.sampled_from([INF, INF, 0.0, 0.25, 1.0]))
    return problem, threshold, draw(st.booleans())


@settings(max_examples=400, deadline=None)
@given(instances())
def test_solve_recompute_equals_exhaustive_search(
    instance: tuple[RecomputeProblem, float, bool],
) -> None:
    problem, threshold, adaptive = instance
    plans = joint_plans(problem)
    result = solve_recompute(problem, threshold, adaptive)
    if not plans:
        assert isinstance(result, Infeasible)
        return
    least_ratio = min(ratio for ratio, _ in plans)
    if least_ratio > threshold and not adaptive:
        assert result == Infeasible("threshold", least_ratio)
        return
    used = max(threshold, least_ratio) if least_ratio > threshold else threshold
    expected = min(objective for ratio, objective in plans if ratio <= used)
    assert isinstance(result, RecomputeSolution)
    assert result.threshold_used == used
    assert (result.bottleneck, result.total_comm, result.total_recompute) == expected
    # The choice returned is a legal one with those figures.
    for place, (start, end) in enumerate(
        itertools.pairwise((0, *result.cuts, problem.base.num_ops))
    ):
        chosen = frozenset(result.recomputed[place])
        assert all(start <= t < end and problem.candidate[t] for t in chosen)
        assert problem.stage_memory(start, end, place, chosen) <= problem.base.memory_limit
    assert score_recompute(problem, result.cuts, used) == result


@settings(max_examples=200, deadline=None)
@given(instances())
def test_without_a_memory_limit_nothing_recomputes_and_the_cuts_are_the_optimisers(
    instance: tuple[RecomputeProblem, float, bool],
) -> None:
    problem, threshold, adaptive = instance
    free = dataclasses.replace(problem, base=dataclasses.replace(problem.base, memory_limit=INF))
    result = solve_recompute(free, threshold, adaptive)
    plain = solve(free.base, free.stages, threshold, adaptive, method="table")
    if isinstance(plain, Infeasible):
        assert result == plain
        return
    assert isinstance(result, RecomputeSolution)
    assert result.cuts == plain.cuts
    assert result.total_recompute == 0 and not any(result.recomputed)


def test_a_stack_that_fits_only_recomputing_recomputes_the_fewest_blocks() -> None:
    # Six equal blocks of 1 s, 4 bytes stored or 1 kept per micro-batch; 2 stages of
    # 1F1B with 4 micro-batches: stage 0 keeps 2 in flight, stage 1 one.
    blocks = 6
    base = Problem(
        op_compute=np.ones(blocks),
        op_memory=np.zeros(blocks),
        cut_comm=np.zeros(blocks + 1),
        admissible=np.array([False, *[True] * (blocks - 1), False]),
        pinned=np.zeros(blocks + 1, dtype=bool),
        memory_limit=18.0,
    )
    problem = RecomputeProblem(
        base=base,
        activation=np.full(blocks, 4.0),
        kept=np.ones(blocks),
        recompute_s=np.full(blocks, 0.5),
        candidate=np.ones(blocks, dtype=bool),
        in_flight=np.array(in_flight_counts("1f1b", 2, 4)),
    )
    assert tuple(problem.in_flight) == (2, 1)
    result = solve_recompute(problem, INF, adaptive=True)
    assert isinstance(result, RecomputeSolution)
    # 3 + 3: stage 0 needs 2 * (4 * 3) = 24 > 18, so it recomputes 1 block (2 * 9 = 18);
    # stage 1 keeps one micro-batch (12). Bottleneck 3.5 s.
    assert result.cuts == (3,)
    assert [len(ops) for ops in result.recomputed] == [1, 0]
    assert result.bottleneck == 3.5
    # Storing everything fits only 2 + 4 blocks (2 * 8 and 1 * 16 bytes): 4 s.
    stored = solve_recompute(problem.without_choice(), INF, True)
    assert isinstance(stored, RecomputeSolution)
    assert (stored.cuts, stored.bottleneck) == ((2,), 4.0)
    # Recomputing every block: 3 + 3 at 3 + 1.5 s.
    every = solve_recompute(problem.recomputing_all(), INF, True)
    assert isinstance(every, RecomputeSolution) and every.bottleneck == 4.5


def test_recomputing_every_block_reads_the_threshold_as_the_choice_does() -> None:
    """The "recompute every block" plan beside the chosen one: its cut's ratio is over the
    stage's compute without what it recomputes, as for any plan (folding the recomputation
    into the compute would let it pass a threshold the choice could not)."""
    base = Problem(
        op_compute=np.ones(2),
        op_memory=np.zeros(2),
        cut_comm=np.array([0.0, 0.12, 0.0]),
        admissible=np.array([False, True, False]),
        pinned=np.zeros(3, dtype=bool),
        memory_limit=100.0,
    )
    problem = RecomputeProblem(
        base=base,
        activation=np.full(2, 4.0),
        kept=np.ones(2),
        recompute_s=np.full(2, 0.5),
        candidate=np.ones(2, dtype=bool),
        in_flight=np.array([2, 1]),
    )
    chosen = solve_recompute(problem, 0.1, adaptive=True)
    every = solve_recompute(problem.every_candidate(), 0.1, adaptive=True)
    assert isinstance(chosen, RecomputeSolution) and isinstance(every, RecomputeSolution)
    assert chosen.threshold_used == every.threshold_used == pytest.approx(0.12)
    assert every.recomputed == ((0,), (1,))
    assert every.bottleneck == pytest.approx(1.0 + 0.12 + 0.5)
    assert every.bottleneck >= chosen.bottleneck


def test_memory_no_choice_fits_says_the_least_limit() -> None:
    base = Problem(
        op_compute=np.ones(2),
        op_memory=np.array([3.0, 3.0]),
        cut_comm=np.zeros(3),
        admissible=np.array([False, True, False]),
        pinned=np.zeros(3, dtype=bool),
        memory_limit=4.0,
    )
    problem = RecomputeProblem(
        base=base,
        activation=np.array([4.0, 4.0]),
        kept=np.array([1.0, 2.0]),
        recompute_s=np.ones(2),
        candidate=np.ones(2, dtype=bool),
        in_flight=np.array([2, 1]),
    )
    # Recomputing both: stage 0 needs 3 + 2 * 1 = 5, stage 1 3 + 2 = 5.
    assert solve_recompute(problem, INF, True) == Infeasible("memory", 5.0)


@pytest.mark.parametrize(("schedule", "expected"), [("1f1b", (3, 2, 1)), ("gpipe", (4, 4, 4))])
def test_in_flight_counts(schedule: str, expected: tuple[int, ...]) -> None:
    assert in_flight_counts(schedule, 3, 4) == expected
    assert in_flight_counts("1f1b", 4, 2) == (2, 2, 2, 1)

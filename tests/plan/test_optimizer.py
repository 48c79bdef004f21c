"""The optimiser is exact: it agrees with exhaustive search on random small instances."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.plan import optimizer
from syncpass.plan.optimizer import (
    Infeasible,
    Problem,
    Solution,
    _range_min,
    _smallest_accepted,
    _stab_max,
    min_threshold,
    rising_threshold_plans,
    score_cuts,
    solve,
)

INF = math.inf


@dataclass(frozen=True)
class Instance:
    problem: Problem
    stages: int
    threshold: float
    adaptive: bool


def _ratio(comm: float, compute: float) -> float:
    if comm == 0:
        return 0.0
    return INF if compute <= 0 else comm / compute


def legal_plans(problem: Problem, stages: int) -> list[tuple[tuple[int, ...], float, float, float]]:
    """Every plan meeting all constraints but the threshold: (cuts, max ratio, bottleneck, comm)."""
    n = problem.num_ops
    admissible = [j for j in range(1, n) if problem.admissible[j]]
    pinned = {j for j in range(1, n) if problem.pinned[j]}
    plans = []
    for cuts in itertools.combinations(admissible, stages - 1):
        if not pinned <= set(cuts):
            continue
        bounds = (0, *cuts, n)
        stage_pairs = list(itertools.pairwise(bounds))
        if any(end - start < problem.min_ops for start, end in stage_pairs):
            continue
        if any(
            sum(problem.op_memory[start:end]) > problem.memory_limit for start, end in stage_pairs
        ):
            continue
        # A value may only reach the next stage (torch pipelines).
        if problem.last_use is not None and any(
            problem.last_use[start] > end for start, end in stage_pairs
        ):
            continue
        computes = [float(sum(problem.op_compute[start:end])) for start, end in stage_pairs]
        ratios = [
            _ratio(float(problem.cut_comm[end]), c)
            for (_, end), c in zip(stage_pairs, computes, strict=True)
            if end < n
        ]
        times = [
            c + problem.cut_comm[start] + problem.cut_comm[end]
            for (start, end), c in zip(stage_pairs, computes, strict=True)
        ]
        comm = 0.0
        for cut in cuts:
            comm += float(problem.cut_comm[cut])
        plans.append((cuts, max(ratios, default=0.0), float(max(times)), comm))
    return plans


def brute_force(instance: Instance) -> tuple[float, float, float] | None:
    """(threshold used, bottleneck, total comm) of the best plan, or None if none is allowed."""
    plans = legal_plans(instance.problem, instance.stages)
    if not plans:
        return None
    if any(ratio <= instance.threshold for _, ratio, _, _ in plans):
        used = instance.threshold
    elif instance.adaptive:
        used = min(ratio for _, ratio, _, _ in plans)
    else:
        return None
    bottleneck, comm = min((b, c) for _, ratio, b, c in plans if ratio <= used)
    return used, bottleneck, comm


@contextlib.contextmanager
def tight_band() -> Iterator[None]:
    """Limits small enough that every search narrows its band by bisection, splits its
    pairs into chunks and bisects the threshold before enumerating the ratios."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optimizer, "_BAND_PAIRS", 40)
        patch.setattr(optimizer, "_CHUNK_PAIRS", 7)
        patch.setattr(optimizer, "_RATIO_CANDIDATES", 3)
        yield


# Dyadic costs keep every sum exact in floating point, so "equal" means equal.
quarter = st.integers(0, 8).map(lambda k: k / 4)
eighth = st.integers(0, 8).map(lambda k: k / 8)


@st.composite
def last_uses(draw: st.DrawFn, n: int) -> npt.NDArray[np.int64] | None:
    """None, or how far the values made up to each position are used (skip connections)."""
    if draw(st.booleans()):
        return None
    furthest = [draw(st.integers(p, n + 1)) for p in range(n + 1)]  # n + 1: the output
    return np.maximum.accumulate(np.array(furthest, dtype=np.int64))


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    n = draw(st.integers(1, 8))
    compute = np.array(draw(st.lists(quarter, min_size=n, max_size=n)))
    memory = np.array(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)), dtype=float)
    inner = draw(
        st.lists(st.sampled_from([True, True, True, False]), min_size=n - 1, max_size=n - 1)
    )
    admissible = np.array([False, *inner, False]) if n > 1 else np.array([False, False])
    comm = np.array([0.0, *draw(st.lists(eighth, min_size=n - 1, max_size=n - 1)), 0.0])
    comm = np.where(admissible, comm, 0.0)
    pin_flags = draw(
        st.lists(st.sampled_from([False] * 6 + [True]), min_size=n + 1, max_size=n + 1)
    )
    pinned = admissible & np.array(pin_flags)
    problem = Problem(
        op_compute=compute,
        op_memory=memory,
        cut_comm=comm,
        admissible=admissible,
        pinned=pinned,
        min_ops=draw(st.integers(1, 3)),
        memory_limit=draw(st.sampled_from([INF, 4.0, 6.0, 9.0, 14.0])),
        last_use=draw(last_uses(n)),
    )
    return Instance(
        problem=problem,
        stages=draw(st.integers(1, 4)),
        threshold=draw(st.sampled_from([INF, 0.0, 0.125, 0.25, 0.5, 1.0, 2.0])),
        adaptive=draw(st.booleans()),
    )


@pytest.mark.parametrize("method", ["table", "search", "narrowed search"])
@settings(max_examples=400, deadline=None)
@given(instance=instances())
def test_solve_equals_exhaustive_search(method: str, instance: Instance) -> None:
    expected = brute_force(instance)
    with tight_band() if method == "narrowed search" else contextlib.nullcontext():
        result = solve(
            instance.problem,
            instance.stages,
            instance.threshold,
            instance.adaptive,
            method=method.split()[-1],
        )
    if expected is None:
        assert isinstance(result, Infeasible)
        return
    assert isinstance(result, Solution)
    assert (result.threshold_used, result.bottleneck, result.total_comm) == expected
    # The cuts returned really have those figures and meet every constraint.
    score = score_cuts(instance.problem, result.cuts)
    assert (score.bottleneck, score.total_comm) == expected[1:]
    legal = {plan[0] for plan in legal_plans(instance.problem, instance.stages)}
    assert result.cuts in legal
    assert all(stage.cut_ratio <= result.threshold_used for stage in score.stages)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_min_threshold_is_the_least_max_ratio(instance: Instance) -> None:
    plans = legal_plans(instance.problem, instance.stages)
    found = min_threshold(instance.problem, instance.stages)
    if not plans:
        assert found is None
    else:
        assert found == min(ratio for _, ratio, _, _ in plans)


def test_adaptive_raises_threshold_to_a_candidate_ratio() -> None:
    # Two ops of compute 1 and 3; the only cut sends 1 s. Ratio = 1/1.
    problem = Problem(
        op_compute=np.array([1.0, 3.0]),
        op_memory=np.zeros(2),
        cut_comm=np.array([0.0, 1.0, 0.0]),
        admissible=np.array([False, True, False]),
        pinned=np.zeros(3, dtype=bool),
    )
    adaptive = solve(problem, 2, 0.1, adaptive=True, method="search")
    assert adaptive == solve(problem, 2, 0.1, adaptive=True, method="table")
    assert isinstance(adaptive, Solution)
    assert adaptive.threshold_used == 1.0
    assert adaptive.cuts == (1,)
    for method in ("table", "search"):
        assert solve(problem, 2, 0.1, adaptive=False, method=method) == Infeasible("threshold", 1.0)


def test_diagnoses_memory_with_the_memory_that_would_do() -> None:
    problem = Problem(
        op_compute=np.ones(4),
        op_memory=np.array([3.0, 3.0, 5.0, 1.0]),
        cut_comm=np.zeros(5),
        admissible=np.array([False, True, True, True, False]),
        pinned=np.zeros(5, dtype=bool),
        memory_limit=4.0,
    )
    for method in ("table", "search"):
        assert solve(problem, 2, INF, adaptive=True, method=method) == Infeasible("memory", 6.0)


def test_diagnoses_too_many_stages() -> None:
    problem = Problem(
        op_compute=np.ones(3),
        op_memory=np.zeros(3),
        cut_comm=np.zeros(4),
        admissible=np.array([False, True, True, False]),
        pinned=np.zeros(4, dtype=bool),
        min_ops=2,
    )
    for method in ("table", "search"):
        assert solve(problem, 2, INF, adaptive=True, method=method) == Infeasible("stages")


def test_tie_cost_breaks_ties_between_equal_bottlenecks() -> None:
    problem = Problem(
        op_compute=np.array([1.0, 0.0, 1.0]),
        op_memory=np.zeros(3),
        cut_comm=np.zeros(4),
        admissible=np.array([False, True, True, False]),
        pinned=np.zeros(4, dtype=bool),
    )
    prefer_second = np.array([0.0, 1.0, 0.0, 0.0])
    for method in ("table", "search"):
        first = solve(problem, 2, INF, adaptive=False, method=method)
        second = solve(problem, 2, INF, adaptive=False, tie_cost=prefer_second, method=method)
        assert isinstance(first, Solution) and isinstance(second, Solution)
        assert first.cuts == (1,)  # earliest on a tie
        assert second.cuts == (2,)


def test_problem_rejects_inconsistent_arrays() -> None:
    with pytest.raises(ValueError, match="pinned cut must be admissible"):
        Problem(
            op_compute=np.ones(2),
            op_memory=np.zeros(2),
            cut_comm=np.zeros(3),
            admissible=np.zeros(3, dtype=bool),
            pinned=np.array([False, True, False]),
        )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-50, 50), min_size=1, max_size=40),
    st.data(),
)
def test_range_and_stab_queries_match_loops(values: list[int], data: st.DataObject) -> None:
    size = len(values)
    array = np.array(values, dtype=float)
    count = data.draw(st.integers(1, 10))
    lo = np.array(data.draw(st.lists(st.integers(0, size - 1), min_size=count, max_size=count)))
    hi = np.array(data.draw(st.lists(st.integers(-1, size - 1), min_size=count, max_size=count)))
    expected_min = [min(values[a : b + 1]) if a <= b else INF for a, b in zip(lo, hi, strict=True)]
    assert _range_min(array, lo, hi).tolist() == expected_min
    weights = np.array(
        data.draw(st.lists(st.integers(-9, 9), min_size=count, max_size=count)), dtype=float
    )
    expected_max = [
        max((w for w, a, b in zip(weights, lo, hi, strict=True) if a <= i <= b), default=-INF)
        for i in range(size)
    ]
    assert _stab_max(weights, lo, hi, size).tolist() == expected_max


def test_smallest_accepted_is_exact_to_the_last_bit() -> None:
    target = 0.1 + 0.2  # not a round number
    found = _smallest_accepted(lambda x: x >= target, 0.0, 1.0)
    assert found == target
    assert np.nextafter(found, 0.0) < target


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 40),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
    st.sampled_from([INF, 0.05, 0.5]),
)
def test_table_and_search_agree_on_larger_real_valued_instances(
    n: int, stages: int, seed: int, threshold: float
) -> None:
    # Real-valued costs: both methods must find the same optimum, whatever the rounding.
    rng = np.random.default_rng(seed)
    admissible = np.concatenate(([False], rng.random(n - 1) < 0.8, [False]))
    problem = Problem(
        op_compute=rng.lognormal(size=n),
        op_memory=rng.random(n),
        cut_comm=np.where(admissible, rng.random(n + 1) * 0.3, 0.0),
        admissible=admissible,
        pinned=np.zeros(n + 1, dtype=bool),
        memory_limit=float(rng.choice([INF, n / stages * 0.9])),
    )
    table = solve(problem, stages, threshold, adaptive=True, method="table")
    search = solve(problem, stages, threshold, adaptive=True, method="search")
    # The same arithmetic in the same order: the very same plan, not a close one.
    assert search == table


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 120),
    st.integers(1, 12),
    st.integers(0, 2**31 - 1),
    st.sampled_from([INF, 0.02, 0.3]),
    st.booleans(),
)
def test_narrowed_band_gives_the_table_s_plan(
    n: int, stages: int, seed: int, threshold: float, skips: bool
) -> None:
    rng = np.random.default_rng(seed)
    admissible = np.concatenate(([False], rng.random(n - 1) < 0.85, [False]))
    last_use = None
    if skips:
        reach = np.arange(n + 1) + rng.integers(0, 4, n + 1)
        last_use = np.maximum.accumulate(np.minimum(reach, n + 1))
    problem = Problem(
        op_compute=rng.lognormal(size=n),
        op_memory=rng.random(n),
        # Without communication the narrowing takes its window-only path (the rules' weights).
        cut_comm=np.where(admissible, rng.random(n + 1) * rng.choice([0.0, 0.4]), 0.0),
        admissible=admissible,
        pinned=admissible & (rng.random(n + 1) < 0.03),
        min_ops=int(rng.integers(1, 3)),
        memory_limit=float(rng.choice([INF, n / stages * 1.2])),
        last_use=last_use,
    )
    for adaptive in (True, False):
        table = solve(problem, stages, threshold, adaptive, method="table")
        with tight_band():
            assert solve(problem, stages, threshold, adaptive, method="search") == table


@settings(max_examples=200, deadline=None)
@given(instances())
def test_min_threshold_by_bisection_is_the_least_max_ratio(instance: Instance) -> None:
    plans = legal_plans(instance.problem, instance.stages)
    with tight_band():
        found = min_threshold(instance.problem, instance.stages)
    assert found == (min(ratio for _, ratio, _, _ in plans) if plans else None)


@settings(max_examples=300, deadline=None)
@given(instances())
def test_rising_thresholds_give_every_better_exact_plan_once(instance: Instance) -> None:
    """Each plan of the walk is the exact one at the least threshold where the solver's
    objective (bottleneck, then communication) improves, and the walk ends unconstrained."""
    first = solve(instance.problem, instance.stages, instance.threshold, adaptive=True)
    if isinstance(first, Infeasible):
        return
    plans = legal_plans(instance.problem, instance.stages)
    ratios = sorted({ratio for _, ratio, _, _ in plans if ratio > first.threshold_used})

    def best_within(threshold: float) -> tuple[float, float]:
        return min((b, c) for _, ratio, b, c in plans if ratio <= threshold)

    expected = [(first.threshold_used, *best_within(first.threshold_used))]
    for ratio in ratios:
        if best_within(ratio) < expected[-1][1:]:
            expected.append((ratio, *best_within(ratio)))
    walked = rising_threshold_plans(instance.problem, instance.stages, first)
    assert [(p.threshold_used, p.bottleneck, p.total_comm) for p in walked] == expected
    assert (walked[-1].bottleneck, walked[-1].total_comm) == best_within(INF)

"""Explanations answer "one cut earlier / later" from the plan's own figures; they must say
exactly what scoring each moved plan from scratch says."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
from costbuilder import cost_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.contracts.costs import Costs, parse_costs
from syncpass.core.units import seconds
from syncpass.plan.explain import broken_constraints, explain_sync_points
from syncpass.plan.optimizer import PlanScore, Problem, score_cuts
from syncpass.plan.problem import problem_from_costs


def rescored_reasons(
    costs: Costs, problem: Problem, cuts: tuple[int, ...], threshold: float
) -> list[str]:
    """The "one cut earlier / later" clauses, each moved plan checked and scored whole."""
    op_ids = [op.id for op in costs.ops]
    score = score_cuts(problem, cuts)
    bounds = (0, *cuts, problem.num_ops)
    admissible = np.flatnonzero(problem.admissible)
    reasons = []
    for index, cut in enumerate(cuts):
        if problem.pinned[cut]:
            reasons.append("pinned by the user")
            continue
        before = admissible[(admissible > bounds[index]) & (admissible < cut)]
        after = admissible[(admissible > cut) & (admissible < bounds[index + 2])]
        moves = [("earlier", int(p)) for p in before[-1:]] + [("later", int(p)) for p in after[:1]]
        parts = []
        for word, position in moves:
            moved = tuple(sorted((*cuts[:index], position, *cuts[index + 1 :])))
            labels = {position: "this sync point, moved there,"}
            if index > 0:
                labels[cuts[index - 1]] = (
                    f"the previous sync point (after {op_ids[cuts[index - 1] - 1]})"
                )
            if index + 1 < len(cuts):
                labels[cuts[index + 1]] = (
                    f"the next sync point (after {op_ids[cuts[index + 1] - 1]})"
                )
            parts.append(
                f"one cut {word} (after {op_ids[position - 1]}) "
                + _compare(problem, moved, score, threshold, op_ids, labels)
            )
        reasons.append("; ".join(parts) or "no other admissible cut lies between its neighbours")
    return reasons


def _compare(
    problem: Problem,
    moved: tuple[int, ...],
    score: PlanScore,
    threshold: float,
    op_ids: Sequence[str],
    labels: Mapping[int, str],
) -> str:
    broken = broken_constraints(problem, moved, threshold, op_ids, labels)
    if broken:
        return "would break a constraint: " + broken[0]
    other = score_cuts(problem, moved)
    change = other.bottleneck - score.bottleneck
    if not math.isclose(other.bottleneck, score.bottleneck, rel_tol=1e-12, abs_tol=0.0):
        sign = "+" if change > 0 else "-"
        return (
            f"would make the bottleneck {seconds(other.bottleneck)} ({sign}{seconds(abs(change))})"
        )
    extra = other.total_comm - score.total_comm
    if extra > 0:
        return f"keeps the bottleneck but adds {seconds(extra)} of communication"
    if extra < 0:
        return f"keeps the bottleneck and saves {seconds(-extra)} of communication"
    return "is as good (a tie)"


@st.composite
def planned(draw: st.DrawFn) -> tuple[Costs, Problem, tuple[int, ...], float]:
    """A small cost file, its problem (sometimes with values reaching far) and any cuts."""
    n = draw(st.integers(2, 12))
    compute = draw(st.lists(st.integers(0, 8).map(lambda k: k / 4), min_size=n, max_size=n))
    live = draw(st.lists(st.one_of(st.none(), st.integers(0, 6)), min_size=n - 1, max_size=n - 1))
    params = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    pinned = [t for t in range(n - 1) if live[t] is not None and draw(st.integers(0, 9)) == 0]
    data = cost_dict(
        compute,
        live,
        params=params,
        alpha=draw(st.sampled_from([0.0, 0.25])),
        memory=draw(st.sampled_from([None, 4.0, 8.0])),
        config={"strategy": "adaptive", "min_sync_interval": draw(st.integers(1, 3))},
        pinned=pinned,
    )
    costs = parse_costs(data, "<test>")
    problem = problem_from_costs(costs, costs.config)
    if draw(st.booleans()):
        furthest = [draw(st.integers(p, n + 1)) for p in range(n + 1)]
        problem = dataclasses.replace(
            problem, last_use=np.maximum.accumulate(np.array(furthest, dtype=np.int64))
        )
    admissible = np.flatnonzero(problem.admissible).tolist()
    cuts = tuple(sorted(draw(st.sets(st.sampled_from(admissible)))) if admissible else ())
    threshold = draw(st.sampled_from([0.0, 0.125, 0.5, 2.0, math.inf]))
    return costs, problem, cuts, threshold


@settings(max_examples=400, deadline=None)
@given(planned())
def test_explanations_say_what_rescoring_each_move_says(
    case: tuple[Costs, Problem, tuple[int, ...], float],
) -> None:
    costs, problem, cuts, threshold = case
    reasons = explain_sync_points(costs, problem, cuts, score_cuts(problem, cuts), threshold)
    expected = rescored_reasons(costs, problem, cuts, threshold)
    assert len(reasons) == len(expected)
    for reason, moves in zip(reasons, expected, strict=True):
        assert reason.startswith("closes stage ")
        assert reason.endswith("; " + moves)


def test_a_sync_point_over_the_threshold_reads_over_it() -> None:
    # 10.104% against 10.1%: both "10.1%" at three digits, which would not read as over.
    problem = Problem(
        op_compute=np.array([1.0, 1.0]),
        op_memory=np.zeros(2),
        cut_comm=np.array([0.0, 0.10104, 0.0]),
        admissible=np.array([False, True, False]),
        pinned=np.zeros(3, dtype=bool),
        min_ops=1,
        last_use=None,
    )
    (broken,) = broken_constraints(problem, (1,), 0.101, ["a", "b"])
    assert broken == (
        "the sync point after a costs 10.104% of the compute of the stage it closes, "
        "over the threshold 10.1%"
    )

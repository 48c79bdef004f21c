"""Why each sync point is where it is, and which constraints a plan breaks.

A sync point is explained by what it closes (the stage, its compute), what
crosses it (bytes, time, share of the stage's compute) and what moving it to
the neighbouring admissible cut would do: raise the bottleneck, add
communication, or break a constraint.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from syncpass.contracts.costs import Costs
from syncpass.core.units import num_bytes, percent, seconds
from syncpass.plan.optimizer import PlanScore, Problem, score_cuts


def broken_constraints(
    problem: Problem,
    cuts: tuple[int, ...],
    threshold: float,
    op_ids: Sequence[str],
    labels: Mapping[int, str] | None = None,
) -> list[str]:
    """Each constraint the plan with ``cuts`` breaks, in words (empty when legal).

    ``op_ids[t]`` names op ``t + 1``, so a cut at position ``j`` is "the sync point
    after ``op_ids[j - 1]``", or what ``labels`` calls it ("the next sync point ...").
    """

    def sync_point(position: int) -> str:
        given = (labels or {}).get(position)
        return given if given is not None else f"the sync point after {op_ids[position - 1]}"

    broken = []
    bounds = (0, *cuts, problem.num_ops)
    for position in np.flatnonzero(problem.pinned).tolist():
        if position not in cuts:
            broken.append(f"drops the pinned sync point after {op_ids[position - 1]}")
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        if end - start < problem.min_ops:
            broken.append(
                f"stage {index} holds {end - start} op(s), fewer than min_sync_interval "
                f"{problem.min_ops}"
            )
        if problem.last_use is not None and int(problem.last_use[start]) > end:
            furthest = int(problem.last_use[start])
            made = "a model input" if start == 0 else f"a value made before stage {index}"
            if furthest > problem.num_ops:
                broken.append(
                    f"{made} is returned by the model, but torch's traced pipelining returns "
                    "only what the last stage makes"
                )
            else:
                broken.append(
                    f"{made} is still used after stage {index} (by "
                    f"{op_ids[furthest - 1]}): it would have to skip a stage"
                )
        memory = problem.stage_memory(start, end)
        if memory > problem.memory_limit:
            broken.append(
                f"stage {index} needs {num_bytes(memory)}, over the device's "
                f"{num_bytes(problem.memory_limit)}"
            )
        if end < problem.num_ops:
            ratio = problem.cut_ratio(start, end)
            if ratio > threshold and math.isinf(ratio):
                broken.append(
                    f"{sync_point(end)} closes a stage with no compute, "
                    f"so its communication exceeds any threshold"
                )
            elif ratio > threshold:
                broken.append(
                    f"{sync_point(end)} costs {percent(ratio)} of the "
                    f"compute of the stage it closes, over the threshold {percent(threshold)}"
                )
    return broken


def explain_sync_points(
    costs: Costs, problem: Problem, cuts: tuple[int, ...], score: PlanScore, threshold: float
) -> list[str]:
    """One sentence per sync point: what it closes, what crosses it, what moving it costs."""
    reasons = []
    op_ids = [op.id for op in costs.ops]
    bounds = (0, *cuts, problem.num_ops)
    admissible = np.flatnonzero(problem.admissible)
    for index, cut in enumerate(cuts):
        stage = score.stages[index]
        first = costs.ops[stage.start].id
        last = costs.ops[stage.end - 1].id
        span = first if first == last else f"{first} .. {last}"
        live = costs.live_bytes_at[cut]
        parts = [
            f"closes stage {index} ({span}: {seconds(stage.compute)} compute); "
            f"{num_bytes(live)} cross it in {seconds(float(problem.cut_comm[cut]))} per step, "
            f"{percent(stage.cut_ratio)} of that compute"
        ]
        if problem.pinned[cut]:
            parts.append("pinned by the user")
        else:
            before = admissible[(admissible > bounds[index]) & (admissible < cut)]
            after = admissible[(admissible > cut) & (admissible < bounds[index + 2])]
            moves = []
            if len(before):
                moves.append(("earlier", int(before[-1])))
            if len(after):
                moves.append(("later", int(after[0])))
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
                    f"one cut {word} (after {costs.ops[position - 1].id}) "
                    + _compare(problem, moved, score, threshold, op_ids, labels)
                )
            if not moves:
                parts.append("no other admissible cut lies between its neighbours")
        reasons.append("; ".join(parts))
    return reasons


def _compare(
    problem: Problem,
    moved: tuple[int, ...],
    score: PlanScore,
    threshold: float,
    op_ids: Sequence[str],
    labels: Mapping[int, str],
) -> str:
    """What moving one sync point (the plan becoming ``moved``) would do. A broken
    constraint names the sync point it is about as ``labels`` say (this one, moved; the
    previous; the next), so that the sentence never seems to be about another one."""
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

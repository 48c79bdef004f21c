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
from syncpass.core.units import num_bytes, percent, percents_apart, seconds
from syncpass.plan.optimizer import PlanScore, Problem


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
    broken = _dropped_pins(problem, cuts, op_ids)
    bounds = (0, *cuts, problem.num_ops)
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        broken.extend(_stage_breaks(problem, index, start, end, threshold, op_ids, labels or {}))
    return broken


def _dropped_pins(problem: Problem, cuts: tuple[int, ...], op_ids: Sequence[str]) -> list[str]:
    return [
        f"drops the pinned sync point after {op_ids[position - 1]}"
        for position in _dropped_pin_positions(problem, cuts)
    ]


def _dropped_pin_positions(problem: Problem, cuts: tuple[int, ...]) -> list[int]:
    chosen = set(cuts)
    return [p for p in np.flatnonzero(problem.pinned).tolist() if p not in chosen]


def _stage_breaks(
    problem: Problem,
    index: int,
    start: int,
    end: int,
    threshold: float,
    op_ids: Sequence[str],
    labels: Mapping[int, str],
) -> list[str]:
    """What stage ``index``, ops ``start + 1 .. end``, breaks (in the order of
    :func:`broken_constraints`)."""
    broken = []
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
        given = labels.get(end)
        sync_point = given if given is not None else f"the sync point after {op_ids[end - 1]}"
        if ratio > threshold and math.isinf(ratio):
            broken.append(
                f"{sync_point} closes a stage with no compute, "
                f"so its communication exceeds any threshold"
            )
        elif ratio > threshold:
            # With the digits that tell them apart: "10.1% over 10.1%" would not read true.
            cost, limit = percents_apart(ratio, threshold)
            broken.append(
                f"{sync_point} costs {cost} of the "
                f"compute of the stage it closes, over the threshold {limit}"
            )
    return broken


def explain_sync_points(
    costs: Costs, problem: Problem, cuts: tuple[int, ...], score: PlanScore, threshold: float
) -> list[str]:
    """One sentence per sync point: what it closes, what crosses it, what moving it costs.

    Moving one sync point changes only the two stages on either side of it, so each
    "one cut earlier / later" is answered from the plan's own figures (the largest
    stage time before and after the pair, the first constraint broken elsewhere) and
    the two new stages: the same words as scoring the moved plan from scratch, at a
    fraction of the work.
    """
    op_ids = [op.id for op in costs.ops]
    context = _PlanContext(problem, cuts, score, threshold, op_ids)
    admissible = np.flatnonzero(problem.admissible)
    bounds = context.bounds
    reasons = []
    for index, cut in enumerate(cuts):
        stage = score.stages[index]
        first = op_ids[stage.start]
        last = op_ids[stage.end - 1]
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
            moves = []
            earlier = int(np.searchsorted(admissible, cut, side="left")) - 1
            if earlier >= 0 and admissible[earlier] > bounds[index]:
                moves.append(("earlier", int(admissible[earlier])))
            later = int(np.searchsorted(admissible, cut, side="right"))
            if later < len(admissible) and admissible[later] < bounds[index + 2]:
                moves.append(("later", int(admissible[later])))
            for word, position in moves:
                parts.append(
                    f"one cut {word} (after {op_ids[position - 1]}) "
                    + context.compare_move(index, position)
                )
            if not moves:
                parts.append("no other admissible cut lies between its neighbours")
        reasons.append("; ".join(parts))
    return reasons


class _PlanContext:
    """A plan's figures that every one-cut move compares against."""

    def __init__(
        self,
        problem: Problem,
        cuts: tuple[int, ...],
        score: PlanScore,
        threshold: float,
        op_ids: Sequence[str],
    ) -> None:
        self.problem = problem
        self.cuts = cuts
        self.score = score
        self.threshold = threshold
        self.op_ids = op_ids
        self.bounds = (0, *cuts, problem.num_ops)
        times = [stage.time for stage in score.stages]
        # Largest stage time among stages [0, k) and [k, S).
        self.time_before = [-math.inf, *itertools.accumulate(times, max)]
        self.time_from = [*itertools.accumulate([-math.inf, *reversed(times)], max)][::-1]
        self.comm: list[float] = problem.cut_comm.tolist()
        # Total communication of the first k cuts, summed in order as score_cuts does.
        self.comm_before = [0.0]
        for cut in cuts:
            self.comm_before.append(self.comm_before[-1] + self.comm[cut])
        self.dropped_pins = _dropped_pin_positions(problem, cuts)
        # Index of the first stage breaking a constraint, from stage k on (default labels).
        stages = len(score.stages)
        self.first_broken_from = [stages] * (stages + 1)
        self.first_message: dict[int, str] = {}
        for index in range(stages - 1, -1, -1):
            start, end = self.bounds[index], self.bounds[index + 1]
            broken = _stage_breaks(problem, index, start, end, threshold, op_ids, {})
            self.first_broken_from[index] = index if broken else self.first_broken_from[index + 1]
            if broken:
                self.first_message[index] = broken[0]

    def _first_broken(self, index: int, position: int, labels: Mapping[int, str]) -> str | None:
        """The first constraint the plan with sync point ``index`` moved to ``position``
        breaks, in the order :func:`broken_constraints` lists them."""
        # The sync point that moves is not pinned; where it moves to may be.
        for pin in self.dropped_pins:
            if pin != position:
                return f"drops the pinned sync point after {self.op_ids[pin - 1]}"
        earlier = self.first_broken_from[0]
        if earlier < index - 1:
            return self.first_message[earlier]
        problem, op_ids, threshold = self.problem, self.op_ids, self.threshold
        bounds = self.bounds
        stages = [
            (index - 1, bounds[index - 1], bounds[index]),
            (index, bounds[index], position),
            (index + 1, position, bounds[index + 2]),
        ]
        for stage, start, end in stages[0 if index > 0 else 1 :]:
            broken = _stage_breaks(problem, stage, start, end, threshold, op_ids, labels)
            if broken:
                return broken[0]
        later = self.first_broken_from[index + 2]
        return self.first_message.get(later)

    def compare_move(self, index: int, position: int) -> str:
        """What moving sync point ``index`` to ``position`` would do. A broken constraint
        names the sync point it is about as the sentence does (this one, moved; the
        previous; the next), so that it never seems to be about another one."""
        cuts, op_ids = self.cuts, self.op_ids
        labels = {position: "this sync point, moved there,"}
        if index > 0:
            labels[cuts[index - 1]] = (
                f"the previous sync point (after {op_ids[cuts[index - 1] - 1]})"
            )
        if index + 1 < len(cuts):
            labels[cuts[index + 1]] = f"the next sync point (after {op_ids[cuts[index + 1] - 1]})"
        broken = self._first_broken(index, position, labels)
        if broken is not None:
            return "would break a constraint: " + broken
        problem, score = self.problem, self.score
        bottleneck = max(
            self.time_before[index],
            problem.stage_time(self.bounds[index], position),
            problem.stage_time(position, self.bounds[index + 2]),
            self.time_from[index + 2],
        )
        change = bottleneck - score.bottleneck
        if not math.isclose(bottleneck, score.bottleneck, rel_tol=1e-12, abs_tol=0.0):
            sign = "+" if change > 0 else "-"
            return f"would make the bottleneck {seconds(bottleneck)} ({sign}{seconds(abs(change))})"
        total = self.comm_before[index] + self.comm[position]
        for cut in cuts[index + 1 :]:
            total += self.comm[cut]
        extra = total - score.total_comm
        if extra > 0:
            return f"keeps the bottleneck but adds {seconds(extra)} of communication"
        if extra < 0:
            return f"keeps the bottleneck and saves {seconds(-extra)} of communication"
        return "is as good (a tie)"

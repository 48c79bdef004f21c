"""Exact choice of sync points together with which ops recompute their activations.

The pipeline model of :mod:`syncpass.plan.optimizer`, with one more decision per op: an op
either **stores** the activations its backward needs, or **recomputes** them in the
backward (activation checkpointing), which runs its forward again. Stage ``k`` (from 0) of
a plan keeps the activations of ``in_flight[k]`` micro-batches at once (the schedule
decides: 1F1B keeps ``min(S - k, M)``, GPipe all ``M``). A stage ``(i, j]`` at place ``k``
that recomputes the ops of ``R`` needs

    memory = Qp[j] - Qp[i] + in_flight[k] * sum(kept[t] if t in R else activation[t])

(``Qp`` the prefix of :attr:`Problem.op_memory`, here the weights' memory alone;
``activation`` and ``kept`` the bytes of one micro-batch that the op keeps when it stores
and when it recomputes: its saved tensors, or only the inputs its checkpoint keeps) and
takes ``Problem.stage_time(i, j) + sum(recompute_s[t] for t in R)``.

Objective, lexicographic: the least bottleneck, then the least total communication, then
the least total time recomputed; the earliest cuts on ties. The threshold and every other
constraint read as in :mod:`syncpass.plan.optimizer` (a cut's ratio is over the stage's
compute without what it recomputes).

How it stays exact: for fixed cuts, each stage's recomputation is independent of the
others', and a stage is fastest with the least time recomputed that fits its memory. That
is a knapsack per stage; its exact answer for every stage ``(i, j]`` comes from the Pareto
front of (activation bytes kept, time recomputed) over the subsets of ops ``i+1..j``, grown
one op at a time from each start ``i`` (the front of a stack of identical blocks has one
entry per count of blocks recomputed). Memory grows with the bytes kept, so the entries
that fit a stage are a prefix of the front, and the last of them recomputes least. A
dynamic program over stages then finds the least bottleneck and, under it, the least
(communication, recomputation) in lexicographic order, which adds up stage by stage.

This costs ``O(n^2)`` fronts and ``O(S n^2)`` table cells: it is for models planned per
layer (hundreds of ops), and runs only when recomputation is asked for
(``--recompute``); the cut optimiser without it is untouched.

This module knows nothing of libcst, torch or the cost file's format.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from syncpass.plan.optimizer import (
    BoolArray,
    FloatArray,
    Infeasible,
    IntArray,
    Problem,
    cut_ratios,
)

_INF = math.inf


@dataclass(frozen=True, eq=False)
class RecomputeProblem:
    """A partitioning instance with a store-or-recompute choice per op.

    ``base`` holds the cuts, compute, communication and constraints; its ``op_memory`` is
    each op's memory that does not depend on the micro-batches in flight (weights,
    gradients, optimizer state). Per op ``t`` (from 0): ``activation[t]`` and ``kept[t]``
    are the bytes of one micro-batch it keeps storing and recomputing, ``recompute_s[t]``
    the time recomputing adds to its stage's step, and ``candidate[t]`` whether it may
    recompute. ``in_flight[k]`` is how many micro-batches stage ``k`` keeps at once."""

    base: Problem
    activation: FloatArray
    kept: FloatArray
    recompute_s: FloatArray
    candidate: BoolArray
    in_flight: IntArray
    # Every candidate recomputes: no store-or-recompute choice left, the threshold read as
    # for any plan (over the stages' compute without what they recompute).
    forced: bool = False

    def __post_init__(self) -> None:
        n = self.base.num_ops
        for name in ("activation", "kept", "recompute_s", "candidate"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} must have one entry per op")
        for name in ("activation", "kept", "recompute_s"):
            values = getattr(self, name)
            if np.any(values < 0) or not np.all(np.isfinite(values)):
                raise ValueError(f"{name} must be finite and >= 0")
        if len(self.in_flight) < 1 or np.any(self.in_flight < 1):
            raise ValueError("in_flight needs one count >= 1 per stage")

    @property
    def stages(self) -> int:
        return len(self.in_flight)

    @cached_property
    def prefix_activation(self) -> FloatArray:
        return np.concatenate(([0.0], np.cumsum(self.activation)))

    def without_choice(self) -> RecomputeProblem:
        """The same instance where no op may recompute (store everything)."""
        return dataclasses.replace(self, candidate=np.zeros_like(self.candidate))

    def every_candidate(self) -> RecomputeProblem:
        """The same instance where every candidate recomputes, no choice left, and every
        other figure (the threshold's ratios included) read as for the instance itself:
        the "recompute every block" plan that sits beside the chosen one."""
        return dataclasses.replace(self, forced=True)

    def recomputing_all(self) -> RecomputeProblem:
        """The same instance where every candidate recomputes, no choice left, folded into
        the ops' compute and activations (the least memory any plan needs)."""
        chosen = self.candidate
        base = dataclasses.replace(
            self.base, op_compute=self.base.op_compute + np.where(chosen, self.recompute_s, 0.0)
        )
        return dataclasses.replace(
            self,
            base=base,
            activation=np.where(chosen, self.kept, self.activation),
            candidate=np.zeros_like(chosen),
        )

    def stage_memory(self, start: int, end: int, place: int, recomputed: frozenset[int]) -> float:
        """Memory of stage ``(start, end]`` at place ``place`` recomputing ``recomputed``."""
        kept = 0.0
        for t in range(start, end):
            kept += float(self.kept[t] if t in recomputed else self.activation[t])
        return self.base.stage_memory(start, end) + float(self.in_flight[place]) * kept


@dataclass(frozen=True)
class RecomputeSolution:
    """Chosen cuts, the ops each stage recomputes (op indices from 0) and the objective."""

    cuts: tuple[int, ...]
    recomputed: tuple[tuple[int, ...], ...]
    threshold_used: float
    bottleneck: float
    total_comm: float
    total_recompute: float


@dataclass(frozen=True)
class _Front:
    """The Pareto front of one stage's subsets: bytes kept ascending, time recomputed
    strictly descending; ``subsets`` (bit masks of ops past the start) when tracked."""

    kept: FloatArray
    cost: FloatArray
    subsets: tuple[int, ...] | None = None


def _grow(
    front: _Front,
    activation: float,
    kept: float,
    cost: float,
    bit: int | None,
    forced: bool = False,
) -> _Front:
    """The front once one more op joins: each subset stores it or recomputes it (only
    recomputes it when ``forced``)."""
    stores = front.kept + activation
    if bit is None:
        return dataclasses.replace(front, kept=stores)
    if forced:
        subsets = None if front.subsets is None else tuple(mask | bit for mask in front.subsets)
        return _Front(front.kept + kept, front.cost + cost, subsets)
    both_kept = np.concatenate((stores, front.kept + kept))
    both_cost = np.concatenate((front.cost, front.cost + cost))
    subsets = None
    if front.subsets is not None:
        subsets = (*front.subsets, *(mask | bit for mask in front.subsets))
    order = np.lexsort((both_cost, both_kept))
    ordered_cost = both_cost[order]
    # Keep an entry when it recomputes strictly less than every entry keeping fewer bytes.
    best_before = np.concatenate(([_INF], np.minimum.accumulate(ordered_cost)[:-1]))
    keep = order[ordered_cost < best_before]
    return _Front(
        both_kept[keep],
        both_cost[keep],
        None if subsets is None else tuple(subsets[int(index)] for index in keep),
    )


def _least_recompute(problem: RecomputeProblem) -> FloatArray:
    """``table[k, i, j]``: the least time stage ``(i, j]`` at place ``k`` recomputes to fit
    the memory limit (``inf``: nothing fits, or ``j <= i``)."""
    base = problem.base
    n, stages = base.num_ops, problem.stages
    table = np.full((stages, n + 1, n + 1), _INF)
    limit = base.memory_limit
    flight = problem.in_flight.astype(np.float64)
    weights = base.prefix_memory
    for start in range(n):
        front = _Front(np.zeros(1), np.zeros(1))
        for end in range(start + 1, n + 1):
            t = end - 1
            chosen = bool(problem.candidate[t])
            front = _grow(
                front,
                float(problem.activation[t]),
                float(problem.kept[t]),
                float(problem.recompute_s[t]),
                1 if chosen else None,
                problem.forced,
            )
            fixed = weights[end] - weights[start]
            if fixed > limit:
                break  # weights alone overflow: longer stages too
            memory = fixed + flight[:, None] * front.kept[None, :]
            fits = memory <= limit  # a prefix of the front at each place
            count = fits.sum(axis=1)
            table[:, start, end] = np.where(count > 0, front.cost[np.maximum(count - 1, 0)], _INF)
    return table


def _stage_choice(problem: RecomputeProblem, start: int, end: int, place: int) -> tuple[int, ...]:
    """The ops stage ``(start, end]`` at ``place`` recomputes: the last entry of its front
    that fits (the same arithmetic as :func:`_least_recompute`)."""
    base = problem.base
    front = _Front(np.zeros(1), np.zeros(1), (0,))
    for t in range(start, end):
        chosen = bool(problem.candidate[t])
        front = _grow(
            front,
            float(problem.activation[t]),
            float(problem.kept[t]),
            float(problem.recompute_s[t]),
            1 << (t - start) if chosen else None,
            problem.forced,
        )
    fixed = base.prefix_memory[end] - base.prefix_memory[start]
    fits = fixed + float(problem.in_flight[place]) * front.kept <= base.memory_limit
    count = int(fits.sum())
    assert count > 0 and front.subsets is not None, "the stage was chosen because it fits"
    mask = front.subsets[count - 1]
    return tuple(start + bit for bit in range(end - start) if mask >> bit & 1)


class _Table:
    """Every stage ``(i, j)`` at every place ``k``, as matrices."""

    def __init__(self, problem: RecomputeProblem) -> None:
        self.problem = problem
        base = problem.base
        n = base.num_ops
        positions = base.positions
        starts, ends = positions[:, None], positions[None, :]
        compute_p, comm = base.prefix_compute, base.cut_comm
        compute = compute_p[None, :] - compute_p[:, None]
        pinned_at = np.where(base.pinned, positions, 0)
        previous_pin = np.concatenate(([0], np.maximum.accumulate(pinned_at)[:-1]))
        self.shape_free = (ends - starts >= base.min_ops) & (starts >= previous_pin[None, :])
        self.shape_ok = self.shape_free
        if base.last_use is not None:
            self.shape_ok = self.shape_free & (base.last_use[:, None] <= ends)
        self.recompute = _least_recompute(problem)
        # Same arithmetic as Problem.stage_time, plus what the stage recomputes.
        self.time = (compute + (comm[:, None] + comm[None, :]))[None, :, :] + self.recompute
        self.ratio = np.where(
            ends < n, cut_ratios(np.broadcast_to(comm[None, :], compute.shape), compute), 0.0
        )
        self.is_last = positions == n

    def _ends(self, stage: int) -> BoolArray:
        last = self.problem.stages
        return self.is_last if stage == last else self.problem.base.admissible

    def min_max(self, values: FloatArray, legal: BoolArray) -> float | None:
        """Least over plans of the largest ``values[k, i, j]`` of their stages (``values``
        and ``legal`` may leave out the place axis); ``None``: no plan."""
        n = self.problem.base.num_ops
        best = np.full(n + 1, _INF)
        reach = np.zeros(n + 1, dtype=bool)
        reach[0] = True
        best[0] = -_INF
        for stage in range(1, self.problem.stages + 1):
            place_values = values[stage - 1] if values.ndim == 3 else values
            place_legal = legal[stage - 1] if legal.ndim == 3 else legal
            usable = place_legal & reach[:, None]
            worst = np.where(usable, np.maximum(best[:, None], place_values), _INF)
            reach = usable.any(axis=0) & self._ends(stage)
            best = np.where(reach, worst.min(axis=0), _INF)
        return float(best[-1]) if reach[-1] else None

    def least_totals(self, legal: BoolArray) -> tuple[int, ...]:
        """The plan of least (communication, recomputation) among stages ``legal[k, i, j]``,
        the earliest start on ties."""
        base = self.problem.base
        n = base.num_ops
        comm_total = np.full(n + 1, _INF)
        recompute_total = np.full(n + 1, _INF)
        comm_total[0] = recompute_total[0] = 0.0
        parents = []
        for stage in range(1, self.problem.stages + 1):
            usable = legal[stage - 1] & (comm_total < _INF)[:, None]
            comms = np.where(usable, comm_total[:, None], _INF)
            least = comms.min(axis=0)
            recomputes = np.where(
                usable & (comms == least[None, :]),
                recompute_total[:, None] + self.recompute[stage - 1],
                _INF,
            )
            parent = np.argmin(recomputes, axis=0)  # the earliest start on ties
            reached = (least < _INF) & self._ends(stage)
            comm_total = np.where(reached, least + base.cut_comm, _INF)
            recompute_total = np.where(reached, recomputes[parent, base.positions], _INF)
            parents.append(parent)
        position = n
        assert comm_total[position] < _INF, "the bottleneck must admit a plan"
        cuts = []
        for parent in reversed(parents[1:]):
            position = int(parent[position])
            cuts.append(position)
        return tuple(reversed(cuts))


def solve_recompute(
    problem: RecomputeProblem, threshold: float, adaptive: bool
) -> RecomputeSolution | Infeasible:
    """The exact plan of ``problem.stages`` stages with each op's store-or-recompute choice
    (see the module docstring). With ``adaptive``, a threshold no plan meets rises to the
    least that admits one. Infeasible says which constraint rules every plan out, and for
    memory the least limit that would admit a plan recomputing every candidate."""
    table = _Table(problem)
    base = problem.base
    if table.min_max(np.zeros((base.num_ops + 1,) * 2), table.shape_ok) is None:
        free = table.min_max(np.zeros((base.num_ops + 1,) * 2), table.shape_free)
        return Infeasible("dataflow" if free is not None else "stages")
    fits = table.shape_ok[None, :, :] & (table.recompute < _INF)
    least_ratio = table.min_max(np.broadcast_to(table.ratio, fits.shape), fits)
    if least_ratio is None:
        return Infeasible("memory", _least_memory(problem, table))
    used = threshold
    if least_ratio > threshold:
        if not adaptive:
            return Infeasible("threshold", least_ratio)
        used = least_ratio
    legal = fits & (table.ratio <= used)[None, :, :]
    bottleneck = table.min_max(table.time, legal)
    assert bottleneck is not None
    cuts = table.least_totals(legal & (table.time <= bottleneck))
    return score_recompute(problem, cuts, used)


def _least_memory(problem: RecomputeProblem, table: _Table) -> float | None:
    """The least memory limit under which some plan fits, every candidate recomputing."""
    every = problem.recomputing_all()
    base = every.base
    weights = base.prefix_memory[None, :] - base.prefix_memory[:, None]
    kept = every.prefix_activation[None, :] - every.prefix_activation[:, None]
    memory = weights[None, :, :] + every.in_flight.astype(np.float64)[:, None, None] * kept
    return table.min_max(memory, table.shape_ok)


def score_recompute(
    problem: RecomputeProblem, cuts: tuple[int, ...], threshold_used: float = 0.0
) -> RecomputeSolution:
    """The plan with ``cuts``, each stage recomputing the least time that fits it."""
    base = problem.base
    bounds = (0, *cuts, base.num_ops)
    recomputed = []
    times = []
    total_recompute = 0.0
    for place, (start, end) in enumerate(itertools.pairwise(bounds)):
        chosen = _stage_choice(problem, start, end, place)
        extra = 0.0
        for t in chosen:
            extra += float(problem.recompute_s[t])
        recomputed.append(chosen)
        times.append(base.stage_time(start, end) + extra)
        total_recompute += extra
    total_comm = 0.0
    for cut in cuts:
        total_comm += float(base.cut_comm[cut])
    return RecomputeSolution(
        cuts=cuts,
        recomputed=tuple(recomputed),
        threshold_used=threshold_used,
        bottleneck=max(times),
        total_comm=total_comm,
        total_recompute=total_recompute,
    )


def in_flight_counts(schedule: str, stages: int, microbatches: int) -> tuple[int, ...]:
    """How many micro-batches' activations each stage keeps at once: 1F1B runs at most
    ``S - k`` forwards on stage ``k`` before its first backward, GPipe all ``M`` (and so
    does every other schedule here, which is an upper bound for them)."""
    if schedule == "1f1b":
        return tuple(min(stages - place, microbatches) for place in range(stages))
    return (microbatches,) * stages

"""Exact choice of pipeline sync points.

The model (DESIGN.md, "Model of a pipeline plan"): ops ``1..n`` in execution
order; position ``j`` (``0 < j < n``) is the cut right after op ``j``. A plan
with ``S`` stages picks cuts ``0 = j_0 < j_1 < ... < j_S = n``; stage ``s``
holds ops ``j_{s-1}+1 .. j_s`` and takes

    time(i, j) = (P[j] - P[i]) + comm[i] + comm[j]

where ``P`` is the prefix sum of op compute and ``comm[0] = comm[n] = 0``.
The optimiser minimises the bottleneck ``max_s time`` and, among plans with
that bottleneck, the total communication ``sum comm[j_s]``, subject to

* every stage holding at least ``min_ops`` ops,
* every stage's memory ``Q[j] - Q[i]`` at most ``memory_limit``,
* no stage containing a pinned cut strictly inside it (pinned cuts are kept),
* every cut ``j < n`` satisfying ``comm[j] / (P[j] - P[i]) <= threshold``.

How it stays exact and fast (n = 10,000 candidate cuts in well under a second):

1. **Reachability oracle.** For a bound ``B``, which positions can end stage
   ``s`` of a plan whose stages all take at most ``B``? For a fixed end ``j``
   the admissible starts form an index window ``[lo_j, hi_j]`` (the memory,
   pin and interval bounds are monotone in ``i``; so is the threshold, since
   the ratio only grows as the stage shrinks), and the time bound reads
   ``comm[i] - P[i] <= B - P[j] - comm[j]``. So one range-minimum query per
   ``j`` over the reachable starts decides it: ``O(S n log n)`` with numpy.
2. **Bottleneck.** Feasibility is monotone in ``B``, so bisection over the
   ordered bit patterns of float64 finds the smallest representable ``B`` the
   oracle accepts: the optimum itself, not an approximation of it.
3. **Adaptive threshold.** Likewise, bisection over the threshold (with
   ``B = inf``) finds the smallest ratio that admits any plan: exactly the
   min over plans of their largest cut ratio, one of the candidate ratios.
4. **Tie-break.** With ``B*`` fixed, a plan of least total communication is
   found by a dynamic program restricted to positions reachable both from the
   start and from the end under ``B*``: at the optimum that is a narrow band
   around each stage boundary, so the quadratic step stays small.

This module knows nothing of libcst, torch or the cost file's format.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_INF = math.inf
# Columns per block in the tie-break dynamic program (bounds its memory).
_BLOCK = 512


@dataclass(frozen=True, eq=False)
class Problem:
    """A partitioning instance as arrays over positions ``0..n``.

    ``op_compute[t]`` and ``op_memory[t]`` belong to op ``t + 1``.
    ``cut_comm[j]`` is the communication of the cut at position ``j``
    (``0`` at ``0`` and ``n``). ``admissible[j]`` says a cut may sit at ``j``;
    ``pinned[j]`` that it must. ``last_use[i]``, when given, is the last position
    whose op uses a value produced at or before position ``i``, the forward's
    inputs counting as produced at ``0`` and the model's output as a use at ``n + 1``:
    a stage ``(i, j]`` is then only legal when ``last_use[i] <= j``, so every value
    reaches at most the next stage, the inputs only the first, and what the model
    returns is made in the last. torch.distributed.pipelining needs this: it cannot
    send one stage output to two later stages, nor reliably past a stage in between,
    hands the model's inputs to the first stage alone and returns the last stage's
    outputs.
    """

    op_compute: FloatArray
    op_memory: FloatArray
    cut_comm: FloatArray
    admissible: BoolArray
    pinned: BoolArray
    min_ops: int = 1
    memory_limit: float = _INF
    last_use: IntArray | None = None

    def __post_init__(self) -> None:
        n = len(self.op_compute)
        if n < 1:
            raise ValueError("a problem needs at least one op")
        if len(self.op_memory) != n:
            raise ValueError("op_memory must have one entry per op")
        for name in ("cut_comm", "admissible", "pinned"):
            if len(getattr(self, name)) != n + 1:
                raise ValueError(f"{name} must have one entry per position 0..n")
        if np.any(self.op_compute < 0) or np.any(self.cut_comm < 0) or np.any(self.op_memory < 0):
            raise ValueError("costs must be >= 0")
        if self.admissible[0] or self.admissible[n]:
            raise ValueError("positions 0 and n are the ends of the model, not cuts")
        if np.any(self.pinned & ~self.admissible):
            raise ValueError("a pinned cut must be admissible")
        if self.cut_comm[0] != 0 or self.cut_comm[n] != 0:
            raise ValueError("cut_comm must be 0 at positions 0 and n")
        if self.min_ops < 1:
            raise ValueError("min_ops must be at least 1")
        if self.last_use is not None:
            if len(self.last_use) != n + 1 or np.any(np.diff(self.last_use) < 0):
                raise ValueError("last_use must be a nondecreasing entry per position 0..n")
            if np.any(self.last_use < self.positions) or np.any(self.last_use > n + 1):
                raise ValueError("last_use[i] must be at least i and at most n + 1")

    @property
    def num_ops(self) -> int:
        return len(self.op_compute)

    @cached_property
    def prefix_compute(self) -> FloatArray:
        return np.concatenate(([0.0], np.cumsum(self.op_compute)))

    @cached_property
    def prefix_memory(self) -> FloatArray:
        return np.concatenate(([0.0], np.cumsum(self.op_memory)))

    @cached_property
    def positions(self) -> IntArray:
        return np.arange(self.num_ops + 1, dtype=np.int64)

    def stage_compute(self, start: int, end: int) -> float:
        return float(self.prefix_compute[end] - self.prefix_compute[start])

    def stage_time(self, start: int, end: int) -> float:
        return self.stage_compute(start, end) + float(self.cut_comm[start] + self.cut_comm[end])

    def stage_memory(self, start: int, end: int) -> float:
        return float(self.prefix_memory[end] - self.prefix_memory[start])

    def cut_ratio(self, start: int, end: int) -> float:
        """Communication of the cut at ``end`` over the compute of the stage it closes."""
        return float(cut_ratios(self.cut_comm[end], self.stage_compute(start, end)))


@dataclass(frozen=True)
class Solution:
    """Chosen cut positions and the threshold under which they were chosen."""

    cuts: tuple[int, ...]
    threshold_used: float
    bottleneck: float
    total_comm: float


@dataclass(frozen=True)
class Infeasible:
    """No plan exists; ``constraint`` is the first one that rules them all out.

    One of ``"stages"`` (too many stages for the ops, cuts, pins and
    ``min_ops``), ``"dataflow"`` (every plan would have a value skip a stage),
    ``"memory"`` or ``"threshold"``. ``needed`` is the smallest
    value of that constraint that would admit a plan, when one exists.
    """

    constraint: str
    needed: float | None = None


def cut_ratios(comm: FloatArray | float, compute: FloatArray | float) -> FloatArray:
    """``comm / compute`` with ``0/0 = 0`` and ``x/0 = inf``: the threshold test's ratio."""
    comm_array = np.asarray(comm, dtype=np.float64)
    compute_array = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = comm_array / compute_array
    return np.where(comm_array == 0, 0.0, np.where(compute_array <= 0, _INF, ratio))


# --- windows of admissible stage starts ------------------------------------


def stage_windows(problem: Problem, threshold: float) -> tuple[IntArray, IntArray]:
    """For each end position ``j``, the index range ``[lo_j, hi_j]`` of starts.

    Empty ranges have ``lo_j > hi_j``. The time bound is not part of the
    window; the oracle applies it separately.
    """
    n = problem.num_ops
    ends = problem.positions
    # Memory: Q[j] - Q[i] <= limit holds for i = j and, Q being sorted, for a
    # suffix of starts; find its first element by bisection.
    memory_q = problem.prefix_memory
    limit = problem.memory_limit
    low = np.zeros(n + 1, dtype=np.int64)
    high = ends.copy()
    while np.any(low < high):
        middle = (low + high) // 2
        fits = memory_q[ends] - memory_q[middle] <= limit
        high = np.where(fits, middle, high)
        low = np.where(fits, low, middle + 1)
    lo = low
    # Pins: a stage may not step over a pinned cut.
    pinned_at = np.where(problem.pinned, problem.positions, 0)
    previous_pin = np.concatenate(([0], np.maximum.accumulate(pinned_at)[:-1]))
    lo = np.maximum(lo, previous_pin)
    # Interval.
    hi = ends - problem.min_ops
    # Threshold: comm[j] / (P[j] - P[i]) grows with i; find the last start
    # that keeps it within the threshold (ends at n close no cut).
    if threshold < _INF:
        compute_p = problem.prefix_compute
        comm = problem.cut_comm
        low = np.full(n + 1, -1, dtype=np.int64)
        high = ends - 1
        while np.any(low < high):
            middle = (low + high + 1) // 2
            safe = np.maximum(middle, 0)
            within = cut_ratios(comm, compute_p[ends] - compute_p[safe]) <= threshold
            low = np.where(within, middle, low)
            high = np.where(within, high, middle - 1)
        ratio_hi = low
        ratio_hi[n] = n - 1
        hi = np.minimum(hi, ratio_hi)
    if problem.last_use is not None:
        # last_use is sorted: the starts whose values are all used by j are a prefix.
        reach_hi = np.searchsorted(problem.last_use, ends, side="right") - 1
        hi = np.minimum(hi, reach_hi)
    return lo, hi


# --- reachability ----------------------------------------------------------


def _floor_log2(lengths: IntArray) -> IntArray:
    return (np.frexp(np.maximum(lengths, 1).astype(np.float64))[1] - 1).astype(np.int64)


def _range_min(values: FloatArray, lo: IntArray, hi: IntArray) -> FloatArray:
    """``min(values[lo_j : hi_j + 1])`` for every ``j`` (``inf`` when empty)."""
    size = len(values)
    levels = [values]
    width = 1
    while 2 * width <= size:
        previous = levels[-1]
        levels.append(np.minimum(previous[:-width], previous[width:]))
        width *= 2
    table = np.full((len(levels), size), _INF)
    for level, row in enumerate(levels):
        table[level, : len(row)] = row
    nonempty = lo <= hi
    low = np.where(nonempty, lo, 0)
    high = np.where(nonempty, hi, 0)
    levels_used = _floor_log2(high - low + 1)
    result = np.minimum(table[levels_used, low], table[levels_used, high - (1 << levels_used) + 1])
    return np.where(nonempty, result, _INF)


def _stab_max(values: FloatArray, lo: IntArray, hi: IntArray, size: int) -> FloatArray:
    """For each position ``i``, the max of ``values[j]`` over ranges ``[lo_j, hi_j]`` holding ``i``."""
    keep = (lo <= hi) & (values > -_INF)
    values, lo, hi = values[keep], lo[keep], hi[keep]
    num_levels = max(1, int(size).bit_length())
    table = np.full((num_levels, size), -_INF)
    if len(values):
        levels_used = _floor_log2(hi - lo + 1)
        np.maximum.at(table, (levels_used, lo), values)
        np.maximum.at(table, (levels_used, hi - (1 << levels_used) + 1), values)
    for level in range(num_levels - 1, 0, -1):
        width = 1 << (level - 1)
        row = table[level]
        np.maximum(table[level - 1], row, out=table[level - 1])
        np.maximum(table[level - 1, width:], row[:-width], out=table[level - 1, width:])
    top: FloatArray = table[0]
    return top


class _Oracle:
    """Answers "is there an S-stage plan with every stage time <= B?" for one threshold."""

    def __init__(self, problem: Problem, stages: int, threshold: float) -> None:
        self.problem = problem
        self.stages = stages
        self.lo, self.hi = stage_windows(problem, threshold)
        n = problem.num_ops
        compute_p = problem.prefix_compute
        comm = problem.cut_comm
        # Stage (i, j) fits B  <=>  start_key[i] <= B - end_key[j].
        self.start_key = comm - compute_p
        self.end_key = compute_p + comm
        self.is_last = problem.positions == n
        self.is_first = problem.positions == 0

    def _ends(self, stage: int) -> BoolArray:
        return self.is_last if stage == self.stages else self.problem.admissible

    def forward(self, bound: float) -> list[BoolArray] | None:
        """Positions that can end stage ``s`` (index ``s``), or ``None`` if no plan fits."""
        reach = [self.is_first]
        for stage in range(1, self.stages + 1):
            starts = np.where(reach[-1], self.start_key, _INF)
            best = _range_min(starts, self.lo, self.hi)
            ok = best < _INF
            if bound < _INF:
                ok &= best <= bound - self.end_key
            reached = ok & self._ends(stage)
            if not reached.any():
                return None
            reach.append(reached)
        return reach

    def backward(self, bound: float) -> list[BoolArray]:
        """Positions from which stages ``s+1..S`` can still be formed (index ``s``)."""
        n = self.problem.num_ops
        reach = [self.is_last]
        for stage in range(self.stages - 1, -1, -1):
            room = np.where(reach[0], bound - self.end_key, -_INF)
            best = _stab_max(room, self.lo, self.hi, n + 1)
            ends = self.is_first if stage == 0 else self.problem.admissible
            reach.insert(0, ends & (self.start_key <= best) & (best > -_INF))
        return reach


# --- search ----------------------------------------------------------------


def _float_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float64).view(np.int64))


def _bits_float(bits: int) -> float:
    return float(np.array(bits, dtype=np.int64).view(np.float64))


def _smallest_accepted(
    accepts: Callable[[float], bool],
    low: float,
    high: float,
    candidates: FloatArray | None = None,
) -> float:
    """Smallest float in ``(low, high]`` that ``accepts`` (monotone), given ``accepts(high)``.

    ``low`` must be rejected (or be the value just below the range). With
    ``candidates`` (sorted values the answer is likely to be one of), a binary
    search over them narrows the range first, then a galloping search checks
    the floats just below the accepted candidate. Either way the last step is
    bisection over the ordered bit patterns of non-negative float64, so the
    answer is exact, never rounded to a step.
    """
    if candidates is not None:
        inside = candidates[(candidates > low) & (candidates < high)]
        rejected, accepted = -1, len(inside)
        while accepted - rejected > 1:
            middle = (rejected + accepted) // 2
            if accepts(float(inside[middle])):
                accepted = middle
            else:
                rejected = middle
        if rejected >= 0:
            low = float(inside[rejected])
        if accepted < len(inside):
            high = float(inside[accepted])
        # The oracle's rounding can differ from the candidates' by a few ulps:
        # the answer may sit just above the rejected candidate, or just
        # below the accepted one. Gallop from each side before bisecting.
        low, high, found = _gallop(accepts, low, high, upward=True)
        if not found:
            low, high, _ = _gallop(accepts, low, high, upward=False)
    low_bits, high_bits = _float_bits(low), _float_bits(high)
    while high_bits - low_bits > 1:
        middle = (low_bits + high_bits) // 2
        if accepts(_bits_float(middle)):
            high_bits = middle
        else:
            low_bits = middle
    return _bits_float(high_bits)


def _gallop(
    accepts: Callable[[float], bool], low: float, high: float, upward: bool
) -> tuple[float, float, bool]:
    """Probe 1, 2, 4, ... ulps from one end of ``(low, high]``; narrow it as the probes answer."""
    step = 1
    for _ in range(24):
        low_bits, high_bits = _float_bits(low), _float_bits(high)
        probe_bits = low_bits + step if upward else high_bits - step
        if not low_bits < probe_bits < high_bits:
            break
        probe = _bits_float(probe_bits)
        if accepts(probe):
            high = probe
            if upward:
                return low, high, True
        else:
            low = probe
            if not upward:
                return low, high, True
        step *= 2
    return low, high, False


#: Up to this many ops, every stage time and cut ratio is enumerated, so the
#: searches take ~log2(n^2) oracle calls instead of ~60.
_ENUMERATE_OPS = 1500


def _pair_values(problem: Problem, kind: str) -> FloatArray | None:
    """Sorted distinct stage times (``"time"``) or cut ratios (``"ratio"``) of legal stages."""
    n = problem.num_ops
    if n > _ENUMERATE_OPS:
        return None
    starts = problem.positions[:, None]
    ends = problem.positions[None, :]
    can_start = (problem.positions == 0) | problem.admissible
    can_end = (problem.positions == n) | problem.admissible
    legal = (ends - starts >= problem.min_ops) & can_start[:, None] & can_end[None, :]
    compute = problem.prefix_compute[None, :] - problem.prefix_compute[:, None]
    if kind == "time":
        values = compute + problem.cut_comm[:, None] + problem.cut_comm[None, :]
    else:
        legal &= ends < n
        values = cut_ratios(np.broadcast_to(problem.cut_comm[None, :], compute.shape), compute)
    unique: FloatArray = np.unique(values[legal])
    return unique


def _min_bottleneck(oracle: _Oracle) -> float:
    problem = oracle.problem
    upper = float(problem.prefix_compute[-1] + 2 * problem.cut_comm.max())
    while oracle.forward(upper) is None:  # rounding can put the true maximum a hair above
        upper = upper * 2 if upper > 0 else 1e-300
    if oracle.forward(0.0) is not None:
        return 0.0
    # Every plan's bottleneck is at least the average stage compute.
    lower = float(problem.prefix_compute[-1]) / oracle.stages * (1 - 1e-9)
    if lower >= upper or oracle.forward(lower) is not None:
        lower = 0.0
    return _smallest_accepted(
        lambda bound: oracle.forward(bound) is not None,
        lower,
        upper,
        _pair_values(problem, "time"),
    )


def _least_comm_cuts(oracle: _Oracle, bound: float, tie_cost: FloatArray) -> tuple[int, ...]:
    """Cuts of a plan with every stage time <= ``bound`` and least total ``tie_cost``."""
    forward = oracle.forward(bound)
    assert forward is not None, "bound must be feasible"
    backward = oracle.backward(bound)
    problem = oracle.problem
    room = bound - oracle.end_key
    cost = np.full(problem.num_ops + 1, _INF)
    cost[0] = 0.0
    parents: list[IntArray] = []
    previous = np.flatnonzero(forward[0] & backward[0])
    for stage in range(1, oracle.stages + 1):
        current = np.flatnonzero(forward[stage] & backward[stage])
        parent = np.full(problem.num_ops + 1, -1, dtype=np.int64)
        new_cost = np.full(problem.num_ops + 1, _INF)
        starts = previous[:, None]
        start_key = oracle.start_key[previous][:, None]
        start_cost = cost[previous][:, None]
        for block in range(0, len(current), _BLOCK):
            ends = current[block : block + _BLOCK]
            valid = (
                (starts >= oracle.lo[ends])
                & (starts <= oracle.hi[ends])
                & (start_key <= room[ends])
                & (start_cost < _INF)
            )
            totals = np.where(valid, start_cost, _INF)
            best = np.argmin(totals, axis=0)
            best_total = totals[best, np.arange(len(ends))]
            reachable = best_total < _INF
            new_cost[ends] = np.where(reachable, best_total + tie_cost[ends], _INF)
            parent[ends] = np.where(reachable, previous[best], -1)
        cost = new_cost
        parents.append(parent)
        previous = current[cost[current] < _INF]
    position = problem.num_ops
    assert cost[position] < _INF, "a feasible bound must give a plan"
    cuts = []
    for parent in reversed(parents):
        position = int(parent[position])
        cuts.append(position)
    assert cuts[-1] == 0
    return tuple(reversed(cuts[:-1]))


def _feasible(problem: Problem, stages: int, threshold: float) -> bool:
    return _Oracle(problem, stages, threshold).forward(_INF) is not None


def min_threshold(problem: Problem, stages: int, at_least: float = 0.0) -> float | None:
    """Smallest threshold >= ``at_least`` that admits an ``stages``-stage plan.

    ``None`` when no threshold does (the other constraints rule every plan
    out); ``inf`` when only plans with a cut that closes a stage of zero
    compute exist.
    """
    if not _feasible(problem, stages, _INF):
        return None
    if _feasible(problem, stages, at_least):
        return at_least
    largest = float(np.finfo(np.float64).max)
    if not _feasible(problem, stages, largest):
        return _INF
    return _smallest_accepted(
        lambda threshold: _feasible(problem, stages, threshold),
        at_least,
        largest,
        _pair_values(problem, "ratio"),
    )


#: Instances with at most this many (start, end, stage) triples are solved
#: on the whole table of stages at once; larger ones by search.
_TABLE_CELLS = 2_000_000


def solve(
    problem: Problem,
    stages: int,
    threshold: float,
    adaptive: bool,
    tie_cost: FloatArray | None = None,
    method: str = "auto",
) -> Solution | Infeasible:
    """Optimal cuts for ``stages`` stages (see the module docstring for the model).

    With ``adaptive``, a threshold no plan meets is raised to the smallest
    one that admits a plan; otherwise the threshold is hard. Among plans with
    the least bottleneck, the one with least total ``tie_cost`` (per cut
    position; by default its communication) wins, the earliest cuts on ties.

    ``method`` is ``"table"`` (dynamic programs over all stages at once,
    ``O(S n^2)`` numpy work: fastest for small models), ``"search"`` (the
    oracle and bisection of the module docstring: for large ones) or
    ``"auto"``. Both are exact and give the same plan.
    """
    if stages < 1:
        raise ValueError("stages must be at least 1")
    if method == "auto":
        cells = (problem.num_ops + 1) ** 2 * stages
        method = "table" if cells <= _TABLE_CELLS else "search"
    if method == "table":
        return _StageTable(problem, stages).solve(threshold, adaptive, tie_cost)
    if method != "search":
        raise ValueError(f"method must be auto, table or search, got {method!r}")
    used = threshold
    if not _feasible(problem, stages, threshold):
        diagnosis = diagnose(problem, stages, threshold)
        if not adaptive or diagnosis.constraint != "threshold":
            return diagnosis
        assert diagnosis.needed is not None
        used = diagnosis.needed
    oracle = _Oracle(problem, stages, used)
    bottleneck_bound = _min_bottleneck(oracle)
    cuts = _least_comm_cuts(
        oracle, bottleneck_bound, problem.cut_comm if tie_cost is None else tie_cost
    )
    score = score_cuts(problem, cuts)
    return Solution(
        cuts=cuts, threshold_used=used, bottleneck=score.bottleneck, total_comm=score.total_comm
    )


#: How many times at most :func:`rising_threshold_plans` raises the threshold past the first.
MAX_RAISES = 64
#: Up to this many ops the walk over rising thresholds visits every plan change (each
#: costs a bisection of full solves, milliseconds at this size); above, only the
#: unconstrained plan is added (a thousand ops over 64 stages would take a minute).
WALK_OPS = 96


def rising_threshold_plans(
    problem: Problem, stages: int, first: Solution, method: str = "auto"
) -> list[Solution]:
    """The exact plans as the threshold rises from ``first.threshold_used``.

    The solver's objective (least bottleneck, then least total communication) can only
    improve as the threshold rises, and it changes only at a candidate ratio. From
    ``first`` (the plan at the least threshold asked for or admitting a plan), each next
    plan is the solver's at the smallest threshold where that objective strictly improves,
    found by bisection over the candidate ratios; the last one is the plan without a
    threshold (one with a stage of no compute needs an unlimited one). At most
    :data:`MAX_RAISES` raises; above :data:`WALK_OPS` ops, ``first`` and the plan without a
    threshold only.
    """
    plans = [first]
    unlimited = solve(problem, stages, _INF, adaptive=False, method=method)
    if isinstance(unlimited, Infeasible):
        return plans
    if problem.num_ops > WALK_OPS:
        if (unlimited.bottleneck, unlimited.total_comm) < (first.bottleneck, first.total_comm):
            ratios = [stage.cut_ratio for stage in score_cuts(problem, unlimited.cuts).stages[:-1]]
            needed = max([first.threshold_used, *ratios])
            plans.append(dataclasses.replace(unlimited, threshold_used=needed))
        return plans
    best = (unlimited.bottleneck, unlimited.total_comm)
    largest = float(np.finfo(np.float64).max)
    candidates = _pair_values(problem, "ratio")
    current = first
    while len(plans) <= MAX_RAISES and (current.bottleneck, current.total_comm) > best:
        beaten = (current.bottleneck, current.total_comm)

        def improves(threshold: float, beaten: tuple[float, float] = beaten) -> bool:
            found = solve(problem, stages, threshold, adaptive=False, method=method)
            return (
                not isinstance(found, Infeasible)
                and (
                    found.bottleneck,
                    found.total_comm,
                )
                < beaten
            )

        if not improves(largest):
            plans.append(unlimited)  # only a stage with no compute (an infinite ratio) helps
            break
        threshold = _smallest_accepted(improves, current.threshold_used, largest, candidates)
        found = solve(problem, stages, threshold, adaptive=False, method=method)
        assert isinstance(found, Solution)
        current = dataclasses.replace(found, threshold_used=threshold)
        plans.append(current)
    return plans


class _StageTable:
    """Every candidate stage ``(start i, end j)`` of a small problem, as matrices."""

    def __init__(self, problem: Problem, stages: int) -> None:
        self.problem = problem
        self.stages = stages
        n = problem.num_ops
        positions = problem.positions
        starts, ends = positions[:, None], positions[None, :]
        compute_p, memory_q, comm = problem.prefix_compute, problem.prefix_memory, problem.cut_comm
        compute = compute_p[None, :] - compute_p[:, None]
        pinned_at = np.where(problem.pinned, positions, 0)
        previous_pin = np.concatenate(([0], np.maximum.accumulate(pinned_at)[:-1]))
        self.shape_free = (ends - starts >= problem.min_ops) & (starts >= previous_pin[None, :])
        self.shape_ok = self.shape_free
        if problem.last_use is not None:
            self.shape_ok = self.shape_free & (problem.last_use[:, None] <= ends)
        self.memory = memory_q[None, :] - memory_q[:, None]
        # Same arithmetic as Problem.stage_time and the threshold windows.
        self.time = compute + (comm[:, None] + comm[None, :])
        self.ratio = np.where(
            ends < n, cut_ratios(np.broadcast_to(comm[None, :], compute.shape), compute), 0.0
        )
        self.is_last = positions == n

    def _ends(self, stage: int) -> BoolArray:
        return self.is_last if stage == self.stages else self.problem.admissible

    def _min_max(self, values: FloatArray, legal: BoolArray) -> float | None:
        """Least over plans of the largest ``values[i, j]`` of their stages (None: no plan)."""
        best = np.full(self.problem.num_ops + 1, _INF)
        reach = np.zeros_like(self.is_last)
        reach[0] = True
        best[0] = -_INF
        for stage in range(1, self.stages + 1):
            usable = legal & reach[:, None]
            worst = np.where(usable, np.maximum(best[:, None], values), _INF)
            reach = usable.any(axis=0) & self._ends(stage)
            best = np.where(reach, worst.min(axis=0), _INF)
        return float(best[-1]) if reach[-1] else None

    def solve(
        self, threshold: float, adaptive: bool, tie_cost: FloatArray | None
    ) -> Solution | Infeasible:
        problem = self.problem
        if self._min_max(self.time, self.shape_ok) is None:
            dataflow = self._min_max(self.time, self.shape_free) is not None
            return Infeasible("dataflow" if dataflow else "stages")
        fits = self.shape_ok & (self.memory <= problem.memory_limit)
        least_ratio = self._min_max(self.ratio, fits)
        if least_ratio is None:
            return Infeasible("memory", self._min_max(self.memory, self.shape_ok))
        used = threshold
        if least_ratio > threshold:
            if not adaptive:
                return Infeasible("threshold", least_ratio)
            used = least_ratio
        legal = fits & (self.ratio <= used)
        bottleneck = self._min_max(self.time, legal)
        assert bottleneck is not None
        cuts = self._least_total(legal & (self.time <= bottleneck), tie_cost)
        score = score_cuts(problem, cuts)
        return Solution(cuts, used, score.bottleneck, score.total_comm)

    def _least_total(self, legal: BoolArray, tie_cost: FloatArray | None) -> tuple[int, ...]:
        problem = self.problem
        cost_at = problem.cut_comm if tie_cost is None else tie_cost
        total = np.full(problem.num_ops + 1, _INF)
        total[0] = 0.0
        parents = []
        for stage in range(1, self.stages + 1):
            candidates = np.where(legal & (total < _INF)[:, None], total[:, None], _INF)
            parent = np.argmin(candidates, axis=0)  # the earliest start on ties
            best = candidates[parent, problem.positions]
            total = np.where((best < _INF) & self._ends(stage), best + cost_at, _INF)
            parents.append(parent)
        position = problem.num_ops
        assert total[position] < _INF, "the bottleneck must admit a plan"
        cuts = []
        for parent in reversed(parents[1:]):
            position = int(parent[position])
            cuts.append(position)
        return tuple(reversed(cuts))


def diagnose(problem: Problem, stages: int, threshold: float) -> Infeasible:
    """Which constraint rules out every plan, and the least value that would not."""
    relaxed = dataclasses.replace(problem, memory_limit=_INF)
    if not _feasible(relaxed, stages, _INF):
        free = dataclasses.replace(relaxed, last_use=None)
        return Infeasible("dataflow" if _feasible(free, stages, _INF) else "stages")
    if not _feasible(problem, stages, _INF):
        largest = float(problem.prefix_memory[-1])
        needed = _smallest_accepted(
            lambda limit: _feasible(dataclasses.replace(problem, memory_limit=limit), stages, _INF),
            0.0,
            largest,
        )
        return Infeasible("memory", needed)
    return Infeasible("threshold", min_threshold(problem, stages, threshold))


# --- scoring ---------------------------------------------------------------


@dataclass(frozen=True)
class StageScore:
    start: int
    end: int
    compute: float
    comm_in: float
    comm_out: float
    time: float
    memory: float
    cut_ratio: float  # of the cut that closes the stage; 0 for the last stage


@dataclass(frozen=True)
class PlanScore:
    stages: tuple[StageScore, ...]
    bottleneck: float
    total_comm: float


def score_cuts(problem: Problem, cuts: tuple[int, ...]) -> PlanScore:
    """Stage figures of the plan with ``cuts`` (positions), under the same model."""
    bounds = (0, *cuts, problem.num_ops)
    scores = []
    for start, end in itertools.pairwise(bounds):
        last = end == problem.num_ops
        scores.append(
            StageScore(
                start=start,
                end=end,
                compute=problem.stage_compute(start, end),
                comm_in=float(problem.cut_comm[start]),
                comm_out=float(problem.cut_comm[end]),
                time=problem.stage_time(start, end),
                memory=problem.stage_memory(start, end),
                cut_ratio=0.0 if last else problem.cut_ratio(start, end),
            )
        )
    total = 0.0
    for cut in cuts:
        total += float(problem.cut_comm[cut])
    return PlanScore(
        stages=tuple(scores),
        bottleneck=max(stage.time for stage in scores),
        total_comm=total,
    )

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

How it stays exact and fast (n = 10,000 candidate cuts over 256 stages in under a
second):

1. **Windows.** For a fixed end ``j`` the admissible starts form an index window
   ``[lo_j, hi_j]`` (the memory, pin, interval and dataflow bounds are monotone in
   ``i``; so is the threshold, since the ratio only grows as the stage shrinks).
   Which positions can end stage ``s`` of some plan is then one prefix count per
   stage forward and one stabbing count backward: the **band** of each stage's end.
2. **Adaptive threshold.** The least threshold admitting a plan is one of the cut
   ratios: bisection on the bit patterns of float64 narrows it until a few
   thousand ratios remain, then bisection over those ratios finds it exactly.
3. **Bottleneck.** A dynamic program over every (start, end) pair inside the band
   gives the least bottleneck, each stage time computed as :meth:`Problem.stage_time`
   computes it. When the band holds too many pairs, it is first narrowed: for a
   bound ``B`` the time test reads ``comm[i] - P[i] <= B - P[j] - comm[j]``, so one
   range minimum per end (forward) and one stabbing maximum per start (backward)
   keep only the positions of plans within ``B``; bisection on ``B`` shrinks the band
   until it is small, and the exact program runs on what is left.
4. **Tie-break.** With the bottleneck fixed, a plan of least total communication is
   a min-sum program over the same pairs, the earliest start winning ties.

The band holds every plan the whole table of pairs (:class:`_StageTable`, used for
small problems) would consider, and the programs do the same arithmetic in the same
order, so both methods return the same plan.

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

    @cached_property
    def shape_windows(self) -> tuple[IntArray, IntArray]:
        """The start windows of every end under all constraints but the threshold and
        the time bound (see :func:`stage_windows`)."""
        return _shape_windows(self)

    def stage_compute(self, start: int, end: int) -> float:
        return float(self.prefix_compute[end] - self.prefix_compute[start])

    def stage_time(self, start: int, end: int) -> float:
        return self.stage_compute(start, end) + float(self.cut_comm[start] + self.cut_comm[end])

    def stage_memory(self, start: int, end: int) -> float:
        return float(self.prefix_memory[end] - self.prefix_memory[start])

    def cut_ratio(self, start: int, end: int) -> float:
        """Communication of the cut at ``end`` over the compute of the stage it closes
        (:func:`cut_ratios` for one stage)."""
        comm, compute = float(self.cut_comm[end]), self.stage_compute(start, end)
        if comm == 0:
            return 0.0
        return _INF if compute <= 0 else comm / compute


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


def _shape_windows(problem: Problem) -> tuple[IntArray, IntArray]:
    """The windows of :func:`stage_windows` without the threshold (memory, pins, interval,
    values reaching the next stage only); computed once per problem."""
    n = problem.num_ops
    ends = problem.positions
    # Memory: Q[j] - Q[i] <= limit holds for i = j and, Q being sorted, for a
    # suffix of starts; find its first element by bisection.
    memory_q = problem.prefix_memory
    limit = problem.memory_limit
    low = np.zeros(n + 1, dtype=np.int64)
    high = ends.copy() if limit < _INF else low.copy()
    while np.any(low < high):
        middle = (low + high) // 2
        fits = memory_q[ends] - memory_q[middle] <= limit
        high = np.where(fits, middle, high)
        low = np.where(fits, low, middle + 1)
    # Pins: a stage may not step over a pinned cut.
    pinned_at = np.where(problem.pinned, problem.positions, 0)
    previous_pin = np.concatenate(([0], np.maximum.accumulate(pinned_at)[:-1]))
    lo = np.maximum(low, previous_pin)
    # Interval.
    hi = ends - problem.min_ops
    if problem.last_use is not None:
        # last_use is sorted: the starts whose values are all used by j are a prefix.
        reach_hi = np.searchsorted(problem.last_use, ends, side="right") - 1
        hi = np.minimum(hi, reach_hi)
    return lo, hi


def _ratio_limits(problem: Problem, threshold: float) -> IntArray:
    """For each end ``j``, the last start whose stage keeps ``comm[j] / compute`` within
    ``threshold`` (``-1``: none; ends at ``n`` close no cut, so any start)."""
    n = problem.num_ops
    ends = problem.positions
    # comm[j] / (P[j] - P[i]) grows with i: bisect for the last start within it.
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
    low[n] = n - 1
    return low


def stage_windows(problem: Problem, threshold: float) -> tuple[IntArray, IntArray]:
    """For each end position ``j``, the index range ``[lo_j, hi_j]`` of starts.

    Empty ranges have ``lo_j > hi_j``. The time bound is not part of the
    window; the search applies it separately.
    """
    if threshold < _INF:
        return _windows_with(problem, _ratio_limits(problem, threshold))
    lo, hi = problem.shape_windows
    return lo.copy(), hi.copy()


def _windows_with(problem: Problem, ratio_limits: IntArray) -> tuple[IntArray, IntArray]:
    lo, hi = problem.shape_windows
    return lo.copy(), np.minimum(hi, ratio_limits)


# --- reachability ----------------------------------------------------------


def _stage_ends(problem: Problem, stages: int, stage: int) -> BoolArray:
    """The positions that may end stage ``stage`` (``0``: the start of the model)."""
    if stage in (0, stages):
        ends: BoolArray = problem.positions == (0 if stage == 0 else problem.num_ops)
        return ends
    return problem.admissible


def _forward_reach(
    problem: Problem, stages: int, lo: IntArray, hi: IntArray
) -> list[BoolArray] | None:
    """Positions that can end stage ``s`` (index ``s``) when only the windows bind, or
    ``None`` when no plan exists. One prefix count per stage: any reachable start in
    ``[lo_j, hi_j]`` will do."""
    nonempty = lo <= hi
    first = np.where(nonempty, lo, 0)
    past = np.where(nonempty, hi + 1, 0)
    reach = [_stage_ends(problem, stages, 0)]
    counts = np.zeros(problem.num_ops + 2, dtype=np.int64)
    for stage in range(1, stages + 1):
        np.cumsum(reach[-1], out=counts[1:])
        reached = (counts[past] > counts[first]) & _stage_ends(problem, stages, stage)
        if not reached.any():
            return None
        reach.append(reached)
    return reach


def _backward_reach(
    problem: Problem, stages: int, lo: IntArray, hi: IntArray, forward: list[BoolArray]
) -> list[BoolArray]:
    """Of the positions in ``forward``, those from which the remaining stages can still be
    formed: the positions of stage ``s``'s end that some whole plan passes through."""
    size = problem.num_ops + 1
    nonempty = lo <= hi
    band = [forward[stages]]
    for stage in range(stages - 1, -1, -1):
        ends = band[0] & nonempty
        marks = np.bincount(lo[ends], minlength=size + 1) - np.bincount(
            hi[ends] + 1, minlength=size + 1
        )
        covered = np.cumsum(marks[:size]) > 0
        band.insert(0, covered & forward[stage])
    return band


def _feasible(problem: Problem, stages: int, threshold: float) -> bool:
    return _forward_reach(problem, stages, *stage_windows(problem, threshold)) is not None


# --- range queries ---------------------------------------------------------


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


# --- the band search -------------------------------------------------------

#: A band holding at most this many (start, end) pairs is solved at once; a wider one is
#: first narrowed by bisection on the bottleneck.
_BAND_PAIRS = 2_000_000
#: Pairs per numpy step of the band's dynamic programs (bounds their memory).
_CHUNK_PAIRS = 1_000_000


def _rounding_slack(problem: Problem) -> float:
    """More than the rounding of any stage time: widening a bound by it keeps every plan
    whose exactly computed bottleneck is within the bound."""
    return 1e-12 * float(problem.prefix_compute[-1] + 2 * problem.cut_comm.max()) + 1e-300


def _pair_ranges(
    problem: Problem,
    lo: IntArray,
    hi: IntArray,
    starts: IntArray,
    ends: IntArray,
    bound: float,
) -> tuple[IntArray, IntArray]:
    """For each end in ``ends``, the range ``[first, first + count)`` of ``starts`` (sorted
    positions) inside its window whose stage compute alone stays within ``bound``."""
    low = lo[ends]
    if bound < _INF:
        compute_p = problem.prefix_compute
        reach = compute_p[ends] - (bound + _rounding_slack(problem))
        low = np.maximum(low, np.searchsorted(compute_p, reach, side="left"))
    first = np.searchsorted(starts, low, side="left")
    past = np.searchsorted(starts, hi[ends], side="right")
    return first, np.maximum(past - first, 0)


def _chunks(counts: IntArray) -> list[slice]:
    """Consecutive runs of ends whose pairs number at most :data:`_CHUNK_PAIRS` (or one end)."""
    totals = np.cumsum(counts)
    chunks = []
    begin = 0
    while begin < len(counts):
        before = int(totals[begin - 1]) if begin else 0
        end = int(np.searchsorted(totals, before + _CHUNK_PAIRS, side="right"))
        end = max(end, begin + 1)
        chunks.append(slice(begin, end))
        begin = end
    return chunks


@dataclass(frozen=True)
class _Pairs:
    """Every (start, end) pair of one chunk, flat: ``start[k]`` indexes the starts and
    ``owner[k]`` the ends; the pairs of end ``e`` lie at ``offsets[e]`` on (when any)."""

    start: IntArray
    owner: IntArray
    offsets: IntArray
    nonempty: BoolArray


def _flat_pairs(first: IntArray, counts: IntArray) -> _Pairs:
    offsets = np.cumsum(counts) - counts
    owner = np.repeat(np.arange(len(counts)), counts)
    start = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(first - offsets, counts)
    nonempty = counts > 0
    return _Pairs(start, owner, offsets[nonempty], nonempty)


def _count_pairs(
    problem: Problem, lo: IntArray, hi: IntArray, band: list[IntArray], bound: float
) -> int:
    return sum(
        int(_pair_ranges(problem, lo, hi, starts, ends, bound)[1].sum())
        for starts, ends in itertools.pairwise(band)
    )


def _band_under(
    problem: Problem, lo: IntArray, hi: IntArray, band: list[IntArray], bound: float
) -> list[IntArray] | None:
    """The positions of ``band`` that some plan with every stage time within ``bound``
    passes through, per stage; ``None`` when no such plan exists.

    Stage ``(i, j]`` fits ``bound`` when ``comm[i] - P[i] <= bound - P[j] - comm[j]``:
    forward, one range minimum over each end's window of reached starts; backward, one
    stabbing maximum over the windows of the ends that can still finish the plan.
    """
    compute_p, comm = problem.prefix_compute, problem.cut_comm
    if not comm.any():
        return _band_within(problem, lo, hi, band, bound)
    start_key = comm - compute_p
    room = bound - (compute_p + comm)
    reached = [band[0]]
    for ends in band[1:]:
        starts = reached[-1]
        first = np.searchsorted(starts, lo[ends], side="left")
        last = np.searchsorted(starts, hi[ends], side="right") - 1
        ok = _range_min(start_key[starts], first, last) <= room[ends]
        if not ok.any():
            return None
        reached.append(ends[ok])
    narrowed = [reached[-1]]
    for starts in reversed(reached[:-1]):
        ends = narrowed[0]
        first = np.searchsorted(starts, lo[ends], side="left")
        last = np.searchsorted(starts, hi[ends], side="right") - 1
        best = _stab_max(room[ends], first, last, len(starts))
        narrowed.insert(0, starts[start_key[starts] <= best])
    return narrowed


def _band_within(
    problem: Problem, lo: IntArray, hi: IntArray, band: list[IntArray], bound: float
) -> list[IntArray] | None:
    """:func:`_band_under` without communication: a stage fits ``bound`` when its compute
    does, which narrows each window of starts (``P[i] >= P[j] - bound``), so the prefix
    counts of :func:`_forward_reach` and :func:`_backward_reach` answer it."""
    compute_p = problem.prefix_compute
    low = np.maximum(lo, np.searchsorted(compute_p, compute_p - bound, side="left"))
    stages = len(band) - 1
    forward = _forward_reach(problem, stages, low, hi)
    if forward is None:
        return None
    return [np.flatnonzero(b) for b in _backward_reach(problem, stages, low, hi, forward)]


def _narrow(
    problem: Problem, lo: IntArray, hi: IntArray, band: list[IntArray]
) -> tuple[list[IntArray], float]:
    """A band of at most :data:`_BAND_PAIRS` pairs and a bound it covers: every plan whose
    bottleneck is within the bound stays inside the band (``inf`` when no narrowing was
    needed, or possible). Bisection on the bound, galloping up from the average stage
    compute; each probe widens its bound by the rounding slack, so that it keeps every
    plan within the bound however its stage times round."""
    stages = len(band) - 1
    if _count_pairs(problem, lo, hi, band, _INF) <= _BAND_PAIRS:
        return band, _INF
    slack = _rounding_slack(problem)
    lower = float(problem.prefix_compute[-1]) / stages * (1 - 1e-9)  # no plan does better
    if not lower > 0:
        return band, _INF
    upper = _INF
    excess = 0.01
    pairs = _INF
    for _ in range(80):
        guess = lower * (1 + excess) if upper == _INF else lower + (upper - lower) / 2
        narrowed = _band_under(problem, lo, hi, band, guess + slack)
        if narrowed is None:
            lower = guess
            excess *= 2
            continue
        band, upper = narrowed, guess
        before, pairs = pairs, _count_pairs(problem, lo, hi, band, upper + slack)
        # Stop when small enough, or when halving the bound no longer shrinks the band
        # much (many plans share the least bottleneck, as with whole-number weights).
        if pairs <= _BAND_PAIRS or pairs > 0.9 * before or upper - lower <= 1e-9 * upper:
            break
    return band, upper


def _least_bottleneck(
    problem: Problem, lo: IntArray, hi: IntArray, band: list[IntArray], bound: float
) -> float:
    """The least bottleneck over plans through ``band``, stage times computed exactly as
    :meth:`Problem.stage_time` does (``bound``: at least the answer)."""
    compute_p, comm = problem.prefix_compute, problem.cut_comm
    starts = band[0]
    worst = np.full(len(starts), -_INF)  # the bottleneck so far of the best way there
    for ends in band[1:]:
        first, counts = _pair_ranges(problem, lo, hi, starts, ends, bound)
        best = np.full(len(ends), _INF)
        for chunk in _chunks(counts):
            pairs = _flat_pairs(first[chunk], counts[chunk])
            i, j = starts[pairs.start], ends[chunk][pairs.owner]
            time = (compute_p[j] - compute_p[i]) + (comm[i] + comm[j])
            values = np.maximum(worst[pairs.start], time)
            if len(values):
                found = best[chunk]
                found[pairs.nonempty] = np.minimum.reduceat(values, pairs.offsets)
                best[chunk] = found
        keep = (best < _INF) & (best <= bound)
        starts, worst = ends[keep], best[keep]
    return float(worst[0]) if len(worst) else _INF


def _least_total(
    problem: Problem,
    lo: IntArray,
    hi: IntArray,
    band: list[IntArray],
    bottleneck: float,
    tie_cost: FloatArray,
) -> tuple[int, ...]:
    """Cuts of a plan through ``band`` with every stage time within ``bottleneck`` and least
    total ``tie_cost``; on ties, each stage starts as early as it can (as the table does)."""
    compute_p, comm = problem.prefix_compute, problem.cut_comm
    starts = band[0]
    total = np.zeros(1)
    parents: list[tuple[IntArray, IntArray]] = []
    for ends in band[1:]:
        first, counts = _pair_ranges(problem, lo, hi, starts, ends, bottleneck)
        best = np.full(len(ends), _INF)
        parent = np.full(len(ends), -1, dtype=np.int64)
        for chunk in _chunks(counts):
            pairs = _flat_pairs(first[chunk], counts[chunk])
            if not len(pairs.start):
                continue
            i, j = starts[pairs.start], ends[chunk][pairs.owner]
            time = (compute_p[j] - compute_p[i]) + (comm[i] + comm[j])
            values = np.where(time <= bottleneck, total[pairs.start], _INF)
            least = np.minimum.reduceat(values, pairs.offsets)
            owners = np.flatnonzero(pairs.nonempty)
            hit = values == np.repeat(least, counts[chunk][pairs.nonempty])
            flat = np.arange(len(values))
            earliest = np.minimum.reduceat(np.where(hit, flat, len(values)), pairs.offsets)
            reached = least < _INF
            found = best[chunk]
            found[owners] = np.where(reached, least + tie_cost[ends[chunk][owners]], _INF)
            best[chunk] = found
            chosen = parent[chunk]
            chosen[owners] = np.where(reached, i[earliest], -1)
            parent[chunk] = chosen
        parents.append((ends, parent))
        keep = best < _INF
        starts, total = ends[keep], best[keep]
    assert len(total) == 1, "the bottleneck must admit a plan"
    position = problem.num_ops
    cuts = []
    for ends, parent in reversed(parents[1:]):
        position = int(parent[np.searchsorted(ends, position)])
        cuts.append(position)
    return tuple(reversed(cuts))


def _solve_band(
    problem: Problem,
    stages: int,
    lo: IntArray,
    hi: IntArray,
    forward: list[BoolArray],
    tie_cost: FloatArray,
) -> tuple[int, ...]:
    whole = [np.flatnonzero(b) for b in _backward_reach(problem, stages, lo, hi, forward)]
    band, covered = _narrow(problem, lo, hi, whole)
    slack = _rounding_slack(problem)
    bottleneck = _least_bottleneck(problem, lo, hi, band, covered + slack)
    if bottleneck > covered:
        # The probe that set the bound found a plan within it, up to rounding: a plan just
        # above it may lie outside the band. Never seen, but the answer must be exact.
        bottleneck = _least_bottleneck(problem, lo, hi, whole, _INF)
        band = whole
    assert bottleneck < _INF, "a reachable band must hold a plan"
    return _least_total(problem, lo, hi, band, bottleneck, tie_cost)


#: The exact threshold search enumerates the candidate ratios once at most this many
#: lie between its bounds; until then it bisects on the bit patterns.
_RATIO_CANDIDATES = 200_000


def _ratio_candidates(
    problem: Problem, below: IntArray, within: IntArray, count_only: bool
) -> tuple[int, FloatArray]:
    """The cut ratios of stages ``(i, j]`` with ``below[j] < i <= within[j]`` inside the
    shape windows (their number, and with ``count_only`` false the sorted distinct values)."""
    lo, hi = problem.shape_windows
    ends = np.flatnonzero(problem.admissible)
    first = np.maximum(below[ends] + 1, lo[ends])
    last = np.minimum(within[ends], hi[ends])
    counts = np.maximum(last - first + 1, 0)
    total = int(counts.sum())
    if count_only:
        return total, np.empty(0)
    pairs = _flat_pairs(first, counts)
    j = ends[pairs.owner]
    compute_p = problem.prefix_compute
    ratios = cut_ratios(problem.cut_comm[j], compute_p[j] - compute_p[pairs.start])
    return total, np.unique(ratios)


def min_threshold(problem: Problem, stages: int, at_least: float = 0.0) -> float | None:
    """Smallest threshold >= ``at_least`` that admits an ``stages``-stage plan.

    ``None`` when no threshold does (the other constraints rule every plan
    out); ``inf`` when only plans with a cut that closes a stage of zero
    compute exist. The answer is one of the cut ratios: bisection on the bit patterns
    of the threshold narrows the range until few ratios lie in it, then bisection over
    those ratios finds it (the windows test the same arithmetic, so it is exact).
    """
    if not _feasible(problem, stages, _INF):
        return None
    if _feasible(problem, stages, at_least):
        return at_least
    largest = float(np.finfo(np.float64).max)
    if not _feasible(problem, stages, largest):
        return _INF
    low, high = at_least, largest  # rejected, accepted
    below, within = _ratio_limits(problem, low), _ratio_limits(problem, high)
    while _ratio_candidates(problem, below, within, count_only=True)[0] > _RATIO_CANDIDATES:
        low_bits, high_bits = _float_bits(low), _float_bits(high)
        if high_bits - low_bits <= 1:
            return high
        middle = _bits_float((low_bits + high_bits) // 2)
        limits = _ratio_limits(problem, middle)
        if _forward_reach(problem, stages, *_windows_with(problem, limits)) is None:
            low, below = middle, limits
        else:
            high, within = middle, limits
    _, candidates = _ratio_candidates(problem, below, within, count_only=False)
    rejected, accepted = -1, len(candidates)  # the answer is among the candidates
    while accepted - rejected > 1:
        middle_index = (rejected + accepted) // 2
        if _feasible(problem, stages, float(candidates[middle_index])):
            accepted = middle_index
        else:
            rejected = middle_index
    assert accepted < len(candidates), "the least threshold is a cut ratio"
    return float(candidates[accepted])


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
    lo, hi = stage_windows(problem, threshold)
    forward = _forward_reach(problem, stages, lo, hi)
    used = threshold
    if forward is None:
        diagnosis = diagnose(problem, stages, threshold)
        if not adaptive or diagnosis.constraint != "threshold":
            return diagnosis
        assert diagnosis.needed is not None
        used = diagnosis.needed
        lo, hi = stage_windows(problem, used)
        forward = _forward_reach(problem, stages, lo, hi)
        assert forward is not None, "the least threshold admits a plan"
    cuts = _solve_band(
        problem, stages, lo, hi, forward, problem.cut_comm if tie_cost is None else tie_cost
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

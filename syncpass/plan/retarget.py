"""Re-target a cost file to another batch size (and see how the plan moves with it), or
to an optimizer state sharded over data-parallel replicas.

Compute time, activation bytes and the bytes crossing each cut scale with the
batch; parameter bytes, the link latency ``alpha`` and the fixed part of each
op's time (what every call costs whatever its batch, when the profile measured
it) do not. So at small
batches latency dominates and fewer, cheaper cuts win, at large batches the
bytes crossing a cut matter more: the best cuts move with the batch size.
The scaling is linear, which is what a cost file measured at one batch size
can support; a device that is not yet saturated at small batches runs them
faster than this predicts (profile at the batch you train with when it matters).

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from syncpass.contracts.costs import Costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import Plan, PlanCache, PlanRequest, make_plan
from syncpass.plan.schedule import OrderSource, single_stage_order
from syncpass.plan.tensor_plan import TensorPlan


def retarget_batch(costs: Costs, batch_size: int) -> Costs:
    """``costs`` as they would be measured at ``batch_size`` (linear in the batch)."""
    if not 1 <= batch_size <= 2**40:
        raise SyncpassError(f"the batch size must be between 1 and 2**40, got {batch_size}")
    if batch_size == costs.batch_size:
        return costs
    scale = batch_size / costs.batch_size
    ops = tuple(
        dataclasses.replace(
            op.with_compute_scaled(scale),
            out_bytes=op.out_bytes * scale,
            saved_bytes=None if op.saved_bytes is None else op.saved_bytes * scale,
            input_bytes=None if op.input_bytes is None else op.input_bytes * scale,
            flops=None if op.flops is None else op.flops * scale,
        )
        for op in costs.ops
    )
    cuts = tuple(
        dataclasses.replace(
            cut,
            live_bytes=cut.live_bytes * scale,
            values=tuple(
                dataclasses.replace(value, bytes=value.bytes * scale) for value in cut.values
            ),
        )
        for cut in costs.cuts
    )
    note = (
        f"re-targeted from batch {costs.batch_size} to {batch_size}: compute and activation "
        f"bytes x{scale:.3g}, parameters, link latency and per-call fixed times unchanged"
    )
    return dataclasses.replace(
        costs, batch_size=batch_size, ops=ops, cuts=cuts, notes=(*costs.notes, note)
    )


def speed_factor(costs: Costs, probes_s: Sequence[float]) -> float:
    """How much slower the machine ran where the speed probe took ``probes_s`` (their
    median) than while ``costs`` were measured: 1 without probes on either side."""
    measured = costs.speed_probe_s
    found = [probe for probe in probes_s if probe > 0]
    if measured is None or not found:
        return 1.0
    return statistics.median(found) / measured


def retarget_speed(costs: Costs, probe_s: float) -> tuple[Costs, float]:
    """``costs`` as measured on the same machine at the speed where syncpass's speed probe
    takes ``probe_s`` (``syncpass run`` times it between its steps), and the factor every
    op time was multiplied by: ``probe_s`` over the cost file's ``speed_probe_s``. A cost
    file without a probe (counted, re-targeted to other hardware, or older) is returned
    as it is, with factor 1. Link and runtime overhead are the hardware profile's and
    stay as they are."""
    measured = costs.speed_probe_s
    factor = speed_factor(costs, (probe_s,))
    if measured is None or factor == 1.0:
        return costs, 1.0
    note = (
        f"op times x{factor:.3g}: the machine's speed probe took {probe_s * 1e3:.2f} ms "
        f"here, {measured * 1e3:.2f} ms while the ops were measured"
    )
    return (
        dataclasses.replace(
            costs,
            ops=tuple(op.with_time_scaled(factor) for op in costs.ops),
            notes=(*costs.notes, note),
            speed_probe_s=probe_s,
        ),
        factor,
    )


def retarget_tensor_parallel(costs: Costs, plan: TensorPlan) -> Costs:
    """``costs`` (of a model profiled whole) for stages whose layers ``plan`` splits over
    ``plan.tp`` ranks: each op's time that scales (not its fixed part per call) multiplied
    by the share one rank computes of the tensor-parallel ops inside it (those whose id is
    the op's or starts with it and a dot: ``blocks.3.attn.qkv`` inside ``blocks.3``; a split
    op computes a ``1/tp`` share), and the plan's collectives inside it added, forward and
    backward. An op with no tensor-parallel op inside keeps its times. A note says so."""
    shares: dict[str, tuple[float, float]] = {}  # op -> (per rank, whole)
    collectives: dict[str, tuple[float, float]] = {}  # op -> (forward, backward)
    prefixes = sorted((op.id for op in costs.ops), key=len, reverse=True)

    def owner(name: str) -> str | None:
        return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)

    for layout in plan.layouts:
        found = owner(layout.op)
        if found is None:
            continue
        whole = layout.compute_s * (1 if layout.layout == "replicated" else plan.tp)
        rank, total = shares.get(found, (0.0, 0.0))
        shares[found] = (rank + layout.compute_s, total + whole)
    for item in plan.collectives:
        found = owner(item.value)
        if found is None or item.within is not None:
            continue
        forward, backward = collectives.get(found, (0.0, 0.0))
        if item.direction == "forward":
            collectives[found] = (forward + item.time_s, backward)
        else:
            collectives[found] = (forward, backward + item.time_s)
    ops = []
    for op in costs.ops:
        rank, total = shares.get(op.id, (0.0, 0.0))
        scaled = op.with_compute_scaled(rank / total) if total > 0 else op
        forward, backward = collectives.get(op.id, (0.0, 0.0))
        ops.append(
            dataclasses.replace(
                scaled,
                compute_s=scaled.compute_s + forward,
                backward_s=scaled.backward_s + backward,
            )
        )
    split = sum(1 for rank, total in shares.values() if total > 0 and rank < total)
    note = (
        f"tensor-parallel over {plan.tp} ranks: {split} op(s) computed as one rank's share "
        "of the split layers inside them, with their collectives added"
    )
    return dataclasses.replace(costs, ops=tuple(ops), notes=(*costs.notes, note))


#: What a stage holds per byte of weights besides its optimizer state, when training:
#: the weights and their gradients. The rest of ``memory_multiplier`` (two Adam moments,
#: for the 4 that ``syncpass profile`` writes) is the optimizer's.
WEIGHTS_AND_GRADIENTS = 2


def shard_optimizer_state(costs: Costs, shards: int) -> Costs:
    """``costs`` with each stage's optimizer state split over ``shards`` data-parallel
    replicas of the pipeline (ZeRO-1, FSDP's ``SHARD_GRAD_OP``): of the memory multiplier,
    the weights and gradients stay whole and the rest is divided by ``shards``."""
    if not 1 <= shards <= 2**20:
        raise SyncpassError(f"--optimizer-shards must be between 1 and 2**20, got {shards}")
    if shards == 1:
        return costs
    if not costs.training or costs.memory_multiplier <= WEIGHTS_AND_GRADIENTS:
        raise SyncpassError(
            f"--optimizer-shards {shards}: the cost file holds no optimizer state to shard "
            f"(memory_multiplier {costs.memory_multiplier:g}"
            f"{'' if costs.training else ', not training'}; weights and gradients count "
            f"{WEIGHTS_AND_GRADIENTS})"
        )
    state = costs.memory_multiplier - WEIGHTS_AND_GRADIENTS
    multiplier = WEIGHTS_AND_GRADIENTS + state / shards
    note = (
        f"optimizer state sharded over {shards} data-parallel replicas: memory multiplier "
        f"{costs.memory_multiplier:g} -> {multiplier:.3g} (weights and gradients whole, "
        f"{state:g}x of optimizer state / {shards})"
    )
    return dataclasses.replace(costs, memory_multiplier=multiplier, notes=(*costs.notes, note))


@dataclass(frozen=True)
class SweepPoint:
    """The plan at one batch size, or why there is none."""

    batch_size: int
    plan: Plan | None
    error: str | None = None

    @property
    def cuts(self) -> tuple[str, ...] | None:
        return None if self.plan is None else tuple(p.after for p in self.plan.sync_points)


@dataclass(frozen=True)
class PlanRange:
    """Batch sizes ``low..high`` (inclusive) over which the same sync points are optimal."""

    low: int
    high: int
    cuts: tuple[str, ...] | None  # None: no plan meets the constraints there


def sweep_batch(
    costs: Costs,
    request: PlanRequest,
    batch_sizes: Sequence[int],
    origin: str = "",
    orders: OrderSource = single_stage_order,
) -> tuple[tuple[SweepPoint, ...], tuple[PlanRange, ...]]:
    """Plan at each of ``batch_sizes``; then the exact batch ranges of each plan.

    Between two swept sizes whose plans differ, the batch size where the plan
    changes is found by bisection over whole batch sizes (assuming one change
    between them; a sweep with closer sizes shows more). ``orders`` gives a multi-stage
    schedule's order (:class:`~syncpass.plan.planner.PlanCache`).
    """
    sizes = sorted(set(batch_sizes))
    if not sizes:
        raise SyncpassError("--sweep-batch needs at least one batch size")
    if request.stages_per_device is None:
        raise SyncpassError("--sweep-batch needs a fixed --stages-per-device V")

    def cuts_at(batch: int) -> tuple[str, ...] | None:
        return _point(costs, request, batch, origin, orders).cuts

    points = tuple(_point(costs, request, batch, origin, orders) for batch in sizes)
    ranges: list[PlanRange] = []
    low = sizes[0]
    for left, right in itertools.pairwise(points):
        if left.cuts != right.cuts:
            change = _first_change(cuts_at, left.batch_size, right.batch_size, left.cuts)
            ranges.append(PlanRange(low, change - 1, left.cuts))
            low = change
    ranges.append(PlanRange(low, sizes[-1], points[-1].cuts))
    return points, tuple(ranges)


def _point(
    costs: Costs, request: PlanRequest, batch: int, origin: str, orders: OrderSource
) -> SweepPoint:
    try:
        at_batch = retarget_batch(costs, batch)
        plan = make_plan(at_batch, request, origin, PlanCache(at_batch, orders))
    except SyncpassError as error:  # no plan at this batch size (or too few samples)
        return SweepPoint(batch, None, error.message)
    return SweepPoint(batch, plan)


def _first_change(
    cuts_at: Callable[[int], tuple[str, ...] | None],
    low: int,
    high: int,
    low_cuts: tuple[str, ...] | None,
) -> int:
    """Smallest batch in ``(low, high]`` whose plan differs from ``low``'s."""
    while high - low > 1:
        middle = (low + high) // 2
        if cuts_at(middle) == low_cuts:
            low = middle
        else:
            high = middle
    return high


def sweep_to_json(points: Sequence[SweepPoint], ranges: Sequence[PlanRange]) -> dict[str, Any]:
    """``plan --sweep-batch --json``: the plan at each batch size and the ranges of each plan."""
    return {
        "sweep": [
            {
                "batch_size": point.batch_size,
                "sync_points": None if point.cuts is None else list(point.cuts),
                "bottleneck_s": None if point.plan is None else point.plan.bottleneck_s,
                "predicted_step_s": None if point.plan is None else point.plan.predicted_step_s,
                **({"error": point.error} if point.error else {}),
            }
            for point in points
        ],
        "ranges": [
            {
                "low": plan_range.low,
                "high": plan_range.high,
                "sync_points": None if plan_range.cuts is None else list(plan_range.cuts),
            }
            for plan_range in ranges
        ],
    }

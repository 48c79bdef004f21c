"""torch's pipeline schedules by syncpass's names, and the order each runs its actions in.

:data:`SCHEDULE_CLASSES` maps ``--schedule`` to the class of
``torch.distributed.pipelining`` that ``syncpass run`` steps. :func:`schedule_order`
reads, from that very class, the compute actions each rank runs (its
``pipeline_order``, which torch lowers to the sends and receives it runs), so that
the planner simulates the order torch runs rather than one derived again.

Reading the order needs no process group: a schedule computes every rank's order
in its constructor from the stages' indices, the group's size and the micro-batch
count, and the stand-ins handed to it here carry just those. Nothing is run.

``gpipe`` and ``1f1b`` are the exception: torch's single-stage schedules step a
loop of their own, and ``Schedule1F1B``'s ``pipeline_order`` (drawn for display)
disagrees with that loop in torch 2.13 (rank 1 of 2 lists ``F1 .. F4`` for four
micro-batches), so their orders are the planner's own
(:func:`syncpass.plan.schedule.stage_order`), which follow the loop.
"""

from __future__ import annotations

import types
from typing import Any

from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from syncpass.contracts.config import MULTI_STAGE_SCHEDULES, SCHEDULES, stage_devices
from syncpass.core.errors import SyncpassError
from syncpass.plan.schedule import Action, ScheduleOrder, single_stage_order

SCHEDULE_CLASSES: dict[str, type[Any]] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "looped-bfs": ScheduleLoopedBFS,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}
assert tuple(SCHEDULE_CLASSES) == SCHEDULES

_KINDS = {
    _ComputationType.FORWARD: "F",
    _ComputationType.FULL_BACKWARD: "B",
    _ComputationType.BACKWARD_INPUT: "I",
    _ComputationType.BACKWARD_WEIGHT: "W",
}


def _stand_in(stage: int, stages: int, devices: int, rank: int) -> types.SimpleNamespace:
    """What a schedule's constructor reads of a stage: its index, the stage count and its
    rank in a group of ``devices``."""
    return types.SimpleNamespace(
        stage_index=stage,
        num_stages=stages,
        group_size=devices,
        group_rank=rank,
        is_first=stage == 0,
        is_last=stage == stages - 1,
        stage_index_to_group_rank=None,
        submod=None,  # no module: nothing compiled to refuse
    )


def _no_loss(output: Any, target: Any) -> Any:  # pragma: no cover - never called
    return output


def _compute_only(schedule_class: type[Any]) -> type[Any]:
    """``schedule_class``, computing every rank's order but not lowering it.

    The constructor computes each rank's compute actions (``pipeline_order``), then
    lowers them (``_prepare_schedule_with_comms``): it inserts the sends and receives,
    and the unshard and reshard of FSDP, between them, in the same order. The
    simulator models the transfers itself, so the lowering, which takes seconds at
    hundreds of stages and micro-batches, is skipped.
    """

    def keep_compute_only(self: Any, actions: Any, format: str = "compute_only") -> None:
        return None

    return type(
        schedule_class.__name__,
        (schedule_class,),
        {"_prepare_schedule_with_comms": keep_compute_only},
    )


def _compute_actions(action: _Action | None) -> list[Action]:
    """``action``'s compute, in the order it runs (an overlapped forward and backward: the
    forward first, as one worker runs them)."""
    if action is None:
        return []
    if action.sub_actions is not None:
        return [part for sub in action.sub_actions for part in _compute_actions(sub)]
    kind = _KINDS.get(action.computation_type)
    if kind is None or action.microbatch_index is None:
        return []  # REDUCE_GRAD, UNSHARD, RESHARD: no compute of the pipeline's own
    return [Action(kind, action.stage_index, action.microbatch_index)]


def schedule_order(
    schedule: str, devices: int, stages_per_device: int, microbatches: int, training: bool = True
) -> ScheduleOrder:
    """The compute actions each of ``devices`` ranks runs, in order, under torch's
    ``schedule`` with ``stages_per_device`` stages a rank and ``microbatches`` per step.

    Raises :class:`SyncpassError` with torch's reason when the schedule refuses the
    combination (ZBV with other than two stages a rank, interleaving with a micro-batch
    count it cannot split into rounds, ...). For inference (``training`` false) each
    rank runs the forwards of its training order, in that order.
    """
    if schedule not in MULTI_STAGE_SCHEDULES:
        return single_stage_order(schedule, devices, stages_per_device, microbatches, training)
    try:
        placement = stage_devices(schedule, devices, stages_per_device)
    except ValueError as error:
        raise SyncpassError(f"--schedule {schedule}: {error}") from None
    stages = len(placement)
    local = [s for s in range(stages) if placement[s] == 0]
    try:
        instance = _compute_only(SCHEDULE_CLASSES[schedule])(
            [_stand_in(s, stages, devices, 0) for s in local], microbatches, loss_fn=_no_loss
        )
    except ValueError as error:
        raise SyncpassError(
            f"torch's {SCHEDULE_CLASSES[schedule].__name__} refuses {devices} device(s) x "
            f"{stages_per_device} stage(s) with {microbatches} micro-batch(es): {error}"
        ) from None
    order = instance.pipeline_order
    kept = ("F", "B", "I", "W") if training else ("F",)  # inference: the forwards alone
    return ScheduleOrder(
        schedule=schedule,
        microbatches=microbatches,
        stage_device=placement,
        actions=tuple(
            tuple(
                part
                for action in order[rank]
                for part in _compute_actions(action)
                if part.kind in kept
            )
            for rank in range(devices)
        ),
    )

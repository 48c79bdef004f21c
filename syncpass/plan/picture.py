"""The picture of a plan's simulated step: ``syncpass plan --picture OUT.png``.

One row per device (per stage when each device holds one), time running left to right
over the predicted step: each action the schedule runs (:attr:`Prediction.actions`) as a
bar of its kind, forward blue and backward green (a zero-bubble schedule's inputs' and
weights' gradients, ``I`` and ``W``, amber and purple), numbered with its micro-batch
when the number fits; the transfers it is busy with before (receiving) and after
(sending) red; the rest of the step, the bubble and the waits for a partner, grey. The
title gives the predicted step. Drawn by :mod:`syncpass.core.picture`.
"""

from __future__ import annotations

import math

from syncpass.core.picture import BACKWARD, FORWARD, TRANSFER, Chart, Kind, Span, draw_chart
from syncpass.core.units import percent, seconds
from syncpass.plan.planner import Plan
from syncpass.plan.schedule import Prediction

#: The kinds of span in a plan's picture, in legend order (the legend lists those drawn).
PLAN_KINDS = (
    Kind("F", "forward", FORWARD),
    Kind("B", "backward", BACKWARD),
    Kind("I", "backward, inputs' gradient (I)", (244, 180, 0)),
    Kind("W", "backward, weights' gradient (W)", (142, 84, 204)),
    Kind("transfer", "send/recv", TRANSFER),
)


def schedule_chart(plan: Plan, prediction: Prediction) -> Chart:
    """The chart of ``prediction``, ``plan``'s simulated step with its actions kept
    (:func:`syncpass.plan.planner.timed_step`)."""
    if not prediction.actions:
        raise ValueError("the prediction kept no actions; simulate it with record=True")
    if not math.isclose(prediction.step_s, plan.predicted_step_s, rel_tol=1e-9, abs_tol=1e-15):
        raise ValueError(
            f"the prediction's step ({prediction.step_s} s) is not the plan's "
            f"({plan.predicted_step_s} s); simulate the plan itself"
        )
    rows = []
    for actions in prediction.actions:
        spans: list[Span] = []
        for timed in actions:
            computing = timed.start_s + timed.recv_s
            sent = timed.end_s - timed.send_s
            if timed.recv_s > 0:
                spans.append(Span("transfer", timed.start_s, computing))
            spans.append(Span(timed.action.kind, computing, sent, str(timed.action.microbatch)))
            if timed.send_s > 0:
                spans.append(Span("transfer", sent, timed.end_s))
        rows.append(tuple(spans))
    drawn = {span.kind for spans in rows for span in spans}
    return Chart(
        rows=tuple(rows),
        labels=_row_labels(plan),
        total_s=prediction.step_s,
        kinds=tuple(kind for kind in PLAN_KINDS if kind.kind in drawn),
        idle="idle (bubble, waiting for a partner)",
        title=_title(plan, prediction),
    )


def draw_plan_picture(plan: Plan, prediction: Prediction, width: int = 1200) -> bytes:
    """The PNG file's bytes of :func:`schedule_chart`."""
    return draw_chart(schedule_chart(plan, prediction), width)


def _row_labels(plan: Plan) -> tuple[str, ...]:
    if plan.stages_per_device == 1:
        by_device = sorted(plan.stages, key=lambda stage: stage.device)
        return tuple(f"stage {stage.index}" for stage in by_device)
    held: list[list[int]] = [[] for _ in range(plan.devices)]
    for stage in plan.stages:
        held[stage.device].append(stage.index)
    return tuple(
        f"rank {device}: stages {','.join(map(str, stages))}" for device, stages in enumerate(held)
    )


def _title(plan: Plan, prediction: Prediction) -> str:
    """As the report says it: ``gpt, 4 stages: predicted step (1f1b, 8 micro-batches) 145 ms;
    communication wait 6.02%, bubble 26.9%``."""
    stages = f"{len(plan.stages)} stage{'s' if len(plan.stages) > 1 else ''}"
    if plan.stages_per_device > 1:
        stages += f" on {plan.devices} ranks"
    return (
        f"{plan.model or 'plan'}, {stages}: predicted step ({plan.schedule}, "
        f"{plan.microbatches} micro-batches) {seconds(prediction.step_s)}; communication "
        f"wait {percent(prediction.comm_wait_ratio)}, bubble {percent(prediction.bubble_ratio)}"
    )

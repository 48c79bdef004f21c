"""The plan as a person reads it: stages, sync points and why, baselines side by side."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

from syncpass.contracts.config import V_SHAPE_SCHEDULES
from syncpass.core.units import num_bytes, percent, percents_apart, seconds
from syncpass.plan.planner import Plan
from syncpass.plan.retarget import PlanRange, SweepPoint


def _table(rows: Sequence[Sequence[str]], right: frozenset[int] = frozenset()) -> list[str]:
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[col]) if col in right else cell.ljust(widths[col])
            for col, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _wrapped(line: str, width: int | None) -> list[str]:
    """``line`` as one line, or wrapped at ``width`` columns, each further line indented
    two columns past the first's indent."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.wrap(
        line, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def _span(ops: Sequence[str]) -> str:
    return ops[0] if len(ops) == 1 else f"{ops[0]} .. {ops[-1]}"


def render_plan(plan: Plan, baselines: Sequence[Plan] = (), width: int | None = None) -> str:
    """A text report of ``plan``, with ``baselines`` compared on the same costs; the
    sync points' explanations wrap at ``width`` columns when given (a terminal's)."""
    mode = "training" if plan.training else "inference"
    title = f"syncpass plan: {plan.model or 'model'}"
    context = f"batch {plan.batch_size}, {mode}"
    if plan.hardware:
        context += f", hardware {plan.hardware}"
    placed = ""
    if plan.stages_per_device > 1:
        placed = (
            f" on {plan.devices} device(s), {plan.stages_per_device} each "
            f"({'in a V' if plan.schedule in V_SHAPE_SCHEDULES else 'round-robin'})"
        )
    lines = [
        f"{title} ({context})",
        f"{len(plan.stages)} stage(s){placed}, strategy {plan.strategy}, "
        f"min_sync_interval {plan.min_sync_interval}",
    ]
    tau = plan.threshold
    if tau.raised_for_speed:
        assert tau.admitting is not None and tau.admitting_step_s is not None
        start, used = percents_apart(tau.admitting, tau.used)
        if tau.forced_by is not None:
            start += (
                f", the least that admits a plan (forced by the sync point after {tau.forced_by})"
            )
        lines.append(
            f"threshold: requested {percent(tau.requested)}, raised to {used} for "
            f"speed: predicted step {seconds(plan.predicted_step_s)}, against "
            f"{seconds(tau.admitting_step_s)} at {start}"
        )
    elif tau.raised:
        lines.append(
            f"threshold: requested {percent(tau.requested)}, raised to {percent(tau.used)} "
            f"(the least that admits a plan; forced by the sync point after {tau.forced_by})"
        )
    else:
        over = sum(point.ratio > tau.requested for point in plan.sync_points)
        verdict = f"not met by {over} sync point(s): {plan.strategy} ignores it" if over else "met"
        lines.append(f"threshold: {percent(tau.requested)} ({verdict})")
    lines.append("")
    several = plan.stages_per_device > 1
    rows = [
        [
            "stage",
            *(["device"] if several else []),
            "ops",
            "#ops",
            "compute",
            "comm in",
            "comm out",
            "time",
            "memory",
            "comm/compute",
        ]
    ]
    for stage, point in zip(plan.stages, (*plan.sync_points, None), strict=True):
        rows.append(
            [
                str(stage.index),
                *([str(stage.device)] if several else []),
                _span(stage.ops),
                str(len(stage.ops)),
                seconds(stage.compute_s),
                seconds(stage.comm_in_s),
                seconds(stage.comm_out_s),
                seconds(stage.time_s) + (" *" if stage.index == plan.bottleneck_stage else ""),
                num_bytes(stage.memory_bytes),
                "-" if point is None else percent(point.ratio),
            ]
        )
    shift = 1 if several else 0
    lines += _table(rows, right=frozenset(column + shift for column in (2, 3, 4, 5, 6, 7, 8)))
    lines.append(
        f"* bottleneck {seconds(plan.bottleneck_s)} (stage {plan.bottleneck_stage}); "
        f"communication {seconds(plan.total_comm_s)} per step over all sync points"
    )
    if several:
        local = [
            point.after
            for point, stage, following in zip(
                plan.sync_points, plan.stages, plan.stages[1:], strict=False
            )
            if stage.device == following.device
        ]
        if local:
            lines.append(
                f"  the sync point(s) after {', '.join(local)} join two stages of one device: "
                "nothing is sent there, and the predicted step charges nothing (the stage "
                "times above do)"
            )
        for device in range(plan.devices):
            held = [stage for stage in plan.stages if stage.device == device]
            lines.append(
                f"  device {device}: stages {', '.join(str(stage.index) for stage in held)}; "
                f"time {seconds(sum(stage.time_s for stage in held))}, memory "
                f"{num_bytes(sum(stage.memory_bytes for stage in held))}"
            )
    lines.append(
        f"predicted step ({plan.schedule}, {plan.microbatches} micro-batches): "
        f"{seconds(plan.predicted_step_s)}; communication wait {percent(plan.comm_wait_ratio)}, "
        f"bubble {percent(plan.bubble_ratio)}"
    )
    if plan.comm_wait_ratio > 0.10:
        lines.append(
            "  note: communication wait is above 10% of the step; fewer stages, larger "
            "micro-batches or a faster link would help"
        )
    if plan.expanded:
        lines += ["", "nested nn.Sequential children planned one by one (too big for a stage):"]
        lines += [f"  {expansion.describe()}" for expansion in plan.expanded]
    if plan.sync_points:
        lines += ["", "sync points:"]
        for point in plan.sync_points:
            lines += _wrapped(f"  after {point.after}: {point.reason}", width)
            if point.recomputed:
                lines += _wrapped(
                    f"    the next stage computes {', '.join(point.recomputed)} again: cheaper "
                    "than receiving it",
                    width,
                )
    else:
        lines += ["", "no sync points: one stage holds the whole model"]
    for note in plan.notes:
        lines.append(f"note: {note}")
    for violation in plan.violations:
        lines.append(f"violates: {violation}")
    if baselines:
        lines += ["", "compared on the same costs and candidate cuts:"]
        rows = [
            [
                "strategy",
                "bottleneck",
                "predicted step",
                "syncpass speedup",
                "sync points",
                "breaks",
            ]
        ]
        for other in (plan, *baselines):
            speedup = (
                other.predicted_step_s / plan.predicted_step_s
                if plan.predicted_step_s > 0
                else math.nan
            )
            rows.append(
                [
                    other.strategy,
                    seconds(other.bottleneck_s),
                    seconds(other.predicted_step_s),
                    "-" if other is plan else f"{speedup:.3f}x",
                    ", ".join(point.after for point in other.sync_points) or "-",
                    f"{len(other.violations)} constraint(s)" if other.violations else "-",
                ]
            )
        lines += _table(rows, right=frozenset({1, 2, 3}))
        for other in baselines:  # what the equal-layers rule counted
            lines += [f"  {note}" for note in other.notes if note.startswith("uniform: ")]
        for other in baselines:
            for violation in other.violations:
                lines.append(f"  {other.strategy} breaks: {violation}")
    return "\n".join(lines) + "\n"


def render_sweep(points: Sequence[SweepPoint], ranges: Sequence[PlanRange]) -> str:
    """How the plan moves with the batch size."""
    rows = [["batch", "bottleneck", "predicted step", "comm wait", "sync points"]]
    for point in points:
        if point.plan is None:
            rows.append([str(point.batch_size), "-", "-", "-", f"no plan: {point.error}"])
            continue
        rows.append(
            [
                str(point.batch_size),
                seconds(point.plan.bottleneck_s),
                seconds(point.plan.predicted_step_s),
                percent(point.plan.comm_wait_ratio),
                ", ".join(point.cuts or ()) or "-",
            ]
        )
    lines = ["how the plan moves with the batch size:", ""]
    lines += _table(rows, right=frozenset({1, 2, 3}))
    lines += ["", "each plan is optimal over:"]
    for plan_range in ranges:
        what = "no plan" if plan_range.cuts is None else ", ".join(plan_range.cuts) or "one stage"
        lines.append(f"  batch {plan_range.low}..{plan_range.high}: {what}")
    return "\n".join(lines) + "\n"

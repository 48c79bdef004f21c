"""The plan file (version 1): a Plan as JSON, for the rewrite stage and for people.

JSON has no infinity: an unlimited threshold is written as ``null``.
The format is documented in ``docs/formats.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncpass.contracts.config import stage_devices
from syncpass.contracts.costs import parse_settings
from syncpass.core.errors import SyncpassError
from syncpass.core.jsonio import read_json
from syncpass.plan.levels import Expansion
from syncpass.plan.planner import Checkpointed, Plan, StagePlan, SyncPoint, Threshold

PLAN_FILE_VERSION = 1


def plan_to_json(plan: Plan, baselines: tuple[Plan, ...] = ()) -> dict[str, Any]:
    """The plan file's object; ``baselines`` are added under ``"baselines"`` in brief."""
    data: dict[str, Any] = {"version": PLAN_FILE_VERSION}
    if plan.model is not None:
        data["model"] = plan.model
    data.update(
        strategy=plan.strategy,
        batch_size=plan.batch_size,
        training=plan.training,
        hardware=plan.hardware,
        schedule=plan.schedule,
        microbatches=plan.microbatches,
        min_sync_interval=plan.min_sync_interval,
        num_stages=len(plan.stages),
        # Written only when a device holds more than one stage, as each stage's device.
        **({"stages_per_device": plan.stages_per_device} if plan.stages_per_device > 1 else {}),
        bottleneck_s=plan.bottleneck_s,
        total_comm_s=plan.total_comm_s,
        predicted_step_s=plan.predicted_step_s,
        comm_wait_ratio=plan.comm_wait_ratio,
        bubble_ratio=plan.bubble_ratio,
        threshold={
            "requested": _finite_or_none(plan.threshold.requested),
            "used": _finite_or_none(plan.threshold.used),
            "forced_by": plan.threshold.forced_by,
            # With no raise for speed both are null; an unlimited threshold is null too.
            "admitting": None
            if plan.threshold.admitting is None
            else _finite_or_none(plan.threshold.admitting),
            "admitting_step_s": plan.threshold.admitting_step_s,
        },
        sync_points=[
            {
                "after": point.after,
                "live_bytes": point.live_bytes,
                "comm_s": point.comm_s,
                "ratio": _finite_or_none(point.ratio),
                "pinned": point.pinned,
                "reason": point.reason,
                **({"kinds": dict(point.kinds)} if point.kinds else {}),
                **({"recomputed": list(point.recomputed)} if point.recomputed else {}),
            }
            for point in plan.sync_points
        ],
        stages=[
            {
                "index": stage.index,
                "ops": list(stage.ops),
                "compute_s": stage.compute_s,
                "comm_in_s": stage.comm_in_s,
                "comm_out_s": stage.comm_out_s,
                "time_s": stage.time_s,
                "memory_bytes": stage.memory_bytes,
                "sync_s": stage.sync_s,
                "idle_s": stage.idle_s,
                **({"device": stage.device} if plan.stages_per_device > 1 else {}),
            }
            for stage in plan.stages
        ],
        violations=list(plan.violations),
        notes=list(plan.notes),
    )
    if plan.model_settings:
        data["model_settings"] = dict(plan.model_settings)
    if plan.expanded:  # written only when the plan looks into a nested nn.Sequential
        data["expanded"] = [
            {
                "op": expansion.op,
                "compute_s": expansion.compute_s,
                "ideal_stage_s": expansion.ideal_s,
                **({"pinned": True} if expansion.pinned else {}),
            }
            for expansion in plan.expanded
        ]
    if plan.checkpointed:  # written only when the plan recomputes (--recompute)
        data["checkpointed"] = [
            {
                "op": checkpointed.op,
                "stage": checkpointed.stage,
                "frees_bytes": checkpointed.frees_bytes,
                "cost_s": checkpointed.cost_s,
            }
            for checkpointed in plan.checkpointed
        ]
    if baselines:
        data["baselines"] = [
            {
                "strategy": other.strategy,
                "sync_points": [point.after for point in other.sync_points],
                "bottleneck_s": other.bottleneck_s,
                "total_comm_s": other.total_comm_s,
                "predicted_step_s": other.predicted_step_s,
                "violations": list(other.violations),
            }
            for other in baselines
        ]
    return data


def dumps_plan(plan: Plan, baselines: tuple[Plan, ...] = ()) -> str:
    return json.dumps(plan_to_json(plan, baselines), indent=2) + "\n"


def load_plan(path: str | Path) -> Plan:
    """Read a plan file; errors name the file and the JSON path at fault."""
    return parse_plan(read_json(path, "plan file"), str(path))


def parse_plan(data: Any, origin: str = "<plan>") -> Plan:
    """Build a :class:`Plan` from decoded JSON (the inverse of :func:`plan_to_json`)."""

    def fail(path: str, message: str) -> SyncpassError:
        return SyncpassError(message, f"{origin}:{path}")

    if not isinstance(data, dict):
        raise fail("$", "must be a JSON object")
    if data.get("version") != PLAN_FILE_VERSION:
        raise fail("$.version", f"unsupported version {data.get('version')!r}; expected 1")
    _check_placement(data, fail)
    try:
        threshold = data["threshold"]
        plan = Plan(
            strategy=data["strategy"],
            batch_size=data["batch_size"],
            training=data["training"],
            schedule=data["schedule"],
            microbatches=data["microbatches"],
            min_sync_interval=data["min_sync_interval"],
            threshold=Threshold(
                requested=_none_to_inf(threshold["requested"]),
                used=_none_to_inf(threshold["used"]),
                forced_by=threshold.get("forced_by"),
                admitting=(
                    None
                    if "admitting_step_s" not in threshold or threshold["admitting_step_s"] is None
                    else _none_to_inf(threshold.get("admitting"))
                ),
                admitting_step_s=threshold.get("admitting_step_s"),
            ),
            sync_points=tuple(
                SyncPoint(
                    after=point["after"],
                    live_bytes=point["live_bytes"],
                    comm_s=point["comm_s"],
                    ratio=_none_to_inf(point["ratio"]),
                    pinned=point.get("pinned", False),
                    reason=point.get("reason", ""),
                    kinds=tuple(sorted(point.get("kinds", {}).items())),
                    recomputed=_names(point.get("recomputed", [])),
                )
                for point in data["sync_points"]
            ),
            stages=tuple(
                StagePlan(
                    index=stage["index"],
                    ops=tuple(stage["ops"]),
                    compute_s=stage["compute_s"],
                    comm_in_s=stage["comm_in_s"],
                    comm_out_s=stage["comm_out_s"],
                    time_s=stage["time_s"],
                    memory_bytes=stage["memory_bytes"],
                    sync_s=stage.get("sync_s", 0.0),
                    idle_s=stage.get("idle_s", 0.0),
                    device=stage.get("device", stage["index"]),
                )
                for stage in data["stages"]
            ),
            bottleneck_s=data["bottleneck_s"],
            total_comm_s=data["total_comm_s"],
            predicted_step_s=data["predicted_step_s"],
            comm_wait_ratio=data["comm_wait_ratio"],
            bubble_ratio=data["bubble_ratio"],
            violations=tuple(data.get("violations", ())),
            notes=tuple(data.get("notes", ())),
            hardware=data.get("hardware"),
            model=data.get("model"),
            stages_per_device=data.get("stages_per_device", 1),
            model_settings=parse_settings(data.get("model_settings", {}), fail),
            expanded=tuple(
                Expansion(
                    op=expansion["op"],
                    compute_s=expansion["compute_s"],
                    ideal_s=expansion["ideal_stage_s"],
                    pinned=expansion.get("pinned", False),
                )
                for expansion in data.get("expanded", ())
            ),
            checkpointed=tuple(
                Checkpointed(
                    op=checkpointed["op"],
                    stage=checkpointed["stage"],
                    frees_bytes=checkpointed["frees_bytes"],
                    cost_s=checkpointed["cost_s"],
                )
                for checkpointed in data.get("checkpointed", ())
            ),
        )
    except KeyError as error:
        raise fail("$", f"missing required field {error.args[0]!r}") from None
    except (TypeError, ValueError) as error:
        raise fail("$", f"malformed plan: {error}") from None
    return plan


def _check_placement(data: dict[str, Any], fail: Callable[[str, str], SyncpassError]) -> None:
    """``stages_per_device`` a whole number that fills every device alike, and each stage's
    ``device`` where the schedule places it."""
    per_device = data.get("stages_per_device", 1)
    stages = data.get("stages")
    if isinstance(per_device, bool) or not isinstance(per_device, int) or per_device < 1:
        raise fail("$.stages_per_device", f"must be a whole number >= 1, got {per_device!r}")
    if not isinstance(stages, list) or not stages:
        return  # reported with the other fields
    if len(stages) % per_device:
        raise fail(
            "$.stages_per_device",
            f"{per_device} stages per device do not divide the plan's {len(stages)} stages",
        )
    try:
        placement = stage_devices(data.get("schedule", ""), len(stages) // per_device, per_device)
    except ValueError as error:
        raise fail("$.stages_per_device", str(error)) from None
    for index, (stage, device) in enumerate(zip(stages, placement, strict=True)):
        given = stage.get("device", device) if isinstance(stage, dict) else device
        if given != device:
            raise fail(
                f"$.stages[{index}].device",
                f"is {given!r}, but {data.get('schedule')} places stage {index} on device {device}",
            )


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise TypeError(f"expected a list of names, got {value!r}")
    return tuple(value)


def _finite_or_none(value: float) -> float | None:
    return None if math.isinf(value) else value


def _none_to_inf(value: float | None) -> float:
    return math.inf if value is None else float(value)

"""The tensor-parallel plan as a person reads it: where each collective goes, what
crosses, its predicted time and why; the split ops; the hand placements beside it."""

from __future__ import annotations

import math

from syncpass.core.units import num_bytes, seconds
from syncpass.plan.report import _table
from syncpass.plan.tensor_plan import PlanCost, TensorPlan


def render_tensor_plan(plan: TensorPlan) -> str:
    """A text report of ``plan``."""
    mode = "training" if plan.training else "inference"
    context = f"tp {plan.tp}, batch {plan.batch_size}, {mode}"
    if plan.hardware:
        context += f", hardware {plan.hardware}"
    cost = plan.cost
    limit = (
        f" (limit {num_bytes(plan.memory_limit_bytes)})"
        if plan.memory_limit_bytes is not None
        else ""
    )
    sequence = "off"
    if plan.sequence_parallel:
        sequence = "used" if plan.uses_sequence_parallel else "allowed, not used"
    lines = [
        f"syncpass tensor plan: {plan.model or 'model'} ({context})",
        f"predicted step {seconds(cost.step_s)} per device: compute {seconds(cost.compute_s)}"
        f" + collectives {seconds(cost.comm_s)}; memory {num_bytes(cost.memory_bytes)}{limit}",
        f"sequence parallelism: {sequence}",
        "",
    ]
    split = [layout for layout in plan.layouts if layout.layout != "replicated"]
    lines.append(
        f"split ops ({len(split)} of {len(plan.layouts)}; the rest run replicated):"
        if split
        else "every op runs replicated: no split pays for its collectives on this link"
    )
    if split:
        rows = [["op", "layout", "reads -> makes", "compute/device", "weights/device", "where"]]
        for layout in split:
            rows.append(
                [
                    layout.op,
                    layout.layout,
                    f"{','.join(layout.reads) or '-'} -> {layout.output}",
                    seconds(layout.compute_s),
                    num_bytes(layout.param_bytes),
                    layout.source or "",
                ]
            )
        lines.extend("  " + line for line in _table(rows, right=frozenset({3, 4})))
    forward = sum(item.direction == "forward" for item in plan.collectives)
    backward = len(plan.collectives) - forward
    lines += ["", f"collectives: {forward} forward, {backward} backward"]
    for number, item in enumerate(plan.collectives, 1):
        at = f"within {item.within}" if item.within else f"after {item.where}"
        lines.append(
            f"  {number}. {item.direction} {item.kind} of {item.value} ({at}): "
            f"{item.source} -> {item.target}, {num_bytes(item.bytes)}, {seconds(item.time_s)}"
        )
        if item.why:
            lines.append(f"     why: {item.why}")
    if plan.baselines:
        lines += ["", "the same costs, other placements:"]
        lines.extend("  " + line for line in _table(_cost_rows(plan), right=frozenset({1, 2, 3})))
        for baseline in plan.baselines:
            if baseline.note:
                lines.append(f"  {baseline.name}: {baseline.note}")
    if plan.notes:
        lines += ["", "notes:"]
        lines.extend(f"  - {note}" for note in plan.notes)
    return "\n".join(lines) + "\n"


def _cost_rows(plan: TensorPlan) -> list[list[str]]:
    rows = [
        ["placement", "step", "compute", "collectives", "count (fwd/bwd)", "memory", "vs syncpass"]
    ]
    for cost in (plan.cost, *plan.baselines):
        rows.append(_cost_row(cost, plan.cost))
    return rows


def _cost_row(cost: PlanCost, best: PlanCost) -> list[str]:
    if math.isinf(cost.step_s):
        return [cost.name, "cannot run", "", "", "", "", ""]
    ratio = "" if cost is best else f"x{cost.step_s / best.step_s:.3g}"
    fits = "" if cost.fits else " (does not fit)"
    return [
        cost.name,
        seconds(cost.step_s),
        seconds(cost.compute_s),
        seconds(cost.comm_s),
        f"{cost.forward_collectives}/{cost.backward_collectives}",
        num_bytes(cost.memory_bytes) + fits,
        ratio,
    ]

"""The tensor-parallel plan: each op's layout and each collective, as data and as JSON.

This is the contract the later stages consume: the rewrite writes one sync call per
:class:`PlannedCollective` (its ``kind``, the value it turns, where: right after the op
that makes the value, before ``readers``), slices each split op's weights as its
:class:`OpLayout` says, and ``run --tp`` counts the collectives it runs against the
plan's. Every figure is per step on one device of the group.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


def family(name: str) -> str:
    """Ops of repeated layers share a family (``h.3.attn.c_proj`` -> ``h.*.attn.c_proj``)."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name)


TENSOR_PLAN_VERSION = 1


@dataclass(frozen=True)
class OpLayout:
    """How one op runs: ``layout`` (``replicated``, ``column``, ``row``, ``vocab``, ``width``,
    ``heads``, ``query-heads``, ``split``, ``partial``, ``sequence``), the state of each
    input as it reads it and of its output (``R``, ``C``, ``P``, ``S``), its compute (forward
    and backward) and weights on one device."""

    op: str
    kind: str
    layout: str
    reads: tuple[str, ...]
    output: str
    compute_s: float
    param_bytes: float
    source: str | None = None
    module: str | None = None


@dataclass(frozen=True)
class PlannedCollective:
    """One collective of the step.

    ``value`` is the id of the op whose output it turns from ``source`` state into
    ``target`` (in the backward: its gradient), ``direction`` ``forward`` or ``backward``;
    it goes right after that op (``where``: its ``file:line``, else its id), before
    ``readers``. ``within`` names the op that runs it inside itself (the
    vocabulary-parallel loss; the weight-gradient bucket) instead of between ops.
    ``why`` says why the layouts around it were chosen.
    """

    kind: str
    direction: str
    value: str
    source: str
    target: str
    bytes: float
    time_s: float
    where: str
    readers: tuple[str, ...] = ()
    within: str | None = None
    why: str = ""


@dataclass(frozen=True)
class PlanCost:
    """A placement scored on the plan's costs: the step on one device and its parts."""

    name: str
    step_s: float
    compute_s: float
    comm_s: float
    memory_bytes: float
    fits: bool
    forward_collectives: int
    backward_collectives: int
    note: str = ""


@dataclass(frozen=True)
class TensorPlan:
    """A tensor-parallel plan for ``tp`` devices, with the hand placements beside it."""

    tp: int
    batch_size: int
    training: bool
    sequence_parallel: bool  # whether the plan could split values on the sequence
    layouts: tuple[OpLayout, ...]
    collectives: tuple[PlannedCollective, ...]
    cost: PlanCost
    baselines: tuple[PlanCost, ...] = ()
    hardware: str | None = None
    model: str | None = None
    memory_limit_bytes: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def uses_sequence_parallel(self) -> bool:
        return any("S" in (layout.output, *layout.reads) for layout in self.layouts)

    def layout_of(self, op: str) -> OpLayout:
        return next(layout for layout in self.layouts if layout.op == op)


def tensor_plan_to_json(plan: TensorPlan) -> dict[str, Any]:
    """The plan as JSON (``syncpass plan --strategy tensor --json``)."""
    data: dict[str, Any] = {"version": TENSOR_PLAN_VERSION, "kind": "tensor"}
    if plan.model is not None:
        data["model"] = plan.model
    data.update(
        tp=plan.tp,
        batch_size=plan.batch_size,
        training=plan.training,
        hardware=plan.hardware,
        memory_limit_bytes=plan.memory_limit_bytes,
        sequence_parallel={"allowed": plan.sequence_parallel, "used": plan.uses_sequence_parallel},
        predicted=plan_cost_to_json(plan.cost),
        baselines=[plan_cost_to_json(cost) for cost in plan.baselines],
        layouts=[
            {
                "op": layout.op,
                "kind": layout.kind,
                "layout": layout.layout,
                "reads": list(layout.reads),
                "output": layout.output,
                "compute_s": layout.compute_s,
                "param_bytes": layout.param_bytes,
                "source": layout.source,
                "module": layout.module,
            }
            for layout in plan.layouts
        ],
        collectives=[
            {
                "kind": item.kind,
                "direction": item.direction,
                "value": item.value,
                "from": item.source,
                "to": item.target,
                "bytes": item.bytes,
                "time_s": item.time_s,
                "where": item.where,
                "readers": list(item.readers),
                "within": item.within,
                "why": item.why,
            }
            for item in plan.collectives
        ],
        notes=list(plan.notes),
    )
    return data


def plan_cost_to_json(cost: PlanCost) -> dict[str, Any]:
    """A placement's cost as JSON (the plan's ``predicted`` and each of its ``baselines``)."""
    return {
        "name": cost.name,
        "step_s": cost.step_s,
        "compute_s": cost.compute_s,
        "comm_s": cost.comm_s,
        "memory_bytes": cost.memory_bytes,
        "fits": cost.fits,
        "forward_collectives": cost.forward_collectives,
        "backward_collectives": cost.backward_collectives,
        "note": cost.note,
    }

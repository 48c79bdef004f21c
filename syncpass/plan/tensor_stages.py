"""Pipeline stages of tensor-parallel groups: ``syncpass plan --strategy tensor --tp N|auto
--stages S``.

Each of the ``S`` stages runs on ``T`` devices that split its layers by the tensor-parallel
plan; ``devices / (S * T)`` such pipelines train data-parallel. For a degree ``T`` the
tensor-parallel plan is made on the cost file's tensor graph, the pipeline's op times are
brought to what one rank of a stage computes under it
(:func:`~syncpass.plan.retarget.retarget_tensor_parallel`), and the stages are planned as any
pipeline is. ``--tp auto`` keeps the degree whose pipelines train the most sequences a
second: ``replicas * batch / (step + gradient all-reduce)``, the all-reduce of one device's
weights over the replicas (not overlapped with the backward: an upper bound of the step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from syncpass.contracts.costs import Costs
from syncpass.contracts.tensor import TensorGraph
from syncpass.core.errors import SyncpassError
from syncpass.plan.collectives import ALL_REDUCE, collective_s
from syncpass.plan.planner import Plan, PlanRequest, make_plan
from syncpass.plan.retarget import retarget_tensor_parallel
from syncpass.plan.tensor_optimizer import Link
from syncpass.plan.tensor_plan import TensorPlan
from syncpass.plan.tensor_planner import DegreeOption, TensorRequest, plan_tensor


@dataclasses.dataclass(frozen=True)
class StagedTensorPlan:
    """The chosen degree's tensor-parallel plan, its pipeline plan, and every degree tried."""

    tensor: TensorPlan
    pipeline: Plan
    options: tuple[DegreeOption, ...]


def plan_tensor_stages(
    costs: Costs,
    graph: TensorGraph,
    link: Link,
    degrees: Sequence[int],
    devices: int,
    tensor_request: TensorRequest,
    pipeline_request: PlanRequest,
    **plan: Any,
) -> StagedTensorPlan:
    """Of ``degrees``, the one whose ``devices / (stages * tp)`` pipelines train the most
    sequences a second (the least degree wins a tie)."""
    stages = pipeline_request.stages or 1
    options: list[DegreeOption] = []
    best: tuple[float, TensorPlan, Plan] | None = None
    for tp in degrees:
        replicas = devices // (stages * tp)
        if replicas < 1:
            options.append(
                DegreeOption(tp, 0, refused=f"{stages} x {tp} ranks exceed the {devices} devices")
            )
            continue
        try:
            split = plan_tensor(graph, link, dataclasses.replace(tensor_request, tp=tp), **plan)
            staged = retarget_tensor_parallel(costs, split) if tp > 1 else costs
            pipeline = make_plan(staged, pipeline_request)
        except SyncpassError as error:
            options.append(DegreeOption(tp, replicas, refused=error.message))
            continue
        weights = sum(layout.param_bytes for layout in split.layouts) / stages
        reduce_s = (
            collective_s(ALL_REDUCE, weights, replicas, link.alpha_s, link.beta_bytes_per_s)
            if split.training
            else 0.0
        )
        step = pipeline.predicted_step_s
        rate = replicas * costs.batch_size / (step + reduce_s)
        options.append(DegreeOption(tp, replicas, step, reduce_s, rate))
        if best is None or rate > best[0] * (1 + 1e-9):
            best = (rate, split, pipeline)
    if best is None:
        reasons = list(dict.fromkeys(option.refused for option in options))
        raise SyncpassError(
            f"no tensor-parallel degree has a plan at {stages} stage(s) on {devices} devices: "
            + (
                reasons[0]
                if len(reasons) == 1
                else "; ".join(f"tp {o.tp}: {o.refused}" for o in options)
            )
        )
    return StagedTensorPlan(best[1], best[2], tuple(options))

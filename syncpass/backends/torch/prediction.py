"""Predictions next to measurements: what the cost model said a run would take.

``syncpass run FILE --costs COSTS`` finds the sync points FILE carries (the
``pipe_split()`` calls, read from the source like any other), plans exactly
those cuts on COSTS for the run's schedule and micro-batches, and sets the
predicted step and stage times beside the measured ones, so the cost model is
checked against a real run rather than trusted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import INPUT, OUTPUT
from syncpass.core.errors import SyncpassError
from syncpass.core.units import percent, seconds
from syncpass.frontend import analyse_model, loop_containers, parse_source, sequential_calls
from syncpass.frontend.match import container_sizes, match_costs
from syncpass.plan.planner import Plan, PlanRequest, make_plan
from syncpass.runtime.contracts import RunResult


@dataclass(frozen=True)
class RunPrediction:
    """The plan of the sync points a file carries, and the run that measured it."""

    plan: Plan
    measured_step_s: float
    measured_stage_steps_s: tuple[float, ...]
    measured_wait_ratio: float

    @property
    def ratio(self) -> float:
        """Predicted over measured step time."""
        return self.plan.predicted_step_s / self.measured_step_s if self.measured_step_s else 0.0


def predict_run(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    """Plan the sync points written in ``text`` on ``costs`` as ``result`` ran them."""
    module = parse_source(text, path)
    name = costs.model
    graph = analyse_model(
        module,
        path,
        name,
        container_sizes(costs, loop_containers(module, name, path)),
        text,
        container_sizes(costs, sequential_calls(module, name, path)),
    )
    # Ops are named as in the cost file: the inserted lines moved the file's own.
    renamed = match_costs(graph, costs)
    as_measured = {here.id: there.id for here, there in zip(renamed.ops, costs.ops, strict=True)}
    as_measured.update({INPUT: INPUT, OUTPUT: OUTPUT})
    written = {as_measured[op_id] for op_id in graph.written}
    unknown = written - {cut.after for cut in costs.cuts}
    if unknown:
        raise SyncpassError(
            f"the cost file has no cut after {', '.join(sorted(unknown))}, where {path} syncs",
            path,
        )
    costs = dataclasses.replace(
        costs,
        cuts=tuple(dataclasses.replace(cut, pinned=cut.after in written) for cut in costs.cuts),
        edges=tuple((as_measured[a], as_measured[b]) for a, b in graph.edges),
    )
    request = PlanRequest(
        stages=len(written) + 1 if written else 1,
        config=SyncConfig(strategy="manual" if written else "adaptive"),
        microbatches=result.microbatches,
        schedule=result.request.schedule,
    )
    plan = make_plan(costs, request, path)
    steps = tuple(stage.step_s for stage in result.stages)
    slowest = max(range(len(steps)), key=steps.__getitem__)
    stage = result.stages[slowest]
    wait = stage.step_s - stage.compute_times_s[stage.median_step]
    return RunPrediction(
        plan=plan,
        measured_step_s=steps[slowest],
        measured_stage_steps_s=steps,
        measured_wait_ratio=wait / steps[slowest] if steps[slowest] else 0.0,
    )


def render_prediction(prediction: RunPrediction) -> str:
    """Predicted beside measured, per stage and for the step."""
    plan = prediction.plan
    lines = [
        "",
        f"predicted by the cost model ({plan.schedule}, {plan.microbatches} micro-batches) "
        "beside the measured run:",
    ]
    for index, (stage, measured) in enumerate(
        zip(plan.stages, prediction.measured_stage_steps_s, strict=False)
    ):
        lines.append(
            f"  stage {index}: {stage.ops[0]} .. {stage.ops[-1]}: predicted busy "
            f"{seconds(stage.time_s)} per step, measured step {seconds(measured)}"
        )
    lines.append(
        f"  step: predicted {seconds(plan.predicted_step_s)}, measured "
        f"{seconds(prediction.measured_step_s)} (predicted/measured {prediction.ratio:.2f}); "
        f"communication wait predicted {percent(plan.comm_wait_ratio)}, measured "
        f"{percent(prediction.measured_wait_ratio)} (bubbles included)"
    )
    return "\n".join(lines) + "\n"


def prediction_to_json(prediction: RunPrediction) -> dict[str, Any]:
    plan = prediction.plan
    return {
        "sync_points": [point.after for point in plan.sync_points],
        "predicted_step_s": plan.predicted_step_s,
        "measured_step_s": prediction.measured_step_s,
        "predicted_over_measured": prediction.ratio,
        "predicted_comm_wait_ratio": plan.comm_wait_ratio,
        "measured_wait_ratio": prediction.measured_wait_ratio,
        "stages": [
            {
                "ops": [stage.ops[0], stage.ops[-1]],
                "predicted_time_s": stage.time_s,
                "measured_step_s": measured,
            }
            for stage, measured in zip(plan.stages, prediction.measured_stage_steps_s, strict=False)
        ],
    }

"""A run's prediction beside its measurement: the result every backend's predict hook
returns, and its report and JSON form (``syncpass run --costs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncpass.core.units import num_bytes, percent, seconds
from syncpass.plan.planner import Plan
from syncpass.plan.tensor_plan import TensorPlan


@dataclass(frozen=True)
class RunPrediction:
    """The plan of the sync points a file carries, and the run that measured it."""

    plan: Plan
    measured_step_s: float
    measured_stage_steps_s: tuple[float, ...]
    measured_wait_ratio: float
    # Per rank: the memory model's prediction for the file's cuts and the blocks its stages
    # recompute (weights, activations), beside the measured peak (RunResult's figures).
    predicted_memory: tuple[tuple[float, float], ...] = ()
    measured_memory: tuple[tuple[int, int | None], ...] = ()  # (peak, its activations)
    memory_measure: str = ""
    memory_note: str = ""
    # The op times' scale to the machine's speed during the run (its speed probes over the
    # cost file's), and the step the plan predicts at the profile's speed where it is not 1.
    speed_factor: float = 1.0
    profile_speed_step_s: float | None = None
    # The run's ranks where they are more than the plan's pipeline ranks (stages of several
    # tensor-parallel ranks each); 0: one rank a stage.
    ranks: int = 0

    @property
    def ratio(self) -> float:
        """Predicted over measured step time."""
        return self.plan.predicted_step_s / self.measured_step_s if self.measured_step_s else 0.0


def render_prediction(prediction: RunPrediction) -> str:
    """Predicted beside measured, per stage and for the step."""
    plan = prediction.plan
    lines = [
        "",
        f"predicted by the cost model ({plan.schedule}, {plan.microbatches} micro-batches) "
        "beside the measured run:",
    ]
    measured_by_rank = prediction.measured_stage_steps_s
    if plan.stages_per_device == 1:
        for index, (stage, measured) in enumerate(zip(plan.stages, measured_by_rank, strict=False)):
            lines.append(
                f"  stage {index}: {stage.ops[0]} .. {stage.ops[-1]}: predicted busy "
                f"{seconds(stage.time_s)} per step, measured step {seconds(measured)}"
            )
    else:
        for rank, measured in enumerate(measured_by_rank):
            held = [stage for stage in plan.stages if stage.device == rank]
            lines.append(
                f"  rank {rank} (stages {', '.join(str(stage.index) for stage in held)}): "
                f"predicted busy {seconds(sum(stage.time_s for stage in held))} per step, "
                f"measured step {seconds(measured)}"
            )
    lines.append(
        f"  step: predicted {seconds(plan.predicted_step_s)}, measured "
        f"{seconds(prediction.measured_step_s)} (predicted/measured {prediction.ratio:.2f}); "
        f"communication wait predicted {percent(plan.comm_wait_ratio)}, measured "
        f"{percent(prediction.measured_wait_ratio)} (bubbles included)"
    )
    if prediction.profile_speed_step_s is not None:
        unscaled = prediction.profile_speed_step_s
        lines.append(
            f"  the machine ran {speed_words(prediction.speed_factor)} than while profiling "
            f"(its speed probe between the steps against the cost file's): op times "
            f"x{prediction.speed_factor:.2f}; at the profile's speed the step is predicted "
            f"{seconds(unscaled)} (predicted/measured "
            f"{unscaled / prediction.measured_step_s if prediction.measured_step_s else 0.0:.2f})"
        )
    if prediction.predicted_memory and prediction.measured_memory:
        lines.append(f"  peak memory per rank, measured as {prediction.memory_measure}:")
        for rank, ((weights, activations), (peak, saved)) in enumerate(
            zip(prediction.predicted_memory, prediction.measured_memory, strict=False)
        ):
            predicted = weights + activations
            measured_activations = "" if saved is None else f"; activations {num_bytes(saved)}"
            lines.append(
                f"    rank {rank}: predicted {num_bytes(predicted)} (weights "
                f"{num_bytes(weights)}, activations {num_bytes(activations)}), measured "
                f"{num_bytes(peak)}{measured_activations} (predicted/measured "
                f"{predicted / peak if peak else 0.0:.2f})"
            )
        if prediction.memory_note:
            lines.append(f"    {prediction.memory_note}")
    if plan.shared_step_s is not None and prediction.measured_step_s:
        shared = plan.shared_step_s
        lines.append(
            f"  the prediction is for a device per rank (the hardware profile's); here "
            f"{prediction.ranks or plan.devices} ranks share fewer, which takes at least "
            f"{seconds(shared)} a step "
            f"({shared / plan.predicted_step_s:.2f}x the prediction; predicted/measured "
            f"{shared / prediction.measured_step_s:.2f} with it)"
        )
    return "\n".join(lines) + "\n"


def speed_words(factor: float) -> str:
    """``1.31x slower`` for a factor above 1, ``1.20x faster`` below."""
    return f"{factor:.2f}x slower" if factor >= 1 else f"{1 / factor:.2f}x faster"


def prediction_to_json(prediction: RunPrediction) -> dict[str, Any]:
    plan = prediction.plan
    return {
        "sync_points": [point.after for point in plan.sync_points],
        "predicted_step_s": plan.predicted_step_s,
        "measured_step_s": prediction.measured_step_s,
        "predicted_over_measured": prediction.ratio,
        "shared_step_s": plan.shared_step_s,
        "ranks": prediction.ranks or plan.devices,
        "speed_factor": prediction.speed_factor,
        "profile_speed_step_s": prediction.profile_speed_step_s,
        "predicted_comm_wait_ratio": plan.comm_wait_ratio,
        "measured_wait_ratio": prediction.measured_wait_ratio,
        **(
            {
                "memory": [
                    {
                        "predicted_bytes": weights + activations,
                        "predicted_weights_bytes": weights,
                        "predicted_activation_bytes": activations,
                        "measured_bytes": peak,
                        "measured_activation_bytes": saved,
                    }
                    for (weights, activations), (peak, saved) in zip(
                        prediction.predicted_memory, prediction.measured_memory, strict=False
                    )
                ],
                "memory_measure": prediction.memory_measure,
            }
            if prediction.predicted_memory and prediction.measured_memory
            else {}
        ),
        "stages": [
            {
                "ops": [stage.ops[0], stage.ops[-1]],
                "predicted_time_s": stage.time_s,
                "device": stage.device,
                "measured_step_s": measured,  # of its device
            }
            for stage in plan.stages
            if stage.device < len(prediction.measured_stage_steps_s)
            for measured in (prediction.measured_stage_steps_s[stage.device],)
        ],
    }


@dataclass(frozen=True)
class TensorRunPrediction:
    """The tensor-parallel plan of the layouts a file carries, and its run's step (the
    slowest rank's median)."""

    plan: TensorPlan
    measured_step_s: float
    speed_factor: float = 1.0  # the compute's scale to the run's speed (RunPrediction's)

    @property
    def ratio(self) -> float:
        """Predicted over measured step time."""
        cost = self.plan.cost
        return cost.step_s / self.measured_step_s if self.measured_step_s else 0.0


def render_tensor_prediction(prediction: TensorRunPrediction) -> str:
    """Predicted beside measured, for a ``run --tp`` file."""
    cost = prediction.plan.cost
    split = sum(item.layout != "replicated" for item in prediction.plan.layouts)
    return (
        f"predicted by the cost model for the file's layouts ({split} of "
        f"{len(prediction.plan.layouts)} op(s) split): step {seconds(cost.step_s)} "
        f"(compute {seconds(cost.compute_s)}, collectives {seconds(cost.comm_s)}: "
        f"{cost.forward_collectives} forward, {cost.backward_collectives} backward), "
        f"measured {seconds(prediction.measured_step_s)} (predicted/measured "
        f"{prediction.ratio:.2f})"
        + (
            ""
            if prediction.speed_factor == 1.0
            else f"; compute x{prediction.speed_factor:.2f}, the machine "
            f"{speed_words(prediction.speed_factor)} than while profiling"
        )
        + "\n"
    )


def tensor_prediction_to_json(prediction: TensorRunPrediction) -> dict[str, Any]:
    cost = prediction.plan.cost
    return {
        "predicted_step_s": cost.step_s,
        "predicted_compute_s": cost.compute_s,
        "predicted_collectives_s": cost.comm_s,
        "measured_step_s": prediction.measured_step_s,
        "predicted_over_measured": prediction.ratio,
        "split_ops": sum(item.layout != "replicated" for item in prediction.plan.layouts),
        "speed_factor": prediction.speed_factor,
    }

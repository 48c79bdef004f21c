"""The torch backend's predict hook: what the cost model says a run of a file would take.

``syncpass run FILE --costs COSTS`` finds the sync points FILE carries (the
``pipe_split()`` calls, read from the source like any other), plans exactly
those cuts on COSTS for the run's schedule and micro-batches, and sets the
predicted step and stage times beside the measured ones
(:class:`~syncpass.runtime.prediction.RunPrediction`), so the cost model is
checked against a real run rather than trusted. The op times are taken at the
speed the machine had during the run (the ranks' speed probes against the cost
file's: :func:`syncpass.plan.retarget.retarget_speed`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import statistics
from collections.abc import Iterable

from syncpass.backends.torch.analysis import analyse_model, loop_containers, sequential_calls
from syncpass.backends.torch.memory import RUN_MEMORY_MULTIPLIER
from syncpass.backends.torch.orders import cached_order
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import INPUT, OUTPUT, OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.frontend.match import container_sizes, match_costs
from syncpass.frontend.source import parse_source
from syncpass.plan.planner import PlanCache, PlanRequest, make_plan
from syncpass.plan.recompute_plan import stage_memory_model, with_recomputation
from syncpass.plan.retarget import retarget_speed, retarget_tensor_parallel
from syncpass.rewrite.source import KnownOps
from syncpass.runtime.contracts import RunResult
from syncpass.runtime.prediction import RunPrediction


def predict_run(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    """Plan the sync points written in ``text`` on ``costs`` as ``result`` ran them."""
    module = parse_source(text, path)
    name = costs.model
    # The lengths the profile recorded win over those read off the op ids: a loop over
    # part of a container (self.layers[:-1]) names fewer layers than the container holds.
    recorded = dict(costs.containers)
    graph = analyse_model(
        module,
        path,
        name,
        {**container_sizes(costs, loop_containers(module, name, path)), **recorded},
        text,
        container_sizes(costs, sequential_calls(module, name, path)),
    )
    return predict_cuts(graph, graph.written, path, costs, result)


def predict_cuts(
    graph: OpGraph,
    written: Iterable[str],
    path: str,
    costs: Costs,
    result: RunResult,
    carries_values: bool = False,
) -> RunPrediction:
    """Plan the cuts after the ops ``written`` (ids of ``graph``, the file's model) on
    ``costs`` as ``result`` ran them; ``carries_values`` for stages that send a value on
    to any later stage (the eager form)."""
    # Ops are named as in the cost file: the inserted lines moved the file's own.
    renamed = match_costs(graph, costs)
    as_measured = {here.id: there.id for here, there in zip(renamed.ops, costs.ops, strict=True)}
    as_measured.update({INPUT: INPUT, OUTPUT: OUTPUT})
    cut_after = {as_measured[op_id] for op_id in written}
    unknown = cut_after - {cut.after for cut in costs.cuts}
    if unknown:
        raise SyncpassError(
            f"the cost file has no cut after {', '.join(sorted(unknown))}, where {path} syncs",
            path,
        )
    costs = dataclasses.replace(
        costs,
        cuts=tuple(dataclasses.replace(cut, pinned=cut.after in cut_after) for cut in costs.cuts),
        edges=tuple((as_measured[a], as_measured[b]) for a, b in graph.edges),
    )
    per_device = result.request.stages_per_device
    request = PlanRequest(
        stages=(len(cut_after) + 1) // per_device if cut_after else 1,
        config=SyncConfig(strategy="manual" if cut_after else "adaptive"),
        microbatches=result.microbatches,
        schedule=result.request.schedule,
        carries_values=carries_values,
        stages_per_device=per_device,
    )
    probes = [probe for stage in result.stages for probe in stage.speed_probes_s]
    at_speed, factor = retarget_speed(costs, statistics.median(probes)) if probes else (costs, 1.0)
    plan = make_plan(at_speed, request, path, PlanCache(at_speed, cached_order))
    at_profile = (
        make_plan(costs, request, path, PlanCache(costs, cached_order)) if factor != 1.0 else None
    )
    steps = tuple(stage.step_s for stage in result.stages)
    slowest = max(range(len(steps)), key=steps.__getitem__)
    stage = result.stages[slowest]
    wait = stage.step_s - stage.compute_times_s[stage.median_step]
    return RunPrediction(
        plan=plan,
        measured_step_s=steps[slowest],
        measured_stage_steps_s=steps,
        measured_wait_ratio=wait / steps[slowest] if steps[slowest] else 0.0,
        speed_factor=factor,
        profile_speed_step_s=None if at_profile is None else at_profile.predicted_step_s,
    )


def predict_stages_run(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    """The eager form's predict hook: the cuts are where the file's stage classes end."""
    from syncpass.backends.torch.stages import analyse, written_cuts
    from syncpass.transformers.torch_stages import STAGES_COMMENT

    if STAGES_COMMENT not in text:  # a pipe_split() file: its calls are the sync points
        return predict_run(text, path, costs, result)
    source = analyse(text, path, KnownOps.of_costs(costs), costs.model)
    cuts = written_cuts(text, path, source)
    recomputed = written_recomputes(text)
    # The stages' times pay each checkpointed block's forward again in its backward.
    timed = with_recomputation(costs, recomputed)
    if result.request.tp > 1:  # each stage's layers split as the file's layout says
        from syncpass.backends.torch.tensor_prediction import (
            literal_layouts,
            written_layouts_plan,
        )

        split = written_layouts_plan(costs, literal_layouts(text), result.request.tp)
        timed = retarget_tensor_parallel(timed, split)
    prediction = predict_cuts(source.graph, cuts, path, timed, result, carries_values=True)
    if result.request.tp > 1:  # the memory model counts a stage's weights whole
        return with_tensor_ranks(prediction, costs, result.request.tp)
    return with_memory(prediction, recomputed, costs, result)


def with_tensor_ranks(prediction: RunPrediction, costs: Costs, tp: int) -> RunPrediction:
    """``prediction`` of stages of ``tp`` ranks each: where they are more than the hardware
    has devices, the least step of the ranks sharing them (each of a stage's ranks doing
    its share of the stage's work) beside the prediction, which is for a device per rank."""
    plan = prediction.plan
    ranks = len(plan.stages) * tp
    devices = costs.hardware.devices
    if devices is None or ranks <= devices:
        return dataclasses.replace(prediction, ranks=ranks)
    work = tp * sum(stage.compute_s + stage.sync_s for stage in plan.stages)
    shared = max(plan.predicted_step_s, work / devices)
    return dataclasses.replace(
        prediction, plan=dataclasses.replace(plan, shared_step_s=shared), ranks=ranks
    )


def written_recomputes(text: str) -> frozenset[str]:
    """The ops the file's eager stage classes recompute (their ``recomputes``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and re.fullmatch(r"\w+Stage\d+", node.name):
            for statement in node.body:
                if (
                    isinstance(statement, ast.Assign)
                    and [getattr(t, "id", None) for t in statement.targets] == ["recomputes"]
                    and isinstance(statement.value, ast.Tuple)
                ):
                    found.update(
                        item.value
                        for item in statement.value.elts
                        if isinstance(item, ast.Constant) and isinstance(item.value, str)
                    )
    return frozenset(found)


def with_memory(
    prediction: RunPrediction, recomputed: frozenset[str], costs: Costs, result: RunResult
) -> RunPrediction:
    """``prediction`` with each rank's memory as the plan's model counts it for these cuts
    and this recomputation, beside the peak each rank measured."""
    measured = [stage for stage in result.stages if stage.peak_memory_bytes is not None]
    if len(measured) != len(result.stages) or result.request.stages_per_device != 1:
        return prediction
    plan = prediction.plan
    memory = stage_memory_model(
        costs,
        tuple(point.after for point in plan.sync_points),
        recomputed,
        plan.schedule,
        plan.microbatches,
        RUN_MEMORY_MULTIPLIER,
    )
    note = (
        f"weights counted at {RUN_MEMORY_MULTIPLIER}x the parameters: the run trains with "
        "plain SGD (weights and gradients, no optimizer state)"
    )
    if costs.memory_multiplier != RUN_MEMORY_MULTIPLIER:
        note += f"; the cost file plans with {costs.memory_multiplier:g}x"
    return dataclasses.replace(
        prediction,
        predicted_memory=tuple((stage.weights, stage.activations) for stage in memory),
        measured_memory=tuple(
            (stage.peak_memory_bytes or 0, stage.peak_activation_bytes) for stage in measured
        ),
        memory_measure=measured[0].memory_measure,
        memory_note=note,
    )

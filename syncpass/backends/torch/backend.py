"""The torch backend's spec: every hook the commands call (:class:`~syncpass.backends.spec.Backend`).

Importing this module imports neither torch, libcst nor the user's code: each
hook imports what it needs when it is called (``syncpass plan`` reads a spec
and never parses a source).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from syncpass.backends.spec import (
    Backend,
    Confirmation,
    EstimateRequest,
    MeasureRequest,
    TensorRewriteRequest,
    TensorRewriteResult,
)
from syncpass.backends.torch.run import PRELOAD
from syncpass.contracts.config import MULTI_STAGE_SCHEDULES
from syncpass.rewrite.source import KnownOps, ModelSource

if TYPE_CHECKING:
    import libcst as cst

    from syncpass.backends.torch.example import Example
    from syncpass.contracts.costs import Costs
    from syncpass.contracts.graph import OpGraph
    from syncpass.frontend.findings import Finding
    from syncpass.plan.schedule import ScheduleOrder
    from syncpass.runtime.contracts import RunRequest, RunResult, TensorRunRequest, TensorRunResult
    from syncpass.runtime.prediction import RunPrediction, TensorRunPrediction
    from syncpass.transformers.common import CheckpointSite, SyncSite


#: What the torch run steps, its default first: torch.distributed.pipelining's schedules.
RUN_SCHEDULES = ("1f1b", "gpipe", *MULTI_STAGE_SCHEDULES)


def _analyse(text: str, path: str, known: KnownOps, class_name: str | None) -> ModelSource:
    from syncpass.backends.torch.analysis import analyse

    return analyse(text, path, known, class_name)


def _insert(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[cst.Module, tuple[str, ...]]:
    from syncpass.backends.torch.rewrite import insert

    return insert(source, sites, path)


def _remove(module: cst.Module, source: ModelSource, path: str) -> str:
    from syncpass.backends.torch.rewrite import remove

    return remove(module, source, path)


def _strip(text: str, path: str, class_name: str | None = None) -> str:
    from syncpass.backends.torch.rewrite import strip_sync_points

    return strip_sync_points(text, path, class_name)


def _lint(text: str, path: str) -> Sequence[Finding]:
    from syncpass.backends.torch.lint import lint_source

    return lint_source(text, path)


def _measure(request: MeasureRequest) -> Costs:
    from syncpass.backends.torch.profile import measure

    return measure(request)


#: The eager stages always plan the children of ``nn.Sequential`` calls (``--depth 2``): a
#: stage may end inside one, and the stage then runs a slice of it (``self.layer3[:1](x)``).
SEQUENTIAL_DEPTH = 2
#: Their profile also plans each child that is an ``nn.Sequential`` per child, this many
#: levels in all (``blocks.1.0`` of timm's EfficientNet is level 3); the planner plans such
#: a group as one op unless it is too big for a stage (:mod:`syncpass.plan.levels`), and a
#: stage then runs a slice of it (``self.blocks[1][1:](x)``). The static estimate stays at
#: :data:`SEQUENTIAL_DEPTH`.
NESTED_DEPTH = 8


def _measure_for_stages(request: MeasureRequest) -> Costs:
    from syncpass.backends.torch.census import census_loops
    from syncpass.backends.torch.profile import AnalysedSource, measure
    from syncpass.backends.torch.stages import (
        ExpandedSource,
        annotate_recorded_loops,
        at_user_lines,
        check_branches,
        expand_source,
        sent_across_cuts,
    )
    from syncpass.frontend.analysis import loop_key
    from syncpass.frontend.branches import ObjectValues

    path = str(request.file)
    expanded: list[ExpandedSource] = []
    read: list[ObjectValues] = []

    def expand(model: object, args: tuple[object, ...]) -> AnalysedSource:
        # The forward is expanded once the model is built: its settings decide branches.
        values = ObjectValues(model, args)
        of = type(model).__name__
        source = expand_source(request.text, path, request.model, values, of)
        # What the decided branches assumed, checked before the expanded forward runs: a
        # branch the example does not take may fail in the profile with a less clear error.
        check_branches(model, args, source, path, request.model)
        planned = request.model or of
        recorded = census_loops(source.expanded, planned, model, args, path)  # type: ignore[arg-type]
        if recorded:
            # The loops that run a layer an iteration, as the run showed: the settings record
            # them, and the expansion marks them so whenever it reads those settings again.
            values.read.update(
                (loop_key(index), container) for index, container in recorded.items()
            )
            marked = annotate_recorded_loops(source.expanded, planned, recorded.get)
            source = dataclasses.replace(source, expanded=marked)
        expanded.append(source)
        read.append(values)
        found = source.inherited.get(request.model) if request.model is not None else None
        inherited = (found.class_name, found.file) if found is not None else None
        return AnalysedSource(source.expanded.code, inherited)

    def refine(graph: OpGraph, model: object, args: tuple[object, ...]) -> OpGraph:
        located = at_user_lines(graph, expanded[0])
        return sent_across_cuts(located, expanded[0].expanded.code, path)

    deeper = dataclasses.replace(request, depth=max(request.depth, NESTED_DEPTH))
    costs = measure(deeper, check_tracer=False, refine=refine, expand=expand)
    return dataclasses.replace(costs, model_settings=tuple(sorted(read[0].read.items())))


def _estimate_for_stages(request: EstimateRequest) -> Costs:
    from syncpass.backends.torch.stages import expand_text
    from syncpass.backends.torch.static import estimate

    expanded = expand_text(request.text, request.file, request.model)
    deeper = dataclasses.replace(request, text=expanded, depth=max(request.depth, SEQUENTIAL_DEPTH))
    return estimate(deeper)


def _analyse_for_stages(
    text: str, path: str, known: KnownOps, class_name: str | None
) -> ModelSource:
    from syncpass.backends.torch.stages import analyse

    return analyse(text, path, known, class_name)


def _insert_stages(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[cst.Module, tuple[str, ...]]:
    from syncpass.backends.torch.stages import insert

    return insert(source, sites, path)


def _insert_checkpointed_stages(
    source: ModelSource,
    sites: Sequence[SyncSite],
    checkpoints: Sequence[CheckpointSite],
    path: str,
) -> tuple[cst.Module, tuple[str, ...]]:
    from syncpass.backends.torch.stages import insert

    return insert(source, sites, path, checkpoints)


def _remove_stages(module: cst.Module, source: ModelSource, path: str) -> str:
    from syncpass.backends.torch.stages import remove

    return remove(module, source, path)


def _strip_stages(text: str, path: str, class_name: str | None = None) -> str:
    from syncpass.backends.torch.stages import strip

    return strip(text, path, class_name)


def _estimate(request: EstimateRequest) -> Costs:
    from syncpass.backends.torch.static import estimate

    return estimate(request)


def _predict(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    from syncpass.backends.torch.prediction import predict_run

    return predict_run(text, path, costs, result)


def _predict_stages(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    from syncpass.backends.torch.prediction import predict_stages_run

    return predict_stages_run(text, path, costs, result)


def _schedule_order(
    schedule: str, devices: int, stages_per_device: int, microbatches: int, training: bool
) -> ScheduleOrder:
    from syncpass.backends.torch.orders import cached_order

    return cached_order(schedule, devices, stages_per_device, microbatches, training)


def _run(request: RunRequest) -> RunResult:
    from syncpass.backends.torch.run import launch

    return launch(request)


def _confirm(confirmation: Confirmation) -> None:
    from syncpass.backends.torch.traceable import confirm_split

    confirm_split(confirmation)


def _tensor_rewrite(request: TensorRewriteRequest) -> TensorRewriteResult:
    from syncpass.backends.torch.tensor_rewrite import rewrite_tensor

    return rewrite_tensor(request)


def _tensor_run(request: TensorRunRequest) -> TensorRunResult:
    from syncpass.backends.torch.tensor_run import launch_tensor

    return launch_tensor(request)


def _tensor_predict(result: TensorRunResult, costs: Costs) -> TensorRunPrediction:
    from syncpass.backends.torch.tensor_prediction import predict_tensor_run

    return predict_tensor_run(result, costs)


def _load_example(spec: str) -> Example:
    from syncpass.backends.torch.example import load_example

    return load_example(spec)


BACKEND = Backend(
    name="torch",
    description="pipe_split() calls in an nn.Module's forward (torch.distributed.pipelining)",
    analyse=_analyse,
    insert=_insert,
    remove=_remove,
    strip=_strip,
    measure=_measure,
    estimate=_estimate,
    run=_run,
    lint=_lint,
    predict=_predict,
    schedules=RUN_SCHEDULES,
    schedule_order=_schedule_order,
    load_example=_load_example,
    confirm=_confirm,
    tensor_rewrite=_tensor_rewrite,
    tensor_run=_tensor_run,
    tensor_predict=_tensor_predict,
    preload=tuple(PRELOAD),
)


#: The eager form: one stage module per pipeline stage, run by ``PipelineStage``
#: (:mod:`syncpass.backends.torch.stages`); measured, estimated, run and linted as above.
STAGES_BACKEND = Backend(
    name="torch_stages",
    description=(
        "one eager stage module per pipeline stage, written after an nn.Module "
        "(torch.distributed.pipelining.PipelineStage)"
    ),
    analyse=_analyse_for_stages,
    insert=_insert_stages,
    insert_checkpointed=_insert_checkpointed_stages,
    remove=_remove_stages,
    strip=_strip_stages,
    measure=_measure_for_stages,
    estimate=_estimate_for_stages,
    run=_run,
    lint=_lint,
    predict=_predict_stages,
    schedules=RUN_SCHEDULES,
    schedule_order=_schedule_order,
    load_example=_load_example,
    carries_values=True,
    refused_kinds=("other",),  # PipelineStage sends tensors; numbers and tuples are packed
    tensor_rewrite=_tensor_rewrite,
    tensor_run=_tensor_run,
    tensor_predict=_tensor_predict,
    preload=tuple(PRELOAD),
)

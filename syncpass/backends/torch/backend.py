"""The torch backend's spec: every hook the commands call (:class:`~syncpass.backends.spec.Backend`).

Importing this module imports neither torch nor the user's code: the measure
and run hooks import torch when they are called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from syncpass.backends.spec import Backend, EstimateRequest, MeasureRequest
from syncpass.backends.torch.analysis import analyse
from syncpass.backends.torch.lint import lint_source
from syncpass.backends.torch.rewrite import insert, remove, strip_sync_points

if TYPE_CHECKING:
    from syncpass.backends.torch.example import Example
    from syncpass.contracts.costs import Costs
    from syncpass.runtime.contracts import RunRequest, RunResult
    from syncpass.runtime.prediction import RunPrediction


def _measure(request: MeasureRequest) -> Costs:
    from syncpass.backends.torch.profile import measure

    return measure(request)


def _estimate(request: EstimateRequest) -> Costs:
    from syncpass.backends.torch.static import estimate

    return estimate(request)


def _predict(text: str, path: str, costs: Costs, result: RunResult) -> RunPrediction:
    from syncpass.backends.torch.prediction import predict_run

    return predict_run(text, path, costs, result)


def _run(request: RunRequest) -> RunResult:
    from syncpass.backends.torch.run import launch

    return launch(request)


def _load_example(spec: str) -> Example:
    from syncpass.backends.torch.example import load_example

    return load_example(spec)


BACKEND = Backend(
    name="torch",
    description="pipe_split() calls in an nn.Module's forward (torch.distributed.pipelining)",
    analyse=analyse,
    insert=insert,
    remove=remove,
    strip=strip_sync_points,
    measure=_measure,
    estimate=_estimate,
    run=_run,
    lint=lint_source,
    predict=_predict,
    schedules=("1f1b", "gpipe"),
    load_example=_load_example,
)

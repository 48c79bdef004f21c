"""The pass as a library, for pipelines that already hold source or a parsed module.

:func:`rewrite_source` and :func:`rewrite_module` plan a model from its cost
file and write the sync points, like ``syncpass rewrite``, but never raise on
bad input and never touch files: the result says what went wrong (message and
``file:line``), so a pipeline that transforms many files can report and go on.

    import libcst as cst
    from syncpass.api import rewrite_module

    tree = cst.parse_module(code)
    tree = tree.visit(MyOtherTransform())           # any libcst stage before ...
    result = rewrite_module(tree, "model.py", costs="model.costs.json", stages=4)
    if result.ok:
        tree = result.module.visit(YetAnotherOne())  # ... and after
    else:
        print(result.error)

The plan's settings come from ``sync_config`` (a :class:`SyncConfig`, or a
mapping of its keys such as ``{"strategy": "adaptive", "min_sync_interval": 2}``)
over the cost file's own. Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from syncpass.backends.registry import load_backend
from syncpass.contracts.config import (
    SyncConfig,
    default_stages_per_device,
    sync_config_from_mapping,
)
from syncpass.contracts.costs import Costs, load_costs
from syncpass.core.errors import SyncpassError, unexpected_error
from syncpass.core.plugins import DEFAULT_BACKEND
from syncpass.plan.planner import Plan, PlanRequest
from syncpass.rewrite.driver import rewrite_text


@dataclass(frozen=True)
class ApiResult:
    """What one rewrite gave: the new source and module, or the error, never both.

    ``code`` and ``module`` are the input unchanged when the rewrite failed, so a
    pipeline can pass the file on as it was (``module`` is empty when ``code``
    does not parse).
    """

    code: str
    module: cst.Module
    plan: Plan | None
    warnings: tuple[str, ...] = ()
    error: SyncpassError | None = None
    changed: bool = False  # the code differs from the input

    @property
    def ok(self) -> bool:
        return self.error is None


def rewrite_source(
    code: str,
    path: str = "<source>",
    *,
    costs: Costs | str | Path,
    stages: int | None,
    sync_config: SyncConfig | Mapping[str, Any] | None = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    stages_per_device: int | str | None = None,
    class_name: str | None = None,
    max_stages: int | None = None,
    backend: str = DEFAULT_BACKEND,
) -> ApiResult:
    """Plan ``costs`` for the model in ``code`` and write its sync points with ``backend``.

    ``stages`` of ``None`` with ``max_stages`` picks the stage count with the
    least predicted step. ``stages`` counts pipeline ranks; under a multi-stage
    ``schedule`` each holds ``stages_per_device`` stages (``None``: the schedule's
    default, 2 for ``zbv`` and ``dualpipev``, else 1; ``"auto"``: the count with the
    least predicted step). Bad input (a syntax error, a cost file of another
    model, an impossible constraint) comes back in :attr:`ApiResult.error`.
    """
    try:
        loaded = costs if isinstance(costs, Costs) else load_costs(costs)
        request = PlanRequest(
            stages=stages,
            config=_config(sync_config, loaded.config),
            microbatches=microbatches,
            schedule=schedule,
            stages_per_device=_stages_per_device(schedule, stages_per_device),
        )
        result = rewrite_text(
            code,
            path,
            load_backend(backend),
            request,
            loaded,
            class_name=class_name,
            max_stages=max_stages,
        )
        module = cst.parse_module(result.rewritten)
    except SyncpassError as error:
        return _failed(code, error)
    except ValueError as error:  # a request out of range (stages < 1, unknown schedule)
        return _failed(code, SyncpassError(str(error), path))
    except Exception as error:  # the API never raises: a crash is a failure too
        return _failed(code, unexpected_error(error, path))
    return ApiResult(result.rewritten, module, result.plan, result.warnings, None, result.changed)


def rewrite_module(
    module: cst.Module,
    path: str = "<module>",
    *,
    costs: Costs | str | Path,
    stages: int | None,
    sync_config: SyncConfig | Mapping[str, Any] | None = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    stages_per_device: int | str | None = None,
    class_name: str | None = None,
    max_stages: int | None = None,
    backend: str = DEFAULT_BACKEND,
) -> ApiResult:
    """:func:`rewrite_source` for a module already parsed; :attr:`ApiResult.module`
    is the new tree (``module`` itself when nothing changed or the rewrite failed)."""
    result = rewrite_source(
        module.code,
        path,
        costs=costs,
        stages=stages,
        sync_config=sync_config,
        microbatches=microbatches,
        schedule=schedule,
        stages_per_device=stages_per_device,
        class_name=class_name,
        max_stages=max_stages,
        backend=backend,
    )
    if not result.ok or not result.changed:
        return ApiResult(module.code, module, result.plan, result.warnings, result.error)
    return result


def _stages_per_device(schedule: str, given: int | str | None) -> int | None:
    """``PlanRequest.stages_per_device`` for the API's ``stages_per_device``."""
    if given == "auto":
        return None
    if given is None:
        return default_stages_per_device(schedule)
    if isinstance(given, bool) or not isinstance(given, int):
        raise ValueError(f'stages_per_device must be a whole number or "auto", got {given!r}')
    return given


def _config(given: SyncConfig | Mapping[str, Any] | None, base: SyncConfig) -> SyncConfig:
    if given is None:
        return base
    if isinstance(given, SyncConfig):
        return given
    return sync_config_from_mapping(dict(given), "sync_config", base)


def _failed(code: str, error: SyncpassError) -> ApiResult:
    try:
        module = cst.parse_module(code)
    except Exception:  # unparseable, or too deep to parse
        module = cst.Module(body=[])
    return ApiResult(code, module, None, (), error)

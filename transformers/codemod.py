"""syncpass as a libcst codemod: ``python -m libcst.tool codemod`` over files and folders.

    python -m libcst.tool initialize .        # once: writes .libcst.codemod.yaml
    python -m libcst.tool codemod --no-format \\
        -x syncpass.transformers.codemod.PipelineSyncCommand --stages 4 models/

Each Python file that holds a model and has a cost file is planned and
rewritten in place, as ``syncpass rewrite --in-place`` would, with the same
settings from the same resolver (:mod:`syncpass.settings.resolve`):
``[tool.syncpass]`` of the nearest ``pyproject.toml`` (its backend, strategy,
threshold, interval, stages, hardware, and the stages and class of the file's
model entry) under the flags given here; the sync points are written for
``--backend`` or the project's backend (by default the eager stage classes of
``torch_stages``; ``pipe_split()`` for ``torch``, ``jax.device_put`` for JAX).
Files without a model or without a cost file are skipped with the reason. The cost file of ``models/gpt.py`` is ``models/gpt.costs.json`` unless
``--costs`` gives another pattern (``{dir}`` and ``{stem}`` are the file's
folder and name without ``.py``), or one file for all. A file the pass refuses
(a cost file of another model, an impossible constraint) fails with the
message ``syncpass rewrite`` would print, and the run goes on with the next.

The command is a :class:`libcst.codemod.CodemodCommand`, so it also runs as a
stage inside another codemod pipeline, on the tree the stages before it made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext, SkipFile

from syncpass.api import rewrite_module
from syncpass.contracts.config import strategy_names
from syncpass.contracts.costs import Costs, load_costs
from syncpass.core.errors import NoModelError, SyncpassError
from syncpass.core.plugins import backend_names
from syncpass.settings.resolve import Overrides, Settings, resolve_settings

DEFAULT_COSTS = "{dir}/{stem}.costs.json"


class PipelineSyncCommand(CodemodCommand):
    """Write the planned pipeline sync points into each model file, for the project's backend."""

    DESCRIPTION: str = (
        "Plan each model's pipeline sync points from its cost file and write them into its "
        "source: pipe_split() calls, or the project backend's sync calls (syncpass)."
    )

    @staticmethod
    def add_args(arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument(
            "--stages",
            type=_stages,
            default=None,
            help="pipeline stages per model, or auto (default: the project's configuration)",
        )
        arg_parser.add_argument(
            "--costs",
            default=DEFAULT_COSTS,
            help="cost file of each model file: a path, or a pattern with {dir} and {stem} "
            f"(default {DEFAULT_COSTS})",
        )
        arg_parser.add_argument("--strategy", choices=strategy_names(), default=None)
        arg_parser.add_argument("--min-sync-interval", type=int, default=None)
        arg_parser.add_argument("--microbatches", type=int, default=None)
        arg_parser.add_argument("--model", default=None, help="the model class in each file")
        arg_parser.add_argument(
            "--backend",
            choices=backend_names(),
            default=None,
            help="what the sync points are written for (default: the project's, else torch_stages)",
        )

    def __init__(
        self,
        context: CodemodContext,
        stages: int | str | None = None,
        costs: str = DEFAULT_COSTS,
        strategy: str | None = None,
        min_sync_interval: int | None = None,
        microbatches: int | None = None,
        model: str | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(context)
        self.backend = backend
        self.stages = stages
        self.costs = costs
        self.strategy = strategy
        self.min_sync_interval = min_sync_interval
        self.microbatches = microbatches
        self.model = model

    def cost_file(self, filename: str) -> Path:
        """The cost file of the model in ``filename``."""
        path = Path(filename)
        return Path(self.costs.format(dir=path.parent, stem=path.stem))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        filename = self.context.filename or "<module>"
        cost_path = self.cost_file(filename)
        if not cost_path.is_file():
            raise SkipFile(f"no cost file {cost_path} (run syncpass profile first)")
        try:
            costs, settings = self._settings(Path(filename), cost_path)
            request = settings.request(costs)
        except SyncpassError as error:
            raise CodemodRefused(error) from None
        result = rewrite_module(
            tree,
            filename,
            costs=costs,
            stages=request.stages,
            sync_config=request.config,
            microbatches=request.microbatches,
            schedule=request.schedule,
            class_name=settings.model,
            max_stages=settings.auto_limit,
            backend=settings.backend,
        )
        if isinstance(result.error, NoModelError):
            raise SkipFile(result.error.message)
        if result.error is not None:
            raise CodemodRefused(result.error)
        for warning in result.warnings:
            self.warn(warning)
        return result.module

    def _settings(self, path: Path, cost_path: Path) -> tuple[Costs, Settings]:
        """The costs and settings ``syncpass rewrite`` would use, from the same resolver."""
        settings = resolve_settings(
            path,
            Overrides(
                stages=self.stages,
                strategy=self.strategy,
                min_sync_interval=self.min_sync_interval,
                microbatches=self.microbatches,
                model=self.model,
                backend=self.backend,
            ),
        )
        costs = settings.retarget(load_costs(cost_path))
        if settings.stages is None and settings.sync_config(costs.config).strategy != "manual":
            raise SyncpassError(
                "no stage count: give --stages, or stages in [tool.syncpass]", str(path)
            )
        return costs, settings


def _stages(text: str) -> int | str:
    return "auto" if text == "auto" else int(text)


class CodemodRefused(Exception):
    """The pass refused a file; the message is the one ``syncpass rewrite`` prints."""

    def __init__(self, error: SyncpassError) -> None:
        super().__init__(str(error))
        self.error = error

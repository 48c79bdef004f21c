"""syncpass as a libcst codemod: ``python -m libcst.tool codemod`` over files and folders.

    python -m libcst.tool initialize .        # once: writes .libcst.codemod.yaml
    python -m libcst.tool codemod -x syncpass.transformers.codemod.PipelineSyncCommand \\
        --stages 4 models/

Each Python file that holds a model (a class with a ``forward``) and has a cost
file is planned and rewritten in place, as ``syncpass rewrite --in-place``
would; files without a model or without a cost file are skipped with the
reason. The cost file of ``models/gpt.py`` is ``models/gpt.costs.json`` unless
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
from syncpass.config import STRATEGIES
from syncpass.errors import SyncpassError

DEFAULT_COSTS = "{dir}/{stem}.costs.json"


class PipelineSyncCommand(CodemodCommand):
    """Write the planned pipeline sync points (``pipe_split()``) into each model file."""

    DESCRIPTION: str = (
        "Plan each model's pipeline sync points from its cost file and write them as "
        "pipe_split() calls (syncpass)."
    )

    @staticmethod
    def add_args(arg_parser: argparse.ArgumentParser) -> None:
        arg_parser.add_argument(
            "--stages", type=int, required=True, help="pipeline stages per model"
        )
        arg_parser.add_argument(
            "--costs",
            default=DEFAULT_COSTS,
            help="cost file of each model file: a path, or a pattern with {dir} and {stem} "
            f"(default {DEFAULT_COSTS})",
        )
        arg_parser.add_argument("--strategy", choices=STRATEGIES, default=None)
        arg_parser.add_argument("--min-sync-interval", type=int, default=None)
        arg_parser.add_argument("--microbatches", type=int, default=None)
        arg_parser.add_argument("--model", default=None, help="the model class in each file")

    def __init__(
        self,
        context: CodemodContext,
        stages: int,
        costs: str = DEFAULT_COSTS,
        strategy: str | None = None,
        min_sync_interval: int | None = None,
        microbatches: int | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(context)
        self.stages = stages
        self.costs = costs
        self.settings = {
            key: value
            for key, value in (("strategy", strategy), ("min_sync_interval", min_sync_interval))
            if value is not None
        }
        self.microbatches = microbatches
        self.model = model

    def cost_file(self, filename: str) -> Path:
        """The cost file of the model in ``filename``."""
        path = Path(filename)
        return Path(self.costs.format(dir=path.parent, stem=path.stem))

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        filename = self.context.filename or "<module>"
        if "forward" not in tree.code:
            raise SkipFile("no model forward in this file")
        costs = self.cost_file(filename)
        if not costs.is_file():
            raise SkipFile(f"no cost file {costs} (run syncpass profile first)")
        result = rewrite_module(
            tree,
            filename,
            costs=costs,
            stages=self.stages,
            sync_config=self.settings or None,
            microbatches=self.microbatches,
            class_name=self.model,
        )
        if result.error is not None:
            raise CodemodRefused(result.error)
        for warning in result.warnings:
            self.warn(warning)
        return result.module


class CodemodRefused(Exception):
    """The pass refused a file; the message is the one ``syncpass rewrite`` prints."""

    def __init__(self, error: SyncpassError) -> None:
        super().__init__(str(error))
        self.error = error

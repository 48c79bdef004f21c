"""Can torch's tracer take this model, and does it split it as planned? Asked at profile
and rewrite time, not first in ``run``.

``syncpass run`` builds ``pipe_split()`` stages with
``torch.distributed.pipelining.pipeline()``, which exports the whole model with
``torch.export`` first. Models with data-dependent control flow, in-place state
or other graph breaks cannot be exported, and would fail only when split and
run. :func:`tracer_failure` tries ``pipeline()`` on the unsplit model with the
example batch (one process, no process group, a second or so on the bundled
examples) and says why it failed, at the user's line when torch names one.

:func:`confirm_split` does the same for the rewritten model before ``rewrite``
writes it, and checks what torch's pipelining needs of the split:
:func:`values_past_the_next_stage` finds each stage output (or model input) that a
stage other than the next one reads, which torch refuses at run time ("Backward of
skip connections not supported yet").
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from syncpass.core.errors import SplitRefused, SyncpassError

if TYPE_CHECKING:
    from torch.distributed.pipelining import Pipe

    from syncpass.backends.spec import Confirmation

#: The reason is torch's first line, cut to this length (the rest is its graph dump).
REASON_CHARS = 160


def tracer_failure(model: torch.nn.Module, args: tuple[Any, ...], file: Path) -> str | None:
    """``None`` when ``pipeline()`` takes the model; else ``"FILE:LINE: why"`` (or just why)."""
    from torch.distributed.pipelining import pipeline

    try:
        with _quiet():
            pipeline(model, mb_args=args)
    except Exception as error:  # whatever torch.export raises is the finding, not a crash
        return _describe(error, file)
    return None


@dataclass(frozen=True)
class StageSkip:
    """A value of the split model that a stage other than the next one reads: ``value``
    is torch's name for it, ``made_in`` the stage that makes it (``-1``: a model input),
    ``used_in`` the stages that read it (the stage count: the model's output)."""

    value: str
    made_in: int
    used_in: tuple[int, ...]

    def describe(self, stages: int) -> str:
        made = "a model input" if self.made_in < 0 else f"stage {self.made_in}'s output"
        readers = [
            "the model's output" if index == stages else f"stage {index}" for index in self.used_in
        ]
        return f"{made} {self.value!r} is read by {' and '.join(readers)}"

    def crossed(self, sync_points: int) -> int:
        """The index of the first of ``sync_points`` the value may not cross: the one
        after the next stage's start (the first, for a model input)."""
        return min(self.made_in + 1, sync_points - 1)


def values_past_the_next_stage(pipe: Pipe) -> tuple[StageSkip, ...]:
    """Every value of ``pipe``'s split graph that reaches past the next stage, or more
    than one stage: torch's PipelineStage sends each stage output to one stage, the
    next, and only the first stage takes the model's inputs."""
    graph = pipe.split_gm.graph
    stage_nodes = [node for node in graph.nodes if node.op == "call_module"]
    stage_of = {node: index for index, node in enumerate(stage_nodes)}
    readers: dict[tuple[int, str], dict[int, None]] = {}

    def source(node: Any) -> tuple[int, str] | None:
        if node.op == "placeholder":
            return (-1, node.name)
        if node in stage_of:
            return (stage_of[node], _output_name(pipe, node, None))
        if node.op == "call_function" and node.args and node.args[0] in stage_of:
            producer = node.args[0]  # operator.getitem(stage output, index)
            index = node.args[1] if isinstance(node.args[1], int) else None
            return (stage_of[producer], _output_name(pipe, producer, index))
        return None

    for node in graph.nodes:
        reader = stage_of.get(node, len(stage_nodes) if node.op == "output" else None)
        if reader is None:
            continue
        for argument in node.all_input_nodes:
            made = source(argument)
            if made is not None:
                readers.setdefault(made, {})[reader] = None
    far = []
    for (made_in, value), used in readers.items():
        expected = 0 if made_in < 0 else made_in + 1
        if set(used) != {expected}:
            far.append(StageSkip(value, made_in, tuple(sorted(used))))
    return tuple(far)


def _output_name(pipe: Pipe, stage_node: Any, index: int | None) -> str:
    """The name torch's graph gives a stage's output (number ``index`` of a tuple)."""
    submodule = getattr(pipe.split_gm, str(stage_node.target), None)
    graph = getattr(submodule, "graph", None)
    outputs = [node for node in graph.nodes if node.op == "output"] if graph is not None else []
    fallback = str(stage_node.name)
    if not outputs:
        return fallback
    returned = outputs[0].args[0]
    if isinstance(returned, tuple | list):
        if index is None or index >= len(returned):
            return fallback
        returned = returned[index]
    return str(getattr(returned, "name", fallback))


def confirm_split(confirmation: Confirmation) -> None:
    """Split the rewritten model with ``pipeline()`` on the example; raise a
    :class:`SyncpassError` at the sync point when torch's split is not the plan."""
    from torch.distributed.pipelining import pipeline

    from syncpass.backends.torch.example import load_example

    loaded = load_example(confirmation.example)
    model = loaded.model
    _adopt_rewritten_classes(model, confirmation.text, confirmation.path)
    try:
        with _quiet():
            pipe = pipeline(model, mb_args=loaded.args)
    except Exception as error:  # torch.export's failure is the finding
        raise SyncpassError(
            "torch.distributed.pipelining.pipeline() cannot split the rewritten model "
            f"({_describe(error, Path(confirmation.path))}); nothing was written. The eager "
            "stages of --backend torch_stages need no tracer",
            confirmation.path,
        ) from None
    points = confirmation.sync_points
    if pipe.num_stages != confirmation.stages:
        raise SyncpassError(
            f"torch's tracer splits the rewritten model into {pipe.num_stages} stage(s), not "
            f"the {confirmation.stages} planned: a stage that runs no tensor op (only Python "
            "numbers, such as `seq = x.shape[1]`) is no stage to the tracer, nor is a "
            "pipe_split() it does not trace through. Nothing was written; ask for fewer "
            "stages, pin the sync points yourself (`# syncpass: sync`), or use --backend "
            "torch_stages, whose stages need no tracer",
            points[0][1] if points else confirmation.path,
        )
    far = values_past_the_next_stage(pipe)
    if far:
        first = far[0]
        after, location = points[first.crossed(len(points))]
        reason = f"{first.describe(confirmation.stages)}, across the sync point after {after}"
        raise SplitRefused(
            f"torch's tracer confirms no such plan: {reason}; torch.distributed.pipelining sends a stage's "
            "output only to the next stage, so `syncpass run` would fail. Nothing was "
            "written; compute the value where it is read (inside the blocks), make it a "
            "buffer, move the sync point, or use --backend torch_stages",
            location,
            after,
            reason,
        )


def _adopt_rewritten_classes(model: torch.nn.Module, text: str, path: str) -> None:
    """Give each module of ``model`` whose class is defined in ``path`` that class as the
    rewritten ``text`` defines it (the same attributes, the forward with sync points)."""
    resolved = Path(path).resolve()
    namespace = types.ModuleType(f"_syncpass_confirm_{abs(hash(str(resolved)))}")
    namespace.__file__ = str(resolved)
    sys.modules[namespace.__name__] = namespace  # dataclasses look their module up
    try:
        exec(compile(text, str(resolved), "exec"), namespace.__dict__)
    except Exception as error:
        raise SyncpassError(
            f"the rewritten model does not import: {type(error).__name__}: {error}", path
        ) from None
    for module in model.modules():
        cls = type(module)
        try:
            defined = Path(sys.modules[cls.__module__].__file__ or "").resolve()
        except (KeyError, AttributeError, TypeError):
            continue
        rewritten = getattr(namespace, cls.__qualname__, None)
        if defined == resolved and isinstance(rewritten, type) and rewritten is not cls:
            module.__class__ = rewritten


def _describe(error: BaseException, file: Path) -> str:
    """The root cause's first line, located at the last line of ``file`` torch names."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    root = chain[-1]
    reason = (str(root).strip().splitlines() or [type(root).__name__])[0]
    if len(reason) > REASON_CHARS:
        reason = reason[: REASON_CHARS - 3].rstrip() + "..."
    where = ""
    pattern = re.compile(rf'File "?{re.escape(str(file.resolve()))}"?(?:, line |:)(\d+)')
    for link in chain:
        lines = pattern.findall(str(link))
        if lines:
            where = f"{file}:{lines[-1]}: "
    return f"{where}{type(root).__name__}: {reason}"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No warnings or graph dumps from torch while it tries: the finding says what failed.

    torch's loggers carry their own handlers and levels, so each one is
    disabled for the duration (and those torch creates meanwhile), then restored;
    ``torch.export`` also prints the failed graph to ``sys.stderr`` itself.
    """
    manager = logging.Logger.manager
    before = {name for name in manager.loggerDict if name.startswith("torch")}
    disabled = {name: logging.getLogger(name).disabled for name in before}
    for name in before:
        logging.getLogger(name).disabled = True
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name in [name for name in manager.loggerDict if name.startswith("torch")]:
            logging.getLogger(name).disabled = disabled.get(name, False)

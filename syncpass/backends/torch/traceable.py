"""Can torch's tracer take this model? Asked once at profile time, not first in ``run``.

``syncpass run`` builds ``pipe_split()`` stages with
``torch.distributed.pipelining.pipeline()``, which exports the whole model with
``torch.export`` first. Models with data-dependent control flow, in-place state
or other graph breaks cannot be exported, and would fail only when split and
run. :func:`tracer_failure` tries ``pipeline()`` on the unsplit model with the
example batch (one process, no process group, a second or so on the bundled
examples) and says why it failed, at the user's line when torch names one.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

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

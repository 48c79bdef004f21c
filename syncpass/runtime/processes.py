"""Starting and stopping local processes: what ``run``'s stages and the guarded example
share. Nothing here imports torch or jax."""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path

#: The modules ``syncpass.runtime.preload`` imports in a fork server that starts, comma-separated.
PRELOAD_ENV = "SYNCPASS_PRELOAD_MODULES"


def process_context(preload: Sequence[str] = ()) -> BaseContext:
    """A fork server's context where there is one (it imports ``preload`` once, when it
    starts: the first caller's list counts), else spawn's."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        if preload:
            context.set_forkserver_preload(list(preload))
        return context
    return multiprocessing.get_context("spawn")


def stop_processes(processes: Sequence[BaseProcess], grace_s: float) -> None:
    """Wait up to ``grace_s`` for the processes to end; terminate, then kill, the rest."""
    deadline = time.monotonic() + grace_s
    for process in processes:
        if process.pid is None:
            continue
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.pid is not None and process.is_alive():
            process.terminate()
    for process in processes:
        if process.pid is None:
            continue
        process.join(timeout=1.0)
        if process.is_alive():
            process.kill()
            with contextlib.suppress(Exception):
                process.join(timeout=1.0)


def top_level_imports(text: str) -> tuple[str, ...]:
    """The modules a file's top-level statements import by absolute name (``import a.b``,
    ``from a.b import c``), in order, ``__future__`` left out; none if it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for statement in tree.body:
        if isinstance(statement, ast.Import):
            names += [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
            names.append(statement.module)
    return tuple(dict.fromkeys(name for name in names if name != "__future__"))


@contextlib.contextmanager
def preloading_imports_of(file: str) -> Iterator[None]:
    """While inside, a fork server that starts imports what ``file`` imports at its top level
    (``syncpass.runtime.preload``), with ``file``'s folder first on the path as the ranks
    have it: the ranks forked from it skip those imports. A server already running keeps its
    preload. The environment is restored on the way out."""
    try:
        names = top_level_imports(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        names = ()
    folder = str(Path(file).resolve().parent)
    before = os.environ.get(PRELOAD_ENV)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    os.environ[PRELOAD_ENV] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PRELOAD_ENV, None)
        else:
            os.environ[PRELOAD_ENV] = before
        if added and folder in sys.path:
            sys.path.remove(folder)

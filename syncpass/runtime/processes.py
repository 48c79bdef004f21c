"""Starting and stopping local processes: what ``run``'s stages and the guarded example
share. Nothing here imports torch or jax."""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess


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

"""Starting and stopping local processes: what ``run``'s stages and the guarded example
share. Nothing here imports torch or jax."""

from __future__ import annotations

import ast
import contextlib
import faulthandler
import multiprocessing
import os
import signal
import sys
import tempfile
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


#: glibc's ``mallopt`` parameters (malloc.h) and what the processes set them to: blocks
#: up to 32 MiB (glibc's largest mmap threshold on 64-bit) come from the heap, and the
#: heap keeps up to 1 GiB it no longer uses instead of giving it back to the system.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 2**30


def steady_allocator() -> bool:
    """Have glibc's allocator reuse large blocks in this process and the ones it forks;
    whether it could (False where the C library is not glibc).

    By default glibc maps each block above a threshold that moves with what the process
    freed before (128 KiB to 32 MiB) afresh, and gives the heap's free top back. A weight
    gradient of a few MiB then costs its page faults again at each backward, or not,
    depending on the history: torchvision's ResNet-18 split after ``layer3``, 2 samples,
    took 31-34 ms for ``layer4``'s backward one way and 19-21 ms the other. Profiles and
    runs landed on either, so the weight-heavy stages' predictions missed by a fifth.
    The fork server (:mod:`syncpass.runtime.preload`) sets it once for every profile and
    every rank, so they measure the same, steady allocator. The same two settings
    (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) make a training run match.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


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


def crash_log(pid: int) -> Path:
    """Where process ``pid`` writes its threads' Python stacks if it dies of a fatal signal
    (a segfault or an abort in C code): :func:`log_crashes`."""
    return Path(tempfile.gettempdir()) / f"syncpass-crash-{pid}.log"


#: The open crash log of this process (:func:`log_crashes`): faulthandler writes to its fd.
_crash_log_file: list[object] = []


def log_crashes() -> None:
    """In a started process: on a fatal signal, write its threads' Python stacks to
    :func:`crash_log` of its pid, which :func:`crash_frames` reads for the error."""
    handle = crash_log(os.getpid()).open("w")
    _crash_log_file.append(handle)
    faulthandler.enable(handle)


#: How many frames of the crashed thread's stack an error names (innermost first).
CRASH_FRAMES = 4


def exit_signal(process: BaseProcess) -> str | None:
    """The name of the signal that ended ``process`` (``"SIGSEGV"``, ``"signal 77"`` for
    one Python does not name), or ``None`` when it exited with a status of its own."""
    code = process.exitcode
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def crash_frames(process: BaseProcess) -> tuple[str, ...]:
    """The innermost frames (at most :data:`CRASH_FRAMES`) of the thread that crashed in
    ``process``, as its :func:`crash_log` has them (``'File "model.py", line 12 in
    forward'``); none when it wrote none (it exited, or was killed, without crashing)."""
    if process.pid is None:
        return ()
    try:
        text = crash_log(process.pid).read_text(errors="replace")
    except OSError:
        return ()
    frames: list[str] = []
    crashed = False
    for line in text.splitlines():
        if line.startswith(("Current thread", "Thread ")):
            crashed = line.startswith("Current thread")
        elif crashed and line.strip().startswith("File "):
            frames.append(line.strip())
    return tuple(frames[:CRASH_FRAMES])


def forget_crash_logs(processes: Sequence[BaseProcess]) -> None:
    """Remove the crash logs of ``processes`` (:func:`log_crashes`), once they are stopped."""
    for process in processes:
        if process.pid is not None:
            crash_log(process.pid).unlink(missing_ok=True)


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

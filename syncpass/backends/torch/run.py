"""Starting, watching and stopping the stage processes of ``syncpass run``.

One process per rank (each holds ``request.stages_per_device`` stages),
rendezvous on a free localhost port. Processes come
from a fork server that has imported torch and the worker module once
(seconds of imports that every stage would otherwise repeat); where there is
no fork server (Windows) they are spawned. This module imports torch only
to check a given micro-batch count against a schedule with several stages per
rank (:func:`check_microbatches`); the one forward of the example that finds the
micro-batches its batch norms take runs in a guarded child
(:func:`with_batch_norm_floor`).

Nothing may hang: each stage reports success or its failure on a queue; the
first failure (or a process that dies without a word, or the deadline) stops
the others, and the failure is raised as a :class:`SyncpassError` naming the
rank.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from syncpass.contracts.config import MULTI_STAGE_SCHEDULES
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import small_microbatches_error
from syncpass.runtime.contracts import RunRequest, RunResult, WorkerDone, WorkerFailed
from syncpass.runtime.guard import call_guarded
from syncpass.runtime.processes import (
    crash_frames,
    exit_signal,
    forget_crash_logs,
    log_crashes,
    preloading_imports_of,
    process_context,
    stop_processes,
)

ResultT = TypeVar("ResultT")

# The worker module imports torch and torch.distributed.pipelining; aot_autograd is what
# the first trace would otherwise import in every stage; the profiler is what a guarded
# example run (profile, rewrite --example) imports. Every fork server user gives this list.
PRELOAD = [
    "syncpass.backends.torch.worker",
    "torch._functorch.aot_autograd",
    "syncpass.backends.torch.profile",
    # The model file's own imports, where launch() names them (runtime/preload.py).
    "syncpass.runtime.preload",
]
POLL_S = 0.1
# After the first failure, how long to wait for the other ranks' reports
# (they usually fail at once with a lost connection) before stopping them.
GRACE_S = 1.0
JOIN_S = 5.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A free TCP port on 127.0.0.1, held for the ``with`` block: a socket bound to it (not
    listening) keeps every other process's bind off it, while rank 0 binds it beside that
    socket (``SO_REUSEPORT``, :func:`~syncpass.backends.torch.rendezvous.join_local_group`).
    Runs started side by side (the test suite's parallel workers) cannot pick the same port
    between its choice and rank 0's bind. Without ``SO_REUSEPORT`` (Windows) it is
    :func:`free_port`."""
    reuse = getattr(socket, "SO_REUSEPORT", None)
    if reuse is None:
        yield free_port()
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, reuse, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def _worker_entry(request: RunRequest, rank: int, messages: Any) -> None:
    # Imported here, in the stage process: the worker module imports torch.
    from syncpass.backends.torch.worker import run_worker

    run_worker(request, rank, messages)


def check_microbatches(request: RunRequest) -> None:
    """Refuse, before any process starts, a ``--microbatches`` count that torch's schedule
    with several stages per rank refuses (with torch's reason); a default count is chosen
    among those it takes (:func:`syncpass.backends.torch.worker.choose_microbatches`)."""
    if request.microbatches is None or request.schedule not in MULTI_STAGE_SCHEDULES:
        return
    from syncpass.backends.torch.schedules import schedule_order

    try:
        schedule_order(
            request.schedule, request.stages, request.stages_per_device, request.microbatches
        )
    except SyncpassError as error:
        raise SyncpassError(f"--microbatches {request.microbatches}: {error.message}") from None


def _example_floor(spec: str) -> tuple[int, int, str | None]:
    """In the guarded child: the example's batch size, and the floor its batch norms set
    (the model built here is thrown away)."""
    from syncpass.backends.torch.example import load_example
    from syncpass.backends.torch.measure import batch_size_of
    from syncpass.backends.torch.norms import batch_norm_floor

    example = load_example(spec)
    batch = batch_size_of(example.args, example.origin or spec)
    floor = batch_norm_floor(example.model, tuple(example.args), batch)
    return batch, floor.size, floor.by


def with_batch_norm_floor(request: RunRequest) -> RunRequest:
    """``request`` with the fewest samples a micro-batch may hold for the example's batch
    norms (:mod:`syncpass.backends.torch.norms`: one forward of the example, in a guarded
    child process, before any stage starts), which the default count keeps to; an asked
    ``--microbatches`` that gives smaller micro-batches is refused here, with the counts
    that work. An example that builds only inside a rank (it reads ``RANK``, say) sets no
    floor here: the ranks build it, and a batch norm it starves fails there, as it
    would run."""
    try:
        batch, size, by = call_guarded(
            _example_floor,
            request.example,
            what="the example",
            timeout_s=request.timeout_s,
            preload=PRELOAD,
        )
    except SyncpassError:
        return request
    if request.microbatches is not None:
        one_per_stage = request.stages if request.schedule == "1f1b" else 1
        error = small_microbatches_error(request.microbatches, batch, size, by, one_per_stage)
        if error is not None:
            raise error
    return replace(request, min_microbatch_size=size, min_microbatch_by=by)


def launch(request: RunRequest) -> RunResult:
    """Run ``request`` on ``request.stages`` local processes and return rank 0's result.

    Raises SyncpassError when a stage fails (bad input, a crash, a process that
    died) or when ``request.timeout_s`` passes; every process is stopped first.
    """
    check_microbatches(request)
    with contextlib.ExitStack() as held:
        held.enter_context(preloading_imports_of(request.file))
        request = with_batch_norm_floor(request)
        if request.port == 0:
            request = replace(request, port=held.enter_context(reserved_port()))
        ready = request
        return run_local(
            _worker_entry,
            ready,
            ready.ranks,
            "syncpass-stage",
            lambda processes, messages: _collect(ready, processes, messages),
        )


def run_local(
    entry: Callable[[Any, int, Any], None],
    request: Any,
    count: int,
    name: str,
    collect: Callable[[list[BaseProcess], Any], ResultT],
) -> ResultT:
    """Start ``count`` processes running ``entry(request, rank, messages)``, gather what
    ``collect`` reads from their queue, and stop them all, whatever happens."""
    context = process_context(PRELOAD)
    messages = context.Queue()
    processes: list[BaseProcess] = [
        context.Process(  # type: ignore[attr-defined]
            target=_logging_crashes,
            args=(entry, request, rank, messages),
            name=f"{name}-{rank}",
            daemon=True,
        )
        for rank in range(count)
    ]
    try:
        for process in processes:
            process.start()
        result = collect(processes, messages)
    except BaseException:
        stop_processes(processes, grace_s=0.0)
        raise
    else:
        stop_processes(processes, grace_s=JOIN_S)
    finally:
        messages.close()
        messages.cancel_join_thread()
        forget_crash_logs(processes)
    return result


def _logging_crashes(
    entry: Callable[[Any, int, Any], None], request: Any, rank: int, messages: Any
) -> None:
    """``entry(request, rank, messages)`` in a started process that writes its Python stack
    where :func:`~syncpass.runtime.processes.crash_report` finds it if it crashes in C."""
    log_crashes()
    entry(request, rank, messages)


def _collect(request: RunRequest, processes: list[BaseProcess], messages: Any) -> RunResult:
    done = wait_for_reports(processes, messages, request.timeout_s)
    result = done[0].result
    if result is None:
        raise SyncpassError("rank 0 finished without the gathered figures")
    return result


def wait_for_reports(
    processes: list[BaseProcess],
    messages: Any,
    timeout_s: float,
    other: Callable[[Any], None] | None = None,
) -> dict[int, WorkerDone]:
    """Every process's WorkerDone, by rank; messages of other kinds go to ``other``.

    Raises SyncpassError for the most telling failure once every process has
    reported or a grace period after the first failure has passed, and when
    ``timeout_s`` passes first.
    """
    deadline = time.monotonic() + timeout_s
    done: dict[int, WorkerDone] = {}
    failures: dict[int, WorkerFailed] = {}
    first_failure_at: float | None = None
    silent: set[int] = set()
    while len(done) + len(failures) < len(processes):
        now = time.monotonic()
        if first_failure_at is not None and now - first_failure_at > GRACE_S:
            break
        if now > deadline:
            running = [rank for rank in range(len(processes)) if rank not in done]
            raise SyncpassError(
                f"timed out after {timeout_s:g} s (--timeout) with rank(s) "
                f"{', '.join(map(str, running))} still running"
            )
        try:
            message = messages.get(timeout=POLL_S)
        except queue.Empty:
            _note_silent_deaths(processes, done, failures, silent)
            if failures and first_failure_at is None:
                first_failure_at = time.monotonic()
            continue
        if isinstance(message, WorkerDone):
            done[message.rank] = message
        elif isinstance(message, WorkerFailed):
            failures.setdefault(message.rank, message)
            if first_failure_at is None:
                first_failure_at = time.monotonic()
        elif other is not None:
            other(message)
    if failures:
        raise _failure(failures, len(processes))
    return done


def _note_silent_deaths(
    processes: list[BaseProcess],
    done: dict[int, WorkerDone],
    failures: dict[int, WorkerFailed],
    silent: set[int],
) -> None:
    """Record processes that exited without a report (killed, out of memory, a crash in C).

    A process is declared silent only when a whole poll after it was first seen
    dead brought no report: its last message may still have been in the pipe.
    """
    for rank, process in enumerate(processes):
        if rank in done or rank in failures or process.exitcode is None:
            continue
        if rank not in silent:
            silent.add(rank)
            continue
        frames = crash_frames(process)
        where = (
            f"; it crashed in {', '.join(frames)}"
            if frames
            else " (its own error output, if any, is above)"
        )
        name = exit_signal(process)
        failures[rank] = WorkerFailed(
            rank,
            f"the process exited with status {process.exitcode}{f' ({name})' if name else ''} "
            f"before reporting{where}",
        )


def _failure(failures: dict[int, WorkerFailed], world: int) -> SyncpassError:
    """The failure to show: bad input, then crashes, then lost connections; the earliest first."""
    arrival = {rank: index for index, rank in enumerate(failures)}
    ordered = sorted(
        failures.values(), key=lambda f: (not f.user_error, f.peer_lost, arrival[f.rank])
    )
    first = ordered[0]
    others = ordered[1:]
    if not others:
        suffix = ""
    elif len(failures) == world and all(f.message == first.message for f in others):
        first = min(ordered, key=lambda f: f.rank)  # whichever arrived first: name rank 0
        suffix = f" (the same on all {world} ranks)"
    else:
        suffix = f" ({len(others)} other rank(s) of {world} failed too)"
    return SyncpassError(f"rank {first.rank}: {first.message}{suffix}", first.location)

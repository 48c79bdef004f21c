"""Running the user's example out of harm's way: in a process of its own, with a deadline.

``profile --example``, ``rewrite --example`` and torch's split check run the user's
code. Whatever it does (``sys.exit(3)``, a ``KeyboardInterrupt`` of its own, a
segmentation fault in native code, a loop that never ends), syncpass reports it as an
error that says what happened, exit status 2, and writes nothing: the hook runs in a
child process (:func:`call_guarded`) that hands back its result or its error, and is
stopped at the deadline. Ctrl-C stops the child too, then the command.

The child comes from a fork server where there is one (it has imported ``preload``
once: torch's import is seconds, a fork is not), else it is spawned. Nothing here
imports torch or jax.
"""

from __future__ import annotations

import io
import queue
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from syncpass.core.errors import SyncpassError, unexpected_error
from syncpass.runtime.processes import (
    crash_frames,
    exit_signal,
    forget_crash_logs,
    log_crashes,
    process_context,
    stop_processes,
)

RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")

#: The default deadline of ``--timeout`` for the commands that run the example.
DEFAULT_TIMEOUT_S = 900.0
POLL_S = 0.1
#: How long a child that has reported may take to end before it is stopped.
JOIN_S = 5.0


def call_guarded(
    hook: Callable[[RequestT], ResultT],
    request: RequestT,
    *,
    what: str,
    timeout_s: float,
    preload: Sequence[str] = (),
    location: str = "",
) -> ResultT:
    """``hook(request)`` in a child process; its result, or a :class:`SyncpassError` for
    what went wrong there (``what`` says what ran: "the example"; ``location`` is where
    it is, for errors that cannot say where). ``hook`` and ``request`` must pickle (a
    module-level function, frozen dataclasses)."""
    context = process_context(preload)
    results = context.Queue()
    child = context.Process(  # type: ignore[attr-defined]
        target=_child, args=(hook, request, results), name="syncpass-example"
    )
    try:
        _start(child, what)
        result = _wait(child, results, what, timeout_s)
    except SyncpassError as error:
        stop_processes([child], grace_s=0.0)
        if not error.location:
            error.location = location  # the same error (an InfeasibleError stays one)
        raise
    except BaseException:  # Ctrl-C: the child goes first
        stop_processes([child], grace_s=0.0)
        raise
    else:
        stop_processes([child], grace_s=JOIN_S)
    finally:
        results.close()
        results.cancel_join_thread()
        forget_crash_logs([child])
    return result  # type: ignore[no-any-return]


class _Forwarded(io.TextIOBase):
    """The child's ``sys.stderr``: each write goes to the parent, which prints it on its
    own (a fork server's children would otherwise write where the server was started)."""

    def __init__(self, results: Any) -> None:
        self.results = results

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.results.put(("stderr", text))
        return len(text)


def _start(child: Any, what: str) -> None:
    try:
        child.start()
    except RuntimeError as error:  # multiprocessing's bootstrapping check
        raise SyncpassError(
            f"cannot start the process that runs {what}: Python is still importing the "
            'script that calls syncpass; put the call under `if __name__ == "__main__":` '
            f"({str(error).strip().splitlines()[0]})"
        ) from None


def _child(hook: Callable[[Any], Any], request: Any, results: Any) -> None:
    """In the child: ``("ok", result)``, ``("error", SyncpassError)`` or ``("exit", code)``,
    after any ``("stderr", text)``."""
    sys.stderr = _Forwarded(results)
    log_crashes()
    try:
        outcome: tuple[str, Any] = ("ok", hook(request))
    except SyncpassError as error:
        outcome = ("error", error)
    except SystemExit as stop:
        outcome = ("exit", stop.code)
    except KeyboardInterrupt:
        outcome = (
            "error",
            SyncpassError("the user's code raised KeyboardInterrupt; nothing was written"),
        )
    except BaseException as error:
        outcome = ("error", unexpected_error(error))
    try:
        results.put(outcome)
    except Exception as error:  # a result that does not pickle
        results.put(("error", unexpected_error(error)))
    results.close()
    results.join_thread()


def _wait(child: Any, results: Any, what: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    gone_since: float | None = None
    while True:
        try:
            kind, value = results.get(timeout=POLL_S)
        except queue.Empty:
            pass
        else:
            if kind != "stderr":
                break
            sys.stderr.write(value)
            continue
        if time.monotonic() > deadline:
            raise SyncpassError(
                f"{what} did not finish within {timeout_s:g} s (--timeout); it was stopped "
                "and nothing was written"
            )
        if child.exitcode is not None:  # dead: wait one more poll for a last message
            if gone_since is not None:
                raise SyncpassError(_death(child, what))
            gone_since = time.monotonic()
    if kind == "ok":
        return value
    if kind == "exit":
        return _exited(value, what)
    raise value


def _exited(code: object, what: str) -> Any:
    status = "0" if code is None else str(code)
    raise SyncpassError(
        f"{what} called sys.exit({'' if code is None else repr(code)}) (status {status}) "
        "instead of returning; nothing was written"
    )


def _death(child: Any, what: str) -> str:
    name = exit_signal(child)
    if name is not None:
        crash = " (a crash in native code)" if name in ("SIGSEGV", "SIGBUS", "SIGILL") else ""
        frames = crash_frames(child)
        where = f" in {', '.join(frames)}" if frames else ""
        return f"{what} died from {name}{crash}{where}; nothing was written"
    return (
        f"{what} ended its process with status {child.exitcode} before reporting; nothing "
        "was written"
    )

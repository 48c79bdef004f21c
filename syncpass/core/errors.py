"""The one error type syncpass raises for bad user input.

Every message names *where* (a file, and a JSON path or a line inside it),
*what* is wrong and, where it helps, how to fix it. The command line prints
``str(error)`` and exits with status 2.
"""

from __future__ import annotations


class SyncpassError(Exception):
    """Bad input or an impossible request, located in the user's files.

    ``location`` is ``"file"``, ``"file:$.json.path"`` or ``"file:line"``;
    empty when the fault is in the request itself (flags, arguments).
    """

    def __init__(self, message: str, location: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message

    def __reduce__(self) -> tuple[type[SyncpassError], tuple[str, ...]]:
        # Sent between processes (a plan's failure reaches every rank) whole.
        return (type(self), (self.message, self.location))


class InfeasibleError(SyncpassError):
    """No plan meets the constraints; ``constraint`` names the one at fault."""

    def __init__(self, message: str, constraint: str, location: str = "") -> None:
        super().__init__(message, location)
        self.constraint = constraint

    def __reduce__(self) -> tuple[type[SyncpassError], tuple[str, ...]]:
        return (type(self), (self.message, self.constraint, self.location))


class NoModelError(SyncpassError):
    """The file holds no model the backend can read (a pipeline over many files skips it)."""


class SplitRefused(SyncpassError):
    """The engine's splitter refuses the plan because of one sync point (``after``, its op
    id): a value it makes crosses that sync point to more than the next stage (``reason``
    says which, in a few words). Planning again without that cut may give a plan the
    engine takes."""

    def __init__(self, message: str, location: str, after: str, reason: str) -> None:
        super().__init__(message, location)
        self.after = after
        self.reason = reason

    def __reduce__(self) -> tuple[type[SyncpassError], tuple[str, ...]]:
        return (type(self), (self.message, self.location, self.after, self.reason))


#: Where a crash of syncpass itself is to be reported.
REPORT_HINT = "this is a bug in syncpass: please report it with the command and the input"


def unexpected_error(error: BaseException, location: str = "") -> SyncpassError:
    """A :class:`SyncpassError` for an exception syncpass did not expect, so every entry
    point reports it as an error (exit 2), never as a traceback or a finding: too deep an
    input and too large a one say so; anything else is an internal error with where it
    was raised and :data:`REPORT_HINT`."""
    causes: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and len(causes) < 20:  # a crash while handling one: its cause
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(cause, RecursionError) for cause in causes):
        return SyncpassError(
            "the input is nested too deeply for syncpass to follow (Python's recursion "
            "limit); split the expression or the structure into smaller ones",
            location,
        )
    if any(isinstance(cause, MemoryError) for cause in causes):
        return SyncpassError("the input needs more memory than this machine has", location)
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    raised = ""
    if frame is not None:
        code = frame.tb_frame.f_code
        raised = (
            f" (raised in {code.co_name}, {code.co_filename.rsplit('/', 1)[-1]}:{frame.tb_lineno})"
        )
    try:
        said = str(error)
    except Exception:  # a message that cannot be made (too deep a tree to print)
        said = "(no message)"
    if len(said) > 300:
        said = said[:300] + "..."
    return SyncpassError(
        f"internal error: {type(error).__name__}: {said}{raised}; {REPORT_HINT}", location
    )

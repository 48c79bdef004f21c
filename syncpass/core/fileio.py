"""Writing files so that nothing is ever half-written, and nothing but the target is touched."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from syncpass.core.errors import SyncpassError

try:
    import fcntl
except ImportError:  # not on Windows: stale temporaries are then left alone
    fcntl = None  # type: ignore[assignment]

#: A temporary file of ours older than this, that no process holds, was left by a
#: writer that was killed between writing it and renaming it.
STALE_AFTER_S = 1.0


def write_atomically(path: str | Path, text: str | bytes) -> None:
    """See :func:`_write`; any failure of the file system is a :class:`SyncpassError`.

    ``text`` is written as UTF-8; ``bytes`` as they are."""
    try:
        _write(Path(path), text)
    except OSError as error:
        raise SyncpassError(f"cannot write: {error.strerror or error}", str(path)) from None


def refuse_clobbering(
    targets: Mapping[str, str | Path | None], reads: Mapping[str, str | Path | None]
) -> None:
    """Refuse, before anything runs, a target (``{"-o": path}``) that is a file the command
    reads (``{"the input file": path}``), directly or through a link, as black and ruff
    refuse to clobber what they read. ``None`` and ``-`` (stdout, stdin) are no files."""
    for flag, target in targets.items():
        for role, source in reads.items():
            if target in (None, "-") or source in (None, "-"):
                continue
            assert target is not None and source is not None
            if _same_file(target, source):
                in_place = flag == "-o" and role == "the input file"
                hint = ", or --in-place to rewrite it" if in_place else ""
                raise SyncpassError(
                    f"{flag} names {role} ({source}); writing there would replace what "
                    f"syncpass reads: give another file{hint}",
                    str(target),
                )


def _same_file(one: str | Path, other: str | Path) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:  # either is missing, or not ours to look at
        return False


def _read_only(mode: int, uid: int, gid: int) -> bool:
    """Whether a file's permission bits deny writing to whoever runs this (root too: a
    read-only file says "do not replace me", and a rename would replace it anyway)."""
    if uid == os.geteuid():
        return not mode & stat.S_IWUSR
    if gid in (os.getegid(), *os.getgroups()):
        return not mode & stat.S_IWGRP
    return not mode & stat.S_IWOTH


def _clean_stale_temporaries(path: Path) -> None:
    """Remove ``.NAME.*.tmp`` files beside ``path`` that a killed writer left: older than
    :data:`STALE_AFTER_S` and locked by no process (a live writer holds its lock until
    its rename)."""
    if fcntl is None:
        return
    for candidate in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - candidate.stat().st_mtime < STALE_AFTER_S:
                continue
            with open(candidate, "rb") as held:
                try:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a writer is still at it
                candidate.unlink()


def _open(target: str | Path | int, text: str | bytes) -> IO[Any]:
    if isinstance(text, bytes):
        return open(target, "wb")
    return open(target, "w", encoding="utf-8", newline="")


def _write(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path`` as a shell redirect would, but never half-written.

    A regular file (new or existing) is written through a temporary file in
    its folder and a rename, so a reader sees the old file or the whole new
    one, and its permissions are kept; a read-only one is refused. Temporary
    files a killed writer left beside it are removed first. A symlink is followed and its target
    written the same way. A device or a pipe (``/dev/stdout``, a FIFO) is
    written to directly. A missing folder or a folder as target is a
    :class:`SyncpassError`, and nothing is written.
    """
    try:
        status: os.stat_result | None = path.stat()  # of what a symlink points to
    except FileNotFoundError:
        status = None
    mode = None if status is None else status.st_mode
    if mode is not None and stat.S_ISDIR(mode):
        raise SyncpassError("is a folder; give a file name to write", str(path))
    regular = status is not None and stat.S_ISREG(status.st_mode)
    if regular and status is not None and _read_only(status.st_mode, status.st_uid, status.st_gid):
        raise SyncpassError(
            "is read-only; make it writable (chmod u+w) or give another file", str(path)
        )
    if mode is not None and not stat.S_ISREG(mode):
        with _open(path, text) as stream:
            stream.write(text)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if not path.parent.is_dir():
        raise SyncpassError(f"no such folder {path.parent}; create it first", str(path))
    _clean_stale_temporaries(path)
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
        )
    except OSError as error:
        raise SyncpassError(f"cannot write here: {error.strerror}", str(path)) from None
    try:
        with _open(handle, text) as stream:
            if fcntl is not None:  # held until the rename: the file is not stale
                fcntl.flock(stream, fcntl.LOCK_EX)
            stream.write(text)
            stream.flush()
            if mode is not None:
                os.chmod(temporary, stat.S_IMODE(mode))
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(temporary, 0o666 & ~umask)
            os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise

"""Writing files so that nothing is ever half-written, and nothing but the target is touched."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

from syncpass.core.errors import SyncpassError


def write_atomically(path: str | Path, text: str | bytes) -> None:
    """See :func:`_write`; any failure of the file system is a :class:`SyncpassError`.

    ``text`` is written as UTF-8; ``bytes`` as they are."""
    try:
        _write(Path(path), text)
    except OSError as error:
        raise SyncpassError(f"cannot write: {error.strerror or error}", str(path)) from None


def _open(target: str | Path | int, text: str | bytes) -> IO[Any]:
    if isinstance(text, bytes):
        return open(target, "wb")
    return open(target, "w", encoding="utf-8", newline="")


def _write(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path`` as a shell redirect would, but never half-written.

    A regular file (new or existing) is written through a temporary file in
    its folder and a rename, so a reader sees the old file or the whole new
    one, and its permissions are kept. A symlink is followed and its target
    written the same way. A device or a pipe (``/dev/stdout``, a FIFO) is
    written to directly. A missing folder or a folder as target is a
    :class:`SyncpassError`, and nothing is written.
    """
    try:
        mode: int | None = path.stat().st_mode  # of what a symlink points to
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise SyncpassError("is a folder; give a file name to write", str(path))
    if mode is not None and not stat.S_ISREG(mode):
        with _open(path, text) as stream:
            stream.write(text)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if not path.parent.is_dir():
        raise SyncpassError(f"no such folder {path.parent}; create it first", str(path))
    try:
        handle, temporary = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
        )
    except OSError as error:
        raise SyncpassError(f"cannot write here: {error.strerror}", str(path)) from None
    try:
        with _open(handle, text) as stream:
            stream.write(text)
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

"""Work done once and shared: by every test of a run (pytest-xdist's workers included), or,
for the corpus's installed packages, by every run on this machine.

A test that needs a result another test may already be making takes the result's lock;
the first one makes it, the others wait and read it. Nothing is shared between runs but
the packages, which are pinned: their folder is named after the pins.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:
    import fcntl
except ImportError:  # Windows: no pytest-xdist locking there; one process runs the tests
    fcntl = None  # type: ignore[assignment]

#: Set it to keep the corpus's packages somewhere other than the user's cache folder.
PACKAGES_ENV = "SYNCPASS_TEST_PACKAGES"


@contextlib.contextmanager
def locked(lock: Path) -> Iterator[None]:
    """Hold ``lock`` (a file, created if need be) against every other process."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(handle, fcntl.LOCK_UN)


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that every test process of this run shares: under pytest-xdist, the parent
    of the workers' own temporary folders."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(folder: Path, make: Callable[[Path], None]) -> Path:
    """``folder``, made by ``make(folder)`` unless a process made it before: whoever comes
    first makes it (holding its lock), the others wait for it. A folder left half made (a
    run stopped mid-way) is made again."""
    done = folder / ".done"
    with locked(folder.with_name(folder.name + ".lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            make(folder)
            done.touch()
    return folder


def shared(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]
) -> Path:
    """What a module-scoped fixture makes, as folder ``name``, made once for the whole run:
    pytest-xdist hands out tests, not modules, so the tests reading one fixture may run on
    several workers, and each would make its own copy (a profile, a distributed run)."""
    return made_once(run_folder(tmp_path_factory) / "shared" / name, make)


def save_process(path: Path, done: subprocess.CompletedProcess[str]) -> None:
    """``done``'s status and output, at ``path``, for :func:`load_process`."""
    fields = {"args": done.args, "returncode": done.returncode}
    path.write_text(json.dumps({**fields, "stdout": done.stdout, "stderr": done.stderr}))


def load_process(path: Path) -> subprocess.CompletedProcess[str]:
    """The finished process :func:`save_process` kept at ``path``."""
    data = json.loads(path.read_text())
    return subprocess.CompletedProcess(
        data["args"], data["returncode"], data["stdout"], data["stderr"]
    )


def packages_folder() -> Path:
    """Where the corpus's pinned packages are installed, once for every run: the user's cache
    folder (``$SYNCPASS_TEST_PACKAGES`` if set)."""
    configured = os.environ.get(PACKAGES_ENV)
    if configured:
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "syncpass" / "test-packages"


def pinned_name(packages: tuple[str, ...]) -> str:
    """A folder name for a set of pinned packages on this Python: the first package and a
    digest of them all (another pin, another folder)."""
    digest = hashlib.sha256("\n".join([sys.version, sys.platform, *packages]).encode()).hexdigest()
    return f"{packages[0].replace('==', '-')}-{digest[:12]}"

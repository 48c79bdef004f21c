"""Writing output files: whole or not at all, and only the target."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import write_atomically


def test_replaces_a_regular_file_keeping_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "out.py"
    target.write_text("old")
    target.chmod(0o640)
    write_atomically(target, "new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.py"]


def test_writes_through_a_symlink_to_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_text("old")
    link = tmp_path / "link.py"
    link.symlink_to("real.py")
    write_atomically(link, "new")
    assert link.is_symlink()
    assert real.read_text() == "new"


def test_writes_into_a_pipe_instead_of_replacing_it(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    write_atomically(fifo, "through the pipe")
    reader.join(timeout=10)
    assert received == ["through the pipe"]
    assert fifo.is_fifo()


@pytest.mark.parametrize(
    ("name", "message"), [("missing/out.py", "no such folder"), (".", "is a folder")]
)
def test_bad_targets_are_errors_and_write_nothing(tmp_path: Path, name: str, message: str) -> None:
    with pytest.raises(SyncpassError, match=message):
        write_atomically(tmp_path / name, "text")
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_a_folder_should_be_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SyncpassError, match=r"no such folder|cannot write"):
        write_atomically(tmp_path / "afile" / "out.json", "text")

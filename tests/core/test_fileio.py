"""Writing output files: whole or not at all, and only the target."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import pytest

from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import refuse_clobbering, write_atomically


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


def test_a_read_only_file_is_refused_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "out.py"
    target.write_text("keep me")
    target.chmod(0o444)
    with pytest.raises(SyncpassError, match="is read-only"):
        write_atomically(target, "new")  # refused even as root: the bits say "keep"
    assert target.read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["out.py"]


def test_a_temporary_file_a_killed_writer_left_is_removed_on_the_next_write(
    tmp_path: Path,
) -> None:
    target = tmp_path / "out.py"
    stale = tmp_path / ".out.py.k1ll3d.tmp"
    stale.write_text("half")
    os.utime(stale, (time.time() - 60, time.time() - 60))
    other = tmp_path / ".other.py.k1ll3d.tmp"  # another target's: not ours to judge here
    other.write_text("half")
    os.utime(other, (time.time() - 60, time.time() - 60))
    write_atomically(target, "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.py.k1ll3d.tmp", "out.py"]


def test_a_temporary_file_a_live_writer_holds_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "out.py"
    busy = tmp_path / ".out.py.busy.tmp"
    busy.write_text("being written")
    os.utime(busy, (time.time() - 60, time.time() - 60))
    with open(busy, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        write_atomically(target, "whole")
    assert busy.exists() and target.read_text() == "whole"


@pytest.mark.parametrize("through_link", [False, True])
def test_a_target_that_is_a_file_the_command_reads_is_refused(
    tmp_path: Path, through_link: bool
) -> None:
    source = tmp_path / "model.py"
    source.write_text("x = 1\n")
    target = source
    if through_link:
        target = tmp_path / "link.py"
        target.symlink_to(source)
    with pytest.raises(SyncpassError) as caught:
        refuse_clobbering({"-o": target, "--report": None}, {"the input file": source})
    assert caught.value.location == str(target)
    assert "-o names the input file" in caught.value.message
    assert "--in-place" in caught.value.message
    refuse_clobbering({"-o": tmp_path / "other.py", "--report": "-"}, {"the input file": source})

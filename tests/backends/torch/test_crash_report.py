"""A rank that dies in C code (a segfault in an extension) is reported with its signal and
the Python frames it crashed in, read from the log the process wrote as it died; its log
is removed once the run is over."""

from __future__ import annotations

import ctypes
import inspect
from typing import Any

import pytest

from syncpass.backends.torch.run import run_local, wait_for_reports
from syncpass.core.errors import SyncpassError
from syncpass.runtime.contracts import WorkerDone
from syncpass.runtime.processes import crash_log


def crash_on_rank_one(request: float, rank: int, messages: Any) -> None:
    """Rank 1 reads address 0 through ctypes (a segfault); rank 0 reports."""
    if rank == 1:
        ctypes.string_at(0)
    messages.put(WorkerDone(rank, None))


def test_a_rank_that_segfaults_is_named_with_its_signal_and_the_frames_it_crashed_in() -> None:
    pids: list[int] = []

    def collect(processes: list[Any], messages: Any) -> None:
        pids.extend(process.pid for process in processes)
        wait_for_reports(processes, messages, 60.0)

    with pytest.raises(SyncpassError) as raised:
        run_local(crash_on_rank_one, 0.0, 2, "syncpass-crash", collect)
    message = raised.value.message
    assert message.startswith("rank 1: the process exited with status -11 (SIGSEGV)"), message
    assert 'it crashed in File "' in message
    lines, first = inspect.getsourcelines(crash_on_rank_one)
    line = first + next(k for k, text in enumerate(lines) if "string_at" in text)
    assert f'{__file__}", line {line} in crash_on_rank_one' in message
    assert not any(crash_log(pid).exists() for pid in pids)

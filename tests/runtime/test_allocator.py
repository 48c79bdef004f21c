"""Every profile and every rank measure with the same allocator: glibc reuses blocks up to
32 MiB from its heap instead of mapping each one afresh (syncpass.runtime.processes.
steady_allocator), set in the fork server they are forked from."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from pathlib import Path

import pytest

from syncpass.runtime.processes import MMAP_THRESHOLD_BYTES, process_context

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only"
)


def from_the_heap(size: int = 20 * 2**20) -> bool:
    """Whether glibc serves a block of ``size`` from its heap, not by mapping it: the
    IS_MMAPPED bit (2) of the chunk's size word, just before the block."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(size)
    assert block
    try:
        return not ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 2
    finally:
        libc.free(block)


def _report_heap(results) -> None:  # type: ignore[no-untyped-def]
    results.put(from_the_heap())


#: A fresh interpreter reporting :func:`from_the_heap`, after ``SETUP``.
CHILD = """
import sys
sys.path.insert(0, {tests!r})
SETUP
from test_allocator import from_the_heap
print(from_the_heap())
"""


def test_a_block_under_the_threshold_comes_from_the_heap_once_it_is_set() -> None:
    assert MMAP_THRESHOLD_BYTES > 20 * 2**20
    child = CHILD.format(tests=str(Path(__file__).parent))
    outputs = []
    for setup in (
        "",
        "from syncpass.runtime.processes import steady_allocator\nsteady_allocator()",
    ):
        command = [sys.executable, "-c", child.replace("SETUP", setup)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        outputs.append(done.stdout.strip())
    # glibc maps a block of 20 MiB by default (its threshold starts at 128 KiB); set, its
    # heap serves it.
    assert outputs == ["False", "True"]


def test_a_process_forked_for_a_profile_or_a_rank_has_it() -> None:
    context = process_context(["syncpass.runtime.preload"])
    results = context.SimpleQueue()
    child = context.Process(target=_report_heap, args=(results,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert results.get() is True

"""The local process group of `run` and `calibrate` listens on loopback only, on a port that
no other process can take between its choice and rank 0's bind."""

from __future__ import annotations

import multiprocessing
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from syncpass.backends.torch.run import reserved_port


def listening_addresses(pid: int) -> set[str]:
    """``address:port`` of every TCP socket process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile (the listing's own fd)
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # LISTEN
                address, port = local.split(":")
                found.add(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hexed: str, width: int) -> str:
    if width == 8:  # little-endian IPv4
        return ".".join(str(int(hexed[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return "::" if int(hexed, 16) == 0 else f"[{hexed}]"


def _rank(port: int, rank: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    from syncpass.backends.torch.rendezvous import join_local_group

    join_local_group("gloo", port, rank, 2, timedelta(seconds=60))
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.barrier()  # every rank's sockets are open now
    results.put((rank, float(total), sorted(listening_addresses(os.getpid()))))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_the_local_group_listens_on_loopback_only() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with reserved_port() as port:  # as `run` holds it: rank 0 binds it beside the hold
        ranks = [context.Process(target=_rank, args=(port, rank, results)) for rank in range(2)]
        for process in ranks:
            process.start()
        reports = sorted(results.get(timeout=120) for _ in ranks)
        for process in ranks:
            process.join(timeout=60)
            assert process.exitcode == 0
    assert [total for _, total, _ in reports] == [2.0, 2.0]
    (_, _, rank0), (_, _, rank1) = reports
    assert f"127.0.0.1:{port}" in rank0  # the store
    for address in [*rank0, *rank1]:
        assert address.startswith("127.0.0.1:"), (address, reports)


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="the port is only probed free")
def test_a_reserved_port_is_kept_from_every_other_bind_until_released() -> None:
    with reserved_port() as port:
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
        for _ in range(200):  # nor does the system hand it out as a free one
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                assert probe.getsockname()[1] != port
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))

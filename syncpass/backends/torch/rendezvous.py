"""How the local processes of ``run`` and ``calibrate`` meet: on loopback only.

``init_process_group(init_method="tcp://127.0.0.1:PORT")`` connects to 127.0.0.1, but
the store rank 0 starts for it listens on every interface. Here rank 0 binds the
store's socket to 127.0.0.1 itself and hands it to :class:`torch.distributed.TCPStore`
(``master_listen_fd``), so nothing a local run opens is reachable from another machine;
gloo's own sockets follow the store's address. Multi-node runs under ``torchrun`` are
the user's own and keep torchrun's rendezvous.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"
#: Rank 0's store sockets, open for the life of the process group.
_listeners: list[socket.socket] = []


def join_local_group(
    backend: str,
    port: int,
    rank: int,
    world_size: int,
    timeout: timedelta,
    device: torch.device | None = None,
) -> None:
    """Join the process group of ``world_size`` local processes that meet on ``port``."""
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):  # beside the parent's hold on the port (reserved_port)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((LOOPBACK, port))
        listener.listen(max(world_size, 128))
        store = dist.TCPStore(  # type: ignore[attr-defined]
            LOOPBACK,
            port,
            world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
        _listeners.append(listener)
    else:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            LOOPBACK, port, world_size, is_master=False, timeout=timeout
        )
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device is not None and device.type == "cuda" else None,
    )

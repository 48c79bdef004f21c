"""torch's schedule orders, kept on disk so that planning need not import torch again.

Reading a multi-stage schedule's order (:mod:`syncpass.backends.torch.schedules`)
imports ``torch.distributed.pipelining``, which takes seconds; the order depends
only on the schedule, the counts and torch's version. :func:`cached_order` keeps
each order it reads as a small JSON file under the cache folder, named by all of
those, and answers from it when asked again, without importing torch:
``syncpass plan`` and ``--stages auto`` over a multi-stage schedule then start as
fast as over ``1f1b``.

The folder is ``$SYNCPASS_CACHE_DIR``, else ``$XDG_CACHE_HOME/syncpass``, else
``~/.cache/syncpass``. A file that cannot be written is not an error (the order is
read from torch each time); a file that cannot be read is read from torch again.
Removing the folder is always safe.

This module imports no torch.
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import write_atomically
from syncpass.plan.schedule import Action, ScheduleOrder


def cache_folder() -> Path:
    """Where the orders are kept."""
    explicit = os.environ.get("SYNCPASS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "syncpass"


def _entry(
    schedule: str, devices: int, stages_per_device: int, microbatches: int, training: bool
) -> Path:
    version = metadata.version("torch")
    mode = "train" if training else "infer"
    name = f"{schedule}-{devices}x{stages_per_device}-m{microbatches}-{mode}.json"
    return cache_folder() / "orders" / f"torch-{version}" / name


def _load(path: Path) -> ScheduleOrder | None:
    try:
        data = json.loads(path.read_text())
        return ScheduleOrder(
            schedule=data["schedule"],
            microbatches=data["microbatches"],
            stage_device=tuple(data["stage_device"]),
            actions=tuple(
                tuple(Action(kind, stage, microbatch) for kind, stage, microbatch in device)
                for device in data["actions"]
            ),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(path: Path, order: ScheduleOrder) -> None:
    data = {
        "schedule": order.schedule,
        "microbatches": order.microbatches,
        "stage_device": list(order.stage_device),
        "actions": [[list(action) for action in device] for device in order.actions],
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(data, separators=(",", ":")))
    except (OSError, SyncpassError):
        return


def cached_order(
    schedule: str, devices: int, stages_per_device: int, microbatches: int, training: bool
) -> ScheduleOrder:
    """:func:`syncpass.backends.torch.schedules.schedule_order`, from the cache when it
    holds the order for this torch."""
    try:
        path = _entry(schedule, devices, stages_per_device, microbatches, training)
    except metadata.PackageNotFoundError:
        raise SyncpassError(
            f"--schedule {schedule}: its order is read from torch's own schedule class, and "
            "torch is not installed here (pip install torch==2.13.0)"
        ) from None
    found = _load(path)
    if found is not None:
        return found
    from syncpass.backends.torch.schedules import schedule_order

    order = schedule_order(schedule, devices, stages_per_device, microbatches, training)
    _store(path, order)
    return order

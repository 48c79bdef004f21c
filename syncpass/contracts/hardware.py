"""Hardware profiles: the link and device a plan is made for, as data in ``configs/hardware``.

A profile gives the link (``alpha_s``, ``beta_bytes_per_s``), the device memory,
the compute rate a device reaches (``flops_per_s``) and, where the machine is
fixed, how many devices it has (``devices``: 8 for an 8-GPU node), each with a note of
where the figures come from. Planning for hardware other than the one the costs
were measured on is explicit: :func:`retarget_hardware` swaps the link and the
memory, scales compute by the ratio of compute rates when both are known, and
records what it did in the costs' notes, which every plan report shows.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from syncpass.contracts.costs import Costs, Hardware
from syncpass.core.errors import SyncpassError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_KEYS = (
    "name",
    "source",
    "alpha_s",
    "beta_bytes_per_s",
    "device_memory_bytes",
    "flops_per_s",
    "stage_overhead_s",
    "devices",
    "collective_alpha_s",
    "collective_beta_bytes_per_s",
    "meet_stall_s",
    "meet_window_s",
)


@dataclass(frozen=True)
class HardwareProfile:
    """A hardware profile and where its figures come from."""

    hardware: Hardware
    source: str


def profile_names() -> tuple[str, ...]:
    """Names of the shipped profiles (``configs/hardware/NAME.toml``)."""
    folder = resources.files("syncpass.configs").joinpath("hardware")
    return tuple(
        sorted(
            item.name.removesuffix(".toml")
            for item in folder.iterdir()
            if item.name.endswith(".toml")
        )
    )


def load_profile(name_or_path: str) -> HardwareProfile:
    """A shipped profile by name, or a TOML file by path."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise SyncpassError(
                f"cannot read the hardware profile: {error.strerror}", str(path)
            ) from None
        where = str(path)
    else:
        if name_or_path not in profile_names():
            raise SyncpassError(
                f"no hardware profile named {name_or_path!r}; shipped profiles: "
                f"{', '.join(profile_names())} (or give a .toml file)"
            )
        text = (
            resources.files("syncpass.configs")
            .joinpath("hardware", f"{name_or_path}.toml")
            .read_text("utf-8")
        )
        where = f"syncpass/configs/hardware/{name_or_path}.toml"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SyncpassError(f"not valid TOML: {error}", where) from None
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise SyncpassError(
            f"unknown field {', '.join(map(repr, unknown))}; known fields are {', '.join(_KEYS)}",
            where,
        )
    try:
        hardware = Hardware(
            alpha_s=data["alpha_s"],
            beta_bytes_per_s=data["beta_bytes_per_s"],
            device_memory_bytes=data.get("device_memory_bytes"),
            name=data.get("name", name_or_path),
            flops_per_s=data.get("flops_per_s"),
            stage_overhead_s=data.get("stage_overhead_s", 0.0),
            devices=data.get("devices"),
            collective_alpha_s=data.get("collective_alpha_s"),
            collective_beta_bytes_per_s=data.get("collective_beta_bytes_per_s"),
            meet_stall_s=data.get("meet_stall_s", 0.0),
            meet_window_s=data.get("meet_window_s", 0.0),
        )
    except KeyError as error:
        raise SyncpassError(f"missing required field {error.args[0]!r}", where) from None
    except ValueError as error:
        raise SyncpassError(str(error), where) from None
    return HardwareProfile(hardware, str(data.get("source", "")))


def cpu_devices(threads: int = 1) -> int:
    """How many stages this CPU machine runs at once: the cores this process may use,
    divided by the threads each stage uses (at least 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, threads))


def retarget_hardware(costs: Costs, profile: HardwareProfile) -> Costs:
    """``costs`` as they would be on ``profile``'s hardware, with a note of what changed."""
    measured, target = costs.hardware, profile.hardware
    ops = costs.ops
    if measured.flops_per_s is not None and target.flops_per_s is not None:
        scale = measured.flops_per_s / target.flops_per_s
        ops = tuple(op.with_compute_scaled(scale) for op in costs.ops)
        compute = (
            f"compute x{scale:.3g} ({measured.flops_per_s:.3g} -> {target.flops_per_s:.3g} FLOP/s;"
            " each op's fixed time per call, host-side work, kept as measured)"
        )
    else:
        compute = (
            "compute kept as measured (the cost file or the profile gives no FLOP/s to scale by)"
        )
    note = (
        f"re-targeted from {measured.name or 'the measured hardware'} to {target.name}: link and "
        f"memory from the profile, {compute}"
    )
    # The op times are no longer the measuring machine's: its speed probe says nothing of them.
    return dataclasses.replace(
        costs, hardware=target, ops=ops, notes=(*costs.notes, note), speed_probe_s=None
    )

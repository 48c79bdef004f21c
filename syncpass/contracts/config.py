"""Pass settings: the ``sync_config`` vocabulary and where its values come from.

Settings are resolved in this order, later ones winning: the built-in
defaults, the ``config`` object of the cost file, a ``--config`` TOML file,
then command-line flags.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import STRATEGY_GROUP, declared

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: Strategies a plan can be made with.
#: ``adaptive`` and ``fixed`` run the exact optimiser (``adaptive`` raises the
#: threshold to the smallest value that admits a plan, ``fixed`` fails
#: instead); the others are the rules people use today, kept for comparison;
#: ``manual`` takes the cuts the user marked. Installed packages add more
#: (:func:`strategy_names`).
STRATEGIES = ("adaptive", "fixed", "uniform", "parameters", "time", "manual")
OPTIMISING_STRATEGIES = ("adaptive", "fixed")
BASELINE_STRATEGIES = ("uniform", "parameters", "time")
#: Pipeline schedules, as torch.distributed.pipelining names their classes:
#: ``gpipe`` (ScheduleGPipe) and ``1f1b`` (Schedule1F1B) hold one stage per device;
#: the others (:data:`MULTI_STAGE_SCHEDULES`) hold ``V`` stages per device
#: (``--stages-per-device``): ``interleaved-1f1b`` (ScheduleInterleaved1F1B),
#: ``looped-bfs`` (ScheduleLoopedBFS), ``interleaved-zb``
#: (ScheduleInterleavedZeroBubble), ``zbv`` (ScheduleZBVZeroBubble) and ``dualpipev``
#: (ScheduleDualPipeV).
SCHEDULES = (
    "gpipe",
    "1f1b",
    "interleaved-1f1b",
    "looped-bfs",
    "interleaved-zb",
    "zbv",
    "dualpipev",
)
SINGLE_STAGE_SCHEDULES = ("gpipe", "1f1b")
MULTI_STAGE_SCHEDULES = ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")
#: The schedules that place stages on the devices in a V (device ``d`` holds stages ``d``
#: and ``2S - 1 - d``) rather than round-robin (``d``, ``d + S``, ...); they hold exactly
#: two stages per device.
V_SHAPE_SCHEDULES = ("zbv", "dualpipev")


def default_stages_per_device(schedule: str) -> int:
    """The stages a device holds when nobody says: two for the V, else one."""
    return 2 if schedule in V_SHAPE_SCHEDULES else 1


def placement_error(
    schedule: str, stages_per_device: int, given_by: str = "--stages-per-device"
) -> str | None:
    """Why ``schedule`` cannot hold ``stages_per_device`` stages on each device (``given_by``
    names where that count comes from, a flag or a config line), or ``None``."""
    if schedule in SINGLE_STAGE_SCHEDULES and stages_per_device != 1:
        return (
            f"--schedule {schedule} holds one stage per device, and {given_by} asks for "
            f"{stages_per_device}: choose a schedule that holds several "
            f"({', '.join(MULTI_STAGE_SCHEDULES)}), or give the stages a device each"
        )
    if schedule in V_SHAPE_SCHEDULES and stages_per_device != 2:
        return (
            f"--schedule {schedule} places exactly two stages on each device (a V: device d "
            f"holds stages d and 2S-1-d), and {given_by} is {stages_per_device}: use 2"
        )
    return None


def stage_devices(schedule: str, devices: int, stages_per_device: int) -> tuple[int, ...]:
    """The device (pipeline rank) of each of the ``devices * stages_per_device`` stages
    under ``schedule``: round-robin, or the V of :data:`V_SHAPE_SCHEDULES`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if devices < 1 or stages_per_device < 1:
        raise ValueError("devices and stages_per_device must be at least 1")
    refused = placement_error(schedule, stages_per_device)
    if refused is not None:
        raise ValueError(refused)
    stages = devices * stages_per_device
    if schedule in V_SHAPE_SCHEDULES:
        return tuple(s if s < devices else 2 * devices - 1 - s for s in range(stages))
    return tuple(s % devices for s in range(stages))


def plugin_strategy_names() -> tuple[str, ...]:
    """The strategies installed packages add (entry point group ``syncpass.strategies``)."""
    return tuple(sorted(declared(STRATEGY_GROUP, STRATEGIES)))


def strategy_names() -> tuple[str, ...]:
    """Every strategy a user may name: the built-in ones, then the installed ones."""
    return (*STRATEGIES, *plugin_strategy_names())


@dataclass(frozen=True)
class SyncConfig:
    """How sync points are chosen.

    ``min_sync_interval``: fewest ops a stage holds.
    ``communication_cost_threshold``: the largest admissible ratio of a sync
    point's communication time to the compute time of the stage it closes.
    """

    strategy: str = "adaptive"
    min_sync_interval: int = 1
    communication_cost_threshold: float = 0.1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES and self.strategy not in plugin_strategy_names():
            raise ValueError(
                f"strategy must be one of {', '.join(strategy_names())}, got {self.strategy!r}"
            )
        if isinstance(self.min_sync_interval, bool) or not isinstance(self.min_sync_interval, int):
            raise ValueError(
                f"min_sync_interval must be a whole number of ops, got {self.min_sync_interval!r}"
            )
        if self.min_sync_interval < 1:
            raise ValueError(
                f"min_sync_interval must be at least 1 (a stage holds at least one op), "
                f"got {self.min_sync_interval}"
            )
        tau = self.communication_cost_threshold
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or math.isnan(tau) or tau < 0:
            raise ValueError(
                f"communication_cost_threshold must be a number >= 0 "
                f"(use inf for no limit), got {tau!r}"
            )

    def replace(self, **changes: Any) -> SyncConfig:
        """A copy with ``changes`` applied; ``None`` values are ignored."""
        kept = {key: value for key, value in changes.items() if value is not None}
        return dataclasses.replace(self, **kept)


CONFIG_KEYS = tuple(field.name for field in dataclasses.fields(SyncConfig))


def sync_config_from_mapping(
    data: Mapping[str, Any], location: str, base: SyncConfig
) -> SyncConfig:
    """Read ``data`` over ``base``; unknown keys and bad values name ``location``."""
    unknown = sorted(set(data) - set(CONFIG_KEYS))
    if unknown:
        raise SyncpassError(
            f"unknown setting {', '.join(map(repr, unknown))}; valid settings are "
            f"{', '.join(CONFIG_KEYS)}",
            location,
        )
    try:
        return base.replace(**dict(data))
    except (ValueError, TypeError) as error:
        raise SyncpassError(str(error), location) from None


@cache
def default_sync_config() -> SyncConfig:
    """The shipped defaults, from ``configs/defaults.toml``."""
    text = resources.files("syncpass.configs").joinpath("defaults.toml").read_text("utf-8")
    return sync_config_from_mapping(
        tomllib.loads(text), "syncpass/configs/defaults.toml", SyncConfig()
    )


def read_config_table(path: Path) -> tuple[Mapping[str, Any], str, str]:
    """The syncpass table of a TOML file, its text, and the table's name for messages.

    The settings may stand at the top level (name ``""``) or under
    ``[tool.syncpass]`` (so a ``pyproject.toml`` can be passed as it is).
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except OSError as error:
        raise SyncpassError(f"cannot read the config file: {error.strerror}", str(path)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SyncpassError(f"not valid TOML: {error}", str(path)) from None
    except RecursionError:  # tomllib recurses per nested array or table
        raise SyncpassError("the TOML is nested too deeply to read", str(path)) from None
    table: Any = data
    name = ""
    if "tool" in data or "project" in data:  # a pyproject.toml: read its own table
        tool = data.get("tool", {})
        table = tool.get("syncpass", {}) if isinstance(tool, dict) else {}
        name = "tool.syncpass"
    if not isinstance(table, Mapping):
        raise SyncpassError("[tool.syncpass] must be a table", f"{path}:[tool.syncpass]")
    return table, text, name

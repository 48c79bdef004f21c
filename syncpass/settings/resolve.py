"""The one settings resolver: what ``plan``, ``rewrite``, ``check``, the codemod and
``parallelize`` plan with.

Settings are laid over each other in one order, later ones winning:

1. the shipped defaults (``configs/defaults.toml``);
2. the ``config`` object of the cost file;
3. the project configuration: ``--config FILE``, else the nearest
   ``pyproject.toml`` with a ``[tool.syncpass]`` table above the input; the
   model entry whose source (or cost file) the input is gives its own stages
   and class first;
4. what the caller says itself: command-line flags, keyword arguments.

:func:`resolve_settings` reads the project once (step 3 and 4, which need no
cost file); :meth:`Settings.request` lays them over a cost file's settings
(steps 1 and 2) when the costs are known, and :meth:`Settings.retarget`
re-targets the costs to the hardware and batch size asked for. The same
inputs give the same request from every entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from syncpass.contracts.config import SyncConfig, default_stages_per_device, placement_error
from syncpass.contracts.costs import Costs
from syncpass.contracts.hardware import load_profile, retarget_hardware
from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import DEFAULT_BACKEND
from syncpass.plan.planner import PlanRequest
from syncpass.plan.retarget import retarget_batch, shard_optimizer_state
from syncpass.settings.project import (
    ModelEntry,
    ProjectConfig,
    Stages,
    find_project_config,
    load_project_config,
)

#: The upper bound of ``stages = "auto"`` unless the caller gives another.
DEFAULT_MAX_STAGES = 8


@dataclass(frozen=True)
class Overrides:
    """What the caller states itself; ``None`` (or ``()``) means not given."""

    stages: Stages | None = None
    strategy: str | None = None
    min_sync_interval: int | None = None
    communication_cost_threshold: float | None = None
    microbatches: int | None = None
    schedule: str | None = None
    stages_per_device: int | str | None = None  # "auto": try what the schedule takes
    pinned: tuple[str, ...] = ()
    hardware: str | None = None
    batch_size: int | None = None
    optimizer_shards: int | None = None
    model: str | None = None
    backend: str | None = None
    config: Path | None = None
    max_stages: int = DEFAULT_MAX_STAGES


@dataclass(frozen=True)
class Settings:
    """Everything an entry point plans with, but the cost file's own settings.

    ``stages`` is ``"auto"`` for the count with the least predicted step (up to
    ``max_stages``), or ``None`` when nobody gave one (``manual`` needs none).
    """

    project: ProjectConfig | None
    entry: ModelEntry | None
    backend: str
    model: str | None
    stages: Stages | None
    max_stages: int
    hardware: str | None
    batch_size: int | None
    overrides: Overrides

    @property
    def auto(self) -> bool:
        return self.stages == "auto"

    @property
    def auto_limit(self) -> int | None:
        """``max_stages`` when the stage count is to be chosen, else ``None``."""
        return self.max_stages if self.auto else None

    def sync_config(self, base: SyncConfig) -> SyncConfig:
        """``base`` (a cost file's settings) with the project's, then the caller's, over it."""
        config = self.project.sync_over(base) if self.project is not None else base
        given = self.overrides
        try:
            return config.replace(
                strategy=given.strategy,
                min_sync_interval=given.min_sync_interval,
                communication_cost_threshold=given.communication_cost_threshold,
            )
        except ValueError as error:
            raise SyncpassError(str(error)) from None

    def request(self, costs: Costs) -> PlanRequest:
        """The plan request over ``costs``'s own settings."""
        schedule, per_device = self.schedule_and_stages_per_device()
        try:
            return PlanRequest(
                stages=None if self.auto or self.stages is None else int(self.stages),
                config=self.sync_config(costs.config),
                microbatches=self.overrides.microbatches,
                schedule=schedule,
                pinned=self.overrides.pinned,
                stages_per_device=per_device,
            )
        except ValueError as error:
            raise SyncpassError(str(error)) from None

    def schedule_and_stages_per_device(
        self, default_schedule: str = "1f1b", check: bool = True
    ) -> tuple[str, int | None]:
        """The schedule, and the stages each device holds (``None``: to be chosen).

        A flag wins over the configuration file, which wins over ``default_schedule``. The
        file's ``stages_per_device`` goes with its ``schedule``: when ``--schedule`` names
        another that cannot hold that many, the other's default is taken (2 for the V, else
        1). With ``check``, a count the schedule cannot hold is an error that names the flag
        or the file's line (without, the caller's backend refuses it in its own words).
        """
        project = self.project
        overrides = self.overrides
        schedule = overrides.schedule or (project.schedule if project else None) or default_schedule
        given, given_by = overrides.stages_per_device, "--stages-per-device"
        if given is None and project is not None and project.stages_per_device is not None:
            given = project.stages_per_device
            given_by = f"stages_per_device ({project.stages_per_device_at})"
            mismatched = given != "auto" and placement_error(schedule, int(given)) is not None
            if mismatched and overrides.schedule is not None:
                given = None  # the file's count was for the file's schedule
        if given == "auto":
            return schedule, None
        if given is None:
            return schedule, default_stages_per_device(schedule)
        refused = placement_error(schedule, int(given), given_by)
        if refused is not None and check:
            raise SyncpassError(refused)
        return schedule, int(given)

    def retarget(self, costs: Costs, *, estimated_for_hardware: bool = False) -> Costs:
        """``costs`` for the hardware and batch size asked for (the report says so).

        An estimate made for the hardware already (``estimated_for_hardware``)
        is only re-targeted to the batch size: there is nothing to re-target from.
        """
        if self.hardware is not None and not estimated_for_hardware:
            costs = retarget_hardware(costs, load_profile(self.hardware))
        if self.batch_size is not None:
            costs = retarget_batch(costs, self.batch_size)
        if self.overrides.optimizer_shards is not None:
            costs = shard_optimizer_state(costs, self.overrides.optimizer_shards)
        return costs


def resolve_settings(
    start: Path, overrides: Overrides = Overrides(), project: ProjectConfig | None = None
) -> Settings:
    """The settings for the input at ``start`` (a model source, a cost file, or a folder).

    The project is ``overrides.config`` when given, else ``project`` when the
    caller has read it already, else the nearest ``pyproject.toml`` with a
    ``[tool.syncpass]`` table above ``start``.
    """
    if overrides.config is not None:
        project = load_project_config(overrides.config)
    elif project is None:
        found = find_project_config(start)
        project = None if found is None else load_project_config(found)
    entry = project.entry_for(start) if project is not None else None
    stages = overrides.stages
    if stages is None and project is not None:
        stages = project.stages_for(entry) if entry is not None else project.stages
    model = overrides.model
    if model is None and entry is not None:
        model = entry.model
    hardware = overrides.hardware
    if hardware is None and project is not None:
        hardware = project.hardware
    backend = overrides.backend
    if backend is None:
        backend = project.backend if project is not None else DEFAULT_BACKEND
    return Settings(
        project=project,
        entry=entry,
        backend=backend,
        model=model,
        stages=stages,
        max_stages=overrides.max_stages,
        hardware=hardware,
        batch_size=overrides.batch_size,
        overrides=overrides,
    )

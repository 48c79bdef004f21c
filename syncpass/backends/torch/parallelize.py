"""Plan from a live profile and return this rank's pipeline stage: ``syncpass.parallelize``.

For users who would rather not write files. Every rank calls

    stage = syncpass.parallelize(model, example_args, stages=world_size,
                                 loss_fn=loss_fn, target=target)
    schedule = Schedule1F1B(stage.stage, n_microbatches=stage.microbatches, loss_fn=loss_fn)

inside an initialised ``torch.distributed`` process group (``torchrun``, or
``init_process_group`` by hand). Rank 0 profiles the model on
``example_args`` (its forward and backward, op by op, as ``syncpass profile``
does, reading the model's source file), plans the sync points with the exact
optimiser under ``sync_config``, and sends the plan to every rank, so all
ranks split at the same points whatever their own timings. The split itself
is ``torch.distributed.pipelining``'s: ``pipeline(model, mb_args,
split_spec=...)`` with a ``SplitPoint`` at each chosen sync point, then
``Pipe.build_stage`` for this rank.

A ``split_spec`` can only split at submodule calls, so only sync points
right after a submodule call (``x = self.layer3(x)``, an iteration of
``for block in self.blocks``), or right before one, are candidates here;
``syncpass rewrite`` can place the others, as ``pipe_split()`` calls in the
source.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import SplitPoint, pipeline

from syncpass.contracts.config import (
    SINGLE_STAGE_SCHEDULES,
    SyncConfig,
    sync_config_from_mapping,
)
from syncpass.contracts.costs import Costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import Plan, make_plan
from syncpass.settings.resolve import Overrides, Settings, resolve_settings


@dataclass(frozen=True)
class ParallelStage:
    """This rank's stage and the plan every rank shares.

    ``stage`` is a ``torch.distributed.pipelining.PipelineStage`` for a
    schedule; ``split_spec`` maps submodule names to ``"end"`` or
    ``"beginning"``, the split points handed to ``pipeline``.
    """

    stage: Any
    plan: Plan
    split_spec: Mapping[str, str]
    microbatches: int
    rank: int


def parallelize(
    model: torch.nn.Module,
    example_args: tuple[Any, ...],
    *,
    stages: int | None = None,
    sync_config: SyncConfig | Mapping[str, Any] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    target: Any = None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
    device: torch.device | str | None = None,
) -> ParallelStage:
    """Plan ``model`` on rank 0 from a live profile and build this rank's stage.

    ``example_args`` is one full batch of the forward's inputs (split into
    ``microbatches`` along dimension 0); ``loss_fn(output, target)`` the loss
    whose backward is profiled (default: the mean square of the output).
    ``stages`` defaults to the process group's size. Bad input raises
    :class:`SyncpassError`.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise SyncpassError(
            "syncpass.parallelize needs an initialised torch.distributed process group "
            "(run under torchrun, or call torch.distributed.init_process_group first)"
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    stages = world if stages is None else stages
    if stages != world:
        raise SyncpassError(f"{stages} stages need {stages} ranks; the process group has {world}")
    shared: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            shared[0] = _plan(
                model, example_args, stages, sync_config, loss_fn, target, microbatches, schedule
            )
        except SyncpassError as error:
            shared[0] = error
        except BaseException as error:  # the other ranks must not wait for a plan forever
            failure = error
            shared[0] = SyncpassError(
                f"rank 0 failed while planning: {type(error).__name__}: {error}"
            )
    dist.broadcast_object_list(shared, src=0)
    if failure is not None:
        raise failure
    outcome = shared[0]
    if isinstance(outcome, SyncpassError):
        raise outcome
    plan, spec = outcome
    chunk = tuple(_first_chunk(value, plan.microbatches) for value in example_args)
    split_spec = {
        name: SplitPoint.END if where == "end" else SplitPoint.BEGINNING
        for name, where in spec.items()
    }
    pipe = pipeline(model, mb_args=chunk, split_spec=split_spec or None)
    if pipe.num_stages != stages:
        raise SyncpassError(
            f"the traced model has {pipe.num_stages} stage(s) where the plan has {stages}"
        )
    where = torch.device(device) if device is not None else torch.device("cpu")
    stage = pipe.build_stage(rank, where)
    return ParallelStage(stage, plan, dict(spec), plan.microbatches, rank)


def resolve_parallel_settings(
    source: Path,
    stages: int,
    sync_config: SyncConfig | Mapping[str, Any] | None,
    microbatches: int | None = None,
    schedule: str = "1f1b",
) -> Settings:
    """The settings :func:`parallelize` plans with, from the one resolver every entry point
    uses: the project of the model's source file, then ``sync_config`` over it (a whole
    :class:`SyncConfig` sets every key; a mapping only its own). :func:`parallelize` builds
    one stage per rank, so ``schedule`` is ``gpipe`` or ``1f1b``, whatever the project's
    configuration says of stages per device."""
    if schedule not in SINGLE_STAGE_SCHEDULES:
        raise SyncpassError(
            f"syncpass.parallelize builds one stage per rank and --schedule {schedule} holds "
            f"several: use {' or '.join(SINGLE_STAGE_SCHEDULES)}, or syncpass rewrite with "
            "--stages-per-device and syncpass run"
        )
    if isinstance(sync_config, SyncConfig):
        given: dict[str, Any] = dataclasses.asdict(sync_config)
    else:
        given = dict(sync_config or {})
        sync_config_from_mapping(given, "sync_config", SyncConfig())  # unknown keys, bad values
    return resolve_settings(
        source,
        Overrides(
            stages=stages,
            strategy=given.get("strategy"),
            min_sync_interval=given.get("min_sync_interval"),
            communication_cost_threshold=given.get("communication_cost_threshold"),
            microbatches=microbatches,
            schedule=schedule,
            stages_per_device=1,
        ),
    )


def _plan(
    model: torch.nn.Module,
    example_args: tuple[Any, ...],
    stages: int,
    sync_config: SyncConfig | Mapping[str, Any] | None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    target: Any,
    microbatches: int | None,
    schedule: str,
) -> tuple[Plan, dict[str, str]]:
    from syncpass.backends.torch.example import default_loss
    from syncpass.backends.torch.measure import batch_size_of, profile_costs
    from syncpass.backends.torch.profile import smaller_batch
    from syncpass.frontend.source import read_model_text

    try:
        source = inspect.getsourcefile(type(model))
    except TypeError:  # a class without a file (built in, or typed into a REPL)
        source = None
    if source is None:
        raise SyncpassError(f"cannot find the source file of {type(model).__name__}")
    batch = batch_size_of(example_args, source)
    if microbatches is not None and batch % microbatches:
        raise SyncpassError(
            f"{microbatches} micro-batches do not cut a batch of {batch} into equal parts, "
            "which the pipeline's stages need; use a divisor of the batch"
        )
    text = read_model_text(Path(source))
    loss = loss_fn or default_loss

    def batch_loss(output: Any) -> torch.Tensor:
        return loss(output, target)

    costs = profile_costs(
        text,
        source,
        model,
        example_args,
        batch_loss,
        class_name=type(model).__name__,
        small_batch=smaller_batch(example_args, target, loss, model),
    )
    costs, spec_of = splittable(costs, model)
    if stages > 1 and not costs.cuts:
        raise SyncpassError(
            "no sync point of this model falls at a submodule call, where split_spec can split; "
            "use syncpass rewrite to write pipe_split() calls into its source",
            source,
        )
    settings = resolve_parallel_settings(Path(source), stages, sync_config, microbatches, schedule)
    costs = settings.retarget(costs)
    request = settings.request(costs)
    plan = make_plan(costs, request, source)
    return plan, dict(spec_of[point.after] for point in plan.sync_points)


def splittable(costs: Costs, model: torch.nn.Module) -> tuple[Costs, dict[str, tuple[str, str]]]:
    """``costs`` with only the cuts a ``split_spec`` can make, and each one's split point.

    A cut after op ``blocks.3`` (a submodule) splits at that submodule's end;
    else a cut before a submodule call splits at that submodule's beginning.
    """
    submodules = dict(model.named_modules())
    spec_of: dict[str, tuple[str, str]] = {}
    index = costs.op_index
    for cut in costs.cuts:
        following = costs.ops[index[cut.after] + 1].id
        if cut.after in submodules and cut.after:
            spec_of[cut.after] = (cut.after, "end")
        elif following in submodules and following:
            spec_of[cut.after] = (following, "beginning")
    kept = tuple(cut for cut in costs.cuts if cut.after in spec_of)
    return dataclasses.replace(costs, cuts=kept), spec_of


def _first_chunk(value: Any, microbatches: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0:
        return value.tensor_split(microbatches)[0]
    return value

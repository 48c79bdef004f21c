"""One rank's process of ``syncpass run``: build its stages, train, measure, check.

Each process does what a ``torchrun`` training script would: it builds the
example (seeded, so every rank has the same weights and batch), builds the
file's eager stage modules (``<Model>Stage<k>.of(model)``) or traces the model
with ``torch.distributed.pipelining.pipeline`` at the shape of one micro-batch
(the tracer cuts at the ``pipe_split()`` calls), builds the stages this rank
holds (one, or ``--stages-per-device`` of them, placed as the schedule places
them) and steps torch's schedule class (:data:`SCHEDULE_CLASSES`) on the
example batch. The outcome, or the failure, goes to the parent through a
queue; nothing here raises out of :func:`run_worker`.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import io
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.pipelining import Pipe, PipelineStage, pipeline
from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks
from torch.distributed.pipelining.stage import _PipelineStageBase

from syncpass.backends.torch import tensor_parallel, verify
from syncpass.backends.torch.example import Example, load_example
from syncpass.backends.torch.memory import (
    CPU_MEASURE,
    CUDA_MEASURE,
    MemoryMeter,
    static_bytes,
    watch_memory,
)
from syncpass.backends.torch.rendezvous import join_local_group
from syncpass.backends.torch.schedules import SCHEDULE_CLASSES, schedule_order
from syncpass.backends.torch.speed import SpeedProbe
from syncpass.backends.torch.traceable import values_past_the_next_stage
from syncpass.contracts.config import SINGLE_STAGE_SCHEDULES
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import raised_microbatches_note
from syncpass.plan.schedule import Action
from syncpass.runtime.contracts import (
    LossCheck,
    ParamCheck,
    RunRequest,
    RunResult,
    StageFigures,
    TiedCheck,
    WorkerDone,
    WorkerFailed,
    default_microbatches,
)
from syncpass.runtime.example import innermost_user_frame

SGD_LR = 1e-3
# What gloo and NCCL say when another rank went away.
PEER_LOST_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
)


class MessageQueue(Protocol):
    """The part of ``multiprocessing.Queue`` a worker uses."""

    def put(self, obj: Any) -> None: ...

    def close(self) -> None: ...

    def join_thread(self) -> None: ...


def run_worker(request: RunRequest, rank: int, queue: MessageQueue) -> None:
    """Run rank ``rank``'s stages of ``request`` and put a WorkerDone or WorkerFailed on
    ``queue``."""
    message: WorkerDone | WorkerFailed
    try:
        message = WorkerDone(rank, _run(request, rank))
    except SyncpassError as error:
        message = WorkerFailed(rank, error.message, error.location, user_error=True)
    except BaseException as error:  # SystemExit from user code must not go unreported
        message = _crash(rank, error)
    # Report first, and wait until the report is in the pipe: tearing the group
    # down closes the connections, and the peers' "connection closed" failures
    # must not overtake this rank's own.
    queue.put(message)
    queue.close()
    queue.join_thread()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _crash(rank: int, error: BaseException) -> WorkerFailed:
    """The failure message for an unexpected exception: its chain, and the user's line if any."""
    parts: list[str] = []
    current: BaseException | None = error
    while current is not None and len(parts) < 4:
        text = " ".join(str(current).split())
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or current.__context__
    frame = innermost_user_frame(error.__traceback__)
    location = f"{frame.filename}:{frame.lineno}" if frame is not None else ""
    return WorkerFailed(rank, "; caused by ".join(parts), location, peer_lost=_lost_peer(error))


def _lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is a broken connection to another rank rather than a failure of this one."""
    if isinstance(error, (dist.DistNetworkError, dist.DistBackendError)):
        return True
    text = str(error)
    return any(sign in text for sign in PEER_LOST_SIGNS)


@dataclass
class Batch:
    """The example batch, on the stage's device, and its micro-batches."""

    args: tuple[Any, ...]
    target: torch.Tensor
    arg_chunks: list[tuple[Any, ...]]
    target_chunks: list[torch.Tensor]
    size: int


@dataclass
class ComputeClock:
    """Adds up the time spent inside the wrapped functions (the stage's own computation)."""

    device: torch.device
    total: float = 0.0
    _depth: int = field(default=0, repr=False)

    def _sync(self) -> None:
        # CUDA kernels run asynchronously: without a sync the host clock would
        # measure only the launches.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        """Time the block, unless it runs inside another measured block."""
        self._depth += 1
        if self._depth == 1:
            self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._sync()
                self.total += time.perf_counter() - start

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, timed."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.measure():
                return function(*args, **kwargs)

        return timed


@dataclass
class ActionLog:
    """The compute actions a rank's schedule runs, in order, while ``on``: ``(kind, stage,
    microbatch)`` as :class:`syncpass.plan.schedule.Action` names them."""

    on: bool = False
    actions: list[tuple[str, int, int]] = field(default_factory=list)

    def record(self, kind: str, stage: int, microbatch: int) -> None:
        if self.on:
            self.actions.append((kind, stage, microbatch))


def watch(stage: _PipelineStageBase, clock: ComputeClock, log: ActionLog) -> None:
    """Time and log the compute the schedule runs on ``stage``.

    torch 2.13's schedules compute through three methods of the stage: a forward
    (``F``) is ``forward_one_chunk``; a full backward (``B``) is ``backward_one_chunk``
    with ``full_backward=True``; the zero-bubble schedules split it into the inputs'
    gradient (``I``: ``backward_one_chunk`` with ``full_backward=False``) and the
    weights' (``W``: ``backward_weight_one_chunk``). Instance attributes shadow the
    methods the schedule calls.
    """
    index = stage.stage_index
    methods = (
        ("forward_one_chunk", lambda _: "F"),
        ("backward_one_chunk", lambda arguments: "B" if arguments["full_backward"] else "I"),
        ("backward_weight_one_chunk", lambda _: "W"),
    )
    for name, kind_of in methods:
        method = getattr(stage, name)
        signature = inspect.signature(method)

        def watched(
            *args: Any,
            _method: Callable[..., Any] = method,
            _signature: inspect.Signature = signature,
            _kind_of: Callable[[dict[str, Any]], str] = kind_of,
            **kwargs: Any,
        ) -> Any:
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            chunk = next(iter(bound.arguments.values()))  # the micro-batch, first in each
            log.record(_kind_of(bound.arguments), index, int(chunk))
            with clock.measure():
                return _method(*args, **kwargs)

        setattr(stage, name, watched)


@dataclass
class StageRun:
    """One rank's stages, ready to step: what :func:`_prepare` builds."""

    request: RunRequest
    rank: int
    device: torch.device
    backend: str
    example: Example
    batch: Batch
    pipe: Pipe | None  # None for eager stages
    stage_modules: tuple[torch.nn.Module, ...]  # every eager stage, sharing the weights
    stages: tuple[Any, ...]  # this rank's PipelineStages, in stage order
    schedule: Any  # torch's schedule class of request.schedule
    optimizer: torch.optim.Optimizer | None
    clock: ComputeClock
    log: ActionLog
    aliases: dict[str, str]
    identity: dict[int, str]
    reference: verify.Reference | None
    randomness: str | None = None  # rank 0, with --verify: why the forward is random
    memory: MemoryMeter | None = None  # on a CPU: counts what the memory model counts
    # With --tp: this rank's place in its stage's tensor-parallel group, the group of the
    # pipeline it belongs to (its stages' sends; None: every rank), and the parameters the
    # file's TENSOR_PARALLEL_LAYOUT splits (name -> kind, dimension, chunks).
    tp_rank: int = 0
    pipeline_group: Any = None
    split: dict[str, tuple[str, int, Any]] = field(default_factory=dict)

    @property
    def is_first(self) -> bool:
        """Whether this rank holds the first stage (it feeds the batch in)."""
        return any(stage.is_first for stage in self.stages)

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage (it computes the loss): the last rank, or
        rank 0 under a V-shaped placement."""
        return any(stage.is_last for stage in self.stages)

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters of every stage this rank holds, each once."""
        seen: dict[int, torch.nn.Parameter] = {}
        for stage in self.stages:
            for parameter in stage.submod.parameters():
                seen.setdefault(id(parameter), parameter)
        return list(seen.values())


def _run(request: RunRequest, rank: int) -> RunResult | None:
    runs = [_prepare(request, rank)]
    # Other splits of the same model, stepped in turn with the first in one process group.
    runs += [
        _prepare(request.alongside_request(file), rank, join=False) for file in request.alongside
    ]
    warmed = [_warm_up(run) for run in runs]
    if request.timeline is not None:
        from syncpass.backends.torch.profiler import Profile

        with Profile("syncpass run", runs[0].stages, output=request.timeline):
            timed, probes = _timed_steps(runs, probe=False)
    else:
        timed, probes = _timed_steps(runs, probe=runs[0].device.type != "cuda")
    results = [
        _gather(run, dataclasses.replace(_figures(run, checks, times), speed_probes_s=probes))
        for run, checks, times in zip(runs, warmed, timed, strict=True)
    ]
    first = results[0]
    if first is None:
        return None
    return dataclasses.replace(first, alongside=tuple(r for r in results[1:] if r is not None))


def _warm_up(run: StageRun) -> tuple[tuple[ParamCheck, ...], tuple[LossCheck, ...]]:
    """The warm-up step: sets up the stages' communication; its gradients are the ones
    checked (with ``--verify``), and its actions the ones reported."""
    run.log.on = True
    if run.memory is not None:
        held = [*run.parameters(), *_buffers(run)]
        run.memory.weights = {t.untyped_storage().data_ptr() for t in held}
        run.memory.on = True
    losses = _step(run, timed=False)
    run.log.on = False
    if run.memory is not None:
        run.memory.on = False
    checks: tuple[tuple[ParamCheck, ...], tuple[LossCheck, ...]] = ((), ())
    if run.reference is not None:
        checks = _check(run, run.reference, losses)
    # Every rank joins the tied weights' all-reduces, one with no parameters of its own
    # (no optimizer) as well: its peers wait for it.
    sum_tied_gradients(run)
    if run.optimizer is not None:
        run.optimizer.step()
    if run.memory is not None:
        run.memory.sample()  # the optimizer's state exists now
    return checks


def _figures(
    run: StageRun,
    checks: tuple[tuple[ParamCheck, ...], tuple[LossCheck, ...]],
    times: tuple[tuple[float, ...], tuple[float, ...]],
) -> StageFigures:
    """What this rank measured and checked of ``run``."""
    tied = _tied_checks(run) if run.reference is not None else ()
    parameters = run.parameters()
    held = tuple(stage.stage_index for stage in run.stages)
    return StageFigures(
        stage=held[0],
        rank=run.rank,
        parameters=sum(p.numel() for p in parameters),
        parameter_tensors=len(parameters),
        step_times_s=times[0],
        compute_times_s=times[1],
        checks=checks[0],
        loss_checks=checks[1],
        held=held if run.request.stages_per_device > 1 else (),
        actions=tuple(run.log.actions),
        tied=tied if run.rank == 0 else (),
        **_peak_memory(run),
    )


def _peak_memory(run: StageRun) -> dict[str, Any]:
    """The rank's peak memory for :class:`StageFigures`, and what measures it."""
    if run.device.type == "cuda":
        return {
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(run.device)),
            "memory_measure": CUDA_MEASURE,
        }
    if run.memory is None:
        return {}
    return {
        "peak_memory_bytes": run.memory.peak_bytes,
        "peak_activation_bytes": run.memory.peak_activations,
        "memory_measure": CPU_MEASURE,
    }


def _prepare(request: RunRequest, rank: int, join: bool = True) -> StageRun:
    """Load the example, trace it, join the process group (unless an earlier run of this
    process did: ``join`` False) and build this rank's stages. ``rank`` is the process's;
    with ``request.tp`` above 1 it holds the stages of pipeline rank ``rank // tp``, its
    layers split as the file's TENSOR_PARALLEL_LAYOUT says, part ``rank % tp``."""
    _quiet_torch_warnings()
    stage_rank, tp_rank = divmod(rank, request.tp)
    try:
        held = request.stages_of(stage_rank)
    except ValueError as error:
        raise SyncpassError(f"--schedule {request.schedule}: {error}") from None
    torch.set_num_threads(request.threads)
    device, backend = _device(request, rank)
    # As torchrun sets them: an example may read its rank.
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(request.ranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(request.port),
    )
    example = load_example(request.example)
    batch = _split_batch(example, request, device)
    model = example.model.to(device)
    reference_model = copy.deepcopy(model) if request.verify else None
    split = _tensor_split(model, request, tp_rank)
    # Taken before tracing: the stages hold these very parameter objects.
    aliases = verify.canonical_names(model)
    identity = {id(p): aliases[name] for name, p in model.named_parameters(remove_duplicate=False)}
    stage_modules = eager_stages(model, request)
    if request.tp > 1 and not stage_modules:
        raise SyncpassError(
            "--stages with --tp runs the eager stages' form: rewrite the tensor-parallel "
            "file with --backend torch_stages (the default), not pipe_split() calls",
            request.file,
        )
    pipe = None if stage_modules else _trace(model, batch, request)

    if join:
        join_local_group(
            backend,
            request.port,
            rank,
            request.ranks,
            timedelta(seconds=request.timeout_s),
            device,
        )
    pipeline_group = (
        _mesh_groups(request.stages, request.tp, device.type) if request.tp > 1 else None
    )
    total = request.total_stages
    loss_fn = example.loss_fn
    clock, log, meter = ComputeClock(device), ActionLog(), MemoryMeter()
    stages: list[_PipelineStageBase] = []
    for index in held:
        stage: _PipelineStageBase
        if pipe is not None:
            stage = pipe.build_stage(index, device)
            _contiguous_transfers(stage)
            _no_warmup_to_self(stage)
        else:
            inputs, outputs = stage_examples(stage_modules, index, batch.arg_chunks[0])
            stage = PipelineStage(
                stage_modules[index],
                index,
                total,
                device,
                input_args=inputs,
                output_args=outputs,
                group=pipeline_group,
                dw_builder=whole_backward_builder(stage_modules[index], index, inputs),
            )
            if index == total - 1:
                loss_fn = StructuredOutput().wrap(stage_modules[index], loss_fn)
        if device.type != "cuda":
            watch_memory(stage, meter)  # first: watch() binds the method's own signature
        watch(stage, clock, log)
        stages.append(stage)
    schedule_class = SCHEDULE_CLASSES[request.schedule]
    schedule = schedule_class(
        stages[0] if request.schedule in SINGLE_STAGE_SCHEDULES else stages,
        n_microbatches=len(batch.arg_chunks),
        loss_fn=clock.wrap(loss_fn),
        scale_grads=True,
    )
    reference, randomness = None, None
    if reference_model is not None:
        with tensor_parallel.running_alone():  # the unsplit model: its collectives do nothing
            reference = verify.run_reference(
                reference_model,
                batch.arg_chunks,
                batch.target_chunks,
                example.loss_fn,
                len(batch.arg_chunks),
            )
            if rank == 0:  # after the reference: its extra forwards change no gradient
                randomness = verify.randomness(reference_model, batch.arg_chunks[0])
    run = StageRun(
        request=request,
        rank=stage_rank,
        device=device,
        backend=backend,
        example=example,
        batch=batch,
        pipe=pipe,
        stage_modules=stage_modules,
        stages=tuple(stages),
        schedule=schedule,
        optimizer=None,
        clock=clock,
        log=log,
        aliases=aliases,
        identity=identity,
        reference=reference,
        randomness=randomness,
        tp_rank=tp_rank,
        pipeline_group=pipeline_group,
        split=split,
    )
    parameters = run.parameters()
    if parameters:
        run.optimizer = torch.optim.SGD(parameters, lr=SGD_LR)
    if device.type != "cuda":
        run.memory = meter
        meter.static = static_bytes(run.parameters, lambda: _buffers(run), lambda: run.optimizer)
    return run


def _tensor_split(
    model: torch.nn.Module, request: RunRequest, tp_rank: int
) -> dict[str, tuple[str, int, Any]]:
    """With ``request.tp`` above 1: ``model``'s weights sliced to this rank's part as the
    file's TENSOR_PARALLEL_LAYOUT says, and the parameters it split."""
    if request.tp == 1:
        return {}
    from syncpass.backends.torch.tensor_form import written_layouts

    layouts = written_layouts(request.file)
    split = tensor_parallel.split_parameters(layouts, model)
    tensor_parallel.shard_module(model, layouts, tp_rank, request.tp)
    return split


@functools.cache
def _mesh_groups(stages: int, tp: int, device_type: str) -> Any:
    """The ranks as torch's ``DeviceMesh`` of shape (stages, tp), rank ``r`` at
    ``(r // tp, r % tp)``, made once per process (the files ``--alongside`` run in the
    same groups): this rank's stage's tensor-parallel group becomes the collectives'
    group (:func:`tensor_parallel.set_tensor_parallel_group`); its pipeline's group is
    returned, for its stages' sends and receives."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (stages, tp), mesh_dim_names=("pipeline", "tensor"))
    tensor_parallel.set_tensor_parallel_group(mesh["tensor"].get_group())
    return mesh["pipeline"].get_group()


def _buffers(run: StageRun) -> list[torch.Tensor]:
    return [buffer for stage in run.stages for buffer in stage.submod.buffers()]


def _timed_steps(
    runs: Sequence[StageRun], probe: bool
) -> tuple[list[tuple[tuple[float, ...], tuple[float, ...]]], tuple[float, ...]]:
    """``--steps`` training steps of each run, each step started together on all ranks:
    (step, compute) times per run. Several runs take their steps in turn, in an order
    rotated each round, so that the machine's load falls on all of them alike.

    With ``probe``, after each round the ranks time the speed probe outside the timed
    steps (:meth:`SpeedProbe.on_ranks`; ranks sharing cores apart, as the prediction counts
    them: ``Plan.shared_step_s``). This rank's probe times come second."""
    step_times: list[list[float]] = [[] for _ in runs]
    compute_times: list[list[float]] = [[] for _ in runs]
    speed = SpeedProbe() if probe else None
    probes: list[float] = []
    request = runs[0].request
    for round_index in range(runs[0].request.steps):
        shift = round_index % len(runs)
        for place in [*range(shift, len(runs)), *range(shift)]:
            run = runs[place]
            dist.barrier()
            run.clock.total = 0.0
            start = time.perf_counter()
            _step(run, timed=True)
            if run.device.type == "cuda":
                torch.cuda.synchronize(run.device)
            step_times[place].append(time.perf_counter() - start)
            compute_times[place].append(run.clock.total)
        if speed is not None:
            probes += speed.on_ranks(request.ranks, request.threads)
    timed = [
        (tuple(steps), tuple(computes))
        for steps, computes in zip(step_times, compute_times, strict=True)
    ]
    return timed, tuple(probes)


def _gather(run: StageRun, figures: StageFigures) -> RunResult | None:
    """Collect every rank's figures on rank 0; rank 0 returns the whole result, others None.

    Rank 0 also holds every rank's executed actions against the order syncpass plans
    with (:func:`schedule_order`) and notes where they differ."""
    request = run.request
    if run.tp_rank != 0:  # a stage's figures are its first tensor-parallel rank's
        return None
    gathered: list[StageFigures] | None = [figures] * request.stages if run.rank == 0 else None
    dist.gather_object(figures, gathered, dst=0, group=run.pipeline_group)
    if gathered is None:
        return None
    unplaced: tuple[ParamCheck, ...] = ()
    if run.reference is not None:
        covered = (check.name for stage_figures in gathered for check in stage_figures.checks)
        unplaced = verify.check_unplaced(covered, run.aliases, run.reference)
    return RunResult(
        request=request,
        batch=run.batch.size,
        microbatches=len(run.batch.arg_chunks),
        backend=run.backend,
        device=str(run.device),
        stages=tuple(gathered),
        model_parameters=len(set(run.aliases.values())),
        unplaced=unplaced,
        randomness=run.randomness,
        order_notes=order_notes(request, len(run.batch.arg_chunks), gathered),
        notes=microbatch_notes(request, run.batch.size, len(run.batch.arg_chunks)),
    )


def microbatch_notes(request: RunRequest, size: int, microbatches: int) -> tuple[str, ...]:
    """Why the default count is ``microbatches``, where the batch norms' floor lowered it."""
    if request.microbatches is not None:
        return ()
    plain = choose_microbatches(size, dataclasses.replace(request, min_microbatch_size=1))
    note = raised_microbatches_note(
        plain, microbatches, size, request.min_microbatch_size, request.min_microbatch_by
    )
    return () if note is None else (note,)


def order_notes(
    request: RunRequest, microbatches: int, figures: Sequence[StageFigures]
) -> tuple[str, ...]:
    """Where a rank's executed actions differ from the order :func:`schedule_order` gives
    (what the planner simulates): one line per such rank, naming the first difference."""
    order = schedule_order(
        request.schedule, request.stages, request.stages_per_device, microbatches
    )
    notes = []
    for rank_figures in figures:
        ran = [Action(*action) for action in rank_figures.actions]
        planned = list(order.actions[rank_figures.rank])
        if ran == planned:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(ran, planned, strict=False)) if a != b),
            min(len(ran), len(planned)),
        )
        shown = {
            "ran": _action_text(ran[at]) if at < len(ran) else "nothing",
            "planned": _action_text(planned[at]) if at < len(planned) else "nothing",
        }
        notes.append(
            f"rank {rank_figures.rank} ran {len(ran)} action(s), {len(planned)} planned; "
            f"action {at} is {shown['ran']}, planned {shown['planned']}"
        )
    return tuple(notes)


def _action_text(action: Action) -> str:
    return f"{action.kind}{action.microbatch} of stage {action.stage}"


def _quiet_torch_warnings() -> None:
    # Deprecation notices from torch's own internals (pytree specs, export) say
    # nothing about the user's model and would bury the report; a failed trace
    # logs the whole graph as a warning, while its cause reaches the user as the error.
    logging.getLogger("torch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*|copyreg")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\..*")


def _device(request: RunRequest, rank: int) -> tuple[torch.device, str]:
    """CUDA with NCCL when every stage gets a GPU of its own, else the CPU with gloo."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if request.device == "cuda" and gpus < request.ranks:
        raise SyncpassError(
            f"--device cuda needs a GPU per rank: {request.ranks} rank(s), {gpus} GPU(s) visible"
        )
    if request.device == "cuda" or (request.device == "auto" and gpus >= request.ranks):
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _split_batch(example: Example, request: RunRequest, device: torch.device) -> Batch:
    """Move the batch to ``device`` and cut it into equal micro-batches along dimension 0."""
    args = tuple(_to(value, device) for value in example.args)
    tensors = [
        (index, value) for index, value in enumerate(args) if isinstance(value, torch.Tensor)
    ]
    if not tensors:
        raise SyncpassError(
            "the example's args hold no tensor to split into micro-batches", example.origin
        )
    first, first_tensor = tensors[0]
    if first_tensor.dim() == 0 or first_tensor.shape[0] == 0:
        raise SyncpassError(
            f"args[{first}] has shape {tuple(first_tensor.shape)}: no batch to split "
            "into micro-batches along its first dimension",
            example.origin,
        )
    size = first_tensor.shape[0]
    for index, value in tensors:
        if value.dim() == 0 or value.shape[0] != size:
            shape = tuple(value.shape)
            raise SyncpassError(
                f"args[{index}] has shape {shape}, but args[{first}] has batch size "
                f"{size}: every tensor input is split into micro-batches along its first dimension",
                example.origin,
            )
    if example.target is None:
        # The schedule hands each micro-batch's target to the loss; the default loss ignores it.
        target = torch.zeros(size, device=device)
    else:
        target = example.target.to(device)
        if target.dim() == 0 or target.shape[0] != size:
            raise SyncpassError(
                f"target has shape {tuple(target.shape)}; its first dimension must be the batch "
                f"size {size}",
                example.origin,
            )
    microbatches = request.microbatches or choose_microbatches(size, request)
    if size % microbatches:
        raise SyncpassError(
            f"a batch of {size} does not split into {microbatches} equal micro-batches (the "
            "pipeline is traced at the shape of one micro-batch); choose --microbatches among "
            f"{', '.join(str(d) for d in range(1, size + 1) if size % d == 0)}",
            example.origin,
        )
    if request.schedule == "1f1b" and microbatches < request.stages:
        raise SyncpassError(
            f"--schedule 1f1b needs at least one micro-batch per stage: {microbatches} "
            f"micro-batch(es) for {request.stages} stages (use gpipe, or a larger batch)"
        )
    try:
        schedule_order(request.schedule, request.stages, request.stages_per_device, microbatches)
    except SyncpassError as error:
        raise SyncpassError(
            f"{microbatches} micro-batch(es) of a batch of {size}: {error.message}",
            example.origin,
        ) from None
    arg_chunks, _ = split_args_kwargs_into_chunks(args, None, microbatches)
    (target_chunks, _) = split_args_kwargs_into_chunks((target,), None, microbatches)
    return Batch(
        args=args,
        target=target,
        arg_chunks=list(arg_chunks),
        target_chunks=[chunk[0] for chunk in target_chunks],
        size=size,
    )


def choose_microbatches(size: int, request: RunRequest) -> int:
    """The default micro-batch count: the largest divisor of the batch ``size`` that is at
    most four per rank, that leaves micro-batches of at least the request's
    ``min_microbatch_size`` samples, and that torch's schedule takes (one with several
    stages per rank may want a multiple of the ranks, or at least two per rank); the plain
    default when none is taken (the caller then says why)."""
    least = request.min_microbatch_size
    plain = default_microbatches(size, request.stages, least)
    if request.schedule in SINGLE_STAGE_SCHEDULES:
        return plain
    for count in sorted((d for d in range(1, size + 1) if size % d == 0), reverse=True):
        if count > 4 * request.stages or size // count < least:
            continue
        try:
            schedule_order(request.schedule, request.stages, request.stages_per_device, count)
        except SyncpassError:
            continue
        return count
    return plain


def stage_count_text(request: RunRequest) -> str:
    """The flags that set the stage count: ``--stages``, or ``--stages 2 x
    --stages-per-device 2``."""
    if request.stages_per_device == 1:
        return "--stages"
    return f"--stages {request.stages} x --stages-per-device {request.stages_per_device}"


def eager_stages(model: torch.nn.Module, request: RunRequest) -> tuple[torch.nn.Module, ...]:
    """Every stage of ``model`` as the eager stage classes of its file build it (``Stage<k>.of``),
    or ``()`` when the file has none (then the model is traced at its ``pipe_split()`` calls).

    Stages that one rank holds together get parameter objects of their own (a tied
    embedding and head under a V-shaped placement): each stage scales and checks its
    own gradient, as stages on different ranks do.
    """
    name = type(model).__name__
    module = sys.modules.get(type(model).__module__)
    classes: list[Any] = []
    while module is not None and hasattr(module, f"{name}Stage{len(classes)}"):
        classes.append(getattr(module, f"{name}Stage{len(classes)}"))
    if not classes:
        return ()
    if len(classes) != request.total_stages:
        written = (
            f"1 stage class ({name}Stage0)"
            if len(classes) == 1
            else f"{len(classes)} stage classes ({name}Stage0 .. {name}Stage{len(classes) - 1})"
        )
        raise SyncpassError(
            f"the file has {written}; {stage_count_text(request)} asks for "
            f"{request.total_stages}" + _rewrite_hint(len(classes), request),
            _class_line(classes[-1]) or request.file,
        )
    stages = own_parameters([stage_class.of(model) for stage_class in classes], request.placement)
    for index, stage_module in enumerate(stages[:-1]):
        _check_sends(stage_module, index)
    return stages


def _rewrite_hint(found: int, request: RunRequest) -> str:
    """How to make the counts agree: other flags, or a file rewritten with the stages asked."""
    per_device = request.stages_per_device
    hints = []
    if found % per_device == 0:
        hints.append(f"run it with --stages {found // per_device}")
    if found % request.stages == 0 and found // request.stages > 1:
        several = found // request.stages
        hints.append(
            f"with --stages-per-device {several} and a schedule that holds {several} stages "
            "per rank (--schedule interleaved-1f1b, say)"
        )
    rewrite = f"--stages {request.stages}"
    if per_device > 1:
        rewrite += f" --schedule {request.schedule} --stages-per-device {per_device}"
    hints.append(f"rewrite the model with {rewrite}")
    return f" ({', or '.join(hints)})"


def _class_line(stage_class: type[Any]) -> str:
    """``file:line`` of a class statement, or ``""``."""
    try:
        _, line = inspect.getsourcelines(stage_class)
    except (OSError, TypeError):
        return ""
    file = inspect.getsourcefile(stage_class)
    return f"{file}:{line}" if file else ""


def own_parameters(
    stage_modules: Sequence[torch.nn.Module], placement: Sequence[int]
) -> tuple[torch.nn.Module, ...]:
    """``stage_modules`` where no two stages on one rank (``placement[k]`` is stage k's)
    share a parameter or buffer object: a later one gets a copy of what an earlier one
    on its rank holds (its own submodules, then, around the same other tensors).

    torch's stages each divide their parameters' gradients by the micro-batch count
    once the step is done; a parameter two local stages shared would be divided twice.
    """
    stages = list(stage_modules)
    for index, stage_module in enumerate(stages):
        earlier = {
            id(tensor)
            for other in range(index)
            if placement[other] == placement[index]
            for tensor in _tensors_of(stages[other])
        }
        shared = [tensor for tensor in _tensors_of(stage_module) if id(tensor) in earlier]
        if not shared:
            continue
        # deepcopy copies the modules; the memo keeps every tensor but the shared ones.
        keep = {id(tensor): tensor for tensor in _tensors_of(stage_module)}
        for tensor in shared:
            del keep[id(tensor)]
        stages[index] = copy.deepcopy(stage_module, memo=dict(keep))
    return tuple(stages)


def _tensors_of(module: torch.nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def whole_backward_builder(
    module: torch.nn.Module, index: int, inputs: Sequence[torch.Tensor]
) -> Callable[[], Callable[[], None]] | None:
    """For a stage after the first that holds weights but receives no gradient-carrying
    input (token ids, a mask, a length): torch's ``dw_builder``, so that its backward runs
    whole, else None.

    The zero-bubble schedules split a stage's backward into its inputs' gradient (``I``)
    and its weights' (``W``), and torch finds the weights' part through the graph from the
    stage's inputs; from inputs that carry no gradient it finds none, and only stage 0 is
    excepted (``backward_weight_one_chunk``), so such a stage would end the step with no
    weight gradients. Given a ``dw_builder``, torch runs the whole backward at ``I`` and
    the builder's runner at ``W``: here nothing, the weights' gradients being in already.
    """
    if index == 0 or any(value.requires_grad for value in inputs):
        return None
    if not any(parameter.requires_grad for parameter in module.parameters()):
        return None
    return lambda: _nothing


def _nothing() -> None:
    """The ``W`` of a stage whose ``I`` ran its whole backward (:func:`whole_backward_builder`)."""


def stage_examples(
    stages: Sequence[torch.nn.Module], index: int, chunk: tuple[Any, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """What stage ``index`` receives and returns for the micro-batch ``chunk``: the stages
    before it run on it first (every rank holds the whole model).

    Handed to ``PipelineStage`` as ``input_args`` / ``output_args``, these spare torch its
    own shape inference, which runs a later stage on uninitialised tensors: a number or a
    shape the stage before sends would be garbage there. The last stage returns what the
    model returns (a dataclass, a dict): its tensors stand for it. The random state is
    left as it was, so dropout draws the same masks in the schedule as without this run.
    """
    with torch.random.fork_rng():  # the CPU's and every visible GPU's random state
        values: tuple[Any, ...] = chunk
        received: tuple[Any, ...] = chunk
        returned: Any = ()
        for before in range(index + 1):
            received = values
            returned = stages[before](*values)
            flat = returned if isinstance(returned, tuple) else (returned,)
            values = tuple(
                value.detach().requires_grad_(value.requires_grad)
                if isinstance(value, torch.Tensor)
                else value
                for value in flat
            )
    if index == len(stages) - 1:
        outputs = tuple(_tensors_in(returned)) or (torch.zeros(()),)
    else:
        outputs = tuple(value for value in values if isinstance(value, torch.Tensor))
    return tuple(v for v in received if isinstance(v, torch.Tensor)), outputs


class StructuredOutput:
    """The last stage's output when it is not a tensor or a tuple of tensors (a ``ModelOutput``,
    a dict, a dataclass).

    torch's schedules take a stage's output apart as a tuple of tensors (to detach them once
    the backward is done); the model's loss reads the output as the model returns it. The
    wrapped stage returns the output's tensors and keeps the output itself, which the wrapped
    loss then reads: each micro-batch's loss follows its forward, in order, in both schedules.
    """

    def __init__(self) -> None:
        self.pending: collections.deque[Any] = collections.deque()

    def wrap(
        self, stage_module: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor]
    ) -> Callable[[Any, Any], torch.Tensor]:
        """Wrap ``stage_module``'s forward, and return ``loss_fn`` reading what it kept."""
        forward = stage_module.forward

        def tensors_only(*args: Any, **kwargs: Any) -> Any:
            output = forward(*args, **kwargs)
            if isinstance(output, torch.Tensor) or (
                type(output) is tuple and all(isinstance(v, torch.Tensor) for v in output)
            ):
                return output
            self.pending.append(output)
            return tuple(_tensors_in(output, detach=False))

        def loss(output: Any, target: Any) -> torch.Tensor:
            return loss_fn(self.pending.popleft() if self.pending else output, target)

        stage_module.forward = tensors_only
        return loss


def _tensors_in(value: Any, detach: bool = True) -> list[torch.Tensor]:
    """The tensors of a model's output (:func:`verify.output_tensors`), detached or not."""
    found = verify.output_tensors(value)
    return [tensor.detach() for tensor in found] if detach else found


def _check_sends(stage_module: torch.nn.Module, index: int) -> None:
    """Make ``stage_module`` refuse to send anything but tensors, naming the value and line,
    and send each tensor as a contiguous one.

    torch's PipelineStage sends only tensors between stages; its own error names
    neither the value nor where it comes from. gloo sends only contiguous tensors, and
    the stage after allocates its receive buffers with the strides of the example output:
    a slice such as ViT's class token ``x[:, 0]`` crosses as a contiguous copy (its
    gradient flows back through the copy as through the slice).
    """
    forward = stage_module.forward
    names = tuple(getattr(type(stage_module), "sends", ()))

    def checked(*args: Any, **kwargs: Any) -> Any:
        outputs = forward(*args, **kwargs)
        values = outputs if isinstance(outputs, tuple) else (outputs,)
        for position, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                name = names[position] if position < len(names) else f"output {position}"
                raise SyncpassError(
                    f"stage {index} sends {name} (of type {type(value).__name__}) to stage "
                    f"{index + 1}: "
                    "torch's PipelineStage sends only tensors between stages; compute "
                    f"{name} again in the next stage from what it receives (or make it a tensor)",
                    _return_line(type(stage_module)),
                )
        contiguous = tuple(value.contiguous() for value in values)
        return contiguous if isinstance(outputs, tuple) else contiguous[0]

    stage_module.forward = checked


def _contiguous_transfers(stage: _PipelineStageBase) -> None:
    """Make a traced stage send and receive contiguous tensors only: gloo moves nothing
    else, and torch shapes a traced stage's outputs and receive buffers as the traced
    values were laid out, where a slice of a buffer (``self.bias[:T, :T]``) is a strided
    view. Its outputs are made contiguous, and so are the buffers it receives activations
    and gradients into (torch 2.13's ``_create_act_recv_info`` and
    ``_create_grad_recv_info``)."""
    module = stage.submod
    forward = module.forward

    def contiguous_outputs(*args: Any, **kwargs: Any) -> Any:
        outputs = forward(*args, **kwargs)
        if isinstance(outputs, tuple):
            return tuple(
                value.contiguous() if isinstance(value, torch.Tensor) else value
                for value in outputs
            )
        return outputs.contiguous() if isinstance(outputs, torch.Tensor) else outputs

    module.forward = contiguous_outputs
    for name in ("_create_act_recv_info", "_create_grad_recv_info"):
        create = getattr(stage, name, None)
        if create is not None:
            setattr(stage, name, _with_contiguous_buffers(create))


def _no_warmup_to_self(stage: _PipelineStageBase) -> None:
    """Keep a traced stage from greeting a neighbour on its own rank.

    Before the first step torch 2.13 sends a dummy tensor between neighbouring stages
    (``_get_init_p2p_neighbors_ops``; the schedules use it for stages that are not
    ``PipelineStage``, as traced ones are). Under a V-shaped placement (zbv, dualpipev)
    the two middle stages sit on one rank, and gloo fails on the send to itself ("Pair
    is not connected"); the schedule hands values between those two in memory anyway.
    """
    create = getattr(stage, "_get_init_p2p_neighbors_ops", None)
    if create is None:
        return
    rank = dist.get_rank()

    def to_others() -> list[dist.P2POp]:
        return [op for op in create() if op.peer != rank]

    stage._get_init_p2p_neighbors_ops = to_others  # type: ignore[method-assign]


def _with_contiguous_buffers(create: Callable[..., Any]) -> Callable[..., Any]:
    def created(*args: Any, **kwargs: Any) -> Any:
        infos = create(*args, **kwargs)
        for info in infos:
            buffer = getattr(info, "buffer", None)
            if isinstance(buffer, torch.Tensor) and not buffer.is_contiguous():
                fresh = torch.empty(buffer.shape, dtype=buffer.dtype, device=buffer.device)
                info.buffer = fresh.requires_grad_(buffer.requires_grad)
                meta = info.tensor_meta
                if meta is not None:
                    info.tensor_meta = dataclasses.replace(meta, stride=fresh.stride())
        return infos

    return created


def _return_line(stage_class: type[torch.nn.Module]) -> str:
    """``file:line`` of the return statement of a stage class's forward."""
    try:
        lines, start = inspect.getsourcelines(stage_class.forward)
    except (OSError, TypeError):
        return ""
    returns = [offset for offset, line in enumerate(lines) if line.strip().startswith("return")]
    file = inspect.getsourcefile(stage_class) or ""
    return f"{file}:{start + returns[-1]}" if returns else file


def shared_parameters(
    stage_modules: tuple[torch.nn.Module, ...], aliases: dict[str, str]
) -> list[dict[str, str]]:
    """The parameters several eager stages hold (a tied embedding and head), as groups of
    ``"stage<k>"`` -> the name there, in the form :func:`verify.sum_replicated` takes."""
    holders: dict[str, dict[str, str]] = {}
    for index, stage_module in enumerate(stage_modules):
        for local, _ in stage_module.named_parameters():
            holders.setdefault(aliases.get(local, local), {})[f"stage{index}"] = local
    return [group for group in holders.values() if len(group) > 1]


def _trace(model: torch.nn.Module, batch: Batch, request: RunRequest) -> Pipe:
    """Split ``model`` at its ``pipe_split()`` calls and check the stage count."""
    # A failed torch.export prints its partial graph to stderr (hundreds of
    # lines); the cause and the user's line are reported instead.
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            pipe = pipeline(model, mb_args=batch.arg_chunks[0])
    except Exception as error:
        cause = error.__cause__ or error
        frame = innermost_user_frame(cause.__traceback__)
        location = f"{frame.filename}:{frame.lineno}" if frame is not None else request.file
        first_line = next((line for line in str(cause).splitlines() if line.strip()), "")
        raise SyncpassError(
            f"torch.distributed.pipelining could not trace the model: "
            f"{type(cause).__name__}: {first_line.strip()}",
            location,
        ) from None
    sys.stderr.write(captured.getvalue())
    if pipe.num_stages != request.total_stages:
        cuts = pipe.num_stages - 1
        message = (
            f"the traced forward has {cuts} pipe_split() sync point(s), which make "
            f"{pipe.num_stages} stage(s); {stage_count_text(request)} asks for "
            f"{request.total_stages}, which {request.total_stages - 1} pipe_split() calls make"
        )
        source = inspect.getsourcefile(type(model))
        if source is not None and Path(source).resolve() != Path(request.file).resolve():
            message += f" (the example's model is defined in {source}, not in this file)"
        raise SyncpassError(message, request.file)
    far = values_past_the_next_stage(pipe)
    if far:
        # torch would fail in build_stage with "Backward of skip connections not supported
        # yet", naming neither the value nor the sync point.
        lines = [
            number
            for number, line in enumerate(Path(request.file).read_text().splitlines(), 1)
            if line.strip().startswith("pipe_split()")
        ]
        where = f"{request.file}:{lines[far[0].crossed(len(lines))]}" if lines else request.file
        raise SyncpassError(
            f"{far[0].describe(pipe.num_stages)}, across this sync point: "
            "torch.distributed.pipelining sends a stage's output only to the next stage. "
            "Move the sync point, compute the value where it is read, or rewrite with "
            "--backend torch_stages",
            where,
        )
    return pipe


def _step(run: StageRun, timed: bool) -> list[torch.Tensor]:
    """One training step; returns the last stage's per-micro-batch losses (else ``[]``).

    The timed steps zero the gradients first and update the weights after; the
    warm-up step leaves both to the caller, which checks the gradients between.
    """
    losses: list[torch.Tensor] = []
    if timed and run.optimizer is not None:
        run.optimizer.zero_grad(set_to_none=True)
    inputs = run.batch.args if run.is_first else ()
    if run.pipe is not None:
        # The traced graph has no input for a None argument (torch.export keeps it constant).
        inputs = tuple(value for value in inputs if value is not None)
    if run.is_last:
        run.schedule.step(*inputs, target=run.batch.target, losses=losses)
    else:
        run.schedule.step(*inputs)
    if timed:
        sum_tied_gradients(run)
    if timed and run.optimizer is not None:
        with run.clock.measure():
            run.optimizer.step()
    return losses


@dataclass(frozen=True)
class _TiedWeight:
    """A weight several stages hold: its copies on this rank and its shape (every rank
    joins its collectives, holding a copy or not)."""

    name: str  # in the unsplit model
    stages: tuple[int, ...]
    copies: tuple[torch.nn.Parameter, ...]
    like: torch.Tensor  # a copy, on whichever rank: for the shape and dtype


def _shared_groups(
    run: StageRun,
) -> tuple[list[dict[str, str]], dict[str, torch.nn.Module], dict[str, torch.nn.Module]]:
    """The parameters several stages hold, as groups of stage name -> the name there (the
    same on every rank); every stage module by that name; and this rank's."""
    if run.pipe is not None:
        groups = [dict(group) for group in run.pipe.replicated_params]
        every = dict(run.pipe.split_gm.named_children())
    else:
        groups = shared_parameters(run.stage_modules, run.aliases)
        every = {f"stage{index}": module for index, module in enumerate(run.stage_modules)}
    own = {
        name: module
        for name, module in every.items()
        if any(stage.submod is module for stage in run.stages)
    }
    return groups, every, own


def _tied_weights(run: StageRun) -> list[_TiedWeight]:
    """The weights several stages hold copies of (a tied embedding and head), in the same
    order on every rank."""
    groups, every, own = _shared_groups(run)
    found = []
    for group in sorted(groups, key=lambda group: sorted(group.items())):
        holder, name = sorted(group.items())[0]
        stages = tuple(sorted(int("".join(filter(str.isdigit, held))) for held in group))
        copies = tuple(
            own[held].get_parameter(local) for held, local in group.items() if held in own
        )
        like = every[holder].get_parameter(name)
        found.append(_TiedWeight(run.aliases.get(name, name), stages, copies, like))
    return found


def sum_tied_gradients(run: StageRun) -> None:
    """Give every copy of a weight several stages hold (a tied embedding and head) the sum
    of the copies' gradients, the one gradient the unsplit model's parameter gets, so that
    the optimizer keeps the copies equal: one all-reduce per such weight, which every rank
    joins in the same order (a rank holding no copy adds zeros)."""
    for weight in _tied_weights(run):
        total = torch.zeros_like(weight.like, device=run.device)
        for tied in weight.copies:
            if tied.grad is not None:
                total += tied.grad
        dist.all_reduce(total, group=run.pipeline_group)
        for tied in weight.copies:
            tied.grad = total.clone()


def _tied_checks(run: StageRun) -> tuple[TiedCheck, ...]:
    """How far apart the copies of each tied weight are after the timed steps."""
    _, atol = verify.tolerances(torch.float32, run.device, run.request.rtol, run.request.atol)
    checks = []
    for weight in _tied_weights(run):
        high = torch.full_like(weight.like, -math.inf, device=run.device)
        low = torch.full_like(weight.like, math.inf, device=run.device)
        for tied in weight.copies:
            high = torch.maximum(high, tied.detach())
            low = torch.minimum(low, tied.detach())
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=run.pipeline_group)
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=run.pipeline_group)
        drift = float((high - low).abs().max())
        checks.append(TiedCheck(weight.name, weight.stages, run.request.steps + 1, drift, atol))
    return tuple(checks)


def _gathered_gradients(
    run: StageRun, stage_module: torch.nn.Module, names: dict[str, str]
) -> dict[str, torch.Tensor]:
    """The whole gradient of each parameter of ``stage_module`` the tensor-parallel layout
    split, gathered from the stage's ranks (each joins, in the same order); a row-split
    layer's bias is rank 0's alone, and kept as it is."""
    whole: dict[str, torch.Tensor] = {}
    for local, parameter in stage_module.named_parameters():
        original = names.get(local, "")
        if original not in run.split or original in whole:
            continue
        _, dim, chunks = run.split[original]
        if dim < 0:
            continue
        grad = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        whole[original] = tensor_parallel.gather_parameter_grad(grad, dim, chunks, run.request.tp)
    return whole


def _check(
    run: StageRun, reference: verify.Reference, losses: list[torch.Tensor]
) -> tuple[tuple[ParamCheck, ...], tuple[LossCheck, ...]]:
    """The gradient checks of this rank's stages (each under its own stage index) and, on
    the rank holding the last stage, the loss checks."""
    request = run.request
    modules = {stage.stage_index: stage.submod for stage in run.stages}
    groups, _, own = _shared_groups(run)
    replicated = verify.sum_replicated(groups, own, run.aliases, reference, run.device)
    checks: list[ParamCheck] = []
    for index, stage_module in sorted(modules.items()):
        names = verify.stage_parameter_names(stage_module, run.identity, run.aliases)
        checks += verify.check_stage(
            index,
            stage_module,
            names,
            replicated,
            reference,
            run.device,
            request.rtol,
            request.atol,
            _gathered_gradients(run, stage_module, names),
        )
    loss_checks: tuple[LossCheck, ...] = ()
    if run.is_last:
        rtol, atol = verify.tolerances(torch.float32, run.device, request.rtol, request.atol)
        loss_checks = verify.check_losses(losses, reference, rtol, atol)
    return tuple(checks), loss_checks

"""``syncpass run --tp N``: a tensor-parallel rewritten model on N gloo processes.

Beside the pipeline runner (:mod:`syncpass.backends.torch.run`), whose process handling
it reuses: each rank joins the group on loopback, builds the example from the rewritten
file (seeded: every rank the same weights and batch), keeps the unsplit model as the
reference, slices its weights with ``shard_module(model, TENSOR_PARALLEL_LAYOUT)`` (the
``dtensor`` form: ``parallelize_module(model, mesh, TENSOR_PARALLEL_PLAN)`` over a 1-D CPU
mesh of the ranks, its collectives counted by DTensor's ``CommDebugMode``), runs
one training step (forward, loss, backward) counting the collectives it issues, and,
with ``--verify``, runs the reference on the same batch alone (every collective the
identity) and compares the loss and every gradient: split weights' gradients are
gathered from the ranks (rank 0 compares them), replicated ones compared on every rank.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from dataclasses import replace
from datetime import timedelta
from multiprocessing.process import BaseProcess
from typing import Any

from syncpass.backends.torch.tensor_form import expected_of, written_form
from syncpass.core.errors import SyncpassError
from syncpass.runtime.contracts import (
    ParamCheck,
    TensorRankDone,
    TensorRunRequest,
    TensorRunResult,
    WorkerDone,
    WorkerFailed,
)
from syncpass.runtime.tensor_report import DEFAULT_ATOL, DEFAULT_RTOL


def _entry(request: TensorRunRequest, rank: int, messages: Any) -> None:
    from syncpass.backends.torch.worker import _crash

    try:
        for done in _rank(request, rank):
            messages.put(done)
        message: WorkerDone | WorkerFailed = WorkerDone(rank)
    except SyncpassError as error:
        message = WorkerFailed(rank, error.message, error.location, user_error=True)
    except BaseException as error:
        message = _crash(rank, error)
    messages.put(message)
    messages.close()
    messages.join_thread()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _check(name: str, got: Any, want: Any, rtol: float, atol: float, note: str = "") -> ParamCheck:
    import torch

    if got is None or want is None:
        ok = got is None and want is None
        return ParamCheck(name, 0, 0, 0.0 if ok else float("inf"), 0.0, ok, rtol, atol, note)
    diff = (got - want).abs()
    rel = diff / want.abs().clamp_min(1e-12)
    ok = bool(torch.all(diff <= atol + rtol * want.abs()))
    return ParamCheck(
        name, 0, want.numel(), float(diff.max()), float(rel.max()), ok, rtol, atol, note
    )


#: DTensor's collectives (``CommDebugMode``'s names) by the plan's kinds.
_FUNCTIONAL_KINDS = {
    "all_reduce": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
}


def _counted(mode: Any, direction: str) -> dict[str, int]:
    """A ``CommDebugMode``'s collectives as ``"direction kind"`` counts."""
    found: dict[str, int] = {}
    for op, count in mode.get_comm_counts().items():
        name = str(op).rsplit(".", 1)[-1]
        key = f"{direction} {_FUNCTIONAL_KINDS.get(name, name)}"
        found[key] = found.get(key, 0) + int(count)
    return found


def _rank(request: TensorRunRequest, rank: int) -> tuple[TensorRankDone, ...]:
    """This rank's figures for the file and for each of ``request.alongside``: each checked
    (and verified) in one step of its own, then their timed steps taken in turn."""
    import torch

    from syncpass.backends.torch.rendezvous import join_local_group

    torch.set_num_threads(request.threads)
    join_local_group("gloo", request.port, rank, request.tp, timedelta(seconds=request.timeout_s))
    checked = [_checked(request, rank)]
    checked += [_checked(request.alongside_request(file), rank) for file in request.alongside]
    if not request.steps:
        return tuple(done for done, _, _ in checked)
    runs = [(model, example) for _, model, example in checked]
    times, probes = _steps_in_turn(runs, request.steps, request.tp, request.threads)
    return tuple(
        replace(done, step_s=step_s, timed_steps=request.steps, speed_probes_s=probes)
        for (done, _, _), step_s in zip(checked, times, strict=True)
    )


def _checked(request: TensorRunRequest, rank: int) -> tuple[TensorRankDone, Any, Any]:
    """The file of ``request`` split on this rank, one training step counted (and with
    ``verify`` checked against the unsplit model): the figures, the model and the example."""
    import torch

    from syncpass.backends.torch import tensor_parallel as tp
    from syncpass.backends.torch.example import load_example

    form = written_form(request.file)
    example = load_example(request.example)
    model = example.model
    reference = copy.deepcopy(model) if request.verify else None
    if form.styles is not None:
        loss, step_s, counts = _dtensor_step(model, example, form.styles, request.tp)
        split: dict[str, tuple[str, int, tp.Chunks]] = {}
    else:
        assert form.layouts is not None
        split = tp.split_parameters(form.layouts, model)
        tp.shard_module(model, form.layouts, rank, request.tp)
        tp.reset_collective_counts()
        start = time.perf_counter()
        loss = example.loss_fn(model(*example.args), example.target)
        loss.backward()  # type: ignore[no-untyped-call]
        step_s = time.perf_counter() - start
        counts = tp.collective_counts()
    checks: list[ParamCheck] = []
    reference_loss = None
    if reference is not None:
        rtol = DEFAULT_RTOL if request.rtol is None else request.rtol
        atol = DEFAULT_ATOL if request.atol is None else request.atol
        with tp.running_alone():
            whole = example.loss_fn(reference(*example.args), example.target)
            whole.backward()  # type: ignore[no-untyped-call]
        reference_loss = float(whole.detach())
        local = dict(model.named_parameters())
        for name, parameter in reference.named_parameters():
            # A row-split layer's bias is on rank 0 only (the eager form's shard_module).
            grad = local[name].grad if name in local else None
            if form.styles is not None and _is_split(local[name]):
                gathered = _local(grad)  # every rank gathers, rank 0 compares
                if rank == 0:
                    checks.append(
                        _check(name, gathered, parameter.grad, rtol, atol, "DTensor, gathered")
                    )
            elif form.styles is not None:
                checks.append(_check(name, _local(grad), parameter.grad, rtol, atol))
            elif name in split:
                kind, dim, chunks = split[name]
                if dim < 0:  # a row-split layer's bias: rank 0's
                    if rank == 0:
                        checks.append(_check(name, grad, parameter.grad, rtol, atol, "rank 0"))
                    continue
                gathered = tp.gather_parameter_grad(
                    grad if grad is not None else torch.zeros_like(local[name]),
                    dim,
                    chunks,
                    request.tp,
                )
                if rank == 0:
                    checks.append(
                        _check(name, gathered, parameter.grad, rtol, atol, f"{kind}, gathered")
                    )
            else:
                checks.append(_check(name, grad, parameter.grad, rtol, atol))
    if form.styles is not None:
        held = sum(_is_split(parameter) for parameter in model.parameters())
    else:
        held = sum(1 for _, dim, _ in split.values() if dim >= 0)
    done = TensorRankDone(
        rank,
        float(loss.detach()),
        reference_loss,
        step_s,
        tuple(sorted(counts.items())),
        tuple(replace(check, stage=rank) for check in checks),
        held,
        0,
        request.file,
    )
    return done, model, example


def _steps_in_turn(
    runs: list[tuple[Any, Any]], steps: int, world: int, threads: int
) -> tuple[list[float], tuple[float, ...]]:
    """The median time of ``steps`` training steps (forward, loss, backward) of each
    ``(model, example)``, their steps taken in turn (the order rotated each round, each
    step started together on every rank), gradients cleared before each: the machine's
    load then falls on every split alike. After each round the ranks time the speed probe
    outside the steps (:meth:`SpeedProbe.on_ranks`): its times on this rank come second."""
    import statistics

    import torch.distributed as dist

    from syncpass.backends.torch.speed import SpeedProbe

    probe = SpeedProbe()
    probes: list[float] = []
    times: list[list[float]] = [[] for _ in runs]
    for round_index in range(steps):
        shift = round_index % len(runs)
        for place in [*range(shift, len(runs)), *range(shift)]:
            model, example = runs[place]
            model.zero_grad(set_to_none=True)
            dist.barrier()
            start = time.perf_counter()
            loss = example.loss_fn(model(*example.args), example.target)
            loss.backward()
            times[place].append(time.perf_counter() - start)
        probes += probe.on_ranks(world, threads)
    return [statistics.median(found) for found in times], tuple(probes)


def _dtensor_step(
    model: Any, example: Any, styles: dict[str, Any], world: int
) -> tuple[Any, float, dict[str, int]]:
    """``model`` parallelised with ``styles`` over a 1-D CPU mesh of the ranks, then one
    training step; the loss, the step's time and its collectives (``CommDebugMode``,
    forward and backward counted apart)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, styles)
    start = time.perf_counter()
    with warnings.catch_warnings():
        # CommDebugMode's module tracker hooks every module's backward, which warns for
        # modules whose inputs need no gradient (the embedding's indices) and for those
        # that return other than tensors (Hugging Face's output dataclasses).
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        with CommDebugMode() as forward:  # type: ignore[no-untyped-call]
            loss = example.loss_fn(model(*example.args), example.target)
        with CommDebugMode() as backward:  # type: ignore[no-untyped-call]
            loss.backward()
    step_s = time.perf_counter() - start
    counts = _counted(forward, "forward")
    for key, count in _counted(backward, "backward").items():
        counts[key] = counts.get(key, 0) + count
    return _local(loss), step_s, counts


def _is_split(parameter: Any) -> bool:
    """Whether ``parameter`` is a DTensor sharded over the mesh (not replicated)."""
    from torch.distributed.tensor import DTensor

    return isinstance(parameter, DTensor) and any(p.is_shard() for p in parameter.placements)


def _local(tensor: Any) -> Any:
    """A DTensor's whole value (a replicated one's local copy); other values as they are."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def launch_tensor(request: TensorRunRequest) -> TensorRunResult:
    """Run ``request`` on ``request.tp`` local gloo processes; every rank's figures."""
    from syncpass.backends.torch.run import reserved_port, run_local, wait_for_reports
    from syncpass.runtime.guard import call_guarded
    from syncpass.runtime.processes import preloading_imports_of

    if request.tp < 1:
        raise SyncpassError(f"--tp must be at least 1, got {request.tp}")
    ranks: dict[tuple[str, int], TensorRankDone] = {}
    files = (request.file, *request.alongside)
    # The fork server imports the model's own imports once for every rank, and the port is
    # held from its choice to rank 0's bind, as for a pipeline run (run.launch).
    with contextlib.ExitStack() as held:
        held.enter_context(preloading_imports_of(request.file))
        expected = [
            call_guarded(expected_of, file, what="the rewritten file", timeout_s=request.timeout_s)
            for file in files
        ]
        if request.port == 0:
            request = replace(request, port=held.enter_context(reserved_port()))

        def collect(processes: list[BaseProcess], messages: Any) -> None:
            def other(message: Any) -> None:
                if isinstance(message, TensorRankDone):
                    ranks[message.file, message.rank] = message

            wait_for_reports(processes, messages, request.timeout_s, other)

        run_local(_entry, request, request.tp, "syncpass-tp", collect)
    if len(ranks) != request.tp * len(files):  # pragma: no cover - a rank reports before done
        raise SyncpassError(f"{request.tp * len(files) - len(ranks)} report(s) missing")
    results = []
    for file, (counts, layouts, style) in zip(files, expected, strict=True):
        done = tuple(ranks[file, rank] for rank in range(request.tp))
        parameters = len({check.name for rank in done for check in rank.checks})
        results.append(
            TensorRunResult(
                request if file == request.file else request.alongside_request(file),
                done,
                tuple(sorted((str(k), int(v)) for k, v in counts.items())),
                parameters,
                layouts=tuple(layouts.items()),
                style=style,
            )
        )
    return replace(results[0], alongside=tuple(results[1:]))

"""``syncpass calibrate``: measure the link and the device, and write a hardware profile.

``syncpass calibrate --backend gloo --procs 2 -o PROFILE.toml`` starts ``--procs``
local processes joined in one process group (gloo on the CPU, or NCCL with one
GPU per process) and measures, in this order:

- **send/recv** between rank 0 and rank 1 as a ping-pong: rank 0 sends a
  message, rank 1 receives it and sends it back. The one-way time is half the
  round trip, the median of ``--repeats`` round trips after ``--warmup`` ones.
  Timing a round trip on one clock needs no clock agreement between processes.
- **all-reduce** (sum of a float32 tensor) over every process, for the same
  sizes. Each repetition starts behind a barrier; the ranks leave the barrier
  at slightly different moments, and every rank but the last one to arrive
  also times its wait for that one, so a repetition's time is the least of the
  ranks' times (the collective itself), and the figure is the median of those.
- **meeting posts** (gloo only): with gloo, a rank that posts its transfers to a
  neighbour as the neighbour posts its own can block for milliseconds. Ranks 0 and 1
  repeat: compute for :data:`MEET_COMPUTE_S` (rank 1 that long plus an offset), then
  exchange one small tensor, a send and a receive in one batch as torch's schedules post
  them. Each offset of :data:`MEET_OFFSETS_S` is timed :data:`MEET_REPEATS` times in a
  block, the offsets taking turns over :data:`MEET_ROUNDS` rounds; a block's figure is
  rank 0's mean repetition less the compute and the offset, and an offset's the median
  of its blocks. Less the figure at :data:`MEET_BASELINE_S` (posts that do not meet),
  that is the stall curve: ``meet_stall_s`` is its height at offset 0 and
  ``meet_window_s`` its area over that height, the half-width of a triangle with the
  same height and area (:func:`meeting_figures`). NCCL posts do not stall so: both 0.
- **matmul FLOP/s**: every process at once multiplies float32 square matrices
  sized so that one measurement takes about 0.2 s, with ``--threads`` threads
  per process; each process reports the median of a few measurements and the
  profile takes the median over the processes.

The send/recv times are fitted with ``t = alpha + bytes / beta`` (see
:func:`fit_link`) and written as a hardware profile in the format of
:func:`syncpass.contracts.hardware.load_profile`, for ``syncpass plan --hardware PROFILE.toml``.

:mod:`syncpass.commands.calibrate` is the command shell. Bad input and failed
processes raise :class:`~syncpass.core.errors.SyncpassError`, which the caller
prints and turns into status 2. The processes come from the
launcher of ``syncpass run`` (:mod:`syncpass.backends.torch.run`). Importing this
module does not import torch; the handler and the processes do.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import socket
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

import numpy as np

from syncpass.backends.torch.run import (
    reserved_port,
    run_local,
    wait_for_reports,
)
from syncpass.contracts.costs import Hardware
from syncpass.contracts.hardware import cpu_devices
from syncpass.core.errors import SyncpassError
from syncpass.core.units import num_bytes, seconds
from syncpass.runtime.contracts import WorkerDone, WorkerFailed

if TYPE_CHECKING:
    import torch

BACKENDS = ("gloo", "nccl")
#: Message sizes by default: 4 B to 64 MiB in powers of 4.
DEFAULT_SIZES = tuple(4**k for k in range(1, 14))
DEFAULT_REPEATS = 20
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 120.0
#: Every message is a float32 tensor (all-reduce sums numbers), so sizes are whole float32s.
ELEMENT_BYTES = 4
#: One matmul measurement takes about this long (a few of them, after a warm-up one).
MATMUL_TARGET_S = 0.2
MATMUL_REPEATS = 5
#: The largest matmul side: 3 float32 matrices of 8192 x 8192 are 768 MiB per process.
MATMUL_MAX_N = 8192
#: The pipeline whose runtime overhead is timed: a linear layer per process, small
#: enough that the layer's own time is a fraction of the runtime's.
OVERHEAD_WIDTH = 64
OVERHEAD_ROWS = 4
OVERHEAD_MICROBATCHES = 8
OVERHEAD_STEPS = 10
#: torch's helper that posts one action's sends and receives (its wait is separate).
_POST_HELPER = "_batch_p2p"
#: The meeting posts' scan (module doc): the compute before each exchange (a pipeline
#: action's order of size), rank 1's offsets, the baseline offset, where posts no longer
#: meet, and the repetitions of a block and the rounds of blocks.
MEET_COMPUTE_S = 2e-3
MEET_OFFSETS_S = (0.0, 2.5e-5, 5e-5, 1e-4, 2e-4, 4e-4)
MEET_BASELINE_S = 1e-3
MEET_REPEATS = 30
MEET_ROUNDS = 5
#: A stall curve lower than this at offset 0 is noise: no stall.
MEET_NOISE_S = 5e-5


@dataclass(frozen=True)
class CalibrateRequest:
    """One ``syncpass calibrate``: which processes to start and what to time.

    ``sizes`` are message sizes in bytes, ascending, each a whole number of
    float32 elements. ``port`` 0 picks a free localhost port when launching.
    """

    backend: str = "gloo"
    procs: int = 2
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = DEFAULT_REPEATS
    warmup: int = DEFAULT_WARMUP
    threads: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    port: int = 0


@dataclass(frozen=True)
class SizeTimes:
    """The median times of one message size: one-way send/recv and all-reduce."""

    size_bytes: int
    send_recv_s: float
    all_reduce_s: float


@dataclass(frozen=True)
class MatmulRate:
    """What one process's matmul achieved: ``repeat`` products of ``n x n`` per measurement."""

    rank: int
    n: int
    repeat: int
    flops_per_s: float


@dataclass(frozen=True)
class Measurements:
    """Everything the processes measured, as rank 0 gathered it.

    ``device_memory_bytes`` is the least GPU memory of the processes with NCCL,
    ``None`` on the CPU (host memory is shared, and no limit is assumed). ``devices``
    is how many stages the machine runs at once: its GPUs with NCCL, its cores divided
    by ``--threads`` on the CPU.
    """

    request: CalibrateRequest
    device: str
    host: str
    torch_version: str
    times: tuple[SizeTimes, ...]
    matmul: tuple[MatmulRate, ...]
    device_memory_bytes: int | None = None
    stage_overhead_s: float = 0.0  # the pipeline runtime's own time per micro-batch action
    devices: int | None = None  # stages that can run at once: GPUs, or cores / threads
    meet_stall_s: float = 0.0  # the expected stall of two ranks' posts that meet
    meet_window_s: float = 0.0  # how far apart two posts may be and still stall

    @property
    def flops_per_s(self) -> float:
        """The median over the processes of each one's median matmul FLOP/s."""
        return statistics.median(rate.flops_per_s for rate in self.matmul)


@dataclass(frozen=True)
class LinkFit:
    """``t = alpha_s + bytes / beta_bytes_per_s`` fitted to one-way times.

    ``alpha_clamped``: the best unconstrained intercept was negative (the small
    messages were faster than a straight line through the large ones allows),
    so the fit was redone with ``alpha_s = 0``.
    """

    alpha_s: float
    beta_bytes_per_s: float
    alpha_clamped: bool = False

    def predict_s(self, size_bytes: float) -> float:
        """The fitted one-way time of a message of ``size_bytes``."""
        return self.alpha_s + size_bytes / self.beta_bytes_per_s


def fit_link(sizes: Sequence[float], times_s: Sequence[float]) -> LinkFit:
    """Least-squares fit of ``t = alpha + bytes / beta`` that weighs every size alike.

    The residuals are relative: the fit minimises ``sum((fitted_i - t_i) / t_i) ** 2``,
    i.e. weighted least squares with weights ``1 / t_i ** 2``. Plain least squares
    on the times is ruled by the largest messages (a 64 MiB message takes ten
    thousand times as long as a 4 B one), leaves ``alpha`` to the noise of a
    handful of huge residuals and can even make it negative; with relative
    residuals a 20% miss costs the same at 4 B as at 64 MiB, so the latency is
    fitted to the small messages and the bandwidth to the large ones.

    The problem is linear in ``(alpha, 1 / beta)``: each row ``(1 / t_i,
    bytes_i / t_i)`` should give 1. It is solved by ``numpy.linalg.lstsq`` on
    columns scaled to unit length (their raw scales differ by orders of
    magnitude). Exact data ``t_i = alpha + bytes_i / beta`` gives back alpha and
    beta to rounding. A negative intercept is refitted as ``alpha = 0``; times
    that do not grow with the size have no bandwidth to fit, an error.
    """
    if len(sizes) != len(times_s):
        raise ValueError("one time per size")
    if len(set(sizes)) < 2:
        raise SyncpassError(
            "fitting latency and bandwidth needs at least two different message sizes (--sizes)"
        )
    for size, time_s in zip(sizes, times_s, strict=True):
        if not (math.isfinite(time_s) and time_s > 0) or not size > 0:
            raise SyncpassError(f"cannot fit a time of {time_s!r} s for {size!r} bytes")
    size_array = np.asarray(sizes, dtype=np.float64)
    time_array = np.asarray(times_s, dtype=np.float64)
    rows = np.column_stack([1.0 / time_array, size_array / time_array])
    norms = np.linalg.norm(rows, axis=0)
    scaled, *_ = np.linalg.lstsq(rows / norms, np.ones_like(time_array), rcond=None)
    alpha, inverse_beta = (float(value) for value in scaled / norms)
    clamped = False
    if alpha < 0:
        # With alpha = 0 the one remaining column has a closed-form least-squares slope.
        # An intercept of rounding size (exact data with no latency) is no clamp worth a word.
        clamped = alpha < -1e-9 * float(time_array.min())
        column = rows[:, 1]
        alpha, inverse_beta = 0.0, float(column.sum() / (column @ column))
    if not inverse_beta > 0:
        raise SyncpassError(
            "the measured times do not grow with the message size, so there is no bandwidth "
            "to fit; include larger messages (--sizes up to a few MiB at least)"
        )
    return LinkFit(alpha, 1.0 / inverse_beta, clamped)


def relative_error(fitted: float, measured: float) -> float:
    """``(fitted - measured) / measured``: how far the fit is off, signed."""
    return (fitted - measured) / measured


def parse_sizes(text: str) -> tuple[int, ...]:
    """``--sizes``: comma-separated byte counts, each a whole number of float32s; sorted, unique."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SyncpassError(
            f"--sizes takes whole numbers of bytes separated by commas, got {text!r}"
        ) from None
    bad = [size for size in sizes if size < ELEMENT_BYTES or size % ELEMENT_BYTES]
    if bad:
        raise SyncpassError(
            f"--sizes: {', '.join(map(str, bad))} is not a positive multiple of {ELEMENT_BYTES} "
            f"bytes (messages are float32 tensors, {ELEMENT_BYTES} bytes per element)"
        )
    unique = tuple(sorted(set(sizes)))
    if len(unique) < 2:
        raise SyncpassError(
            "--sizes needs at least two different sizes to fit latency and bandwidth"
        )
    return unique


def check_gpus(procs: int) -> None:
    """NCCL needs a GPU of its own per process; say so before starting any."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < procs:
        raise SyncpassError(
            f"--backend nccl needs a GPU per process: {procs} process(es), {gpus} GPU(s) "
            "visible; use --backend gloo to calibrate processes on the CPU"
        )
    if not dist.is_nccl_available():
        raise SyncpassError("--backend nccl: this torch build has no NCCL; use --backend gloo")


def measure(request: CalibrateRequest) -> Measurements:
    """Run ``request`` on ``request.procs`` local processes and return what they measured.

    Raises SyncpassError when a process fails (bad input, a crash, a process
    that died) or when ``request.timeout_s`` passes; every process is stopped first.
    """
    with contextlib.ExitStack() as held:
        if request.port == 0:
            request = replace(request, port=held.enter_context(reserved_port()))
        ready = request
        return run_local(
            _worker_entry,
            ready,
            ready.procs,
            "syncpass-calibrate",
            lambda processes, messages: _collect(ready, processes, messages),
        )


def _collect(
    request: CalibrateRequest, processes: list[BaseProcess], messages: Any
) -> Measurements:
    """Wait for every process's report; rank 0 sends the measurements before its own."""
    gathered: list[Measurements] = []
    wait_for_reports(processes, messages, request.timeout_s, gathered.append)
    if not gathered:
        raise SyncpassError("rank 0 finished without the gathered measurements")
    return gathered[0]


def _worker_entry(request: CalibrateRequest, rank: int, messages: Any) -> None:
    """One process: measure, then report a WorkerDone or a WorkerFailed; never raises."""
    # Imported here, in the process: both import torch.
    import torch.distributed as dist

    from syncpass.backends.torch.worker import _crash

    message: WorkerDone | WorkerFailed
    try:
        result = _measure(request, rank)
        if result is not None:
            messages.put(result)
        message = WorkerDone(rank)
    except SyncpassError as error:
        message = WorkerFailed(rank, error.message, error.location, user_error=True)
    except BaseException as error:
        message = _crash(rank, error)
    # Report first, and wait until the report is in the pipe: tearing the group down
    # closes the connections, and the peers' "connection closed" must not overtake it.
    messages.put(message)
    messages.close()
    messages.join_thread()
    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# --- measuring (in the processes) -------------------------------------------------------------


def _measure(request: CalibrateRequest, rank: int) -> Measurements | None:
    """This rank's part of the calibration; rank 0 returns everything, the others None."""
    import torch
    import torch.distributed as dist

    from syncpass.backends.torch.rendezvous import join_local_group

    torch.set_num_threads(request.threads)
    if request.backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < request.procs:
            raise SyncpassError(
                f"--backend nccl needs a GPU per process: {request.procs} process(es), "
                f"{gpus} GPU(s) visible"
            )
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    join_local_group(
        request.backend,
        request.port,
        rank,
        request.procs,
        timedelta(seconds=request.timeout_s),
        device,
    )

    def sync() -> None:
        # CUDA work is queued: a time is only taken once the device has finished it.
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    send_recv = _ping_pong(request, rank, device, sync)
    all_reduce = _all_reduce(request, device, sync)
    dist.barrier()
    matmul = _matmul_rate(rank, device, sync)
    dist.barrier()
    overhead = _stage_overhead(request, rank, device, sync)
    dist.barrier()
    meeting = (
        _meeting_scan(request, rank) if request.backend == "gloo" and request.procs >= 2 else {}
    )
    memory = (
        torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    )
    gathered: list[Any] | None = [None] * request.procs if rank == 0 else None
    dist.gather_object((all_reduce, matmul, memory, overhead), gathered, dst=0)
    if gathered is None:
        return None
    # Per repetition the rank that entered last timed only the collective (see the module doc).
    reduce_medians = [
        statistics.median(min(samples) for samples in zip(*per_rank, strict=True))
        for per_rank in zip(*(entry[0] for entry in gathered), strict=True)
    ]
    memories = [entry[2] for entry in gathered if entry[2] is not None]
    stall, window = meeting_figures(meeting) if meeting else (0.0, 0.0)
    return Measurements(
        request=request,
        device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        host=socket.gethostname(),
        torch_version=str(torch.__version__),
        times=tuple(
            SizeTimes(size, one_way, reduce)
            for size, one_way, reduce in zip(request.sizes, send_recv, reduce_medians, strict=True)
        ),
        matmul=tuple(entry[1] for entry in gathered),
        device_memory_bytes=min(memories) if memories else None,
        stage_overhead_s=statistics.median(entry[3] for entry in gathered),
        meet_stall_s=stall,
        meet_window_s=window,
        devices=torch.cuda.device_count()
        if device.type == "cuda"
        else cpu_devices(request.threads),
    )


def _ping_pong(
    request: CalibrateRequest, rank: int, device: torch.device, sync: Callable[[], None]
) -> list[float]:
    """Median one-way send/recv time per size on rank 0 (round trip / 2); empty elsewhere.

    The sizes take turns, one round trip each per pass, rather than all repetitions of
    one size in a row: a burst of other load on the machine then spoils one sample of
    many sizes, which the medians absorb, not every sample of one size.
    """
    import torch
    import torch.distributed as dist

    messages = [
        torch.ones(size // ELEMENT_BYTES, dtype=torch.float32, device=device)
        for size in request.sizes
    ]
    samples: list[list[float]] = [[] for _ in request.sizes]
    dist.barrier()
    for index in range(request.warmup + request.repeats):
        for message, size_samples in zip(messages, samples, strict=True):
            if rank == 0:
                start = time.perf_counter()
                dist.send(message, dst=1)
                dist.recv(message, src=1)
                sync()
                if index >= request.warmup:
                    size_samples.append((time.perf_counter() - start) / 2)
            elif rank == 1:
                dist.recv(message, src=0)
                dist.send(message, dst=0)
    return [statistics.median(size_samples) for size_samples in samples] if rank == 0 else []


def _all_reduce(
    request: CalibrateRequest, device: torch.device, sync: Callable[[], None]
) -> list[list[float]]:
    """This rank's all-reduce times per size (timed repetitions only), sizes taking turns."""
    import torch
    import torch.distributed as dist

    tensors = [
        torch.ones(size // ELEMENT_BYTES, dtype=torch.float32, device=device)
        for size in request.sizes
    ]
    samples: list[list[float]] = [[] for _ in request.sizes]
    for index in range(request.warmup + request.repeats):
        for tensor, size_samples in zip(tensors, samples, strict=True):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            sync()
            if index >= request.warmup:
                size_samples.append(time.perf_counter() - start)
    return samples


def _stage_overhead(
    request: CalibrateRequest, rank: int, device: torch.device, sync: Callable[[], None]
) -> float:
    """This rank's pipeline runtime time per micro-batch forward or backward.

    Every process holds one stage of a real ``torch.distributed.pipelining``
    pipeline of small linear layers run under 1F1B; the time inside the
    stage's forward and backward calls and in the schedule's posting of each
    action's sends and receives, less what the same layer takes for the same
    micro-batches run directly, spread over the actions, is what the runtime
    adds to each (input checks, autograd bookkeeping, posting the transfers;
    the wait for a transfer to arrive is the link's, not counted here). Median
    over the timed steps.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, schedules

    # 1F1B needs at least as many micro-batches as stages.
    width, rows = OVERHEAD_WIDTH, OVERHEAD_ROWS
    microbatches = max(OVERHEAD_MICROBATCHES, request.procs)
    layer = torch.nn.Linear(width, width).to(device)
    stage = PipelineStage(layer, rank, request.procs, device)
    inside = [0.0]

    def timed(call: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                sync()
                inside[0] += time.perf_counter() - start

        return run

    stage.forward_one_chunk = timed(stage.forward_one_chunk)  # type: ignore[method-assign]
    stage.backward_one_chunk = timed(stage.backward_one_chunk)  # type: ignore[method-assign]
    # The schedule posts each action's isend/irecv through this module-level helper.
    posting = getattr(schedules, _POST_HELPER, None)
    if posting is not None:
        setattr(schedules, _POST_HELPER, timed(posting))

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output - target) ** 2).mean()

    schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=loss)
    batch = torch.randn(microbatches * rows, width, device=device)
    target = torch.randn(microbatches * rows, width, device=device)
    chunk = batch[:rows].clone().requires_grad_()

    def direct() -> float:
        start = time.perf_counter()
        for _ in range(microbatches):
            layer(chunk).sum().backward()
        sync()
        return time.perf_counter() - start

    samples = []
    for index in range(request.warmup + OVERHEAD_STEPS):
        dist.barrier()
        inside[0] = 0.0
        if rank == 0:
            schedule.step(batch)
        elif rank == request.procs - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        if index >= request.warmup:
            samples.append(max(0.0, inside[0] - direct()) / (2 * microbatches))
    if posting is not None:
        setattr(schedules, _POST_HELPER, posting)
    return statistics.median(samples)


def _meeting_scan(request: CalibrateRequest, rank: int) -> dict[float, float]:
    """Rank 0's figure per offset of the meeting posts' scan (module doc); empty elsewhere.
    Ranks above 1 only wait at the barriers."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank > 1:
        dist.barrier()
        return {}
    work = torch.randn(64, 64)
    outgoing, incoming = torch.ones(64), torch.zeros(64)
    peer = 1 - rank

    def repetition(offset_s: float) -> None:
        until = time.perf_counter() + MEET_COMPUTE_S + (offset_s if rank == 1 else 0.0)
        while time.perf_counter() < until:
            work @ work
        ops = [dist.P2POp(dist.isend, outgoing, peer), dist.P2POp(dist.irecv, incoming, peer)]
        for posted in dist.batch_isend_irecv(ops):
            posted.wait()

    offsets = (*MEET_OFFSETS_S, MEET_BASELINE_S)
    blocks: dict[float, list[float]] = {offset: [] for offset in offsets}
    for _ in range(request.warmup):
        repetition(MEET_BASELINE_S)
    for _ in range(MEET_ROUNDS):
        for offset in offsets:
            repetition(offset)  # the exchange lines the two ranks up
            start = time.perf_counter()
            for _ in range(MEET_REPEATS):
                repetition(offset)
            mean = (time.perf_counter() - start) / MEET_REPEATS
            blocks[offset].append(mean - MEET_COMPUTE_S - offset)
    dist.barrier()
    return (
        {offset: statistics.median(times) for offset, times in blocks.items()} if rank == 0 else {}
    )


def meeting_figures(scan: Mapping[float, float]) -> tuple[float, float]:
    """``(meet_stall_s, meet_window_s)`` from the meeting posts' scan (module doc): each
    offset's extra time of a repetition, the largest offset the baseline. The stall curve
    is each figure less the baseline's, at least 0 and, as posts further apart cannot
    stall longer, at most the figure of the offset before (a noisy sample does not widen
    it); past the last offset it is taken as 0. The stall is its height at offset 0, the
    window its area (both signs of the offset, the trapezoid rule) over the height, so at
    most twice the last offset. A height under :data:`MEET_NOISE_S` is no stall: ``(0, 0)``.
    """
    offsets = sorted(scan)
    baseline = scan[offsets[-1]]
    curve: list[tuple[float, float]] = []
    for offset in offsets[:-1]:
        extra = max(0.0, scan[offset] - baseline)
        curve.append((offset, min(extra, curve[-1][1]) if curve else extra))
    height = curve[0][1] if curve and curve[0][0] == 0 else 0.0
    if height < MEET_NOISE_S:
        return 0.0, 0.0
    area = 2 * sum(
        (right - left) * (low + high) / 2
        for (left, low), (right, high) in itertools.pairwise(curve)
    )
    return height, area / height


def _matmul_rate(rank: int, device: torch.device, sync: Callable[[], None]) -> MatmulRate:
    """This process's float32 matmul FLOP/s: median of a few ~0.2 s measurements."""
    import torch

    def timed(n: int, repeat: int) -> float:
        left = torch.rand(n, n, dtype=torch.float32, device=device)
        right = torch.rand(n, n, dtype=torch.float32, device=device)
        product = torch.empty(n, n, dtype=torch.float32, device=device)
        torch.matmul(left, right, out=product)  # first touch of the memory, kernel choice
        sync()
        start = time.perf_counter()
        for _ in range(repeat):
            torch.matmul(left, right, out=product)
        sync()
        return time.perf_counter() - start

    # Grow a probe until it is long enough to time, then scale the side by the cube root
    # of what is missing: the work of a matmul grows as n ** 3.
    n = 256
    elapsed = timed(n, 1)
    while elapsed < 0.01 and n < MATMUL_MAX_N:
        n *= 2
        elapsed = timed(n, 1)
    side = (MATMUL_TARGET_S / elapsed) ** (1 / 3) * n
    best = max(64, min(MATMUL_MAX_N, 64 * round(side / 64)))
    expected = elapsed * (best / n) ** 3
    # A fast device may finish even the largest matmul quickly: repeat it within a measurement.
    repeat = max(1, round(MATMUL_TARGET_S / expected))
    samples = [timed(best, repeat) for _ in range(MATMUL_REPEATS)]
    return MatmulRate(rank, best, repeat, 2 * best**3 * repeat / statistics.median(samples))


# --- report and profile ---------------------------------------------------------------------


def render_calibration(measurements: Measurements, fit: LinkFit) -> str:
    """The table of measured and fitted times, the fit, and the matmul rate."""
    request = measurements.request
    lines = [
        f"syncpass calibrate: {request.procs} processes on {measurements.host}, "
        f"{request.backend} on {measurements.device}; median of {request.repeats} after "
        f"{request.warmup} warm-up",
        "",
    ]
    header = (
        "size",
        "send/recv one-way",
        "fitted",
        "error",
        f"all-reduce ({request.procs} procs)",
    )
    rows = [
        (
            num_bytes(entry.size_bytes),
            seconds(entry.send_recv_s),
            seconds(fit.predict_s(entry.size_bytes)),
            f"{100 * relative_error(fit.predict_s(entry.size_bytes), entry.send_recv_s):+.1f}%",
            seconds(entry.all_reduce_s),
        )
        for entry in measurements.times
    ]
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    for row in (header, *rows):
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    errors = [
        abs(relative_error(fit.predict_s(entry.size_bytes), entry.send_recv_s))
        for entry in measurements.times
    ]
    clamped = " (clamped: the best intercept was negative)" if fit.alpha_clamped else ""
    lines += [
        "",
        f"fit t = alpha + bytes / beta (least squares on relative error): alpha "
        f"{seconds(fit.alpha_s)}{clamped}, beta {_rate(fit.beta_bytes_per_s, 'B/s')}; "
        f"|error| max {100 * max(errors):.1f}%, median {100 * statistics.median(errors):.1f}%",
        _describe_matmul(measurements),
        f"pipeline runtime overhead per micro-batch forward or backward (1F1B, "
        f"{OVERHEAD_MICROBATCHES} micro-batches): {seconds(measurements.stage_overhead_s)}",
        (
            f"posts of two ranks that meet (an exchange after {seconds(MEET_COMPUTE_S)} of "
            f"compute): stall {seconds(measurements.meet_stall_s)} at the same moment, "
            f"window {seconds(measurements.meet_window_s)}"
            + ("" if measurements.meet_stall_s else " (no stall)")
            if request.backend == "gloo" and request.procs >= 2
            else "posts of two ranks that meet: not measured (NCCL's do not stall)"
        ),
    ]
    return "\n".join(lines) + "\n"


def _describe_matmul(measurements: Measurements) -> str:
    rates = ", ".join(_rate(rate.flops_per_s, "FLOP/s") for rate in measurements.matmul)
    first = measurements.matmul[0]
    times = f" x{first.repeat}" if first.repeat > 1 else ""
    return (
        f"matmul float32 {first.n}x{first.n}{times}, {measurements.request.threads} thread(s) "
        f"per process: {_rate(measurements.flops_per_s, 'FLOP/s')} (median of the processes: "
        f"{rates})"
    )


def _rate(value: float, unit: str) -> str:
    """``1.5e9, "B/s"`` -> ``"1.5 GB/s"`` (decimal prefixes, as bandwidths are quoted)."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def profile_toml(measurements: Measurements, fit: LinkFit, when: datetime) -> str:
    """The hardware profile (see :func:`syncpass.contracts.hardware.load_profile`) of a calibration.

    ``source`` says what was measured, when, on how many processes and over which
    backend; comment lines keep the measured table, which no field holds.
    """
    request = measurements.request
    collective = collective_fit(measurements)
    hardware = Hardware(
        alpha_s=_round(fit.alpha_s),
        beta_bytes_per_s=_round(fit.beta_bytes_per_s),
        device_memory_bytes=measurements.device_memory_bytes,
        name=f"{request.procs} local processes over {request.backend} on {measurements.host} "
        "(calibrated)",
        flops_per_s=_round(measurements.flops_per_s),
        stage_overhead_s=_round(measurements.stage_overhead_s),
        devices=measurements.devices,
        meet_stall_s=_round(measurements.meet_stall_s),
        meet_window_s=_round(measurements.meet_window_s),
        collective_alpha_s=None if collective is None else _round(collective.alpha_s),
        collective_beta_bytes_per_s=None
        if collective is None
        else _round(collective.beta_bytes_per_s),
    )
    first, last = measurements.times[0].size_bytes, measurements.times[-1].size_bytes
    errors = [
        abs(relative_error(fit.predict_s(entry.size_bytes), entry.send_recv_s))
        for entry in measurements.times
    ]
    matmul = measurements.matmul[0]
    source = (
        f"syncpass calibrate, {when:%Y-%m-%d %H:%M} UTC, torch {measurements.torch_version}: "
        f"{request.procs} local processes on {measurements.host}, backend {request.backend} on "
        f"{measurements.device}; alpha_s and beta_bytes_per_s fitted (least squares on relative "
        f"error, max {100 * max(errors):.1f}%) to send/recv ping-pong between rank 0 and rank 1 "
        f"(one-way = round trip / 2, median of {request.repeats} after {request.warmup} "
        f"warm-up) at {len(measurements.times)} sizes from {num_bytes(first)} to "
        f"{num_bytes(last)}; flops_per_s: float32 matmul {matmul.n}x{matmul.n}, "
        f"{request.threads} thread(s) per process, median of {MATMUL_REPEATS}, median of the "
        f"{request.procs} processes measured at once; stage_overhead_s: a real 1F1B pipeline "
        f"of one {OVERHEAD_WIDTH}-wide linear layer per process, {OVERHEAD_MICROBATCHES} "
        f"micro-batches, time inside the stage's forward and backward calls less the same "
        f"layer's, per action, median of {OVERHEAD_STEPS} steps and of the processes; "
        f"meet_stall_s and meet_window_s: ranks 0 and 1 compute {seconds(MEET_COMPUTE_S)} "
        "then exchange a small tensor, rank 1's posts offset by 0 to "
        f"{seconds(MEET_OFFSETS_S[-1])}; the extra time of an exchange over one at "
        f"{seconds(MEET_BASELINE_S)} (median of {MEET_ROUNDS} blocks of {MEET_REPEATS}), its "
        "height at 0 and its area over the height"
        + (
            ""
            if collective is None
            else "; collective_alpha_s and collective_beta_bytes_per_s: the ring model "
            f"(2(N-1) alpha + 2(N-1)/N bytes/beta for N = {request.procs}) fitted the same way "
            "to the all-reduce times"
        )
    )
    lines = [
        f"# Measured by syncpass calibrate on {when:%Y-%m-%d %H:%M} UTC.",
        "# size_bytes  send_recv_one_way_s  fitted_s  all_reduce_s",
        *(
            f"# {entry.size_bytes}  {entry.send_recv_s:.4g}  "
            f"{fit.predict_s(entry.size_bytes):.4g}  {entry.all_reduce_s:.4g}"
            for entry in measurements.times
        ),
        f"name = {_toml_string(hardware.name or '')}",
        f"source = {_toml_string(source)}",
        f"alpha_s = {hardware.alpha_s!r}",
        f"beta_bytes_per_s = {hardware.beta_bytes_per_s!r}",
    ]
    if hardware.device_memory_bytes is not None:
        lines.append(f"device_memory_bytes = {int(hardware.device_memory_bytes)}")
    lines.append(f"flops_per_s = {hardware.flops_per_s!r}")
    lines.append(f"stage_overhead_s = {hardware.stage_overhead_s!r}")
    if hardware.meet_stall_s and hardware.meet_window_s:
        lines.append(f"meet_stall_s = {hardware.meet_stall_s!r}")
        lines.append(f"meet_window_s = {hardware.meet_window_s!r}")
    if hardware.devices is not None:
        lines.append(f"devices = {hardware.devices}")
    if hardware.collective_alpha_s is not None:
        lines.append(f"collective_alpha_s = {hardware.collective_alpha_s!r}")
        lines.append(f"collective_beta_bytes_per_s = {hardware.collective_beta_bytes_per_s!r}")
    return "\n".join(lines) + "\n"


def collective_fit(measurements: Measurements) -> LinkFit | None:
    """The ring model's latency and bandwidth whose all-reduce over the calibrated processes
    takes the measured times: ``t = A + bytes / B`` fitted as the link is
    (:func:`fit_link`), then ``alpha = A / (2(N-1))`` and ``beta = B * 2(N-1) / N``; None
    for a single process, or times that give no bandwidth."""
    procs = measurements.request.procs
    if procs < 2:
        return None
    try:
        fitted = fit_link(
            [entry.size_bytes for entry in measurements.times],
            [entry.all_reduce_s for entry in measurements.times],
        )
    except SyncpassError:
        return None
    steps = 2 * (procs - 1)
    return replace(
        fitted,
        alpha_s=fitted.alpha_s / steps,
        beta_bytes_per_s=fitted.beta_bytes_per_s * steps / procs,
    )


def _round(value: float) -> float:
    """Four significant digits: as many as a measurement supports."""
    return float(f"{value:.4g}")


def _toml_string(text: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped."""
    escaped = []
    for char in text:
        if char in '"\\':
            escaped.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'

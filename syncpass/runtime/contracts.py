"""What the parent and the stage processes of ``syncpass run`` exchange.

Everything here is a frozen dataclass of plain values, so it pickles across
processes and imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from syncpass.contracts.config import SCHEDULES as SCHEDULES  # what run may be asked for
from syncpass.contracts.config import stage_devices
from syncpass.plan.planner import default_microbatches as plan_microbatches

DEVICES = ("auto", "cpu", "cuda")


def default_microbatches(batch: int, stages: int, min_size: int = 1) -> int:
    """The largest divisor of ``batch`` that is at most four per stage and leaves
    micro-batches of at least ``min_size`` samples (as plans assume)."""
    return plan_microbatches(stages, batch, min_size)


@dataclass(frozen=True)
class RunRequest:
    """One ``syncpass run``: what to run, how, and what to check.

    ``microbatches`` is ``None`` for the default (the largest divisor of the
    batch that is at most four per stage and leaves micro-batches of at least
    ``min_microbatch_size`` samples: what the model's batch norms take, as the run
    found before starting; ``min_microbatch_by`` names the one that needs them). ``rtol``/``atol`` are ``None`` for
    the defaults of the parameter's dtype and device (see
    :func:`syncpass.backends.torch.verify.tolerances`). ``timeline``, when set, is
    where the timed steps' profile goes (``.json`` and ``.png``, by
    :class:`syncpass.backends.torch.profiler.Profile`).

    ``stages`` is the number of ranks (devices, processes); each holds
    ``stages_per_device`` pipeline stages, so the file holds
    ``stages * stages_per_device`` of them (:attr:`total_stages`), placed on the
    ranks as :attr:`placement` says.
    """

    file: str
    example: str
    stages: int
    microbatches: int | None = None
    schedule: str = "1f1b"
    steps: int = 3
    verify: bool = False
    threads: int = 1
    device: str = "auto"
    rtol: float | None = None
    atol: float | None = None
    timeout_s: float = 300.0
    port: int = 0
    timeline: str | None = None
    stages_per_device: int = 1
    min_microbatch_size: int = 1
    min_microbatch_by: str | None = None
    # Other files splitting the same model otherwise: their stages step in turn with
    # ``file``'s in one run (``syncpass run FILE --alongside OTHER ...``).
    alongside: tuple[str, ...] = ()
    # Tensor-parallel ranks per pipeline rank (``--stages S --tp T``): the file's
    # TENSOR_PARALLEL_LAYOUT splits each stage's layers over ``tp`` ranks, ``stages * tp``
    # in all (:attr:`ranks`), global rank ``stage_rank * tp + tp_rank``.
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be at least 1, got {self.tp}")
        if self.min_microbatch_size < 1:
            raise ValueError(
                f"min_microbatch_size must be at least 1, got {self.min_microbatch_size}"
            )
        if self.stages < 1 or self.stages_per_device < 1:
            raise ValueError(
                f"stages and stages_per_device must be at least 1, got {self.stages} and "
                f"{self.stages_per_device}"
            )

    def alongside_request(self, file: str) -> RunRequest:
        """This request for ``file``, one of :attr:`alongside`: its own example factory of
        the same name, and no timeline."""
        function = self.example.rpartition(":")[2] or "example"
        return replace(self, file=file, example=f"{file}:{function}", alongside=(), timeline=None)

    @property
    def ranks(self) -> int:
        """The processes of the run: ``stages`` pipeline ranks of ``tp`` ranks each."""
        return self.stages * self.tp

    @property
    def total_stages(self) -> int:
        """The pipeline stages of the file: ``stages_per_device`` on each of ``stages`` ranks."""
        return self.stages * self.stages_per_device

    @property
    def placement(self) -> tuple[int, ...]:
        """The rank of each stage under the schedule (round-robin, or a V for zbv and
        dualpipev: :func:`syncpass.contracts.config.stage_devices`)."""
        return stage_devices(self.schedule, self.stages, self.stages_per_device)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages ``rank`` holds, in order."""
        return tuple(stage for stage, holder in enumerate(self.placement) if holder == rank)


@dataclass(frozen=True)
class ParamCheck:
    """One parameter's gradient from the pipeline against the unsplit model's.

    ``name`` is the parameter's name in the original model; ``stage`` is -1
    for a parameter that no stage holds. ``ok`` follows the rule of
    ``torch.isclose``: ``|pipeline - reference| <= atol + rtol * |reference|``
    everywhere.
    """

    name: str
    stage: int
    numel: int
    max_abs: float
    max_rel: float
    ok: bool
    rtol: float
    atol: float
    note: str = ""


@dataclass(frozen=True)
class LossCheck:
    """One micro-batch's loss on the last stage against the unsplit model's."""

    microbatch: int
    pipeline: float
    reference: float
    ok: bool


@dataclass(frozen=True)
class TiedCheck:
    """A weight several stages hold copies of (a tied embedding and head) after the timed
    steps: each step gives every copy the sum of their gradients, so the copies stay equal,
    as the unsplit model's one parameter is. ``max_abs`` is the largest difference between
    two copies; ``atol`` the verification's absolute tolerance."""

    name: str
    stages: tuple[int, ...]
    steps: int
    max_abs: float
    atol: float

    @property
    def ok(self) -> bool:
        """Whether the copies are still equal within the tolerance."""
        return self.max_abs <= self.atol


@dataclass(frozen=True)
class StageFigures:
    """What one stage measured, and (with ``--verify``) what it checked.

    Times are per training step after the warm-up step. ``compute_times_s`` is
    the time spent in this stage's forward, backward, loss and optimizer
    update; the rest of a step is waiting for activations or gradients from
    the neighbouring stages (pipeline bubbles included) and schedule overhead.
    The summary figures are those of the median step, so that step = compute +
    comm wait.

    ``device`` is the stage's own device where one process holds several
    stages (JAX: ``cpu:1``), and empty where each stage is a process of its
    own (``rank`` says which; the run's ``device`` is rank 0's).

    Under a schedule with several stages per rank (torch's ``--stages-per-device``)
    one figure covers one rank: ``held`` lists the stages it holds, ``stage`` is the
    first of them, and the parameters and times are those of all of them together.
    ``actions`` is what the rank's schedule ran in the checked (warm-up) step, in
    order: ``(kind, stage, microbatch)`` with kind ``F`` forward, ``B`` backward,
    ``I`` the inputs' gradient and ``W`` the weights' (zero-bubble schedules); empty
    where the backend does not record it.
    """

    stage: int
    rank: int
    parameters: int
    parameter_tensors: int
    step_times_s: tuple[float, ...]
    compute_times_s: tuple[float, ...]
    checks: tuple[ParamCheck, ...] = ()
    loss_checks: tuple[LossCheck, ...] = ()
    device: str = ""
    held: tuple[int, ...] = ()
    actions: tuple[tuple[str, int, int], ...] = ()
    tied: tuple[TiedCheck, ...] = ()  # rank 0's, with --verify: every rank computes the same
    # The rank's peak memory in bytes and what it measures (``memory_measure``: on a GPU
    # torch.cuda.max_memory_allocated, on a CPU the bytes the plan's memory model counts,
    # syncpass.backends.torch.memory); ``peak_activation_bytes`` the activations part of it.
    peak_memory_bytes: int | None = None
    peak_activation_bytes: int | None = None
    memory_measure: str = ""
    # The machine's speed between the timed steps: this rank's times of the speed probe
    # (syncpass.backends.torch.speed), one after each round of steps; empty where not taken.
    speed_probes_s: tuple[float, ...] = ()

    @property
    def stages_held(self) -> tuple[int, ...]:
        """The stages these figures cover: ``held``, or ``stage`` alone."""
        return self.held or (self.stage,)

    @property
    def median_step(self) -> int:
        """Index of the median step (the lower one of the two middle steps for an even count)."""
        order = sorted(range(len(self.step_times_s)), key=self.step_times_s.__getitem__)
        return order[(len(order) - 1) // 2]

    @property
    def step_s(self) -> float:
        """Time of the median step."""
        return self.step_times_s[self.median_step]

    @property
    def compute_s(self) -> float:
        """Time spent computing in the median step."""
        return self.compute_times_s[self.median_step]

    @property
    def comm_wait_s(self) -> float:
        """Time of the median step not spent computing: waiting on the other stages."""
        return max(0.0, self.step_s - self.compute_s)


@dataclass(frozen=True)
class RunResult:
    """The whole run, as rank 0 gathered it from every stage.

    ``backend`` is what carried the stages' traffic (torch: ``gloo`` or
    ``nccl``; JAX: ``jax``), ``device`` rank 0's device. ``own_threads`` is
    False where the backend leaves the CPU threads to its runtime (XLA sizes
    its own pool) instead of setting ``request.threads`` per process.
    """

    request: RunRequest
    batch: int
    microbatches: int
    backend: str
    device: str
    stages: tuple[StageFigures, ...]
    model_parameters: int
    unplaced: tuple[ParamCheck, ...] = ()
    own_threads: bool = True
    # With --verify: why the unsplit forward is random (dropout), when it is; else None.
    randomness: str | None = None
    # The ranks whose executed actions differ from the order syncpass plans with
    # (syncpass.backends.torch.schedules.schedule_order), each with a short reason.
    order_notes: tuple[str, ...] = ()
    # What else the report says: why the default micro-batch count is what it is.
    notes: tuple[str, ...] = ()
    # The runs of request.alongside, stepped in turn with this one.
    alongside: tuple[RunResult, ...] = ()

    @property
    def stage_count(self) -> int:
        """How many pipeline stages ran (over all ranks)."""
        return sum(len(figures.stages_held) for figures in self.stages)

    @property
    def checks(self) -> tuple[ParamCheck, ...]:
        """Every parameter check, stage by stage, then those of parameters in no stage."""
        return tuple(check for stage in self.stages for check in stage.checks) + self.unplaced

    @property
    def loss_checks(self) -> tuple[LossCheck, ...]:
        """The last stage's loss checks."""
        return tuple(check for stage in self.stages for check in stage.loss_checks)

    @property
    def tied(self) -> tuple[TiedCheck, ...]:
        """The weights several stages hold, as they stand after the timed steps."""
        return tuple(check for stage in self.stages for check in stage.tied)

    @property
    def verified(self) -> bool:
        """Whether ``--verify`` ran and found every loss and gradient equal within tolerance
        (and every tied weight's copies still equal after the steps)."""
        return (
            self.request.verify
            and all(check.ok for check in self.checks)
            and all(check.ok for check in self.loss_checks)
            and all(check.ok for check in self.tied)
        )


@dataclass(frozen=True)
class WorkerDone:
    """A stage process finished; rank 0's message carries the gathered result."""

    rank: int
    result: RunResult | None = None


@dataclass(frozen=True)
class WorkerFailed:
    """A stage process failed.

    ``user_error``: bad input (a SyncpassError), not a crash. ``peer_lost``: the
    failure is a lost connection to another rank, most likely the echo of that
    rank's own failure.
    """

    rank: int
    message: str
    location: str = ""
    user_error: bool = False
    peer_lost: bool = False


@dataclass(frozen=True)
class TensorRunRequest:
    """One ``syncpass run --tp N``: the rewritten model of ``file`` on ``tp`` gloo ranks.

    With ``verify``, each rank also runs the unsplit model (the same file with every
    collective the identity) on the same batch and compares the loss and every gradient,
    gathered across the ranks for split weights. ``rtol``/``atol`` ``None``: 1e-4 and 1e-5
    (the split sums add in another order than the whole ones)."""

    file: str
    example: str
    tp: int
    verify: bool = False
    rtol: float | None = None
    atol: float | None = None
    timeout_s: float = 300.0
    port: int = 0
    threads: int = 1
    steps: int = 0  # timed training steps after the checked one (its warm-up)
    # Other files splitting the same model otherwise (Megatron-LM's placement beside
    # syncpass's): each checked on its own, their timed steps taken in turn with ``file``'s.
    alongside: tuple[str, ...] = ()

    def alongside_request(self, file: str) -> TensorRunRequest:
        """This request for ``file``, one of :attr:`alongside`: its own example factory of
        the same name."""
        function = self.example.rpartition(":")[2] or "example"
        return replace(self, file=file, example=f"{file}:{function}", alongside=())


@dataclass(frozen=True)
class TensorRankDone:
    """What one rank of a tensor-parallel run measured and checked: its loss (and the
    unsplit model's), its step's forward and backward time (the median of ``timed_steps``
    after the checked one, or the checked one's), the collectives it issued by
    ``"direction kind"``, and with ``verify`` each parameter's check (rank 0 checks the
    gathered split weights; every rank its replicated ones)."""

    rank: int
    loss: float
    reference_loss: float | None
    step_s: float
    counts: tuple[tuple[str, int], ...]
    checks: tuple[ParamCheck, ...] = ()
    split: int = 0  # parameters this rank holds a slice of
    timed_steps: int = 0  # how many steps ``step_s`` is the median of (0: the checked one)
    file: str = ""  # the run's file these figures are of (it or one of its ``alongside``)
    # This rank's times of the speed probe after each round of timed steps (StageFigures').
    speed_probes_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class TensorRunResult:
    """A tensor-parallel run: every rank's figures and the collectives the plan expects."""

    request: TensorRunRequest
    ranks: tuple[TensorRankDone, ...]
    expected: tuple[tuple[str, int], ...]
    parameters: int
    alongside: tuple[TensorRunResult, ...] = ()  # the request's other files, in order
    # What the file splits: module name (a pattern, ``blocks.*.mlp.fc``) -> ``column`` or
    # ``row`` as written (``column:3``, ``row transposed``), and its form (``eager`` or
    # ``dtensor``, whose ColwiseParallel and RowwiseParallel are read as column and row).
    layouts: tuple[tuple[str, str], ...] = ()
    style: str = "eager"
    engine: str = "gloo rank(s)"  # what ran the ranks, as the report names them
    # One program ran every rank (JAX's shard_map): ``ranks`` holds its one set of figures.
    one_program: bool = False

    @property
    def collectives_match(self) -> bool:
        return all(dict(rank.counts) == dict(self.expected) for rank in self.ranks)

    @property
    def verified(self) -> bool:
        losses = all(
            rank.reference_loss is not None
            and abs(rank.loss - rank.reference_loss)
            <= (self.request.atol or 1e-5) + (self.request.rtol or 1e-4) * abs(rank.reference_loss)
            for rank in self.ranks
        )
        checks = all(check.ok for rank in self.ranks for check in rank.checks)
        others = all(other.verified for other in self.alongside)
        return losses and checks and self.collectives_match and others

"""From a cost file to a Plan: where the sync points go, what each stage costs, and why.

:func:`make_plan` runs one strategy; :func:`compare_baselines` scores the
rules people use today on the same costs; :func:`best_stage_count` picks the
number of stages with the least predicted step time. Plans serialise to the
plan file (JSON, ``docs/formats.md``) that the rewrite stage consumes.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from syncpass.contracts.config import (
    BASELINE_STRATEGIES,
    MULTI_STAGE_SCHEDULES,
    OPTIMISING_STRATEGIES,
    SCHEDULES,
    V_SHAPE_SCHEDULES,
    SyncConfig,
    stage_devices,
    strategy_names,
)
from syncpass.contracts.costs import Costs, SettingValue
from syncpass.contracts.graph import INPUT
from syncpass.core.errors import InfeasibleError, SyncpassError
from syncpass.core.units import num_bytes, percent, percents_apart, seconds
from syncpass.plan.explain import broken_constraints, explain_sync_points
from syncpass.plan.levels import Expansion, Level, plan_level
from syncpass.plan.optimizer import (
    Infeasible,
    PlanScore,
    Problem,
    Solution,
    rising_threshold_plans,
    score_cuts,
    solve,
)
from syncpass.plan.problem import FarValue, far_reaching_value, problem_from_costs
from syncpass.plan.schedule import (
    Link,
    OrderSource,
    Prediction,
    ScheduleOrder,
    StageLoad,
    simulate,
    simulate_order,
    single_stage_order,
)
from syncpass.plan.strategies import (
    BASELINE_RULES,
    baseline_cuts,
    plugin_cuts,
    uniform_rule,
)


@dataclass(frozen=True)
class PlanRequest:
    """What the user asked for: ``stages`` (or ``None`` for manual) and settings.

    ``pinned`` adds user-marked cuts (op ids) to those pinned in the cost file.
    ``carries_values`` says that the stages the plan is for pass any value on to
    any later stage (torch's eager stages, JAX); without it, as for torch's tracer,
    every value may reach only the next stage. ``refused_kinds`` are the kinds of
    value (:data:`syncpass.contracts.costs.VALUE_KINDS`) the stages cannot send: no
    sync point goes where one would cross.

    ``stages`` counts devices (pipeline ranks); each holds ``stages_per_device`` stages
    (``V``, for the schedules of :data:`MULTI_STAGE_SCHEDULES`), so the plan has
    ``stages * stages_per_device`` stages. ``None`` asks :func:`plan_for` to try the
    counts the schedule takes (:func:`stages_per_device_choices`) and keep the fastest.
    """

    stages: int | None
    config: SyncConfig
    microbatches: int | None = None
    schedule: str = "1f1b"
    pinned: tuple[str, ...] = ()
    carries_values: bool = False
    refused_kinds: tuple[str, ...] = ()
    stages_per_device: int | None = 1

    def __post_init__(self) -> None:
        if self.stages is not None and self.stages < 1:
            raise ValueError(f"stages must be at least 1, got {self.stages}")
        if self.microbatches is not None and self.microbatches < 1:
            raise ValueError(f"microbatches must be at least 1, got {self.microbatches}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}")
        if self.stages_per_device is not None:
            if self.stages_per_device < 1:
                raise ValueError(
                    f"stages per device must be at least 1, got {self.stages_per_device}"
                )
            stage_devices(self.schedule, 1, self.stages_per_device)  # the schedule takes it

    @property
    def per_device(self) -> int:
        """``stages_per_device``, which :func:`plan_for` has settled by now."""
        if self.stages_per_device is None:
            raise ValueError("stages_per_device is still to be chosen (plan_for chooses it)")
        return self.stages_per_device


def stages_per_device_choices(schedule: str) -> tuple[int, ...]:
    """The stage counts per device ``--stages-per-device auto`` tries under ``schedule``."""
    if schedule in V_SHAPE_SCHEDULES:
        return (2,)
    if schedule in MULTI_STAGE_SCHEDULES:
        return (1, 2, 4)
    return (1,)


@dataclass(frozen=True)
class SyncPoint:
    """One chosen sync point: a cut right after op ``after``."""

    after: str
    live_bytes: float
    comm_s: float  # per step: both directions when training
    ratio: float  # comm_s over the compute of the stage it closes
    pinned: bool
    reason: str
    kinds: tuple[tuple[str, str], ...] = ()  # live values that were not tensors (CutCost.kinds)
    recomputed: tuple[str, ...] = ()  # what the stage after computes again (Costs.crossing)


@dataclass(frozen=True)
class Checkpointed:
    """An op a plan has recompute its activations in the backward (activation
    checkpointing, ``--recompute``): on stage ``stage`` it keeps only its inputs, which
    frees ``frees_bytes`` (its saved activations less its inputs, for every micro-batch
    the stage keeps in flight), and runs its forward again, ``cost_s`` a step."""

    op: str
    stage: int
    frees_bytes: float
    cost_s: float

    def __post_init__(self) -> None:
        if self.stage < 0 or self.frees_bytes < 0 or self.cost_s < 0:
            raise ValueError(
                f"checkpointed op {self.op!r}: stage, frees_bytes and cost_s must be >= 0"
            )


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: its ops and figures (full batch, per step)."""

    index: int
    ops: tuple[str, ...]
    compute_s: float
    comm_in_s: float
    comm_out_s: float
    time_s: float
    memory_bytes: float
    sync_s: float  # simulated time in transfers, of its device
    idle_s: float  # simulated bubble and waiting, of its device
    device: int  # the pipeline rank that holds it


@dataclass(frozen=True)
class Threshold:
    """The communication threshold asked for and the one the plan used.

    ``forced_by`` names the sync point whose ratio set the least threshold that
    admits a plan, when the adaptive strategy had to raise the requested one to
    it. When it raised the threshold further, because a plan with a larger one
    predicts a faster step, ``admitting`` is the threshold it started from (the
    requested one, or the least admitting a plan) and ``admitting_step_s`` the
    predicted step there. ``math.inf`` means no limit.
    """

    requested: float
    used: float
    forced_by: str | None = None
    admitting: float | None = None
    admitting_step_s: float | None = None

    @property
    def raised(self) -> bool:
        return self.used > self.requested

    @property
    def raised_for_speed(self) -> bool:
        return self.admitting is not None


@dataclass(frozen=True)
class Plan:
    """A pipeline plan: the contract between planning and rewriting."""

    strategy: str
    batch_size: int
    training: bool
    schedule: str
    microbatches: int
    min_sync_interval: int
    threshold: Threshold
    sync_points: tuple[SyncPoint, ...]
    stages: tuple[StagePlan, ...]
    bottleneck_s: float
    total_comm_s: float
    predicted_step_s: float
    comm_wait_ratio: float
    bubble_ratio: float
    violations: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    hardware: str | None = None
    model: str | None = None
    stages_per_device: int = 1
    # The cost file's model_settings: the analysis decides the same branches from them.
    model_settings: tuple[tuple[str, SettingValue], ...] = ()
    # Nested nn.Sequential children the plan looks into, and why (syncpass.plan.levels).
    expanded: tuple[Expansion, ...] = ()
    # With more pipeline ranks than the hardware has devices: the least step of the ranks
    # sharing them (their whole work over the devices), beside the predicted one.
    shared_step_s: float | None = None
    # The ops that recompute (--recompute): the stages' times include their forward again,
    # and the stages' memory counts activations per micro-batch in flight.
    checkpointed: tuple[Checkpointed, ...] = ()

    def __post_init__(self) -> None:
        if len(self.stages) != len(self.sync_points) + 1:
            raise ValueError("a plan has one more stage than it has sync points")
        for checkpointed in self.checkpointed:
            if checkpointed.stage >= len(self.stages) or (
                checkpointed.op not in self.stages[checkpointed.stage].ops
            ):
                raise ValueError(
                    f"checkpointed op {checkpointed.op!r} is not in stage {checkpointed.stage}"
                )
        if self.strategy not in strategy_names():
            raise ValueError(f"unknown strategy {self.strategy!r}")
        if len(self.stages) % self.stages_per_device:
            raise ValueError("a plan's stages fill every device alike")

    @property
    def devices(self) -> int:
        """The pipeline ranks the plan runs on."""
        return len(self.stages) // self.stages_per_device

    @property
    def bottleneck_stage(self) -> int:
        return max(range(len(self.stages)), key=lambda s: self.stages[s].time_s)


# --- what planning one cost file computes once ------------------------------------


class PlanCache:
    """What planning one cost file computes, kept so that the plan, the baselines it is
    compared with and the stage counts ``--stages auto`` tries compute nothing twice:
    the optimiser's problems (one per micro-batch count and request), the exact
    solutions, the rules' cuts and the simulated steps."""

    def __init__(self, costs: Costs, orders: OrderSource = single_stage_order) -> None:
        self.costs = costs
        self.orders = orders
        self._orders: dict[tuple[object, ...], ScheduleOrder] = {}
        self._problems: dict[tuple[object, ...], Problem] = {}
        self._solutions: dict[tuple[object, ...], Solution | Infeasible] = {}
        self._baselines: dict[tuple[object, ...], tuple[int, ...] | Infeasible] = {}
        self._predictions: dict[tuple[object, ...], Prediction] = {}
        self._levels: dict[tuple[int, tuple[str, ...]], tuple[Level, PlanCache]] = {}
        self._by_expansion: dict[tuple[str, ...], PlanCache] = {}

    def level(self, stages: int, pinned: tuple[str, ...] = ()) -> tuple[Level, PlanCache]:
        """The costs a plan of ``stages`` stages (sync points ``pinned`` after those ops
        besides the cost file's) is made from (:func:`plan_level`), and the cache that
        serves them."""
        if (stages, pinned) not in self._levels:
            level = plan_level(self.costs, stages, pinned)
            key = tuple(expansion.op for expansion in level.expanded)
            if key not in self._by_expansion:
                inner = PlanCache(level.costs, self.orders)
                inner._orders = self._orders  # the schedules do not depend on the ops
                self._by_expansion[key] = inner
            self._levels[(stages, pinned)] = (level, self._by_expansion[key])
        return self._levels[(stages, pinned)]

    def for_plan(self, plan: Plan) -> PlanCache:
        """The cache of the costs ``plan`` (made with this cache) was planned on: these, or
        those with the groups it did not look into merged (:meth:`level`)."""
        if not self.costs.groups:
            return self
        key = tuple(expansion.op for expansion in plan.expanded)
        if key not in self._by_expansion:
            raise ValueError("the plan was not made with this cache")
        return self._by_expansion[key]

    def problem(self, request: PlanRequest, microbatches: int = 1) -> Problem:
        key = (
            request.config.min_sync_interval,
            request.pinned,
            microbatches,
            request.carries_values,
            request.refused_kinds,
            request.per_device,
        )
        if key not in self._problems:
            self._problems[key] = problem_from_costs(
                self.costs,
                request.config,
                request.pinned,
                microbatches,
                request.carries_values,
                request.refused_kinds,
                request.per_device,
            )
        return self._problems[key]

    def order(
        self, schedule: str, devices: int, stages_per_device: int, microbatches: int
    ) -> ScheduleOrder:
        """What each device runs under ``schedule`` (from :attr:`orders`); raises
        :class:`SyncpassError` when the schedule refuses the counts."""
        key = (schedule, devices, stages_per_device, microbatches)
        if key not in self._orders:
            if schedule in MULTI_STAGE_SCHEDULES and self.orders is single_stage_order:
                raise SyncpassError(
                    f"--schedule {schedule} holds several stages per device, and the backend "
                    "planned for runs gpipe and 1f1b only; plan for a torch backend "
                    "(--backend torch_stages or torch), or use --schedule gpipe or 1f1b"
                )
            try:
                found = self.orders(
                    schedule, devices, stages_per_device, microbatches, self.costs.training
                )
            except ValueError as error:
                raise SyncpassError(f"--schedule {schedule}: {error}") from None
            self._orders[key] = found
        return self._orders[key]

    def solve(
        self, problem: Problem, stages: int, threshold: float, adaptive: bool
    ) -> Solution | Infeasible:
        key = (id(problem), stages, threshold, adaptive)
        if key not in self._solutions:
            self._solutions[key] = solve(problem, stages, threshold, adaptive)
        return self._solutions[key]

    def baseline(self, problem: Problem, stages: int, rule: str) -> tuple[int, ...] | Infeasible:
        key = (id(problem), stages, rule)
        if key not in self._baselines:
            self._baselines[key] = baseline_cuts(problem, stages, rule, self.costs)
        return self._baselines[key]

    def predict(
        self,
        problem: Problem,
        cuts: tuple[int, ...],
        microbatches: int,
        schedule: str,
        stages_per_device: int = 1,
    ) -> Prediction:
        key = (id(problem), cuts, microbatches, schedule, stages_per_device)
        if key not in self._predictions:
            order = None
            if schedule in MULTI_STAGE_SCHEDULES:
                devices = (len(cuts) + 1) // stages_per_device
                order = self.order(schedule, devices, stages_per_device, microbatches)
            self._predictions[key] = predict(
                self.costs, problem, cuts, microbatches, schedule, order
            )
        return self._predictions[key]


def _cache_for(costs: Costs, cache: PlanCache | None) -> PlanCache:
    if cache is None:
        return PlanCache(costs)
    if cache.costs is not costs:
        raise ValueError("a PlanCache serves the cost file it was made for")
    return cache


# --- strategies ---------------------------------------------------------------


def make_plan(
    costs: Costs, request: PlanRequest, origin: str = "", cache: PlanCache | None = None
) -> Plan:
    """Plan ``costs`` with ``request.config.strategy``.

    Raises :class:`SyncpassError` (an :class:`InfeasibleError` when the
    constraints rule out every plan) with a message that says what to change.
    ``cache`` shares the work with other plans of the same ``costs``.
    """
    cache = _cache_for(costs, cache)
    if costs.groups:
        # Nested nn.Sequential children: planned one by one only where a group is too big
        # for a stage of this plan (syncpass.plan.levels).
        level, inner = cache.level(_planned_stages(costs, request), request.pinned)
        pinned = tuple(level.op_id(op) for op in request.pinned)
        plan = make_plan(level.costs, dataclasses.replace(request, pinned=pinned), origin, inner)
        plan = dataclasses.replace(plan, expanded=level.expanded)
        whole, whole_cache = cache.level(1, request.pinned)  # every group whole, as before
        if whole.expanded == level.expanded or request.config.strategy not in OPTIMISING_STRATEGIES:
            return plan
        # Looking inside only adds cuts, so the least bottleneck can only fall; the predicted
        # step is simulated, and the plan keeps the groups whole if that is faster.
        pinned = tuple(whole.op_id(op) for op in request.pinned)
        try:
            before = make_plan(
                whole.costs, dataclasses.replace(request, pinned=pinned), origin, whole_cache
            )
        except SyncpassError:
            return plan
        if before.predicted_step_s >= plan.predicted_step_s:
            return plan
        note = (
            f"planning inside {', '.join(e.op for e in level.expanded)} predicted a slower step "
            f"({seconds(plan.predicted_step_s)}) than keeping them whole "
            f"({seconds(before.predicted_step_s)}): kept whole"
        )
        return dataclasses.replace(before, expanded=whole.expanded, notes=(*before.notes, note))
    per_device = request.per_device
    # The stage count depends only on the pins and the admissible cuts; the micro-batch
    # count (which the costs per step depend on) may depend on the stage count.
    stages = request.stages
    if stages is None or request.microbatches is None:
        unit = cache.problem(request)
        stages = _stage_count(unit, request, origin, _refusals(costs, request)) // per_device
    microbatches = request.microbatches or default_microbatches(
        stages, costs.batch_size, costs.min_microbatch_size
    )
    problem = cache.problem(request, microbatches)
    strategy = request.config.strategy
    requested_tau = request.config.communication_cost_threshold
    # From here on ``stages`` counts the plan's stages, ``per_device`` to a device.
    stages = _stage_count(problem, request, origin, _refusals(costs, request))
    if request.schedule in MULTI_STAGE_SCHEDULES:
        _check_order(
            cache, request.schedule, stages // per_device, per_device, microbatches, origin
        )
    notes: list[str] = list(costs.notes)
    dominant = _dominant_op_note(costs, stages)
    if dominant is not None:
        notes.append(dominant)
    faster: _SpeedRaise | None = None
    admitting_cuts: tuple[int, ...] = ()  # the plan at the least threshold admitting one
    if strategy in OPTIMISING_STRATEGIES:
        result = cache.solve(problem, stages, requested_tau, adaptive=strategy == "adaptive")
        if isinstance(result, Infeasible):
            raise _infeasible_error(
                result, problem, stages, request.config, costs, origin, per_device
            )
        cuts, used_tau = result.cuts, result.threshold_used
        admitting_cuts = cuts
        if strategy == "adaptive":
            faster = _fastest(cache, problem, stages, result, microbatches, request)
            if faster is not None:
                cuts = faster.cuts
    elif strategy == "manual":
        cuts, used_tau = tuple(int(p) for p in np.flatnonzero(problem.pinned)), requested_tau
    elif strategy not in BASELINE_STRATEGIES:
        cuts, used_tau = plugin_cuts(problem, stages, strategy, costs, origin), requested_tau
        notes.append(f"{strategy}: a strategy from an installed package (syncpass.strategies)")
    else:
        baseline = cache.baseline(problem, stages, strategy)
        if isinstance(baseline, Infeasible):
            raise _infeasible_error(
                baseline, problem, stages, request.config, costs, origin, per_device
            )
        cuts, used_tau = baseline, requested_tau
        rule = uniform_rule(costs) if strategy == "uniform" else BASELINE_RULES[strategy]
        notes.append(f"{strategy}: {rule}")
    forced_by = None
    if used_tau > requested_tau:
        # The sync point whose ratio the least admitting threshold is, in the plan made there.
        scored = score_cuts(problem, admitting_cuts)
        worst = max(range(len(admitting_cuts)), key=lambda c: scored.stages[c].cut_ratio)
        forced_by = costs.ops[admitting_cuts[worst] - 1].id
        notes.append(
            f"no {stages}-stage plan keeps every sync point within the threshold "
            f"{percent(requested_tau)}; raised it to {percent(used_tau)}, the least that admits "
            f"a plan, forced by the sync point after {forced_by}"
        )
    if faster is not None:
        notes.append(faster.note)
    if strategy in OPTIMISING_STRATEGIES:

        def step(plan_cuts: tuple[int, ...]) -> float:
            return cache.predict(
                problem, plan_cuts, microbatches, request.schedule, per_device
            ).step_s

        held_back = _dataflow_note(cache, problem, stages, cuts, step)
        if held_back is not None:
            notes.insert(0, held_back)
    score = score_cuts(problem, cuts)
    used, admitting, admitting_step_s = used_tau, None, None
    if faster is not None and faster.threshold is not None:
        used, admitting, admitting_step_s = faster.threshold, used_tau, faster.admitting_step_s
    threshold = Threshold(requested_tau, used, forced_by, admitting, admitting_step_s)
    return _assemble(cache, problem, request, strategy, cuts, score, threshold, notes)


def _dominant_op_note(costs: Costs, stages: int) -> str | None:
    """What to tell of an op that holds more than a stage's share of the step's compute (a
    mask built by a library function, a block the analysis does not open): no stage can
    take less time than it, whatever the plan, so more stages stop paying."""
    times = [op.compute_s + (op.backward_s if costs.training else 0.0) for op in costs.ops]
    total = sum(times)
    if stages < 2 or total <= 0:
        return None
    index = max(range(len(times)), key=times.__getitem__)
    share = times[index] / total
    if share <= 1 / stages:
        return None
    op = costs.ops[index]
    where = f" at {op.source}" if op.source else ""
    return (
        f"{op.id}{where} holds {share:.0%} of the compute, more than a stage's share at "
        f"{stages} stages ({1 / stages:.0%}): no stage takes less than it, so more stages "
        "shorten the step no further; it stays whole because it is one op the analysis does "
        "not open (a function's call, a module whose forward runs no layer stack, or a loop "
        "or branch no sync point may enter)"
    )


def _planned_stages(costs: Costs, request: PlanRequest) -> int:
    """The stages a plan of ``request`` has (1 when it asks for none: the planner says so)."""
    if request.stages is not None:
        return request.stages * request.per_device
    if request.config.strategy == "manual":
        return len({cut.after for cut in costs.cuts if cut.pinned} | set(request.pinned)) + 1
    return 1


@dataclass(frozen=True)
class _SpeedRaise:
    """A faster plan than the least bottleneck's: its ``cuts``, the ``threshold`` they
    need (``None``: no raise, a rule's cuts within the same one), the predicted step of
    the plan they replace, and the note saying so."""

    cuts: tuple[int, ...]
    threshold: float | None
    admitting_step_s: float
    note: str


def _fastest(
    cache: PlanCache,
    problem: Problem,
    stages: int,
    first: Solution,
    microbatches: int,
    request: PlanRequest,
) -> _SpeedRaise | None:
    """What the adaptive strategy raises the threshold to for speed, if anything.

    The candidates are the exact plans as the threshold rises from ``first``'s
    (:func:`~syncpass.plan.optimizer.rising_threshold_plans`) and the rules' plans that
    keep every constraint but the threshold (``uniform``, ``parameters``, ``time``), each
    at the threshold its sync points need. The one with the least predicted step (the
    schedule simulated) wins; on ties, the smaller threshold. ``None`` when that is
    ``first`` itself.

    A candidate with a stage that holds no weights, where the model has some, is left out
    (:func:`_idle_stage`): that rank would only pass the batch on, so it is a plan for one
    stage fewer, and the gloo stall of meeting posts can make it predict faster than the
    stages asked for (an empty first stage of a balanced transformer keeps its neighbour's
    posts apart).
    """
    ids = [op.id for op in cache.costs.ops]
    weights = [op.param_bytes for op in cache.costs.ops]

    def step(cuts: tuple[int, ...]) -> float:
        return cache.predict(
            problem, cuts, microbatches, request.schedule, request.per_device
        ).step_s

    first_step = step(first.cuts)
    best: tuple[float, float, tuple[int, ...], str] = (
        first_step,
        first.threshold_used,
        first.cuts,
        "",
    )
    for plan in rising_threshold_plans(problem, stages, first)[1:]:
        if _idle_stage(plan.cuts, weights):
            continue
        candidate = (step(plan.cuts), plan.threshold_used, plan.cuts, "")
        best = min(best, candidate, key=lambda entry: entry[:2])
    for rule in BASELINE_STRATEGIES:
        cuts = cache.baseline(problem, stages, rule)
        if isinstance(cuts, Infeasible) or broken_constraints(problem, cuts, math.inf, ids):
            continue
        if _idle_stage(cuts, weights):
            continue
        ratios = [stage.cut_ratio for stage in score_cuts(problem, cuts).stages[:-1]]
        needed = max([first.threshold_used, *ratios])
        best = min(best, (step(cuts), needed, cuts, rule), key=lambda entry: entry[:2])
    faster_step, threshold, cuts, rule = best
    if cuts == first.cuts:
        return None
    if threshold == first.threshold_used:
        # A rule's sync points, within the same threshold, predict a faster step.
        note = (
            f"the {rule} rule's sync points predict a faster step ({seconds(faster_step)}) "
            f"than the least bottleneck's ({seconds(first_step)}): they are the plan"
        )
        return _SpeedRaise(cuts, None, first_step, note)
    whose = f" (the {rule} rule's sync points)" if rule else ""
    before, after = percents_apart(first.threshold_used, threshold)
    note = (
        f"raised the threshold from {before} to {after} "
        f"for speed{whose}: predicted step {seconds(faster_step)}, against "
        f"{seconds(first_step)} within {before}"
    )
    return _SpeedRaise(cuts, threshold, first_step, note)


def _idle_stage(cuts: tuple[int, ...], weights: list[float]) -> bool:
    """Whether a stage of the plan with ``cuts`` holds none of the model's weights
    (``weights``: each op's parameter bytes) while others do."""
    if not any(weights):
        return False
    bounds = (0, *cuts, len(weights))
    return any(not any(weights[start:end]) for start, end in itertools.pairwise(bounds))


def compare_baselines(
    costs: Costs, request: PlanRequest, cache: PlanCache | None = None
) -> tuple[Plan, ...]:
    """The ``uniform``, ``parameters`` and ``time`` plans for the same request.

    A rule that cannot make a legal plan here (the pins break its balance, say)
    is left out rather than failing the comparison. With the ``cache`` the plan was
    made with, the rules' cuts and steps its adaptive strategy weighed are reused.
    """
    cache = _cache_for(costs, cache)
    plans = []
    for strategy in BASELINE_STRATEGIES:
        try:
            plans.append(
                make_plan(
                    costs,
                    dataclasses.replace(request, config=request.config.replace(strategy=strategy)),
                    cache=cache,
                )
            )
        except SyncpassError:
            continue
    return tuple(plans)


def plan_for(
    costs: Costs,
    request: PlanRequest,
    origin: str = "",
    max_stages: int | None = None,
    cache: PlanCache | None = None,
) -> Plan:
    """The plan ``request`` asks for; with ``request.stages`` of ``None`` and ``max_stages``,
    the stage count with the least predicted step (``manual``: the pins decide the count);
    with ``request.stages_per_device`` of ``None``, the stages per device with the least
    predicted step of those the schedule takes (:func:`stages_per_device_choices`)."""
    if request.stages_per_device is None:
        return _best_stages_per_device(costs, request, origin, max_stages, cache)
    if request.stages is None and max_stages is not None and request.config.strategy != "manual":
        return best_stage_count(costs, request, max_stages, origin, cache)
    return make_plan(costs, request, origin, cache)


def _best_stages_per_device(
    costs: Costs,
    request: PlanRequest,
    origin: str,
    max_stages: int | None,
    cache: PlanCache | None,
) -> Plan:
    """:func:`plan_for` at each count of stages per device the schedule takes; the plan
    with the least predicted step, noting what the others predicted."""
    cache = _cache_for(costs, cache)
    tried: list[tuple[int, Plan]] = []
    refused: list[str] = []
    last_error: SyncpassError | None = None
    for per_device in stages_per_device_choices(request.schedule):
        try:
            plan = plan_for(
                costs,
                dataclasses.replace(request, stages_per_device=per_device),
                origin,
                max_stages,
                cache,
            )
        except SyncpassError as error:
            last_error = error
            refused.append(f"{per_device}: {error.message}")
            continue
        tried.append((per_device, plan))
    if not tried:
        assert last_error is not None
        raise last_error
    chosen, best = min(tried, key=lambda entry: entry[1].predicted_step_s)
    others = ", ".join(
        f"{per_device} on {plan.devices} device(s): {seconds(plan.predicted_step_s)}"
        for per_device, plan in tried
        if per_device != chosen
    )
    note = (
        f"--stages-per-device auto: {chosen} stage(s) per device on {best.devices} device(s) "
        f"predict the least step ({seconds(best.predicted_step_s)})"
        + (f"; {others}" if others else "")
        + (f"; refused {'; '.join(refused)}" if refused else "")
    )
    return dataclasses.replace(best, notes=(*best.notes, note))


def shared_step(costs: Costs, prediction: Prediction) -> float | None:
    """The least step of a plan with more pipeline ranks than the hardware has devices
    (``hardware.devices``, when known), the ranks sharing them: their whole work over the
    devices there are, or the predicted step if that is more. None when each rank has a
    device of its own (or the count is unknown)."""
    devices, ranks = costs.hardware.devices, len(prediction.stages)
    if devices is None or ranks <= devices:
        return None
    work = sum(stage.compute_s + stage.sync_s for stage in prediction.stages)
    return max(prediction.step_s, work / devices)


def _shared_devices_note(costs: Costs, prediction: Prediction) -> str | None:
    """What the prediction means when the plan has more pipeline ranks than the hardware
    has devices: it is for a device per rank, as the hardware profile would give; ranks
    that share devices take at least :func:`shared_step`, which the note puts beside it."""
    shared = shared_step(costs, prediction)
    if shared is None:
        return None
    devices, ranks = costs.hardware.devices, len(prediction.stages)
    work = sum(stage.compute_s + stage.sync_s for stage in prediction.stages)
    return (
        f"{ranks} pipeline ranks on {devices} device(s) ({costs.hardware.name or 'the hardware'}):"
        f" the predicted step, {seconds(prediction.step_s)}, is for a device per rank; ranks "
        f"sharing {devices} take at least their {seconds(work)} of work over {devices}, "
        f"{seconds(shared)} a step ({shared / prediction.step_s:.2f}x the prediction). Plan for "
        f"at most {devices}, or read it as the figure for hardware with {ranks} devices"
    )


def _meeting_posts_note(costs: Costs, prediction: Prediction) -> str | None:
    """What the step pays for posts that met (:func:`~syncpass.plan.schedule.meeting_stalls`):
    on hardware whose posts stall so, stages whose work lines their posts up pay it."""
    if not prediction.stalled_posts:
        return None
    hardware = costs.hardware
    return (
        f"{prediction.stalled_posts} batches of transfers a step are posted as the "
        f"neighbouring rank posts its own (within {seconds(hardware.meet_window_s)}), and "
        f"{hardware.name or 'the hardware'}'s posts stall when they meet "
        f"({seconds(hardware.meet_stall_s)} at the same moment, `meet_stall_s`): "
        f"{seconds(prediction.stalled_s)} of the ranks' time in all. Stages whose work "
        "differs by more than the window keep their posts apart"
    )


def auto_stage_limit(costs: Costs, max_stages: int, stages_per_device: int = 1) -> int:
    """The most stages (ranks) ``--stages auto`` tries: ``max_stages``, but no more than the
    model has ops for (``stages_per_device`` each) or the hardware devices (see
    :func:`best_stage_count`)."""
    devices = costs.hardware.devices
    limit = min(max_stages, len(costs.ops) // stages_per_device)
    return limit if devices is None else min(limit, devices)


def best_stage_count(
    costs: Costs,
    request: PlanRequest,
    max_stages: int,
    origin: str = "",
    cache: PlanCache | None = None,
) -> Plan:
    """The plan with the least predicted step time over 1..``max_stages`` stages, and no
    more stages than the hardware has devices (``hardware.devices``, when known): more
    stages than devices would share them, which the prediction does not model, and no more
    than the model has ops: a stage holds at least one."""
    cache = _cache_for(costs, cache)
    devices = costs.hardware.devices
    limit = auto_stage_limit(costs, max_stages, request.per_device)
    if limit < 1:
        raise InfeasibleError(
            f"the model has {len(costs.ops)} op(s): too few for {request.per_device} stages "
            "on even one device; use fewer stages per device (--stages-per-device)",
            "stages",
            origin,
        )
    best: Plan | None = None
    last_error: SyncpassError | None = None
    tried: list[tuple[int, str]] = []  # each count and its predicted step, or why none
    for stages in range(1, limit + 1):
        try:
            plan = make_plan(costs, dataclasses.replace(request, stages=stages), origin, cache)
        except InfeasibleError as error:
            last_error = error
            tried.append((stages, "no plan"))
            continue
        tried.append((stages, seconds(plan.predicted_step_s)))
        if best is None or plan.predicted_step_s < best.predicted_step_s:
            best = plan
    if best is None:
        assert last_error is not None
        raise last_error
    chosen = len(best.stages) // request.per_device
    steps = ", ".join(
        f"{count}: {step}" + (" (chosen)" if count == chosen else "") for count, step in tried
    )
    counted = "stage(s)" if request.per_device == 1 else "rank(s)"
    best = dataclasses.replace(
        best, notes=(*best.notes, f"--stages auto, predicted step by {counted}: {steps}")
    )
    if limit < max_stages:
        why = (
            f"the hardware has {devices} device(s)"
            if devices is not None and devices == limit
            else f"the model has {len(costs.ops)} op(s)"
        )
        note = f"--stages auto tried 1 to {limit} {counted}, not {max_stages}: {why}"
        best = dataclasses.replace(best, notes=(*best.notes, note))
    return best


def _check_order(
    cache: PlanCache,
    schedule: str,
    devices: int,
    per_device: int,
    microbatches: int,
    origin: str,
) -> None:
    """Raise, as an :class:`InfeasibleError` saying which micro-batch counts would do,
    when the engine's ``schedule`` refuses ``microbatches`` for these counts."""
    try:
        cache.order(schedule, devices, per_device, microbatches)
    except SyncpassError as error:
        if schedule in MULTI_STAGE_SCHEDULES and cache.orders is single_stage_order:
            raise
        batch = cache.costs.batch_size
        taken = []
        for count in (d for d in range(1, min(batch, 4096) + 1) if batch % d == 0):
            try:
                cache.order(schedule, devices, per_device, count)
            except SyncpassError:
                continue
            taken.append(str(count))
        advice = (
            f"--microbatches {', '.join(taken[:8])}{', ...' if len(taken) > 8 else ''} would do "
            f"(each divides the batch of {batch})"
            if taken
            else f"no micro-batch count that divides the batch of {batch} will do: plan for a "
            "larger batch (--batch-size), fewer devices or fewer stages per device"
        )
        message = f"{error.message.rstrip('.')}; {advice}"
        raise InfeasibleError(message, "microbatches", origin) from None


def _refusals(costs: Costs, request: PlanRequest) -> str:
    """`` (3 more are refused: ...)`` for the cuts a value the stages cannot send crosses."""
    refused = costs.unsendable(request.refused_kinds)
    if not refused:
        return ""
    names = ", ".join(dict.fromkeys(name for crossing in refused.values() for name in crossing))
    return (
        f" ({len(refused)} more are refused: {names} would cross them, and the stages "
        "send only tensors, numbers and shapes)"
    )


def _stage_count(problem: Problem, request: PlanRequest, origin: str, refusals: str = "") -> int:
    """The plan's stage count: ``request.stages`` devices times the stages each holds, or
    the marked sync points' for the manual strategy."""
    pins = int(problem.pinned.sum())
    per_device = request.per_device
    if request.config.strategy == "manual":
        # One stage asked for needs no mark (--recompute on one device plans that way).
        if pins == 0 and (request.stages is None or request.stages * per_device != 1):
            raise SyncpassError(
                "the manual strategy uses only the sync points the user marked, and none is "
                'marked; pin cuts ("pinned": true in the cost file, or --cuts)',
                origin,
            )
        if request.stages is not None and request.stages * per_device != pins + 1:
            raise SyncpassError(
                f"{pins} marked sync point(s) make {pins + 1} stages, but "
                f"{request.stages * per_device} were asked for; drop --stages or mark more cuts",
                origin,
            )
        if (pins + 1) % per_device:
            raise SyncpassError(
                f"{pins} marked sync point(s) make {pins + 1} stages, which do not fill "
                f"devices of {per_device} stage(s) each; mark more or fewer cuts",
                origin,
            )
        return pins + 1
    if request.stages is None:
        raise SyncpassError("the number of stages is required (--stages S)")
    stages = request.stages * per_device
    n, k = problem.num_ops, problem.min_ops
    cuts = int(problem.admissible.sum())
    if stages * k > n:
        advice = f"use at most {n // k} stages" if n // k else f"lower min_sync_interval to {n}"
        if per_device > 1:
            advice = _per_device_advice(n // k, per_device)
        raise InfeasibleError(
            f"{stages} stages need at least {stages * k} ops (min_sync_interval {k}), "
            f"but the model has {n}; {advice}",
            "stages",
            origin,
        )
    if stages - 1 > cuts:
        advice = f"use at most {cuts + 1} stages"
        if per_device > 1:
            advice = _per_device_advice(cuts + 1, per_device)
        raise InfeasibleError(
            f"{stages} stages need {stages - 1} sync points, but the cost file lists only "
            f"{cuts} admissible cut(s){refusals}; {advice}",
            "stages",
            origin,
        )
    if pins > stages - 1:
        raise InfeasibleError(
            f"{pins} pinned sync points make at least {pins + 1} stages, but {stages} were asked for",
            "stages",
            origin,
        )
    return stages


def _per_device_advice(most: int, per_device: int) -> str:
    """What to ask for when at most ``most`` stages fit and each device holds
    ``per_device``: fewer devices (``--stages``), or fewer stages per device."""
    devices = most // per_device
    fewer = f"use --stages {devices} or fewer, or " if devices else "use "
    return f"at most {most} stages fit: {fewer}fewer stages per device (--stages-per-device)"


def _fewer(problem: Problem, stages: int) -> str:
    """ "use at most K stages", K the most that the op structure allows (or just "fewer")."""
    relaxed = dataclasses.replace(problem, memory_limit=math.inf)
    for fewer in range(stages - 1, 0, -1):
        if not isinstance(solve(relaxed, fewer, math.inf, adaptive=False), Infeasible):
            return f"use at most {fewer} stage(s)"
    return "use fewer stages"


#: What to change when a value must reach past the next stage (a mask, a rotary table).
FAR_VALUE_FIX = (
    "compute it where it is used (inside the blocks), make it a buffer of the model, or "
    "use --backend torch_stages, whose stages hand any value on to any later stage"
)
#: What to change when a model input is read after the first stage.
FAR_INPUT_FIX = (
    "torch's pipelining hands the model's inputs to the first stage only: read it there, "
    "or use --backend torch_stages, whose stages hand the inputs on to the stage that "
    "reads them"
)


def _far_fix(far: FarValue) -> str:
    return FAR_INPUT_FIX if far.producer == INPUT else FAR_VALUE_FIX


def _far_value(problem: Problem, stages: int, costs: Costs) -> str:
    """``: for one, <the value> ...; <the fix>``: the value the best plan without the
    next-stage rule sends furthest, or nothing."""
    free = dataclasses.replace(problem, last_use=None, memory_limit=math.inf)
    result = solve(free, stages, math.inf, adaptive=False)
    far = None if isinstance(result, Infeasible) else far_reaching_value(costs, result.cuts)
    return "" if far is None else f": for one, {far.describe(costs)}; {_far_fix(far)}"


def _dataflow_note(
    cache: PlanCache,
    problem: Problem,
    stages: int,
    cuts: tuple[int, ...],
    step: Callable[..., float],
) -> str | None:
    """A note when the next-stage rule is what holds the plan back: the plan without it
    (same constraints otherwise) predicts a faster step. It names the value that plan
    would send too far, and what to change."""
    if problem.last_use is None:
        return None
    free = dataclasses.replace(problem, last_use=None)
    result = solve(free, stages, math.inf, adaptive=True)
    if isinstance(result, Infeasible):
        return None
    costs = cache.costs
    far = far_reaching_value(costs, result.cuts)
    held, freed = step(cuts), step(result.cuts)
    if far is None or freed >= held * (1 - _FASTER_BY):
        return None
    return (
        f"the next-stage rule holds this plan back: {far.describe(costs)}, and torch's "
        f"traced pipelining sends a value only to the next stage; without that, the "
        f"predicted step would be {seconds(freed)} against {seconds(held)}. To lift it: "
        f"{_far_fix(far)}"
    )


#: How much faster a plan must be predicted for a note to point at it.
_FASTER_BY = 0.02


def _infeasible_error(
    result: Infeasible,
    problem: Problem,
    stages: int,
    config: SyncConfig,
    costs: Costs,
    origin: str,
    per_device: int = 1,
) -> InfeasibleError:
    if result.constraint == "stages":
        message = (
            f"no {stages}-stage plan exists with at least {config.min_sync_interval} op(s) per "
            f"stage (min_sync_interval) using only the {int(problem.admissible.sum())} admissible "
            f"cut(s) and keeping the {int(problem.pinned.sum())} pinned one(s); "
            f"{_fewer(problem, stages)}, a smaller min_sync_interval, or allow more cuts"
        )
    elif result.constraint == "dataflow":
        message = (
            f"no {stages}-stage plan keeps every value within the next stage of where it is "
            "made: torch.distributed.pipelining cannot send one stage's output to two later "
            "stages, nor past a stage in between, and values used far from where they are made "
            f"(skip connections) leave too few such cuts{_far_value(problem, stages, costs)}; "
            f"{_fewer(problem, stages)}"
        )
    elif result.constraint == "memory":
        limit = costs.hardware.device_memory_bytes
        assert limit is not None and result.needed is not None
        if per_device == 1:
            message = (
                f"no {stages}-stage plan fits in device memory {num_bytes(limit)} "
                f"(hardware.device_memory_bytes): the best plan needs {num_bytes(result.needed)} "
                "on its fullest device; use more stages or a device with more memory"
            )
        else:
            message = (
                f"no {stages}-stage plan fits in device memory {num_bytes(limit)} "
                f"(hardware.device_memory_bytes) with {per_device} stages per device, each "
                f"within its share of {num_bytes(limit / per_device)}: the best plan's fullest "
                f"stage needs {num_bytes(result.needed)}; use fewer stages per device, more "
                "devices, or a device with more memory"
            )
    else:
        needed = result.needed
        hint = (
            f"the least threshold that admits a plan is {percent(needed)} (--threshold {needed:.6g})"
            if needed is not None and math.isfinite(needed)
            else "no finite threshold admits one (some stage would have no compute)"
        )
        message = (
            f"no {stages}-stage plan keeps every sync point's communication within "
            f"{percent(config.communication_cost_threshold)} of the compute of the stage it "
            f"closes (communication_cost_threshold, strategy fixed); {hint}, or use "
            "--strategy adaptive"
        )
    return InfeasibleError(message, result.constraint, origin)


# --- assembling ------------------------------------------------------------------


def default_microbatches(stages: int, batch_size: int, min_size: int = 1) -> int:
    """Up to four micro-batches per stage (a bubble under 20% for 1F1B): the largest
    divisor of the batch that is at most ``4 * stages``, so that every micro-batch is
    the same size, as ``syncpass run`` cuts them, and that leaves micro-batches of at
    least ``min_size`` samples (what the model's batch norms take: Costs.min_microbatch_size);
    1 when none does."""
    return max(
        (
            d
            for d in range(1, min(batch_size, 4 * stages) + 1)
            if batch_size % d == 0 and batch_size // d >= min_size
        ),
        default=1,
    )


def microbatch_counts(batch_size: int, min_size: int) -> tuple[int, ...]:
    """The micro-batch counts that cut ``batch_size`` into equal micro-batches of at
    least ``min_size`` samples."""
    return tuple(
        d for d in range(1, batch_size + 1) if batch_size % d == 0 and batch_size // d >= min_size
    )


def _samples(count: int) -> str:
    return f"{count} sample" + ("" if count == 1 else "s")


def raised_microbatches_note(
    plain: int, chosen: int, batch_size: int, min_size: int, by: str | None
) -> str | None:
    """What a report says when the default micro-batch count went down from ``plain``
    to ``chosen`` for micro-batches of ``min_size`` samples (``by`` needs them), else
    ``None``: "8 micro-batches would give 1 sample each; layer4.1.bn2 needs at least 2:
    using 4"."""
    if chosen >= plain or by is None:
        return None
    return (
        f"{plain} micro-batches would give {_samples(batch_size // plain)} each; {by}, a batch "
        f"norm in training, needs at least {min_size} (more than one value per channel): "
        f"using {chosen}"
    )


def small_microbatches_error(
    count: int,
    batch_size: int,
    min_size: int,
    by: str | None,
    at_least: int = 1,
    flag: str = "--microbatches",
) -> SyncpassError | None:
    """The refusal of an asked ``count`` whose micro-batches hold fewer than ``min_size``
    samples (``by`` needs them), naming the counts that work (of those the schedule takes:
    ``at_least``, 1F1B's one per stage); ``None`` when it fits."""
    if batch_size % count or batch_size // count >= min_size or by is None:
        return None
    works = [d for d in microbatch_counts(batch_size, min_size) if d >= at_least]
    if works:
        listed = ", ".join(map(str, works[:-1])) + (" or " if len(works) > 1 else "")
        hint = f"use {flag} {listed}{works[-1]}"
    else:
        hint = (
            f"no count of at least {at_least} gives micro-batches that large: use a larger "
            "batch, fewer stages or --schedule gpipe"
        )
    return SyncpassError(
        f"{flag} {count} cuts the batch of {batch_size} into micro-batches of "
        f"{_samples(batch_size // count)}; {by}, a batch norm in training, needs at least "
        f"{min_size} (more than one value per channel, or torch stops with 'Expected more "
        f"than 1 value per channel when training'): {hint}"
    )


def predict(
    costs: Costs,
    problem: Problem,
    cuts: tuple[int, ...],
    microbatches: int,
    schedule: str,
    order: ScheduleOrder | None = None,
) -> Prediction:
    """Simulated step of the plan with ``cuts`` under ``schedule``: with one stage per
    device by :func:`simulate`, else by :func:`simulate_order` over ``order``."""
    loads, links = _loads_and_links(costs, cuts, problem.num_ops)
    if order is not None:
        return simulate_order(loads, links, order)
    return simulate(loads, links, microbatches, schedule, costs.training)


def timed_step(plan: Plan, cache: PlanCache) -> Prediction:
    """``plan``'s simulated step with what each device ran and when
    (:attr:`Prediction.actions`, transfers included), for a plan made with ``cache``: the
    step :func:`predict` gave the plan, every action kept."""
    cache = cache.for_plan(plan)
    costs = cache.costs
    if tuple(op for stage in plan.stages for op in stage.ops) != tuple(op.id for op in costs.ops):
        raise ValueError("the plan was not made from these costs")
    cuts = tuple(itertools.accumulate(len(stage.ops) for stage in plan.stages[:-1]))
    if plan.schedule in MULTI_STAGE_SCHEDULES:
        order = cache.order(plan.schedule, plan.devices, plan.stages_per_device, plan.microbatches)
    else:  # simulated as simulate() does, action by action
        order = single_stage_order(
            plan.schedule, plan.devices, 1, plan.microbatches, costs.training
        )
    loads, links = _loads_and_links(costs, cuts, len(costs.ops))
    return simulate_order(loads, links, order, record=True)


def _loads_and_links(
    costs: Costs, cuts: tuple[int, ...], num_ops: int
) -> tuple[tuple[StageLoad, ...], tuple[Link, ...]]:
    """Each stage's work and each sync point's link, the stages ending at ``cuts`` (and the
    last at ``num_ops``, the costs' op count)."""
    bounds = (0, *cuts, num_ops)
    training = costs.training
    crossing = costs.crossing_at
    loads = tuple(
        StageLoad(
            # A stage computes again what it does not receive (Costs.crossing).
            forward_s=sum(op.compute_s for op in costs.ops[start:end])
            + (crossing[start].recompute_s if start else 0.0),
            backward_s=sum(op.backward_s for op in costs.ops[start:end]) if training else 0.0,
            forward_fixed_s=sum(op.fixed_s for op in costs.ops[start:end]),
            backward_fixed_s=sum(op.backward_fixed_s for op in costs.ops[start:end])
            if training
            else 0.0,
            overhead_s=costs.hardware.stage_overhead_s,
            input_gradient_s=sum(op.input_gradient_s() for op in costs.ops[start:end])
            if training
            else 0.0,
        )
        for start, end in itertools.pairwise(bounds)
    )
    links = tuple(
        Link(
            alpha_s=costs.hardware.alpha_s,
            beta_bytes_per_s=costs.hardware.beta_bytes_per_s,
            batch_bytes=crossing[cut].forward_bytes,
            grad_bytes=crossing[cut].backward_bytes,
            backward=crossing[cut].backward,
            meet_stall_s=costs.hardware.meet_stall_s,
            meet_window_s=costs.hardware.meet_window_s,
        )
        for cut in cuts
    )
    return loads, links


def _assemble(
    cache: PlanCache,
    problem: Problem,
    request: PlanRequest,
    strategy: str,
    cuts: tuple[int, ...],
    score: PlanScore,
    threshold: Threshold,
    notes: list[str],
) -> Plan:
    costs = cache.costs
    stages = len(cuts) + 1
    per_device = request.per_device
    microbatches = request.microbatches or default_microbatches(
        stages // per_device, costs.batch_size, costs.min_microbatch_size
    )
    if microbatches > costs.batch_size:
        raise SyncpassError(
            f"{microbatches} micro-batches do not fit a batch of {costs.batch_size}; "
            f"use at most {costs.batch_size}"
        )
    if request.microbatches is not None:
        too_small = small_microbatches_error(
            microbatches,
            costs.batch_size,
            costs.min_microbatch_size,
            costs.min_microbatch_by,
            stages if request.schedule == "1f1b" and costs.training else 1,
        )
        if too_small is not None:
            raise too_small
    else:
        raised = raised_microbatches_note(
            default_microbatches(stages // per_device, costs.batch_size),
            microbatches,
            costs.batch_size,
            costs.min_microbatch_size,
            costs.min_microbatch_by,
        )
        notes = notes if raised is None else [*notes, raised]
    if request.schedule == "1f1b" and costs.training and microbatches < stages:
        raise InfeasibleError(
            f"1F1B needs at least as many micro-batches as stages ({stages}), got "
            f"{microbatches}; use --microbatches {stages} or more, or --schedule gpipe",
            "microbatches",
        )
    prediction = cache.predict(problem, cuts, microbatches, request.schedule, per_device)
    shared = _shared_devices_note(costs, prediction)
    if shared is not None:
        notes = [*notes, shared]
    meeting = _meeting_posts_note(costs, prediction)
    if meeting is not None:
        notes = [*notes, meeting]
    placement = stage_devices(request.schedule, stages // per_device, per_device)
    live = costs.live_bytes_at
    reasons = explain_sync_points(costs, problem, cuts, score, threshold.used)
    kinds_after = {cut.after: cut.kinds for cut in costs.cuts if cut.kinds}
    sync_points = tuple(
        SyncPoint(
            after=costs.ops[cut - 1].id,
            live_bytes=live[cut],
            comm_s=float(problem.cut_comm[cut]),
            ratio=score.stages[index].cut_ratio,
            pinned=bool(problem.pinned[cut]),
            reason=reasons[index],
            kinds=kinds_after.get(costs.ops[cut - 1].id, ()),
            recomputed=costs.crossing_at[cut].recomputed,
        )
        for index, cut in enumerate(cuts)
    )
    stage_plans = tuple(
        StagePlan(
            index=index,
            ops=tuple(op.id for op in costs.ops[stage.start : stage.end]),
            compute_s=stage.compute,
            comm_in_s=stage.comm_in,
            comm_out_s=stage.comm_out,
            time_s=stage.time,
            memory_bytes=stage.memory,
            sync_s=prediction.stages[placement[index]].sync_s,
            idle_s=prediction.stages[placement[index]].idle_s,
            device=placement[index],
        )
        for index, stage in enumerate(score.stages)
    )
    violations: list[str] = []
    if strategy not in OPTIMISING_STRATEGIES:  # the optimiser's plans are legal by construction
        violations = broken_constraints(
            problem,
            cuts,
            request.config.communication_cost_threshold,
            [op.id for op in costs.ops],
        )
    return Plan(
        strategy=strategy,
        batch_size=costs.batch_size,
        training=costs.training,
        schedule=request.schedule,
        microbatches=microbatches,
        min_sync_interval=request.config.min_sync_interval,
        threshold=threshold,
        sync_points=sync_points,
        stages=stage_plans,
        bottleneck_s=score.bottleneck,
        total_comm_s=score.total_comm,
        predicted_step_s=prediction.step_s,
        comm_wait_ratio=prediction.comm_wait_ratio,
        bubble_ratio=prediction.bubble_ratio,
        violations=tuple(violations),
        notes=tuple(notes),
        hardware=costs.hardware.name,
        model=costs.model,
        model_settings=costs.model_settings,
        stages_per_device=per_device,
        shared_step_s=shared_step(costs, prediction),
    )

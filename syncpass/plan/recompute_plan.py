"""A pipeline plan that also chooses which blocks recompute their activations
(``syncpass plan --recompute auto|all|none``), from a cost file, with its report.

The memory of a stage here counts activations as the schedule keeps them: the weights'
memory (``memory_multiplier * param_bytes``) plus, for each micro-batch in flight on the
stage (1F1B: ``min(S - k, M)`` on stage ``k``; other schedules: all ``M``), each op's saved
activations for one micro-batch (``saved_bytes / M``; ``out_bytes`` where a cost file has
no ``saved_bytes``), or only the inputs its checkpoint keeps (``input_bytes / M``) when
it recomputes, which adds its forward (a step's) to its stage's time.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from syncpass.contracts.costs import Costs
from syncpass.core.errors import SyncpassError
from syncpass.core.units import num_bytes as format_bytes
from syncpass.core.units import percent
from syncpass.core.units import seconds as format_seconds
from syncpass.plan.optimizer import Infeasible
from syncpass.plan.planner import (
    Checkpointed,
    Plan,
    PlanCache,
    PlanRequest,
    Threshold,
    auto_stage_limit,
    default_microbatches,
    make_plan,
)
from syncpass.plan.problem import problem_from_costs
from syncpass.plan.recompute import (
    RecomputeProblem,
    RecomputeSolution,
    in_flight_counts,
    solve_recompute,
)
from syncpass.plan.strategies import op_layers

#: What ``--recompute`` takes: choose per block, recompute every block, recompute none.
RECOMPUTE_MODES = ("auto", "all", "none")


@dataclass(frozen=True)
class RecomputePlan:
    """The plan of ``mode`` and the two it is compared with, each a solution or why none
    fits; ``candidates`` are the op ids that may recompute, ``recomputing`` those that do
    already as written."""

    mode: str
    stages: int
    microbatches: int
    schedule: str
    in_flight: tuple[int, ...]
    memory_limit: float | None
    candidates: tuple[str, ...]
    recomputing: tuple[str, ...]
    plans: tuple[tuple[str, RecomputeSolution | Infeasible], ...]  # (mode, result)

    @property
    def chosen(self) -> RecomputeSolution | Infeasible:
        return dict(self.plans)[self.mode]


def recompute_problem(costs: Costs, request: PlanRequest, microbatches: int) -> RecomputeProblem:
    """The optimiser's instance for ``costs``: which ops may recompute (the ops of a layer
    stack with measured saved and input bytes, storing more than their checkpoint would
    keep, not already recomputing as written; any such op when the model has no stack)."""
    if request.stages is None:
        raise SyncpassError("--recompute needs a stage count (--stages S)")
    base = problem_from_costs(
        costs,
        request.config,
        request.pinned,
        microbatches,
        request.carries_values,
        request.refused_kinds,
        request.per_device,
    )
    weights = np.array([costs.memory_multiplier * op.param_bytes for op in costs.ops], float)
    base = dataclasses.replace(base, op_memory=weights)
    activation = np.array(
        [(op.out_bytes if op.saved_bytes is None else op.saved_bytes) for op in costs.ops], float
    )
    kept = np.array([op.input_bytes or 0.0 for op in costs.ops], float)
    layers = op_layers(costs)
    stacked = len({layer for layer in layers if layer is not None}) >= 2
    candidate = np.array(
        [
            op.saved_bytes is not None
            and op.input_bytes is not None
            and not op.recomputes
            and op.saved_bytes > op.input_bytes
            and (layer is not None or not stacked)
            for op, layer in zip(costs.ops, layers, strict=True)
        ]
    )
    stages = request.stages * request.per_device
    return RecomputeProblem(
        base=base,
        activation=activation / microbatches,
        kept=np.minimum(kept, activation) / microbatches,
        recompute_s=np.array([op.forward_step_s(microbatches) for op in costs.ops], float),
        candidate=candidate,
        in_flight=np.array(in_flight_counts(request.schedule, stages, microbatches)),
    )


def plan_recompute(costs: Costs, request: PlanRequest, mode: str) -> RecomputePlan:
    """The exact plan recomputing as ``mode`` says, beside recomputing nothing and every
    candidate block."""
    if mode not in RECOMPUTE_MODES:
        raise SyncpassError(f"--recompute takes {', '.join(RECOMPUTE_MODES)}, not {mode!r}")
    if request.stages is None:
        raise SyncpassError("--recompute needs a stage count (--stages S)")
    stages = request.stages * request.per_device
    microbatches = request.microbatches or default_microbatches(
        stages, costs.batch_size, costs.min_microbatch_size
    )
    problem = recompute_problem(costs, request, microbatches)
    threshold = request.config.communication_cost_threshold
    adaptive = request.config.strategy == "adaptive"
    variants = {
        "auto": problem,
        "none": problem.without_choice(),
        "all": problem.every_candidate(),
    }
    plans = []
    for name in (mode, *(other for other in RECOMPUTE_MODES if other != mode)):
        found = solve_recompute(variants[name], threshold, adaptive)
        if name == "all" and isinstance(found, RecomputeSolution):
            # Every candidate of each stage recomputes; say so.
            bounds = (0, *found.cuts, len(costs.ops))
            found = dataclasses.replace(
                found,
                recomputed=tuple(
                    tuple(t for t in range(start, end) if problem.candidate[t])
                    for start, end in itertools.pairwise(bounds)
                ),
                total_recompute=float(
                    sum(problem.recompute_s[t] for t in np.flatnonzero(problem.candidate))
                ),
            )
        plans.append((name, found))
    ids = [op.id for op in costs.ops]
    return RecomputePlan(
        mode=mode,
        stages=stages,
        microbatches=microbatches,
        schedule=request.schedule,
        in_flight=tuple(int(count) for count in problem.in_flight),
        memory_limit=costs.hardware.device_memory_bytes,
        candidates=tuple(ids[t] for t in np.flatnonzero(problem.candidate)),
        recomputing=tuple(op.id for op in costs.ops if op.recomputes),
        plans=tuple(plans),
    )


def recompute_stage_count(
    costs: Costs, request: PlanRequest, mode: str, max_stages: int, origin: str = ""
) -> tuple[PlanRequest, Plan, RecomputePlan]:
    """``--stages auto`` with ``--recompute mode``: of 1 to
    :func:`~syncpass.plan.planner.auto_stage_limit`'s limit, the stage count whose plan
    (recomputing as ``mode`` chooses) predicts the least step: ``request`` at that count,
    its plan (:func:`plan_with_recompute`; the last note says why, with each count's
    predicted step) and the choice behind it. A count no plan fits (memory, micro-batches)
    is passed over, and named."""
    limit = auto_stage_limit(costs, max_stages, request.per_device)
    tried: list[tuple[int, Plan, RecomputePlan]] = []
    refused: list[int] = []
    for count in range(1, limit + 1):
        try:
            plan, found = plan_with_recompute(
                costs, dataclasses.replace(request, stages=count), mode, origin
            )
        except SyncpassError:
            refused.append(count)
            continue
        tried.append((count, plan, found))
    if not tried:
        raise SyncpassError(
            f"--stages auto --recompute {mode}: no plan of 1 to {limit} stage(s) fits", origin
        )
    best, plan, found = min(tried, key=lambda entry: entry[1].predicted_step_s)
    steps = ", ".join(f"{count}: {format_seconds(p.predicted_step_s)}" for count, p, _ in tried)
    note = (
        f"--stages auto: {best} stage(s) predict the least step "
        f"({format_seconds(plan.predicted_step_s)}) recomputing as --recompute {mode} chooses; "
        f"predicted step by stage count: {steps}"
        + (f"; no plan fits at {', '.join(map(str, refused))}" if refused else "")
    )
    plan = dataclasses.replace(plan, notes=(*plan.notes, note))
    return dataclasses.replace(request, stages=best), plan, found


def with_recomputation(costs: Costs, recomputed: Collection[str]) -> Costs:
    """``costs`` with the ops named in ``recomputed`` checkpointed: each runs its forward
    again in its backward (the input-gradient part too, which waits for it) and keeps only
    its inputs, as ``torch.utils.checkpoint.checkpoint`` does."""
    ops = tuple(
        dataclasses.replace(
            op,
            backward_s=op.backward_s + op.compute_s,
            backward_fixed_s=op.backward_fixed_s + op.fixed_s,
            backward_input_s=op.input_gradient_s() + op.compute_s,
            saved_bytes=op.input_bytes,
            recomputes=True,
        )
        if op.id in recomputed and not op.recomputes
        else op
        for op in costs.ops
    )
    return dataclasses.replace(costs, ops=ops)


def plan_with_recompute(
    costs: Costs,
    request: PlanRequest,
    mode: str,
    origin: str = "",
    found: RecomputePlan | None = None,
) -> tuple[Plan, RecomputePlan]:
    """The plan ``rewrite --recompute MODE`` writes: the cuts and the ops to recompute of
    :func:`plan_recompute`, as a :class:`Plan` whose stages pay each chosen op's forward
    again in their backward (their times, the simulated step) and whose stages' memory is
    the memory model of the module docstring; :attr:`Plan.checkpointed` names the ops,
    what each frees and costs; ``found``: :func:`plan_recompute`'s result for ``request``
    when the caller has it. Raises :class:`SyncpassError` when no plan fits."""
    if costs.groups:
        raise SyncpassError(
            "--recompute plans the ops as the cost file lists them, and this one groups "
            "nested nn.Sequential children (profiled with --depth 2); profile at --depth 1"
        )
    if found is None:
        found = plan_recompute(costs, request, mode)
    chosen = found.chosen
    if isinstance(chosen, Infeasible):
        raise SyncpassError(f"--recompute {mode}: {_why_not(mode, chosen)}", origin)
    problem = recompute_problem(costs, request, found.microbatches)
    recomputed = {t: place for place, ops in enumerate(chosen.recomputed) for t in ops}
    ids = [op.id for op in costs.ops]
    # Memory is this module's to check (activations in flight), so the cut planner sees no
    # limit.
    unlimited = dataclasses.replace(costs.hardware, device_memory_bytes=None)
    recomputing = dataclasses.replace(
        with_recomputation(costs, {ids[t] for t in recomputed}), hardware=unlimited
    )
    pinned = tuple(ids[cut - 1] for cut in chosen.cuts)
    requested = request.config.communication_cost_threshold
    used = max(chosen.threshold_used, requested)
    config = request.config.replace(strategy="manual", communication_cost_threshold=used)
    manual = dataclasses.replace(
        request, config=config, pinned=pinned, microbatches=found.microbatches
    )
    plan = make_plan(recomputing, manual, origin, PlanCache(recomputing))
    bounds = (0, *chosen.cuts, len(ids))
    stages = tuple(
        dataclasses.replace(
            stage,
            memory_bytes=problem.stage_memory(
                start, end, place, frozenset(chosen.recomputed[place])
            ),
        )
        for place, (stage, (start, end)) in enumerate(
            zip(plan.stages, itertools.pairwise(bounds), strict=True)
        )
    )
    checkpointed = tuple(
        Checkpointed(
            op=ids[t],
            stage=place,
            frees_bytes=float(found.in_flight[place])
            * float(problem.activation[t] - problem.kept[t]),
            cost_s=float(problem.recompute_s[t]),
        )
        for t, place in sorted(recomputed.items())
    )
    notes = [note for note in plan.notes if not note.startswith("manual")]
    notes += _why_recompute(found, problem, chosen, ids)
    plan = dataclasses.replace(
        plan,
        strategy=request.config.strategy,
        threshold=Threshold(requested, used),
        stages=stages,
        checkpointed=checkpointed,
        notes=tuple(notes),
        hardware=costs.hardware.name,
    )
    return plan, found


def _why_recompute(
    plan: RecomputePlan, problem: RecomputeProblem, chosen: RecomputeSolution, ids: list[str]
) -> list[str]:
    """A note per stage that recomputes: what storing everything would need, and the cost."""
    limit = "no limit" if plan.memory_limit is None else format_bytes(plan.memory_limit)
    bounds = (0, *chosen.cuts, len(ids))
    notes = []
    for place, chosen_ops in enumerate(chosen.recomputed):
        if not chosen_ops:
            continue
        start, end = bounds[place], bounds[place + 1]
        stored = problem.stage_memory(start, end, place, frozenset())
        spent = sum(float(problem.recompute_s[t]) for t in chosen_ops)
        if plan.mode == "all":
            why = "--recompute all recomputes every block"
        else:
            why = (
                f"storing every activation needs {format_bytes(stored)} for "
                f"{plan.in_flight[place]} micro-batch(es) in flight, over {limit}; these cost "
                "the least time recomputed of the choices that fit"
            )
        notes.append(
            f"stage {place} recomputes {_listed([ids[t] for t in chosen_ops])} "
            f"({format_seconds(spent)}/step): {why}"
        )
    return notes


_NAMES = {
    "auto": "recompute chosen",
    "none": "recompute nothing",
    "all": "recompute every block",
}


def render_recompute(plan: RecomputePlan, costs: Costs, problem: RecomputeProblem) -> str:
    """The report: the chosen plan's stages (ops, time, memory, what recomputes and why),
    then the three plans side by side."""
    ids = [op.id for op in costs.ops]
    limit = "no limit" if plan.memory_limit is None else format_bytes(plan.memory_limit)
    lines = [
        f"syncpass plan --recompute {plan.mode}: {plan.stages} stage(s), {plan.microbatches} "
        f"micro-batch(es), {plan.schedule} keeps {', '.join(map(str, plan.in_flight))} "
        f"in flight per stage; device memory {limit}",
    ]
    if plan.recomputing:
        lines.append(f"already recomputing as written (kept so): {_listed(plan.recomputing)}")
    if not plan.candidates:
        lines.append(
            "no op may recompute: none has measured saved_bytes above what its checkpoint "
            "would keep (profile again with this syncpass for saved_bytes and input_bytes)"
        )
    chosen = plan.chosen
    if isinstance(chosen, Infeasible):
        lines.append(_why_not(plan.mode, chosen))
    else:
        bounds = (0, *chosen.cuts, len(ids))
        spans = [
            f"{ids[start]} .. {ids[end - 1]}" if end - start > 1 else ids[start]
            for start, end in itertools.pairwise(bounds)
        ]
        wide = max(27, *map(len, spans))  # the ops column as wide as its longest span
        lines.append(f"stage  {'ops':<{wide}}  {'time':>8}  {'memory':>10}  recomputes")
        for place, (start, end) in enumerate(itertools.pairwise(bounds)):
            ops = spans[place]
            recomputed = frozenset(chosen.recomputed[place])
            extra = sum(float(problem.recompute_s[t]) for t in recomputed)
            memory = _memory(problem, start, end, place, recomputed, plan.mode == "all")
            time = problem.base.stage_time(start, end) + extra
            named = _listed([ids[t] for t in sorted(recomputed)]) if recomputed else "-"
            lines.append(
                f"{place:<5}  {ops:<{wide}}  {format_seconds(time):>8}  {format_bytes(memory):>10}"
                f"  {named}"
            )
        for place, chosen_ops in enumerate(chosen.recomputed):
            if chosen_ops and plan.mode == "auto":
                start, end = bounds[place], bounds[place + 1]
                stored = problem.stage_memory(start, end, place, frozenset())
                spent = sum(float(problem.recompute_s[t]) for t in chosen_ops)
                lines.append(
                    f"  stage {place} recomputes {len(chosen_ops)} block(s): storing them all "
                    f"needs {format_bytes(stored)} for {plan.in_flight[place]} micro-batch(es) "
                    f"in flight, over {limit}; these cost the least time recomputed "
                    f"({format_seconds(spent)}) of the choices that fit"
                )
    lines.append("compared:")
    for name, found in plan.plans:
        if isinstance(found, Infeasible):
            lines.append(f"  {_NAMES[name]:<22} {_why_not(name, found)}")
        else:
            count = sum(len(ops) for ops in found.recomputed)
            # The threshold ranks before the bottleneck: a faster plan whose sync points
            # need it raised loses to one that keeps them within it.
            chosen = plan.chosen
            raised = (
                f"; its sync points need the threshold at {percent(found.threshold_used)}, "
                f"over the chosen plan's {percent(chosen.threshold_used)}"
                if isinstance(chosen, RecomputeSolution)
                and found.threshold_used > chosen.threshold_used * (1 + 1e-9)
                else ""
            )
            lines.append(
                f"  {_NAMES[name]:<22} bottleneck {format_seconds(found.bottleneck)}, "
                f"{count} block(s) recomputed ({format_seconds(found.total_recompute)}/step), "
                f"sync points after {', '.join(ids[cut - 1] for cut in found.cuts) or '-'}"
                f"{raised}"
            )
    return "\n".join(lines) + "\n"


def _memory(
    problem: RecomputeProblem,
    start: int,
    end: int,
    place: int,
    recomputed: frozenset[int],
    every: bool,
) -> float:
    if every:
        recomputed = frozenset(t for t in range(start, end) if problem.candidate[t])
    return problem.stage_memory(start, end, place, recomputed)


def _why_not(mode: str, found: Infeasible) -> str:
    if found.constraint == "memory":
        needed = "" if found.needed is None else f" (it needs {format_bytes(found.needed)})"
        if mode == "none":
            return f"no plan fits the device's memory storing every activation{needed}"
        return f"no plan fits the device's memory even recomputing every block{needed}"
    return f"no plan: the {found.constraint} constraint rules every plan out"


def _listed(names: list[str] | tuple[str, ...]) -> str:
    if len(names) <= 6:
        return ", ".join(names)
    return f"{', '.join(names[:3])}, ... {names[-1]} ({len(names)})"


@dataclass(frozen=True)
class StageMemory:
    """A stage's memory as the model of this module counts it: ``weights`` (parameters
    times the multiplier: weights, gradients, optimizer state) and ``activations`` (saved
    per micro-batch in flight, or only the inputs of the ops that recompute)."""

    weights: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.activations


def stage_memory_model(
    costs: Costs,
    cuts: tuple[str, ...],
    recomputed: frozenset[str],
    schedule: str,
    microbatches: int,
    memory_multiplier: float | None = None,
) -> tuple[StageMemory, ...]:
    """Each stage's memory for the sync points after the ops ``cuts``, the ops
    ``recomputed`` recomputing, as ``plan --recompute`` counts it (``memory_multiplier``:
    the cost file's unless given)."""
    ids = [op.id for op in costs.ops]
    # A cut after a nested group (trunk_output.2, planned whole) is after its last op.
    last_of = {group.id: group.ops[-1] for group in costs.groups}
    bounds = (0, *sorted(ids.index(last_of.get(cut, cut)) + 1 for cut in cuts), len(ids))
    flight = in_flight_counts(schedule, len(bounds) - 1, microbatches)
    multiplier = costs.memory_multiplier if memory_multiplier is None else memory_multiplier
    found = []
    for place, (start, end) in enumerate(itertools.pairwise(bounds)):
        weights = activations = 0.0
        for op in costs.ops[start:end]:
            weights += multiplier * op.param_bytes
            saved = op.out_bytes if op.saved_bytes is None else op.saved_bytes
            kept = min(op.input_bytes or 0.0, saved) if op.id in recomputed else saved
            activations += flight[place] * kept / microbatches
        found.append(StageMemory(weights, activations))
    return tuple(found)

"""From a tensor graph to a :class:`~syncpass.plan.tensor_plan.TensorPlan`: check the
request, solve, explain each collective, and score the hand placements beside it.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from syncpass.contracts.costs import Costs, Hardware
from syncpass.contracts.tensor import TensorGraph
from syncpass.core.errors import SyncpassError
from syncpass.core.units import seconds
from syncpass.plan.collectives import ALL_REDUCE, collective_s
from syncpass.plan.tensor_baselines import megatron_layouts
from syncpass.plan.tensor_optimizer import (
    Evaluation,
    Link,
    NoTensorPlan,
    TensorProblem,
    evaluate,
    layouts,
    solve,
)
from syncpass.plan.tensor_plan import OpLayout, PlanCost, PlannedCollective, TensorPlan, family
from syncpass.plan.tensor_rules import STATE_NAMES, Mode, contribution


@dataclass(frozen=True)
class TensorRequest:
    """What to plan: ``tp`` devices; ``sequence_parallel`` lets values between the split
    layers be split again (on the sequence, or on features); ``baselines`` scores
    Megatron's and the replicated placement; ``explain`` prices each layout around a
    collective against its alternatives (one solve per distinct op)."""

    tp: int
    sequence_parallel: bool = True
    baselines: bool = True
    explain: bool = True
    #: op id -> the layouts it may take (what a rewrite can write); unlisted ops take any.
    allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()


def check_tensor_request(graph: TensorGraph, tp: int, devices: int | None = None) -> None:
    """A request the plan cannot be made for is a :class:`SyncpassError` saying why."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise SyncpassError(f"--tp must be a whole number of devices >= 1, got {tp!r}")
    for op in graph.ops:
        if op.kind == "attention" and op.heads is not None and op.heads % tp:
            divisors = [n for n in range(1, op.heads + 1) if op.heads % n == 0]
            raise SyncpassError(
                f"--tp {tp} does not divide the {op.heads} heads of {op.id} "
                f"({op.where()}); tensor parallelism splits attention by heads: "
                f"use one of {', '.join(map(str, divisors))}"
            )
    if devices is not None and tp > devices:
        raise SyncpassError(
            f"--tp {tp} needs {tp} devices and the hardware has {devices}; plan for other "
            "hardware with --hardware (e.g. nvlink-8xh100) or a smaller --tp"
        )


def link_for(hardware: Hardware) -> Link:
    """The group's link for collectives and device memory from a hardware profile: its
    collectives' own latency and bandwidth where calibrated, else the point-to-point
    link's."""
    alpha = hardware.collective_alpha_s
    beta = hardware.collective_beta_bytes_per_s
    return Link(
        hardware.alpha_s if alpha is None else alpha,
        hardware.beta_bytes_per_s if beta is None else beta,
        hardware.device_memory_bytes,
    )


def retarget_tensor_graph(
    graph: TensorGraph, *, compute_scale: float = 1.0, batch_size: int | None = None
) -> TensorGraph:
    """``graph`` with compute scaled by ``compute_scale`` (another device's speed), and
    compute and activation bytes scaled linearly to ``batch_size``."""
    batch = batch_size or graph.batch_size
    scale = batch / graph.batch_size
    if compute_scale == 1.0 and scale == 1.0:
        return graph
    ops = tuple(
        dataclasses.replace(
            op,
            out_bytes=op.out_bytes * scale if op.tokens else op.out_bytes,
            compute_s=op.compute_s * scale * compute_scale,
            backward_s=op.backward_s * scale * compute_scale,
        )
        for op in graph.ops
    )
    return dataclasses.replace(graph, ops=ops, batch_size=batch)


def tensor_graph_of(costs: Costs, measured: Costs | None = None) -> TensorGraph:
    """The cost file's tensor graph, re-targeted as ``costs`` were from ``measured`` (the
    file as read): compute by the ratio of FLOP rates, sizes to the batch."""
    graph = costs.tensor if measured is None else measured.tensor
    if graph is None:
        raise SyncpassError(
            "this cost file has no tensor graph ($.tensor), which --strategy tensor plans "
            "from; record one with syncpass.backends.torch.tensor_record.record_tensor_graph "
            "(see docs/tensor.md)"
        )
    scale = 1.0
    if measured is not None:
        was, now = measured.hardware.flops_per_s, costs.hardware.flops_per_s
        if was is not None and now is not None:
            scale = was / now
    return retarget_tensor_graph(graph, compute_scale=scale, batch_size=costs.batch_size)


def plan_tensor(
    graph: TensorGraph,
    link: Link,
    request: TensorRequest,
    *,
    training: bool = True,
    memory_multiplier: float = 4.0,
    hardware: str | None = None,
    model: str | None = None,
    notes: tuple[str, ...] = (),
) -> TensorPlan:
    """The least-time tensor-parallel plan of ``graph`` on ``request.tp`` devices."""
    check_tensor_request(graph, request.tp)
    problem = TensorProblem(
        graph,
        request.tp,
        link,
        training=training,
        memory_multiplier=memory_multiplier,
        sequence_parallel=request.sequence_parallel,
        allowed=request.allowed,
    )
    try:
        best = solve(problem)
    except NoTensorPlan:
        whole = evaluate(problem, layouts(problem, {}))
        raise SyncpassError(
            f"no layout on {request.tp} devices fits the device memory "
            f"({_gib(link.memory_bytes)}; replicated needs {_gib(whole.memory_bytes)}): "
            "use more devices, a smaller batch, or --hardware with more memory"
        ) from None
    collectives = _collectives(problem, best)
    if request.explain:
        explain = _Explainer(problem, best)
        collectives = tuple(
            dataclasses.replace(item, why=explain.why(item)) for item in collectives
        )
    baselines: list[PlanCost] = []
    if request.baselines:
        baselines.append(_baseline(problem, "megatron", megatron_layouts(graph)))
        baselines.append(_baseline(problem, "replicated", {}))
    plan_notes = list(notes)
    if request.sequence_parallel and not any(
        "S" in (mode.output, *(use.state for use in mode.inputs)) for mode in best.modes
    ):
        plan_notes.append(
            "sequence parallelism was allowed and not chosen: splitting the values between "
            "the split layers would not pay for its collectives on this link"
        )
    return TensorPlan(
        tp=request.tp,
        batch_size=graph.batch_size,
        training=training,
        sequence_parallel=request.sequence_parallel,
        layouts=tuple(
            OpLayout(
                op=op.id,
                kind=op.kind,
                layout=mode.layout,
                reads=tuple(use.state for use in mode.inputs),
                output=mode.output,
                compute_s=problem.op_compute_s(position, mode),
                param_bytes=op.param_bytes / mode.param_divisor,
                source=op.source,
                module=op.module,
            )
            for position, (op, mode) in enumerate(zip(graph.ops, best.modes, strict=True))
        ),
        collectives=collectives,
        cost=_score("syncpass", best, collectives),
        baselines=tuple(baselines),
        hardware=hardware,
        model=model,
        memory_limit_bytes=link.memory_bytes,
        notes=(*graph.notes, *plan_notes),
    )


def _gib(value: float | None) -> str:
    return "unlimited" if value is None else f"{value / 2**30:.3g} GiB"


def _collectives(problem: TensorProblem, scored: Evaluation) -> tuple[PlannedCollective, ...]:
    """Every collective of ``scored``: those between ops in graph order (each value's
    forward one, then its backward one), then those ops run within themselves."""
    graph = problem.graph
    found: list[PlannedCollective] = []
    for item in scored.collectives:
        op = graph.op(item.value)
        readers = _readers(problem, scored, item.value, item.direction)
        found.append(
            PlannedCollective(
                kind=item.kind,
                direction=item.direction,
                value=item.value,
                source=item.source,
                target=item.target,
                bytes=item.bytes,
                time_s=item.time_s,
                where=op.where(),
                readers=readers,
            )
        )
    bucket_ops: list[str] = []
    for op, mode in zip(graph.ops, scored.modes, strict=True):
        for size in mode.internal_all_reduce_bytes:
            found.append(
                PlannedCollective(
                    kind=ALL_REDUCE,
                    direction="forward",
                    value=op.id,
                    source="P",
                    target="R",
                    bytes=size,
                    time_s=problem.collective_s(ALL_REDUCE, size),
                    where=op.where(),
                    within=op.id,
                    why=mode.why,
                )
            )
        if mode.grad_reduce_bytes and problem.training:
            bucket_ops.append(op.id)
    if bucket_ops:
        size = scored.grad_bucket_bytes
        steps = problem.tp - 1
        time_s = problem.bucket_latency_s() + 2 * steps / problem.tp * size / (
            problem.link.beta_bytes_per_s
        )
        found.append(
            PlannedCollective(
                kind=ALL_REDUCE,
                direction="backward",
                value="<weight gradients>",
                source="P",
                target="R",
                bytes=size,
                time_s=time_s,
                where="end of the backward",
                within=", ".join(bucket_ops),
                why=f"{len(bucket_ops)} op(s) run whole weights over their part of the "
                "sequence; their weights' gradients are summed in one bucket",
            )
        )
    return tuple(found)


def _readers(
    problem: TensorProblem, scored: Evaluation, value: str, direction: str
) -> tuple[str, ...]:
    """The readers of ``value`` a collective serves: forward, those that read it in
    another state than it is made in; backward, those whose gradient is not whole."""
    graph = problem.graph
    made = scored.modes[graph.index[value]].output
    found = []
    for reader in graph.consumers[value]:
        op = graph.op(reader)
        mode = scored.modes[graph.index[reader]]
        for name, use in zip(op.inputs, mode.inputs, strict=True):
            if name != value:
                continue
            served = use.state != made if direction == "forward" else contribution(made, use) != "R"
            if served:
                found.append(reader)
    if value in graph.outputs and made != "R":
        found.append("<output>")
    return tuple(dict.fromkeys(found))


def _score(name: str, scored: Evaluation, collectives: tuple[PlannedCollective, ...]) -> PlanCost:
    return PlanCost(
        name=name,
        step_s=scored.step_s,
        compute_s=scored.compute_s,
        comm_s=scored.comm_s,
        memory_bytes=scored.memory_bytes,
        fits=scored.fits,
        forward_collectives=sum(item.direction == "forward" for item in collectives),
        backward_collectives=sum(item.direction == "backward" for item in collectives),
    )


def _baseline(problem: TensorProblem, name: str, chosen: Mapping[str, str]) -> PlanCost:
    """A hand placement scored; when an op cannot take its layout (sizes that do not
    divide), it runs replicated and the note says so; when the result cannot run, the
    cost is infinite and the note says why."""
    fallbacks: list[str] = []
    picked: dict[str, str] = {}
    for op, modes in zip(problem.graph.ops, problem.modes, strict=True):
        wanted = chosen.get(op.id)
        if wanted is None:
            continue
        if any(mode.layout == wanted for mode in modes):
            picked[op.id] = wanted
        else:
            fallbacks.append(f"{op.id} cannot run {wanted}")
    note = "; ".join(fallbacks[:3]) + (" ..." if len(fallbacks) > 3 else "")
    try:
        scored = evaluate(problem, layouts(problem, picked))
    except ValueError as error:
        return PlanCost(name, float("inf"), 0.0, 0.0, 0.0, False, 0, 0, note or str(error))
    return dataclasses.replace(_score(name, scored, _collectives(problem, scored)), note=note)


class _Explainer:
    """Prices the layouts around each collective: the least step with that op forced to
    each other layout it can take, against the plan's (exact: one solve each; ops of
    repeated layers are priced once)."""

    def __init__(self, problem: TensorProblem, best: Evaluation) -> None:
        self.problem = problem
        self.best = best
        self.graph = problem.graph
        self._priced: dict[str, str] = {}

    def mode(self, op_id: str) -> Mode:
        return self.best.modes[self.graph.index[op_id]]

    def alternatives(self, op_id: str) -> str:
        group = family(op_id)
        if group in self._priced:
            return self._priced[group]
        position = self.graph.index[op_id]
        chosen = self.best.modes[position]
        parts = []
        for mode in self.problem.modes[position]:
            if mode.layout == chosen.layout:
                continue
            forced = dataclasses.replace(
                self.problem,
                allowed=(*self.problem.allowed, (op_id, (mode.layout,))),
            )
            try:
                other = solve(forced)
            except NoTensorPlan:
                parts.append(f"{mode.layout} does not fit")
                continue
            parts.append(f"{mode.layout} +{seconds(other.step_s - self.best.step_s)}")
        text = ", ".join(parts) if parts else "no other layout"
        self._priced[group] = text
        return text

    def describe(self, op_id: str) -> str:
        mode = self.mode(op_id)
        reason = f": {mode.why}" if mode.why else ""
        return f"{op_id} {mode.layout}{reason} (best step with it {self.alternatives(op_id)})"

    def why(self, item: PlannedCollective) -> str:
        if item.within is not None:
            return item.why
        made = STATE_NAMES[item.source]
        if item.direction == "forward":
            need = f"read {STATE_NAMES[item.target]} by {', '.join(item.readers) or 'the output'}"
            text = f"{item.value} makes it {made}, {need}"
        else:
            text = f"its gradient comes back {made} and {item.value} needs it {STATE_NAMES[item.target]}"
        around = [item.value, *[r for r in item.readers if r in self.graph.index]]
        details = "; ".join(self.describe(op) for op in dict.fromkeys(around))
        return f"{text}. {details}"


@dataclass(frozen=True)
class DegreeOption:
    """One tensor-parallel degree of :func:`choose_tp`: ``replicas`` data-parallel copies of
    a ``tp``-device group over the hardware's devices, the group's step, the replicas'
    gradient all-reduce (``data_parallel_s``), and the sequences a second they train;
    ``refused`` says why the degree has no plan (no layout fits, heads do not divide)."""

    tp: int
    replicas: int
    step_s: float = math.inf
    data_parallel_s: float = 0.0
    sequences_per_s: float = 0.0
    refused: str = ""


def choose_tp(
    graph: TensorGraph,
    link: Link,
    devices: int,
    request: TensorRequest,
    **plan: Any,
) -> tuple[TensorPlan, tuple[DegreeOption, ...]]:
    """``--tp auto``: of the degrees that divide ``devices`` (each group a tensor-parallel
    split, the groups data-parallel replicas of it), the one that trains the most sequences
    a second: ``replicas * batch / (step + gradient all-reduce)``. The gradient all-reduce
    runs over the replicas, of each device's weights, on the same link (not overlapped with
    the backward: the figure is the step's upper bound); the least degree wins a tie."""
    options: list[DegreeOption] = []
    best: tuple[float, TensorPlan] | None = None
    for tp in (n for n in range(1, devices + 1) if devices % n == 0):
        replicas = devices // tp
        try:
            made = plan_tensor(graph, link, dataclasses.replace(request, tp=tp), **plan)
        except SyncpassError as error:
            options.append(DegreeOption(tp, replicas, refused=error.message))
            continue
        weights = sum(layout.param_bytes for layout in made.layouts)
        reduce_s = (
            collective_s(ALL_REDUCE, weights, replicas, link.alpha_s, link.beta_bytes_per_s)
            if made.training
            else 0.0
        )
        rate = replicas * made.batch_size / (made.cost.step_s + reduce_s)
        options.append(DegreeOption(tp, replicas, made.cost.step_s, reduce_s, rate))
        if best is None or rate > best[0] * (1 + 1e-9):
            best = (rate, made)
    if best is None:
        raise SyncpassError(
            f"--tp auto: no degree dividing the {devices} devices has a plan: "
            + "; ".join(f"tp {o.tp}: {o.refused}" for o in options)
        )
    return best[1], tuple(options)


def render_degrees(
    options: tuple[DegreeOption, ...], chosen: int, devices: int | None = None, stages: int = 1
) -> str:
    """The ``--tp auto`` table: each degree's step, gradient all-reduce and throughput;
    with ``stages``, of pipelines of that many stages of tensor-parallel groups."""
    devices = devices or options[0].tp * options[0].replicas
    groups = (
        "tensor-parallel groups of tp, data-parallel over the groups"
        if stages == 1
        else f"pipelines of {stages} stages of tp ranks each, data-parallel over the pipelines; "
        "the step is the pipeline's"
    )
    lines = [
        f"--tp auto: tp {chosen} trains the most sequences a second on {devices} device(s) "
        f"({groups}):",
        "    tp  replicas       step  grad all-reduce  sequences/s",
    ]
    for option in options:
        if option.refused:
            lines.append(f"  {option.tp:4d}  {option.replicas:8d}  {option.refused}")
            continue
        mark = "  <- chosen" if option.tp == chosen else ""
        lines.append(
            f"  {option.tp:4d}  {option.replicas:8d}  {seconds(option.step_s):>9}  "
            f"{seconds(option.data_parallel_s):>15}  {option.sequences_per_s:11.4g}{mark}"
        )
    return "\n".join(lines)

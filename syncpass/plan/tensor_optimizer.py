"""The exact tensor-parallel optimiser: each op's layout by dynamic programming.

**The model.** Every op of a :class:`~syncpass.contracts.tensor.TensorGraph` runs in one
of its modes (:mod:`syncpass.plan.tensor_rules`); a mode fixes the state of the value it
makes and the state it reads each input in. A value made in state ``s`` and read in
states ``T`` costs the collectives that turn ``s`` into every state of ``T``:

* forward: nothing when ``T`` holds only ``s``, or ``s`` is replicated (slicing is free);
  from ``C`` or ``S`` an all-gather (then a free slice); from ``P`` an all-reduce when a
  reader needs it whole (or both splits), else one reduce-scatter;
* backward (training): the readers' gradients summed into what the producer needs.
  A producer in ``R`` or ``P`` needs its gradient whole: nothing when every gradient is
  whole, an all-gather when they are all parts of one split, else an all-reduce; a
  producer in ``C`` or ``S`` its own part: a reduce-scatter when a gradient comes back
  as a partial sum.

The step's predicted time is each op's compute on one device (divided by ``N`` when the
op is split) plus every collective's time (:mod:`syncpass.plan.collectives`), plus, when
some op runs whole weights over a split sequence, one all-reduce of those weights'
gradients (one bucket per step: its latency once). A plan must fit the device's memory:
weights times the memory multiplier when training (divided by ``N`` when split) plus the
activations kept for the backward (divided by ``N`` when split).

**The dynamic program.** Which values are live between two ops is fixed by the graph;
what the future costs depends only on each live value's state, the states it has been
read in so far and the gradients its readers send back. The program walks the ops in
order keeping, for each such summary of the live values, the least cost (and, under a
memory limit, every cost/memory pair no other beats). It is exact for the model above;
``tests/plan/test_tensor_optimizer.py`` compares it with exhaustive search.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from syncpass.contracts.tensor import TensorGraph
from syncpass.plan.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_s
from syncpass.plan.tensor_rules import (
    STATES,
    Mode,
    Use,
    contribution,
    op_modes,
    reachable,
    residual_adds,
)

_STATE_BIT = {state: 1 << index for index, state in enumerate(STATES)}


def _states(mask: int) -> frozenset[str]:
    return frozenset(state for state in STATES if mask & _STATE_BIT[state])


@dataclass(frozen=True)
class Link:
    """The group's link and devices: ``alpha_s + bytes / beta`` a message, memory a device."""

    alpha_s: float
    beta_bytes_per_s: float
    memory_bytes: float | None = None


@dataclass(frozen=True)
class ValueCollective:
    """One collective a value needs: ``kind`` in ``direction`` (``forward`` or
    ``backward``), turning the value from ``source`` state into ``target`` (for the
    backward, the gradient's), on ``bytes`` (whole), taking ``time_s``."""

    value: str
    kind: str
    direction: str
    source: str
    target: str
    bytes: float
    time_s: float


@dataclass(frozen=True)
class TensorProblem:
    """A tensor graph planned for ``tp`` devices on ``link``."""

    graph: TensorGraph
    tp: int
    link: Link
    training: bool = True
    memory_multiplier: float = 4.0
    sequence_parallel: bool = True
    #: op id -> the layouts it may take (the rest it may not); unlisted ops take any.
    allowed: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be a whole number >= 1, got {self.tp!r}")

    @cached_property
    def tokens(self) -> dict[str, bool]:
        return {op.id: op.tokens for op in self.graph.ops}

    @cached_property
    def sizes(self) -> dict[str, float]:
        return {op.id: op.out_bytes for op in self.graph.ops}

    @cached_property
    def modes(self) -> tuple[tuple[Mode, ...], ...]:
        """Each op's modes, in graph order, as :attr:`allowed` restricts them."""
        allowed = dict(self.allowed)
        residual = residual_adds(self.graph)
        found = []
        for op in self.graph.ops:
            modes = op_modes(
                op, self.tp, self.tokens, self.sizes, self.sequence_parallel, op.id in residual
            )
            if op.id in allowed:
                modes = tuple(mode for mode in modes if mode.layout in allowed[op.id])
            found.append(modes)
        return tuple(found)

    @cached_property
    def needs_grad(self) -> tuple[bool, ...]:
        """Whether a gradient flows back into each op's value."""
        found: list[bool] = []
        index = self.graph.index
        for op in self.graph.ops:
            if op.kind == "input":
                found.append(op.grad)
            else:
                fed = op.param_bytes > 0 or any(found[index[name]] for name in op.inputs)
                found.append(op.grad and fed)
        return tuple(found)

    @cached_property
    def last_reader(self) -> tuple[int, ...]:
        """The position of each value's last reader; ``len(ops)`` for a returned value
        (the end of the forward reads it whole), ``-1`` for a value nobody reads."""
        n = len(self.graph.ops)
        last = [-1] * n
        index = self.graph.index
        for position, op in enumerate(self.graph.ops):
            for name in op.inputs:
                last[index[name]] = position
        for name in self.graph.outputs:
            last[index[name]] = n
        return tuple(last)

    def collective_s(self, kind: str, num_bytes: float) -> float:
        return collective_s(kind, num_bytes, self.tp, self.link.alpha_s, self.link.beta_bytes_per_s)

    def value_collectives(
        self, position: int, made: str, read: frozenset[str], grads: frozenset[str]
    ) -> tuple[ValueCollective, ...]:
        """The collectives of the value of the op at ``position``, made in state ``made``,
        read in the states ``read``, its readers' gradients ``grads``
        (:func:`~syncpass.plan.tensor_rules.contribution`)."""
        op = self.graph.ops[position]
        size = op.out_bytes
        found = []
        others = read - {made}
        if others and made != "R":
            if made in ("C", "S"):
                kind, target = ALL_GATHER, "R"  # then a free slice to any other split
            elif "R" in others or len(others) > 1:
                kind, target = ALL_REDUCE, "R"
            else:
                kind, target = REDUCE_SCATTER, next(iter(others))
            found.append(
                ValueCollective(
                    op.id, kind, "forward", made, target, size, self.collective_s(kind, size)
                )
            )
        if self.training and self.needs_grad[position]:
            back = None
            if made in ("R", "P"):
                parts = grads - {"R"}
                if parts in (frozenset("C"), frozenset("S")):
                    back = (ALL_GATHER, next(iter(parts)), "R")
                elif parts:
                    back = (ALL_REDUCE, "P", "R")
            elif "P" in grads:
                back = (REDUCE_SCATTER, "P", made)
            if back is not None:
                kind, source, target = back
                found.append(
                    ValueCollective(
                        op.id, kind, "backward", source, target, size, self.collective_s(kind, size)
                    )
                )
        return tuple(found)

    def op_compute_s(self, position: int, mode: Mode) -> float:
        op = self.graph.ops[position]
        total = op.compute_s + (op.backward_s if self.training else 0.0)
        return total / mode.compute_divisor

    def op_memory_bytes(self, position: int, mode: Mode) -> float:
        op = self.graph.ops[position]
        multiplier = self.memory_multiplier if self.training else 1.0
        memory = multiplier * op.param_bytes / mode.param_divisor
        if self.training:
            memory += op.out_bytes / (self.tp if mode.output in ("C", "S") else 1)
        return memory

    def op_extra_s(self, position: int, mode: Mode) -> float:
        """What a mode costs besides its compute and its values' collectives: its own
        all-reduces, and the bandwidth of its share of the weight-gradient bucket."""
        extra = sum(self.collective_s(ALL_REDUCE, size) for size in mode.internal_all_reduce_bytes)
        if self.training and mode.grad_reduce_bytes:
            steps = self.tp - 1
            extra += 2 * steps / self.tp * mode.grad_reduce_bytes / self.link.beta_bytes_per_s
        return extra

    def bucket_latency_s(self) -> float:
        """The latency of the one all-reduce of the weight-gradient bucket."""
        return 2 * (self.tp - 1) * self.link.alpha_s if self.training else 0.0


@dataclass(frozen=True)
class Evaluation:
    """A full assignment of modes, scored: ``step_s`` = ``compute_s`` + ``comm_s``."""

    modes: tuple[Mode, ...]
    compute_s: float
    comm_s: float
    memory_bytes: float
    collectives: tuple[ValueCollective, ...]
    #: Where each value was read in what state: value id -> ((reader id, state), ...).
    reads: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    grad_bucket_bytes: float
    fits: bool

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s


def evaluate(problem: TensorProblem, modes: Iterable[Mode]) -> Evaluation:
    """Score one mode per op of ``problem`` (in graph order) by the model above."""
    chosen = tuple(modes)
    graph = problem.graph
    if len(chosen) != len(graph.ops):
        raise ValueError("evaluate needs one mode per op")
    index = graph.index
    read: list[set[str]] = [set() for _ in graph.ops]
    grads: list[set[str]] = [set() for _ in graph.ops]
    readers: list[list[tuple[str, str]]] = [[] for _ in graph.ops]
    compute = comm = memory = bucket = 0.0
    for position, (op, mode) in enumerate(zip(graph.ops, chosen, strict=True)):
        compute += problem.op_compute_s(position, mode)
        memory += problem.op_memory_bytes(position, mode)
        comm += problem.op_extra_s(position, mode)
        bucket += mode.grad_reduce_bytes if problem.training else 0.0
        for name, use in zip(op.inputs, mode.inputs, strict=True):
            source = index[name]
            made = chosen[source].output
            if use.state not in reachable(made, problem.sequence_parallel):
                raise ValueError(f"{op.id} cannot read {name} ({made}) as {use.state}")
            read[source].add(use.state)
            grads[source].add(contribution(made, use))
            readers[source].append((op.id, use.state))
    for name in graph.outputs:
        source = index[name]
        read[source].add("R")
        grads[source].add(contribution(chosen[source].output, Use("R")))
        readers[source].append(("<output>", "R"))
    collectives: list[ValueCollective] = []
    for position, mode in enumerate(chosen):
        if problem.last_reader[position] < 0:
            continue
        collectives.extend(
            problem.value_collectives(
                position, mode.output, frozenset(read[position]), frozenset(grads[position])
            )
        )
    comm += sum(item.time_s for item in collectives)
    if bucket:
        comm += problem.bucket_latency_s()
    limit = problem.link.memory_bytes
    return Evaluation(
        modes=chosen,
        compute_s=compute,
        comm_s=comm,
        memory_bytes=memory,
        collectives=tuple(collectives),
        reads=tuple(
            (op.id, tuple(found)) for op, found in zip(graph.ops, readers, strict=True) if found
        ),
        grad_bucket_bytes=bucket,
        fits=limit is None or memory <= limit * (1 + 1e-12),
    )


class NoTensorPlan(Exception):
    """No assignment of modes fits the device's memory (or the allowed layouts)."""


# A live value's summary: made-state index | read-states mask << 2 | grads mask << 6.
_S = {state: index for index, state in enumerate(STATES)}


@dataclass
class _Entry:
    cost: float
    memory: float
    count: int
    parent: _Entry | None
    mode: int  # the mode index of the op this entry chose


def solve(problem: TensorProblem) -> Evaluation:
    """The least-time assignment of modes that fits the memory (exact for the model).

    Raises :class:`NoTensorPlan` when none fits. Ties on time go to fewer collectives,
    then less memory.
    """
    best: Evaluation | None = None
    with_grad_reduce = any(mode.grad_reduce_bytes for modes in problem.modes for mode in modes)
    for allow_bucket in (False, True) if with_grad_reduce and problem.training else (True,):
        found = _solve(problem, allow_bucket)
        if found is None:
            continue
        scored = evaluate(problem, found)
        if best is None or (scored.step_s, len(scored.collectives)) < (
            best.step_s,
            len(best.collectives),
        ):
            best = scored
    if best is None:
        raise NoTensorPlan("no layout of the ops fits the device's memory")
    return best


def _solve(problem: TensorProblem, allow_bucket: bool) -> tuple[Mode, ...] | None:
    """The least-time modes, or ``None`` when none fit. The search without the memory limit
    keeps one entry per state and is fast; every op's memory is a nonnegative amount added
    to the device's, so when its optimum fits, no fitting assignment is better and it is the
    answer. Only when it does not fit does the search keep, per state, every entry that no
    other beats on both time and memory (a Pareto set, far slower on a deep model)."""
    limit = problem.link.memory_bytes
    relaxed = _search(problem, allow_bucket, pareto=False)
    if relaxed is None or limit is None or relaxed[1] <= limit * (1 + 1e-12):
        return None if relaxed is None else relaxed[0]
    constrained = _search(problem, allow_bucket, pareto=True)
    return None if constrained is None else constrained[0]


def _search(
    problem: TensorProblem, allow_bucket: bool, pareto: bool
) -> tuple[tuple[Mode, ...], float] | None:
    """The dynamic program over the ops in order, its state the live values' codes; with
    ``pareto``, under the device's memory. The chosen modes and their memory."""
    graph = problem.graph
    n = len(graph.ops)
    last = problem.last_reader
    index = graph.index
    limit = problem.link.memory_bytes
    # live[i]: the values live after op i has run, in a fixed order.
    live_after: list[tuple[int, ...]] = []
    current: list[int] = []
    for position in range(n):
        current = [value for value in current if last[value] > position]
        if last[position] > position:
            current.append(position)
        live_after.append(tuple(current))
    value_cost: dict[tuple[int, int], tuple[float, int]] = {}

    def close(value: int, code: int) -> tuple[float, int]:
        key = (value, code)
        if key not in value_cost:
            made = STATES[code & 3]
            items = problem.value_collectives(
                value, made, _states((code >> 2) & 15), _states(code >> 6)
            )
            value_cost[key] = (sum(item.time_s for item in items), len(items))
        return value_cost[key]

    frontier: dict[tuple[int, ...], list[_Entry]] = {(): [_Entry(0.0, 0.0, 0, None, -1)]}
    before: tuple[int, ...] = ()
    for position, op in enumerate(graph.ops):
        after = live_after[position]
        slots = [before.index(index[name]) for name in op.inputs]
        closing = [slot for slot, value in enumerate(before) if last[value] == position]
        keep = [slot for slot, value in enumerate(before) if last[value] > position]
        step: dict[tuple[int, ...], list[_Entry]] = {}
        for key, entries in frontier.items():
            for mode_index, mode in enumerate(problem.modes[position]):
                if mode.grad_reduce_bytes and problem.training and not allow_bucket:
                    continue
                codes = list(key)
                ok = True
                for slot, use in zip(slots, mode.inputs, strict=True):
                    code = codes[slot]
                    made = STATES[code & 3]
                    if use.state not in reachable(made, problem.sequence_parallel):
                        ok = False
                        break
                    grad = contribution(made, use)
                    codes[slot] = code | (_STATE_BIT[use.state] << 2) | (_STATE_BIT[grad] << 6)
                if not ok:
                    continue
                cost = problem.op_compute_s(position, mode) + problem.op_extra_s(position, mode)
                memory = problem.op_memory_bytes(position, mode)
                count = 0
                for slot in closing:
                    time_s, collectives = close(before[slot], codes[slot])
                    cost += time_s
                    count += collectives
                new_key = tuple(codes[slot] for slot in keep)
                if last[position] > position:
                    new_key += (_S[mode.output],)
                elif last[position] < 0:
                    pass  # nobody reads it: no collective
                else:  # pragma: no cover - an op cannot read its own value
                    raise AssertionError
                for entry in entries:
                    candidate = _Entry(
                        entry.cost + cost,
                        entry.memory + memory,
                        entry.count + count,
                        entry,
                        mode_index,
                    )
                    if pareto and limit is not None and candidate.memory > limit * (1 + 1e-12):
                        continue
                    _offer(step, new_key, candidate, pareto)
        frontier = step
        before = after
        if not frontier:
            return None
    # The end of the forward reads each returned value whole.
    finals: list[_Entry] = []
    for key, entries in frontier.items():
        extra, count = 0.0, 0
        for slot, value in enumerate(before):
            code = key[slot]
            made = STATES[code & 3]
            code |= (_STATE_BIT["R"] << 2) | (_STATE_BIT[contribution(made, Use("R"))] << 6)
            time_s, collectives = close(value, code)
            extra += time_s
            count += collectives
        for entry in entries:
            finals.append(_Entry(entry.cost + extra, entry.memory, entry.count + count, entry, -1))
    if not finals:
        return None
    chosen = min(finals, key=lambda entry: (entry.cost, entry.count, entry.memory))
    picks: list[int] = []
    walker = chosen.parent
    while walker is not None and walker.mode >= 0:
        picks.append(walker.mode)
        walker = walker.parent
    picks.reverse()
    return (
        tuple(problem.modes[position][pick] for position, pick in enumerate(picks)),
        chosen.memory,
    )


def _offer(
    step: dict[tuple[int, ...], list[_Entry]], key: tuple[int, ...], entry: _Entry, pareto: bool
) -> None:
    """Keep ``entry`` under ``key`` unless an entry there is as good (cost and count, and
    memory when memory is limited); drop the ones it beats."""
    entries = step.get(key)
    if entries is None:
        step[key] = [entry]
        return
    rank = (entry.cost, entry.count, entry.memory)
    if not pareto:
        if rank < (entries[0].cost, entries[0].count, entries[0].memory):
            entries[0] = entry
        return
    for other in entries:
        if (
            other.cost <= entry.cost
            and other.memory <= entry.memory
            and ((other.cost, other.count, other.memory) <= rank)
        ):
            return
    kept = [
        other
        for other in entries
        if not (entry.cost <= other.cost and entry.memory <= other.memory)
    ]
    kept.append(entry)
    step[key] = kept


def layouts(problem: TensorProblem, chosen: Mapping[str, str]) -> tuple[Mode, ...]:
    """The modes ``chosen`` names by layout (op id -> layout), replicated for the rest;
    a layout an op cannot take is a ``ValueError`` naming it."""
    found = []
    for op, modes in zip(problem.graph.ops, problem.modes, strict=True):
        wanted = chosen.get(op.id, "replicated")
        match = [mode for mode in modes if mode.layout == wanted]
        if not match:
            known = ", ".join(mode.layout for mode in modes)
            raise ValueError(f"{op.id} cannot run {wanted} on {problem.tp} devices ({known})")
        found.append(match[0])
    return tuple(found)

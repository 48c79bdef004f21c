"""Source sites of a tensor graph: what one line of source runs for every layer.

A rewrite writes one layout per line of source, and every layer's op runs that line, so
ops are grouped by site (:func:`site_key`), timed as their site's median
(:func:`site_medians`), and named by family (``h.3.attn.c_proj`` -> ``h.*.attn.c_proj``).
Backend-neutral: the torch and JAX rewrites both plan through it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from syncpass.contracts.tensor import TensorGraph, TensorOp
from syncpass.core.errors import SyncpassError
from syncpass.plan.tensor_baselines import megatron_layouts
from syncpass.plan.tensor_plan import PlannedCollective, TensorPlan, family
from syncpass.plan.tensor_planner import TensorRequest, plan_tensor


def tail(op: TensorOp) -> str:
    """The last part of an op's id: its attribute or function (``c_proj``, ``gelu#2``)."""
    return op.id.rsplit(".", 1)[-1]


def site_key(op: TensorOp) -> tuple[str, str, str]:
    """Ops of one source site share it: their line, kind and name."""
    return (op.source or op.id, op.kind, re.sub(r"#\d+$", "", tail(op)))


#: Rounds of refusals before a plan must have settled (each takes a layout away).
MAX_ROUNDS = 64
Checked = TypeVar("Checked")


@dataclass(frozen=True)
class Refusal:
    """An op that may not take ``layout``, and why."""

    op: str
    layout: str
    reason: str


def plan_the_source_carries(
    graph: TensorGraph,
    request: TensorRequest,
    plan: Mapping[str, Any],
    allowed: Mapping[str, tuple[str, ...]],
    check: Callable[[TensorPlan], tuple[Sequence[Refusal], Checked]],
) -> tuple[TensorPlan, tuple[Refusal, ...], Checked]:
    """Plan ``graph`` with each op restricted to ``allowed`` (what a rewrite writes), without
    sequence parallelism; ``check`` says what of the plan the source cannot carry; each
    refused layout is taken out of its op's choices and the plan made again (exact for what
    is left) until nothing is refused. The plan, every refusal, and the last check's result."""
    choices = dict(allowed)
    refusals: list[Refusal] = []
    for _ in range(MAX_ROUNDS):
        made = plan_tensor(
            graph,
            request=dataclasses.replace(
                request,
                allowed=tuple(choices.items()),
                sequence_parallel=False,
                explain=False,
            ),
            **plan,
        )
        found, checked = check(made)
        if not found:
            return made, tuple(refusals), checked
        for refusal in found:
            kept = tuple(x for x in choices[refusal.op] if x != refusal.layout)
            choices[refusal.op] = kept or ("replicated",)
        refusals += found
    raise SyncpassError(  # pragma: no cover - each round takes a layout away
        "the tensor-parallel plan did not settle; plan it with --no-baselines"
    )


def writable_choices(
    graph: TensorGraph, writable: Mapping[str, tuple[str, ...]], placement: str
) -> dict[str, tuple[str, ...]]:
    """Each op's layouts a rewrite can write (``writable`` by kind, else replicated);
    ``placement`` ``megatron``: only Megatron-LM's layout for it, where writable."""
    allowed = {op.id: writable.get(op.kind, ("replicated",)) for op in graph.ops}
    if placement != "megatron":
        return allowed
    hand = megatron_layouts(graph)
    return {
        op: (hand[op],) if hand.get(op) in layouts else ("replicated",)
        for op, layouts in allowed.items()
    }


def refusal_notes(
    refusals: Sequence[Refusal], family_of: Callable[[str], str] = family
) -> tuple[str, ...]:
    """Why ops stay replicated, one note per source site and reason."""
    seen: dict[str, str] = {}
    for refusal in refusals:
        key = family_of(refusal.op)
        seen.setdefault(f"{key} {refusal.layout}", f"{key} not {refusal.layout}: {refusal.reason}")
    return tuple(seen.values())


def site_medians(
    graph: TensorGraph, key: Callable[[TensorOp], tuple[str, str, str]] = site_key
) -> TensorGraph:
    """Each op timed as the median of the ops of its source site (``key``; a line every
    layer runs): one forward's times differ by layer only by noise, and a plan the source
    carries takes one layout per site."""
    groups: dict[tuple[str, str, str], list[TensorOp]] = collections.defaultdict(list)
    for op in graph.ops:
        groups[key(op)].append(op)
    medians = {
        key: (
            statistics.median(op.compute_s for op in ops),
            statistics.median(op.backward_s for op in ops),
        )
        for key, ops in groups.items()
    }
    ops = tuple(
        dataclasses.replace(op, compute_s=medians[key(op)][0], backward_s=medians[key(op)][1])
        for op in graph.ops
    )
    return dataclasses.replace(graph, ops=ops)


def collapse(
    layouts: Mapping[str, str], family_of: Callable[[str], str] = family
) -> dict[str, str]:
    """Module names as patterns (``blocks.*.mlp.fc``) where every layer agrees."""
    families: dict[str, set[str]] = collections.defaultdict(set)
    for name, layout in layouts.items():
        families[family_of(name)].add(layout)
    found: dict[str, str] = {}
    for name, layout in layouts.items():
        key = family_of(name)
        found.setdefault(key if len(families[key]) == 1 else name, layout)
    return found


def per_reader_gradient_reduces(
    graph: TensorGraph, plan: TensorPlan, form: str, family_of: Callable[[str], str] = family
) -> TensorPlan:
    """``plan`` where each column-split layer all-reduces the gradient of its input on its
    own (``form`` says who does: DTensor's ``ColwiseParallel``, a ``copy_to`` wrapped around
    each call), so a value ``k`` such layers read has ``k`` backward all-reduces where a
    plan that sums the gradients first has one. The step and the counts take the extra
    ones; a note says where."""
    layout = {item.op: item for item in plan.layouts}
    collectives: list[PlannedCollective] = []
    extra_s = 0.0
    extra = 0
    notes: list[str] = []
    for item in plan.collectives:
        columns = sorted(
            reader
            for reader in graph.consumers[item.value]
            if graph.op(reader).kind == "linear" and layout[reader].layout == "column"
        )
        if item.direction != "backward" or item.kind != "all-reduce" or len(columns) < 2:
            collectives.append(item)
            continue
        collectives += [dataclasses.replace(item, readers=(reader,)) for reader in columns]
        extra += len(columns) - 1
        extra_s += (len(columns) - 1) * item.time_s
        notes.append(
            f"{family_of(item.value)}: its gradient is all-reduced by each of the "
            f"{len(columns)} {form} that read it "
            f"({', '.join(sorted({tail(graph.op(r)) for r in columns}))}), where the eager "
            "form sums it first and all-reduces once"
        )
    if not extra:
        return plan
    cost = dataclasses.replace(
        plan.cost,
        step_s=plan.cost.step_s + extra_s,
        comm_s=plan.cost.comm_s + extra_s,
        backward_collectives=plan.cost.backward_collectives + extra,
    )
    unique = tuple(dict.fromkeys(notes))
    return dataclasses.replace(
        plan, collectives=tuple(collectives), cost=cost, notes=(*plan.notes, *unique)
    )

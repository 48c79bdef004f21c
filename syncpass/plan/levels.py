"""How deep a plan looks into nested ``nn.Sequential`` children: each group one op, unless
it is too big for a stage.

The eager form's profile plans a call of an ``nn.Sequential`` per child, and a child that
is an ``nn.Sequential`` too per child again, every level down
(:class:`~syncpass.contracts.costs.OpGroup`: timm's EfficientNet ``blocks.1`` and its
``blocks.1.0``, ``blocks.1.1``, ...). Planned that finely, a plan would cut anywhere, with op
ids and stage code no one asked for. So for a plan of ``S`` stages a group is planned as one
op (its id the group's, ``blocks.1``) unless

* its compute (forward, and backward when training, over the cost file's batch) exceeds
  the ideal stage's, the model's total over ``S``: then no stage boundary could fall at
  its ends alone without one stage holding more than its share, and its children are
  planned one by one (**expanded**); or
* a sync point the user pinned (or a written stage's end, for ``run``'s prediction) falls
  inside it.

Groups nested in a group planned whole go with it; those nested in an expanded group are
weighed the same way, level by level. The level the profile plans first (a call's own
children) is never merged: plans of models without nested groups stay what they were.
An expanded group only adds cuts to those of the group whole, so the exact optimiser's
bottleneck can only fall.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from syncpass.contracts.costs import Costs, CutCost, OpCost, OpGroup
from syncpass.contracts.graph import INPUT, OUTPUT
from syncpass.core.units import seconds


@dataclass(frozen=True)
class Expansion:
    """A group the plan looks into (its ops planned one by one), and why: its compute
    ``compute_s`` against the ideal stage's ``ideal_s`` (the model's total over the plan's
    stages), or a sync point pinned inside it (``pinned``)."""

    op: str
    compute_s: float
    ideal_s: float
    pinned: bool = False

    def describe(self) -> str:
        """``blocks.1 expanded: 13.2 ms > ideal stage 6.7 ms``."""
        if self.compute_s > self.ideal_s:
            return (
                f"{self.op} expanded: {seconds(self.compute_s)} > ideal stage "
                f"{seconds(self.ideal_s)}"
            )
        return f"{self.op} expanded: a pinned sync point lies inside it"


@dataclass(frozen=True)
class Level:
    """The costs a plan of some stage count is made from (``costs``: groups planned whole
    merged into one op each), and the groups it looks into (``expanded``)."""

    costs: Costs
    expanded: tuple[Expansion, ...]
    # The last op of each group planned whole, and the group's id: a cut after it is a cut
    # after the group.
    merged: tuple[tuple[str, str], ...] = ()

    def op_id(self, op: str) -> str:
        """The id ``costs`` give the cut after the cost file's op ``op``."""
        return dict(self.merged).get(op, op)


def plan_level(costs: Costs, stages: int, pinned: tuple[str, ...] = ()) -> Level:
    """``costs`` as a plan of ``stages`` stages plans them (module docstring), with sync
    points pinned after the ops ``pinned`` besides the cost file's own."""
    if not costs.groups:
        return Level(costs, ())
    compute = {op.id: costs.op_compute_s(op) for op in costs.ops}
    ideal = sum(compute.values()) / max(stages, 1)
    pinned_inside = {cut.after for cut in costs.cuts if cut.pinned} | set(pinned)
    spans = {group.id: _span(costs, group) for group in costs.groups}
    # Outermost first: a group is weighed only once the group holding it is expanded.
    ordered = sorted(costs.groups, key=lambda group: (spans[group.id][0], -len(group.ops)))
    expanded: list[Expansion] = []
    merged: list[OpGroup] = []
    for group in ordered:
        holder = _holder(group, ordered, spans)
        if holder is not None and holder.id not in {expansion.op for expansion in expanded}:
            continue  # inside a group planned whole
        total = sum(compute[op] for op in group.ops)
        split = any(op in pinned_inside for op in group.ops[:-1])
        if total > ideal or split:
            expanded.append(Expansion(group.id, total, ideal, split and total <= ideal))
        else:
            merged.append(group)
    if not merged:
        return Level(dataclasses.replace(costs, groups=()), tuple(expanded))
    ends = tuple((group.ops[-1], group.id) for group in merged)
    return Level(_merge(costs, merged), tuple(expanded), ends)


def _span(costs: Costs, group: OpGroup) -> tuple[int, int]:
    return costs.op_index[group.ops[0]], costs.op_index[group.ops[-1]]


def _holder(
    group: OpGroup, ordered: list[OpGroup], spans: dict[str, tuple[int, int]]
) -> OpGroup | None:
    """The smallest other group that holds ``group``, if any."""
    first, last = spans[group.id]
    holders = [
        other
        for other in ordered
        if other.id != group.id
        and spans[other.id][0] <= first
        and last <= spans[other.id][1]
        and len(other.ops) > len(group.ops)
    ]
    return min(holders, key=lambda other: len(other.ops)) if holders else None


def _merge(costs: Costs, groups: list[OpGroup]) -> Costs:
    """``costs`` with each of ``groups`` one op: its ops' costs summed, the cuts inside it
    dropped, the cut after its last op and every edge to or from it renamed to it."""
    rename: dict[str, str] = {}
    for group in groups:
        rename.update(dict.fromkeys(group.ops, group.id))
    by_id = {group.id: group for group in groups}
    ops: list[OpCost] = []
    for op in costs.ops:
        owner = rename.get(op.id)
        if owner is None:
            ops.append(op)
        elif op.id == by_id[owner].ops[0]:
            ops.append(_merged_op(owner, [costs.ops[costs.op_index[i]] for i in by_id[owner].ops]))
    cuts: list[CutCost] = []
    for cut in costs.cuts:
        owner = rename.get(cut.after)
        if owner is not None and cut.after != by_id[owner].ops[-1]:
            continue  # inside a group planned whole
        values = tuple(
            dataclasses.replace(
                value, recompute=tuple(dict.fromkeys(rename.get(op, op) for op in value.recompute))
            )
            for value in cut.values
        )
        cuts.append(dataclasses.replace(cut, after=rename.get(cut.after, cut.after), values=values))
    edges: dict[tuple[str, str], None] = {}
    for producer, consumer in costs.edges:
        edge = (rename.get(producer, producer), rename.get(consumer, consumer))
        if edge[0] != edge[1] or edge[0] in (INPUT, OUTPUT):
            edges[edge] = None
    return dataclasses.replace(
        costs, ops=tuple(ops), cuts=tuple(cuts), edges=tuple(edges), groups=()
    )


def _merged_op(group: str, ops: list[OpCost]) -> OpCost:
    """One op that runs ``ops`` in turn: every time, byte and FLOP count summed."""
    flops = [op.flops for op in ops]
    inputs = [op.backward_input_s for op in ops]
    return OpCost(
        id=group,
        compute_s=sum(op.compute_s for op in ops),
        backward_s=sum(op.backward_s for op in ops),
        param_bytes=sum(op.param_bytes for op in ops),
        out_bytes=sum(op.out_bytes for op in ops),
        flops=None if None in flops else sum(flop for flop in flops if flop is not None),
        source=ops[0].source,
        fixed_s=sum(op.fixed_s for op in ops),
        backward_fixed_s=sum(op.backward_fixed_s for op in ops),
        backward_input_s=None
        if None in inputs
        else sum(value for value in inputs if value is not None),
    )

"""Nested nn.Sequential groups: planned as one op each, unless too big for a stage."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from costbuilder import cost_dict

from syncpass.contracts.costs import Costs, OpGroup, costs_to_json, parse_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.levels import plan_level
from syncpass.plan.planfile import dumps_plan, parse_plan
from syncpass.plan.planner import PlanRequest, make_plan
from syncpass.plan.report import render_plan

# stem, g.0 (light group of 2), g.1 (heavy group: g.1.0, g.1.1, and g.1.2 of 2), tail, head
IDS = ["stem", "g.0.0", "g.0.1", "g.1.0", "g.1.1", "g.1.2.0", "g.1.2.1", "tail", "head"]
COMPUTE = [1.0, 0.5, 0.5, 4.0, 4.0, 4.0, 4.0, 1.0, 1.0]
GROUPS = [
    {"id": "g.0", "ops": ["g.0.0", "g.0.1"]},
    {"id": "g.1", "ops": ["g.1.0", "g.1.1", "g.1.2.0", "g.1.2.1"]},
    {"id": "g.1.2", "ops": ["g.1.2.0", "g.1.2.1"]},
]


def nested_costs(pinned: tuple[int, ...] = ()) -> Costs:
    data = cost_dict(COMPUTE, [1.0] * (len(IDS) - 1), beta=1e9, pinned=pinned)
    for op, op_id in zip(data["ops"], IDS, strict=True):
        op["id"] = op_id
    for cut, op_id in zip(data["cuts"], IDS, strict=False):
        cut["after"] = op_id
    data["edges"] = [["<input>", "stem"], *([a, b] for a, b in itertools.pairwise(IDS))]
    data["edges"].append(["head", "<output>"])
    data["groups"] = GROUPS
    return parse_costs(data)


def test_a_group_within_its_share_is_one_op_with_its_ops_summed() -> None:
    level = plan_level(nested_costs(), 1)  # the ideal stage is the whole model
    assert [op.id for op in level.costs.ops] == ["stem", "g.0", "g.1", "tail", "head"]
    assert level.costs.ops[2].compute_s == 16.0
    assert [cut.after for cut in level.costs.cuts] == ["stem", "g.0", "g.1", "tail"]
    assert ("g.0", "g.1") in level.costs.edges and ("g.1", "g.1") not in level.costs.edges
    assert level.expanded == ()


def test_a_group_over_the_ideal_stage_is_expanded_level_by_level() -> None:
    # total 20: at 2 stages the ideal is 10, g.1 (16) is expanded, g.1.2 (8) is not.
    two = plan_level(nested_costs(), 2)
    assert [op.id for op in two.costs.ops] == [
        *("stem", "g.0", "g.1.0", "g.1.1", "g.1.2", "tail", "head")
    ]
    assert [(e.op, e.compute_s, e.ideal_s) for e in two.expanded] == [("g.1", 16.0, 10.0)]
    assert two.expanded[0].describe() == "g.1 expanded: 16 s > ideal stage 10 s"
    # At 4 stages the ideal is 5: g.1.2 (8) is expanded too; g.0 (1) stays one op.
    four = plan_level(nested_costs(), 4)
    assert [e.op for e in four.expanded] == ["g.1", "g.1.2"]
    assert "g.0" in [op.id for op in four.costs.ops]
    assert "g.1.2.0" in [op.id for op in four.costs.ops]


def test_a_pin_inside_a_group_expands_it() -> None:
    level = plan_level(nested_costs(pinned=(1,)), 1)  # pinned after g.0.0
    assert [e.op for e in level.expanded] == ["g.0"]
    assert level.expanded[0].pinned
    assert "pinned" in level.expanded[0].describe()


def test_the_plan_says_what_it_expanded_and_is_never_worse_than_the_groups_whole() -> None:
    costs = nested_costs()
    request = PlanRequest(stages=4, config=costs.config)
    plan = make_plan(costs, request)
    assert [e.op for e in plan.expanded] == ["g.1", "g.1.2"]
    whole = make_plan(plan_level(costs, 1).costs, request)
    assert plan.bottleneck_s <= whole.bottleneck_s
    assert plan.bottleneck_s < whole.bottleneck_s  # g.1 alone is 16 of 20
    assert "g.1 expanded: 16 s > ideal stage 5 s" in render_plan(plan)
    again = parse_plan(json.loads(dumps_plan(plan)))
    assert again.expanded == plan.expanded
    # A plan of the cost file's ops alone writes no "expanded" key.
    assert '"expanded"' not in dumps_plan(make_plan(plan_level(costs, 1).costs, request))


def test_groups_survive_the_cost_file_and_bad_ones_are_refused() -> None:
    costs = nested_costs()
    assert parse_costs(costs_to_json(costs)).groups == costs.groups
    data = costs_to_json(costs)
    data["groups"] = [{"id": "g.x", "ops": ["g.0.1", "g.1.0", "stem"]}]
    with pytest.raises(SyncpassError, match="consecutive"):
        parse_costs(data)
    data["groups"] = [{"id": "stem", "ops": ["g.0.0", "g.0.1"]}]
    with pytest.raises(SyncpassError, match="own"):
        parse_costs(data)
    with pytest.raises(ValueError, match="overlap"):
        dataclasses.replace(costs, groups=(*costs.groups, OpGroup("g.y", ("g.0.1", "g.1.0"))))

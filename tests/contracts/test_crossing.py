"""Send or compute again: what a cut costs when its values are known one by one."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, costs_to_json, parse_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import Plan, PlanRequest, make_plan
from syncpass.plan.retarget import retarget_batch

BETA = 1e9  # bytes/s: 1 MB costs 1 ms
ALPHA = 1e-5

BASE: dict[str, Any] = {
    "version": 1,
    "batch_size": 8,
    "training": True,
    "memory_multiplier": 1,
    "hardware": {"alpha_s": ALPHA, "beta_bytes_per_s": BETA},
    "ops": [
        {"id": "seq", "compute_s": 1e-6},
        {"id": "mask", "compute_s": 2e-4},  # builds the mask: 0.2 ms
        {"id": "embed", "compute_s": 1e-3, "param_bytes": 4096},
        {"id": "blocks.0", "compute_s": 1e-2, "param_bytes": 4096},
        {"id": "blocks.1", "compute_s": 1e-2, "param_bytes": 4096},
    ],
    "cuts": [
        {
            "after": "blocks.0",
            "live_bytes": 1_500_000,
            "values": [
                {"name": "x", "bytes": 1_000_000, "grad": True},
                {
                    "name": "mask",
                    "bytes": 500_000,
                    "grad": False,
                    "recompute": ["mask"],
                    "needs": ["T"],
                },
                {"name": "T", "bytes": 0, "grad": False, "sent": False},
            ],
        }
    ],
}


def costs_with(change: Any = None) -> Costs:
    data = copy.deepcopy(BASE)
    if change is not None:
        change(data)
    return parse_costs(data, "c.json")


def mask_value(data: dict[str, Any]) -> dict[str, Any]:
    return data["cuts"][0]["values"][1]  # type: ignore[no-any-return]


def test_a_value_cheaper_to_compute_again_is_not_sent() -> None:
    costs = costs_with()
    crossing = costs.crossing(costs.cuts[0])
    # The mask (0.5 ms to send) is sliced again in 0.2 ms; its size T crosses instead.
    assert crossing.recomputed == ("mask",)
    assert crossing.forward_bytes == 1_000_000
    assert crossing.backward_bytes == 1_000_000
    assert crossing.recompute_s == pytest.approx(2e-4)
    # One transfer each way per micro-batch, plus the recomputation.
    expected = 2 * (2 * ALPHA + 1_000_000 / BETA) + 2e-4
    assert costs.cut_comm_s(costs.cuts[0], microbatches=2) == pytest.approx(expected)


def test_a_value_dearer_to_compute_again_is_sent_and_no_gradient_comes_back_for_it() -> None:
    costs = costs_with(lambda d: d["ops"][1].update(compute_s=1e-3))
    crossing = costs.crossing(costs.cuts[0])
    assert crossing.recomputed == ()
    assert crossing.forward_bytes == 1_500_000
    assert crossing.backward_bytes == 1_000_000  # the mask needs no gradient
    expected = (ALPHA + 1_500_000 / BETA) + (ALPHA + 1_000_000 / BETA)
    assert costs.cut_comm_s(costs.cuts[0]) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: mask_value(d).update(grad=True), "it needs a gradient"),
        (lambda d: d["ops"][1].update(param_bytes=64), "its op holds weights"),
        # What it needs would cost more to send than the mask itself.
        (lambda d: d["cuts"][0]["values"][2].update(bytes=600_000), "its needs are dear"),
        (lambda d: d["cuts"][0]["values"][2].update(grad=True), "it needs a value with a gradient"),
    ],
)
def test_a_value_is_sent_when_computing_it_again_would_be_wrong_or_dear(
    change: Any, why: str
) -> None:
    costs = costs_with(change)
    assert costs.crossing(costs.cuts[0]).recomputed == (), why


def test_without_values_everything_live_goes_both_ways() -> None:
    costs = costs_with(lambda d: d["cuts"][0].pop("values"))
    crossing = costs.crossing(costs.cuts[0])
    assert (crossing.forward_bytes, crossing.backward_bytes) == (1_500_000, 1_500_000)
    assert costs.cut_comm_s(costs.cuts[0]) == pytest.approx(2 * (ALPHA + 1_500_000 / BETA))


def test_values_round_trip_and_scale_with_the_batch() -> None:
    costs = costs_with()
    assert parse_costs(costs_to_json(costs), "again.json") == costs
    doubled = retarget_batch(costs, 16)
    crossing = doubled.crossing(doubled.cuts[0])
    assert crossing.recomputed == ("mask",)
    assert crossing.forward_bytes == 2_000_000  # x alone, at twice the batch


def plan_through_blocks_0(costs: Costs) -> Plan:
    config = SyncConfig(strategy="manual", communication_cost_threshold=math.inf)
    return make_plan(costs, PlanRequest(stages=None, config=config, pinned=("blocks.0",)))


def test_the_plan_says_what_the_stage_after_computes_again_and_charges_it() -> None:
    plan = plan_through_blocks_0(costs_with())
    (point,) = plan.sync_points
    assert point.recomputed == ("mask",)
    assert point.live_bytes == 1_000_000
    # The recomputation is part of the stage after's forward in the simulated step.
    dear = plan_through_blocks_0(costs_with(lambda d: d["ops"][1].update(compute_s=0.4e-3)))
    assert dear.sync_points[0].recomputed == ("mask",)
    assert dear.predicted_step_s > plan.predicted_step_s
    sent = plan_through_blocks_0(costs_with(lambda d: d["ops"][1].update(compute_s=1e-3)))
    assert sent.sync_points[0].recomputed == ()
    assert sent.sync_points[0].live_bytes == 1_500_000


@pytest.mark.parametrize(
    ("change", "where", "what"),
    [
        (
            lambda d: mask_value(d).update(needs=["S"]),
            "$.cuts[0].values[1].needs",
            "'S' is not one of the cut's values",
        ),
        (
            lambda d: mask_value(d).update(recompute=["blocks.1"]),
            "$.cuts[0].values[1].recompute",
            "'blocks.1' names no op up to 'blocks.0'",
        ),
        (
            lambda d: mask_value(d).update(grad="no"),
            "$.cuts[0].values[1].grad",
            "must be true or false",
        ),
        (
            lambda d: d["cuts"][0]["values"].append({"name": "x", "bytes": 1}),
            "$.cuts[0].values[3].name",
            "'x' is listed twice",
        ),
        (
            lambda d: mask_value(d).update(bytes=-1),
            "$.cuts[0].values[1].bytes",
            "must be >= 0",
        ),
    ],
)
def test_bad_values_are_named_by_json_path(change: Any, where: str, what: str) -> None:
    with pytest.raises(SyncpassError) as caught:
        costs_with(change)
    assert caught.value.location == f"c.json:{where}"
    assert what in caught.value.message


def test_renaming_ops_renames_what_computes_a_value_again() -> None:
    # The cost file matched to a source whose lines moved (match_costs renames by order).
    costs = costs_with()
    rename = {op.id: f"{op.id}@moved" for op in costs.ops}
    renamed = costs.renamed(rename)
    value = renamed.cuts[0].values[1]
    assert value.recompute == ("mask@moved",)
    assert renamed.cuts[0].after == "blocks.0@moved"
    assert renamed.crossing(renamed.cuts[0]) == costs.crossing(costs.cuts[0])

"""Re-targeting costs to another batch size, and the batch ranges of each plan."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.cli import main
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import parse_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import PlanRequest, make_plan
from syncpass.plan.retarget import (
    retarget_batch,
    retarget_speed,
    retarget_tensor_parallel,
    shard_optimizer_state,
    sweep_batch,
)
from syncpass.plan.tensor_plan import OpLayout, PlanCost, PlannedCollective, TensorPlan


def test_compute_and_bytes_scale_parameters_and_latency_do_not() -> None:
    costs = parse_costs(
        cost_dict([1.0, 2.0], [64], backward=[2.0, 4.0], params=[8, 8], out=[16, 32], alpha=0.5)
    )
    bigger = retarget_batch(costs, 32)  # the cost file is at batch 8
    assert bigger.batch_size == 32
    assert [op.compute_s for op in bigger.ops] == [4.0, 8.0]
    assert [op.backward_s for op in bigger.ops] == [8.0, 16.0]
    assert [op.out_bytes for op in bigger.ops] == [64, 128]
    assert [op.param_bytes for op in bigger.ops] == [8, 8]
    assert bigger.cuts[0].live_bytes == 256
    assert bigger.hardware == costs.hardware
    assert retarget_batch(costs, 8) is costs
    with pytest.raises(SyncpassError):
        retarget_batch(costs, 0)


def test_a_slower_machine_scales_every_op_time_and_nothing_else() -> None:
    data = cost_dict([1.0, 2.0], [64], backward=[2.0, 4.0], params=[8, 8], alpha=0.5)
    data["ops"][0].update(fixed_s=0.5, backward_fixed_s=1.0, backward_input_s=1.5)
    costs = dataclasses.replace(parse_costs(data), speed_probe_s=0.002)
    slower, factor = retarget_speed(costs, 0.003)
    assert factor == pytest.approx(1.5)
    first = slower.ops[0]
    assert (first.compute_s, first.backward_s) == pytest.approx((1.5, 3.0))
    assert (first.fixed_s, first.backward_fixed_s, first.backward_input_s) == pytest.approx(
        (0.75, 1.5, 2.25)
    )
    assert [op.compute_s for op in slower.ops] == pytest.approx([1.5, 3.0])
    assert slower.hardware == costs.hardware and slower.cuts == costs.cuts
    assert slower.speed_probe_s == 0.003 and "x1.5" in slower.notes[-1]
    # A cost file that measured no speed is taken as it is.
    unprobed = parse_costs(data)
    assert retarget_speed(unprobed, 0.003) == (unprobed, 1.0)


def test_stages_of_tensor_parallel_ranks_compute_one_ranks_share_and_their_collectives() -> None:
    data = cost_dict([1.0, 4.0, 4.0, 2.0], [8, 8, 8], backward=[2.0, 8.0, 8.0, 4.0])
    for op, name in zip(data["ops"], ("embed", "blocks.0", "blocks.1", "head"), strict=True):
        op["id"] = name
    for cut, name in zip(data["cuts"], ("embed", "blocks.0", "blocks.1"), strict=True):
        cut["after"] = name
    data["ops"][1].update(fixed_s=0.5)  # not divided: every call pays it
    costs = parse_costs(data)

    def layout(op: str, how: str, compute: float) -> OpLayout:
        return OpLayout(op, "linear", how, ("R",), "R", compute, 0.0)

    def collective(value: str, direction: str, time_s: float) -> PlannedCollective:
        return PlannedCollective("all-reduce", direction, value, "P", "R", 64, time_s, value)

    plan = TensorPlan(
        tp=2,
        batch_size=8,
        training=True,
        sequence_parallel=False,
        layouts=(
            layout("blocks.0.fc", "column", 1.0),  # a rank's half of 2.0
            layout("blocks.0.ln", "replicated", 0.5),
            layout("blocks.1.fc", "column", 1.0),
            layout("blocks.1.ln", "replicated", 0.5),
            layout("head", "replicated", 3.0),
        ),
        collectives=(
            collective("blocks.0.proj", "forward", 0.25),
            collective("blocks.0.fc", "backward", 0.5),
        ),
        cost=PlanCost("syncpass", 1.0, 1.0, 0.0, 0.0, True, 1, 1),
    )
    split = retarget_tensor_parallel(costs, plan)
    share = (1.0 + 0.5) / (2.0 + 0.5)  # what one rank computes of blocks.N
    embed, first, second, head = split.ops
    assert (embed.compute_s, head.compute_s) == (1.0, 2.0)  # nothing of them split
    assert first.compute_s == pytest.approx(0.5 + 3.5 * share + 0.25)
    assert first.backward_s == pytest.approx(8.0 * share + 0.5)
    assert second.compute_s == pytest.approx(4.0 * share)
    assert "tensor-parallel over 2 ranks: 2 op(s)" in split.notes[-1]
    assert split.cuts == costs.cuts and split.hardware == costs.hardware


def sweep_costs() -> dict[str, object]:
    # Latency is paid twice by a middle stage: at small batches it must hold less compute.
    return cost_dict([1.0] * 9, [1.0] * 8, alpha=0.2, beta=64.0)


def request() -> PlanRequest:
    # The exact optimiser alone (adaptive would also weigh the rules' plans by their step).
    config = SyncConfig().replace(communication_cost_threshold=math.inf, strategy="fixed")
    return PlanRequest(stages=3, config=config, microbatches=1)


def test_sweep_ranges_are_exact() -> None:
    costs = parse_costs(sweep_costs())
    points, ranges = sweep_batch(costs, request(), [1, 4, 16, 64])
    assert [point.batch_size for point in points] == [1, 4, 16, 64]
    assert len({point.cuts for point in points}) > 1  # the plan does move with the batch
    assert ranges[0].low == 1 and ranges[-1].high == 64
    for plan_range in ranges:
        for batch in range(plan_range.low, plan_range.high + 1):
            plan = make_plan(retarget_batch(costs, batch), request())
            assert tuple(p.after for p in plan.sync_points) == plan_range.cuts, batch
    assert all(a.high + 1 == b.low for a, b in itertools.pairwise(ranges))


def test_the_fixed_part_of_each_op_does_not_scale_with_the_batch() -> None:
    data = cost_dict([1.0, 2.0], [64], backward=[2.0, 4.0])
    ops = data["ops"]
    assert isinstance(ops, list)
    ops[0].update(fixed_s=0.5, backward_fixed_s=1.0)
    costs = parse_costs(data)
    bigger = retarget_batch(costs, 32)  # x4
    assert bigger.ops[0].compute_s == pytest.approx(0.5 + 0.5 * 4)
    assert bigger.ops[0].backward_s == pytest.approx(1.0 + 1.0 * 4)
    assert (bigger.ops[0].fixed_s, bigger.ops[0].backward_fixed_s) == (0.5, 1.0)
    assert bigger.ops[1].compute_s == pytest.approx(8.0)


def test_sharded_optimizer_state_lets_a_plan_fit_that_did_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two ops of 10 bytes of weights; 4x when training (weights, gradients, two Adam
    # moments) is 40 bytes a stage: over the 30-byte devices. Over 4 replicas, the two
    # moments take 2/4: 25 bytes.
    data = cost_dict([1.0, 1.0], [0.0], params=[10, 10], memory=30, training=True, multiplier=4)
    costs = parse_costs(data)
    sharded = shard_optimizer_state(costs, 4)
    assert sharded.memory_multiplier == 2.5
    assert "sharded over 4 data-parallel replicas" in sharded.notes[-1]
    assert shard_optimizer_state(costs, 1) is costs
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    argv = ["plan", "--costs", str(path), "--stages", "2"]
    assert main(argv) == 2
    assert "fits in device memory" in capsys.readouterr().err
    assert main([*argv, "--optimizer-shards", "4"]) == 0
    out = capsys.readouterr().out
    assert "memory multiplier 4 -> 2.5" in out


def test_no_optimizer_state_to_shard_is_an_error() -> None:
    costs = parse_costs(cost_dict([1.0, 1.0], [0.0], training=False, multiplier=1))
    with pytest.raises(SyncpassError, match="no optimizer state to shard"):
        shard_optimizer_state(costs, 2)

"""Schedules with several stages per device: torch's orders, their simulation, the plans
(torch's schedule classes give the orders, so these tests live with the torch backend)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.backends.torch.schedules import schedule_order
from syncpass.contracts.config import MULTI_STAGE_SCHEDULES, SyncConfig, stage_devices
from syncpass.contracts.costs import parse_costs
from syncpass.core.errors import InfeasibleError, SyncpassError
from syncpass.plan.planfile import parse_plan, plan_to_json
from syncpass.plan.planner import PlanCache, PlanRequest, make_plan, plan_for
from syncpass.plan.problem import problem_from_costs
from syncpass.plan.report import render_plan
from syncpass.plan.schedule import (
    Link,
    ScheduleOrder,
    StageLoad,
    simulate,
    simulate_order,
    single_stage_order,
)

FREE = Link(alpha_s=0.0, beta_bytes_per_s=1.0, batch_bytes=0.0)
GRIDS = [(2, 2, 4), (3, 2, 6), (4, 2, 8), (4, 2, 16), (2, 4, 8), (4, 4, 8), (8, 2, 16)]


def equal_loads(stages: int, microbatches: int, forward: float = 1.0, backward: float = 2.0):
    """Stages whose micro-batch takes ``forward`` and ``backward``."""
    return tuple(StageLoad(forward * microbatches, backward * microbatches) for _ in range(stages))


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs"])
@pytest.mark.parametrize(("devices", "per_device", "microbatches"), GRIDS)
def test_interleaving_gives_megatrons_step_on_equal_stages(
    schedule: str, devices: int, per_device: int, microbatches: int
) -> None:
    # Equal stages, free links: (M * V + S - 1) stage times (f + b) per step, the bubble of
    # interleaving (Narayanan et al. 2021) V times smaller than 1F1B's (M + S - 1) (V f + V b).
    order = schedule_order(schedule, devices, per_device, microbatches)
    stages = devices * per_device
    step = simulate_order(equal_loads(stages, microbatches), (FREE,) * (stages - 1), order).step_s
    assert step == pytest.approx((microbatches * per_device + devices - 1) * 3.0)
    one = single_stage_order("1f1b", devices, 1, microbatches, True)
    whole = equal_loads(devices, microbatches, per_device * 1.0, per_device * 2.0)
    assert simulate_order(whole, (FREE,) * (devices - 1), one).step_s > step


@pytest.mark.parametrize(("devices", "per_device", "microbatches"), GRIDS)
def test_splitting_the_backward_fills_the_bubble(
    devices: int, per_device: int, microbatches: int
) -> None:
    stages = devices * per_device
    loads = equal_loads(stages, microbatches)
    links = (FREE,) * (stages - 1)
    interleaved = simulate_order(
        loads, links, schedule_order("interleaved-1f1b", devices, per_device, microbatches)
    )
    zero_bubble = simulate_order(
        loads, links, schedule_order("interleaved-zb", devices, per_device, microbatches)
    )
    assert zero_bubble.step_s < interleaved.step_s
    assert zero_bubble.bubble_ratio < interleaved.bubble_ratio
    # No weight gradient to move: the bubble cannot be filled with one.
    no_weights = tuple(
        StageLoad(load.forward_s, load.backward_s, input_gradient_s=load.backward_s)
        for load in loads
    )
    later = simulate_order(
        no_weights, links, schedule_order("interleaved-zb", devices, per_device, microbatches)
    )
    assert later.step_s > zero_bubble.step_s


@pytest.mark.parametrize("schedule", MULTI_STAGE_SCHEDULES)
def test_torch_orders_run_every_action_once_without_deadlock(schedule: str) -> None:
    for devices, per_device, microbatches in GRIDS:
        if schedule in ("zbv", "dualpipev") and per_device != 2:
            continue
        if schedule == "dualpipev" and microbatches < devices * per_device:
            with pytest.raises(SyncpassError, match="DualPipeV requires"):
                schedule_order(schedule, devices, per_device, microbatches)
            continue
        order = schedule_order(schedule, devices, per_device, microbatches)
        assert order.stage_device == stage_devices(schedule, devices, per_device)
        done = {
            (action.kind, action.stage, action.microbatch) for d in order.actions for action in d
        }
        for stage, m in itertools.product(range(order.stages), range(microbatches)):
            assert ("F", stage, m) in done
            assert (("B", stage, m) in done) != (
                ("I", stage, m) in done and ("W", stage, m) in done
            )
        rng = random.Random(devices * 100 + per_device * 10 + microbatches)
        loads = tuple(
            StageLoad(rng.uniform(0.5, 2), rng.uniform(1, 4)) for _ in range(order.stages)
        )
        links = tuple(
            Link(alpha_s=0.01, beta_bytes_per_s=1e6, batch_bytes=rng.uniform(0, 1e5))
            for _ in range(order.stages - 1)
        )
        prediction = simulate_order(loads, links, order)
        busiest = max(
            sum(
                load.forward_s + load.backward_s
                for s, load in enumerate(loads)
                if order.stage_device[s] == d
            )
            for d in range(devices)
        )
        assert prediction.step_s >= busiest - 1e-9
        assert len(prediction.stages) == devices


def test_single_stage_orders_simulate_as_the_single_stage_simulator() -> None:
    rng = random.Random(7)
    for schedule, stages, microbatches in itertools.product(("gpipe", "1f1b"), (1, 2, 4), (4, 8)):
        loads = tuple(
            StageLoad(rng.uniform(1, 3), rng.uniform(1, 5), overhead_s=0.01) for _ in range(stages)
        )
        links = tuple(
            Link(alpha_s=0.05, beta_bytes_per_s=1e3, batch_bytes=rng.uniform(0, 500))
            for _ in range(stages - 1)
        )
        order = single_stage_order(schedule, stages, 1, microbatches, True)
        assert simulate_order(loads, links, order).step_s == pytest.approx(
            simulate(loads, links, microbatches, schedule, True).step_s
        )


def test_the_turn_of_the_v_sends_nothing() -> None:
    # Stages 1 and 2 of zbv on 2 devices both sit on device 1: what crosses between them
    # costs nothing, where round-robin sends it.
    heavy = Link(alpha_s=0.0, beta_bytes_per_s=1.0, batch_bytes=40.0)
    links = (FREE, heavy, FREE)
    loads = equal_loads(4, 4)
    order = schedule_order("zbv", 2, 2, 4)
    assert order.stage_device == (0, 1, 1, 0)
    assert simulate_order(loads, links, order).step_s == pytest.approx(
        simulate_order(loads, (FREE,) * 3, order).step_s
    )
    interleaved = schedule_order("interleaved-zb", 2, 2, 4)
    assert simulate_order(loads, links, interleaved).step_s > (
        simulate_order(loads, (FREE,) * 3, interleaved).step_s
    )


def test_an_order_must_name_each_action_once_on_its_stages_device() -> None:
    from syncpass.plan.schedule import Action

    with pytest.raises(ValueError, match="not its stage's"):
        ScheduleOrder("x", 1, (0, 1), ((Action("F", 1, 0),), (Action("F", 0, 0),)))
    with pytest.raises(ValueError, match="listed twice"):
        ScheduleOrder("x", 1, (0,), ((Action("F", 0, 0), Action("F", 0, 0)),))


# --- plans -------------------------------------------------------------------------


def multi_request(stages: int | None, per_device: int | None, schedule: str, **config: object):
    return PlanRequest(
        stages=stages,
        config=SyncConfig().replace(**config),
        microbatches=4,
        schedule=schedule,
        stages_per_device=per_device,
    )


def brute_force(problem, stages: int) -> tuple[float, float]:
    """The least (bottleneck, communication) over every plan of ``stages`` stages."""
    n = problem.num_ops
    best = (math.inf, math.inf)
    for cuts in itertools.combinations(range(1, n), stages - 1):
        if not all(problem.admissible[c] for c in cuts):
            continue
        bounds = (0, *cuts, n)
        times, fits = [], True
        for i, j in itertools.pairwise(bounds):
            memory = float(problem.op_memory[i:j].sum())
            fits &= memory <= problem.memory_limit
            times.append(
                float(problem.op_compute[i:j].sum() + problem.cut_comm[i] + problem.cut_comm[j])
            )
        if fits:
            comm = float(sum(problem.cut_comm[c] for c in cuts))
            best = min(best, (max(times), comm))
    return best


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "interleaved-zb", "zbv"])
def test_the_plan_has_s_times_v_stages_exact_against_brute_force(schedule: str) -> None:
    rng = random.Random(schedule)
    for _ in range(6):
        n = rng.randint(6, 9)
        compute = [rng.uniform(0.5, 3) for _ in range(n)]
        data = cost_dict(
            compute,
            [rng.uniform(0, 0.4) for _ in range(n - 1)],
            backward=[2 * c for c in compute],
            params=[rng.uniform(0, 10) for _ in range(n)],
            training=True,
            memory=25.0,
        )
        costs = parse_costs(data)
        # fixed: the least bottleneck itself (adaptive may trade it for a faster step).
        req = multi_request(2, 2, schedule, strategy="fixed", communication_cost_threshold=math.inf)
        cache = PlanCache(costs, schedule_order)
        try:
            plan = make_plan(costs, req, cache=cache)
        except InfeasibleError:
            problem = problem_from_costs(
                costs, req.config, microbatches=4, carries_values=False, stages_per_device=2
            )
            assert brute_force(problem, 4)[0] == math.inf
            continue
        assert len(plan.stages) == 4 and plan.devices == 2 and plan.stages_per_device == 2
        assert [stage.device for stage in plan.stages] == list(stage_devices(schedule, 2, 2))
        problem = cache.problem(req, 4)
        assert problem.memory_limit == pytest.approx(12.5)  # each stage: half the device's
        bottleneck, comm = brute_force(problem, 4)
        assert plan.bottleneck_s == pytest.approx(bottleneck)
        assert plan.total_comm_s == pytest.approx(comm)
        for device in range(2):
            held = [stage for stage in plan.stages if stage.device == device]
            assert sum(stage.memory_bytes for stage in held) <= 25.0 + 1e-9
        again = parse_plan(json.loads(json.dumps(plan_to_json(plan))))
        assert again.stages_per_device == 2
        assert [stage.device for stage in again.stages] == [s.device for s in plan.stages]


def test_stages_per_device_auto_keeps_the_fastest_and_says_so() -> None:
    compute = [1.0] * 16
    costs = parse_costs(cost_dict(compute, [0.0] * 15, backward=[2.0] * 16, training=True))
    cache = PlanCache(costs, schedule_order)
    plan = plan_for(costs, multi_request(2, None, "interleaved-1f1b"), cache=cache)
    steps = {
        per_device: make_plan(
            costs, multi_request(2, per_device, "interleaved-1f1b"), cache=cache
        ).predicted_step_s
        for per_device in (1, 2, 4)
    }
    assert plan.predicted_step_s == min(steps.values())
    assert plan.stages_per_device == 4  # free links: the more stages, the smaller the bubble
    assert any("--stages-per-device auto: 4 stage(s) per device" in note for note in plan.notes)


def test_schedules_refuse_what_torch_refuses() -> None:
    with pytest.raises(ValueError, match="one stage per device"):
        multi_request(2, 2, "1f1b")
    with pytest.raises(ValueError, match="places exactly two stages on each device"):
        multi_request(2, 3, "zbv")
    costs = parse_costs(cost_dict([1.0] * 8, [0.0] * 7, backward=[1.0] * 8, training=True))
    cache = PlanCache(costs, schedule_order)
    few = dataclasses.replace(multi_request(2, 2, "dualpipev"), microbatches=3)
    with pytest.raises(InfeasibleError, match="DualPipeV requires at least as many"):
        make_plan(costs, few, cache=cache)
    # DualPipeV at 2 x 2 takes 4 or 8 micro-batches of a batch of 8, and the error says so.
    with pytest.raises(InfeasibleError, match="--microbatches 4, 8 would do"):
        make_plan(costs, few, cache=PlanCache(costs, schedule_order))
    # Without the engine's orders (JAX), the planner knows only gpipe and 1f1b.
    with pytest.raises(SyncpassError, match="runs gpipe and 1f1b only; plan for a torch backend"):
        make_plan(costs, multi_request(2, 2, "interleaved-1f1b"))


def test_plan_command_plans_stages_per_device(tmp_path: Path) -> None:
    data = cost_dict([1.0] * 12, [0.1] * 11, backward=[2.0] * 12, training=True)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "syncpass",
            "plan",
            "--costs",
            str(path),
            "--stages",
            "2",
            "--schedule",
            "zbv",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["num_stages"] == 4 and plan["stages_per_device"] == 2
    assert [stage["device"] for stage in plan["stages"]] == [0, 1, 1, 0]
    assert len(plan["baselines"]) == 3  # the rules, for the same schedule and placement
    costs = parse_costs(data)
    plan_text = make_plan(
        costs, multi_request(2, 2, "interleaved-1f1b"), cache=PlanCache(costs, schedule_order)
    )
    text = render_plan(plan_text)
    assert "4 stage(s) on 2 device(s), 2 each (round-robin)" in text
    assert "device 1: stages 1, 3" in text


def test_orders_are_read_from_torch_once_and_kept(tmp_path: Path, monkeypatch) -> None:
    from syncpass.backends.torch import orders

    monkeypatch.setenv("SYNCPASS_CACHE_DIR", str(tmp_path))
    first = orders.cached_order("interleaved-zb", 2, 2, 4, True)
    assert first == schedule_order("interleaved-zb", 2, 2, 4, True)
    (kept,) = tmp_path.glob("orders/torch-*/interleaved-zb-2x2-m4-train.json")
    # Answered from the file: a changed file is what comes back.
    data = json.loads(kept.read_text())
    data["actions"][0].reverse()
    kept.write_text(json.dumps(data))
    assert orders.cached_order("interleaved-zb", 2, 2, 4, True).actions[0] == tuple(
        reversed(first.actions[0])
    )
    kept.write_text("not json")  # a damaged file is read from torch again
    assert orders.cached_order("interleaved-zb", 2, 2, 4, True) == first
    monkeypatch.setenv("SYNCPASS_CACHE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # a folder that cannot be made: no error
    assert orders.cached_order("looped-bfs", 2, 2, 4, True).stages == 4


@pytest.mark.parametrize("schedule", MULTI_STAGE_SCHEDULES)
def test_the_simulation_runs_torchs_order_and_waits_for_each_dependency(schedule: str) -> None:
    devices, per_device, microbatches = 3, 2, 6
    order = schedule_order(schedule, devices, per_device, microbatches)
    rng = random.Random(schedule)
    loads = tuple(
        StageLoad(rng.uniform(0.5, 2), rng.uniform(1, 4), input_gradient_s=None)
        for _ in range(order.stages)
    )
    prediction = simulate_order(loads, (FREE,) * (order.stages - 1), order, record=True)
    # Each device ran exactly torch's list for its rank, in its order, one action at a time.
    assert [[timed.action for timed in device] for device in prediction.actions] == [
        list(actions) for actions in order.actions
    ]
    end = {timed.action: timed.end_s for device in prediction.actions for timed in device}
    last = order.stages - 1
    for device in prediction.actions:
        previous = 0.0
        for timed in device:
            kind, stage, m = timed.action
            assert timed.start_s >= previous - 1e-12
            previous = timed.end_s
            if kind == "F" and stage > 0:
                waited = end[("F", stage - 1, m)]
            elif kind in ("B", "I") and stage < last:
                waited = end.get(("B", stage + 1, m), end.get(("I", stage + 1, m)))
            elif kind in ("B", "I"):
                waited = end[("F", stage, m)]
            elif kind == "W":
                waited = end[("I", stage, m)]
            else:
                continue
            assert waited is not None and timed.start_s >= waited - 1e-12
    assert prediction.step_s == pytest.approx(max(end.values()))


def test_sweeps_tiny_models_and_plan_files_are_refused_clearly() -> None:
    from syncpass.plan.planner import best_stage_count
    from syncpass.plan.retarget import sweep_batch

    data = cost_dict([1.0] * 12, [0.1] * 11, backward=[2.0] * 12, training=True)
    costs = parse_costs(data)
    # A sweep over batch sizes reads the engine's order too.
    points, _ = sweep_batch(costs, multi_request(2, 2, "zbv"), [8, 16], orders=schedule_order)
    assert all(point.plan is not None and len(point.plan.stages) == 4 for point in points)
    with pytest.raises(SyncpassError, match="--sweep-batch needs a fixed --stages-per-device"):
        sweep_batch(costs, multi_request(2, None, "zbv"), [8])
    # Too few ops for even one device's stages: an error, not a crash.
    tiny = parse_costs(cost_dict([1.0] * 3, [0.0] * 2, training=True))
    with pytest.raises(InfeasibleError, match="too few for 4 stages on even one device"):
        best_stage_count(tiny, multi_request(None, 4, "interleaved-1f1b"), 8)
    with pytest.raises(InfeasibleError, match="fewer stages per device"):
        make_plan(tiny, multi_request(1, 4, "interleaved-1f1b"), cache=PlanCache(tiny))
    # A plan file's placement is checked where it is written.
    plan = make_plan(costs, multi_request(2, 2, "zbv"), cache=PlanCache(costs, schedule_order))
    document = plan_to_json(plan)
    for field, value, where in (
        ("stages_per_device", 0, "$.stages_per_device"),
        ("stages_per_device", 3, "$.stages_per_device"),
    ):
        with pytest.raises(SyncpassError) as raised:
            parse_plan({**document, field: value}, "p.json")
        assert raised.value.location == f"p.json:{where}"
    moved = json.loads(json.dumps(document))
    moved["stages"][1]["device"] = 0
    with pytest.raises(SyncpassError, match="places stage 1 on device 1") as raised:
        parse_plan(moved, "p.json")
    assert raised.value.location == "p.json:$.stages[1].device"

"""Plans from cost files: strategies, baselines on equal terms, explanations, plan files."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
import re

import pytest
from costbuilder import cost_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.contracts.config import BASELINE_STRATEGIES, SyncConfig
from syncpass.contracts.costs import Costs, costs_to_json, load_costs, parse_costs
from syncpass.core.errors import InfeasibleError, SyncpassError
from syncpass.core.units import seconds
from syncpass.plan.optimizer import WALK_OPS, Infeasible, Problem, _pair_values, solve
from syncpass.plan.planfile import parse_plan, plan_to_json
from syncpass.plan.planner import (
    Plan,
    PlanRequest,
    auto_stage_limit,
    best_stage_count,
    compare_baselines,
    make_plan,
    plan_for,
    predict,
)
from syncpass.plan.problem import problem_from_costs
from syncpass.plan.report import render_plan
from syncpass.plan.strategies import baseline_cuts


def request(stages: int | None, **config: object) -> PlanRequest:
    return PlanRequest(stages=stages, config=SyncConfig().replace(**config), microbatches=4)


def test_stages_cover_the_ops_in_order() -> None:
    costs = parse_costs(cost_dict([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0]))
    plan = make_plan(costs, request(3, communication_cost_threshold=math.inf))
    assert [op for stage in plan.stages for op in stage.ops] == [op.id for op in costs.ops]
    assert [point.after for point in plan.sync_points] == [
        "op2",
        "op4",
    ]  # 6 | 4+5 | 6 ... best is 9
    assert plan.bottleneck_s == max(stage.time_s for stage in plan.stages)


def test_syncpass_avoids_a_heavy_cut_that_time_balancing_takes() -> None:
    # Compute splits evenly after op1, but 9 s of activations cross there;
    # after op0 or op2 almost nothing crosses.
    costs = parse_costs(cost_dict([2, 2, 2, 2], [0.1, 9.0, 0.1], beta=1.0))
    config = {"communication_cost_threshold": math.inf}
    plan = make_plan(costs, request(2, **config))
    time_plan = make_plan(costs, request(2, strategy="time", **config))
    assert [p.after for p in time_plan.sync_points] == ["op1"]
    assert [p.after for p in plan.sync_points] in (["op0"], ["op2"])
    assert plan.bottleneck_s == pytest.approx(6.1)
    assert time_plan.bottleneck_s == pytest.approx(13.0)
    assert (
        "one cut later" in plan.sync_points[0].reason
        or "one cut earlier" in plan.sync_points[0].reason
    )


def test_uniform_and_parameters_baselines_follow_their_rules() -> None:
    costs = parse_costs(cost_dict([1] * 6, [0] * 5, params=[100, 0, 0, 0, 0, 100], out=[0] * 6))
    uniform = make_plan(costs, request(3, strategy="uniform"))
    assert [len(stage.ops) for stage in uniform.stages] == [2, 2, 2]
    costs = parse_costs(cost_dict([1] * 4, [0] * 3, params=[60, 40, 30, 70]))
    parameters = make_plan(costs, request(2, strategy="parameters"))
    assert [p.after for p in parameters.sync_points] == ["op1"]  # 100 bytes each side
    assert "DeepSpeed" in parameters.notes[0]


def six_blocks(ids: list[str], containers: dict[str, int] | None = None) -> Costs:
    data = cost_dict([1e-3] * len(ids), [0] * (len(ids) - 1))
    for op, op_id in zip(data["ops"], ids, strict=True):
        op["id"] = op_id
    for cut, op_id in zip(data["cuts"], ids, strict=False):
        cut["after"] = op_id
    if containers:
        data["containers"] = containers
    return parse_costs(data)


def test_uniform_counts_the_layers_of_the_stack_as_a_hand_split_does() -> None:
    # Statements before the stack are not layers: 3 | 3 blocks, not 2 | 4 ops-wise.
    ids = ["stmt@L27", "torch.triu@L29", "wte", *(f"blocks.{k}" for k in range(6)), "head"]
    costs = six_blocks(ids, {"blocks": 6})
    uniform = make_plan(costs, request(2, strategy="uniform"))
    assert [p.after for p in uniform.sync_points] == ["blocks.2"]
    assert (
        "uniform: equal numbers of layers per stage (6 layers counted: blocks.0 .. blocks.5; "
        "the 4 op(s) outside them go with the layers beside them)"
    ) in uniform.notes
    # A layer of several ops counts once (the ids show the stack without `containers`).
    ids = ["wte", *(f"blocks.{k}.{part}" for k in range(4) for part in ("attn", "mlp")), "head"]
    uniform = make_plan(six_blocks(ids), request(2, strategy="uniform"))
    assert [p.after for p in uniform.sync_points] == ["blocks.1.mlp"]
    assert "(4 layers counted: blocks.0 .. blocks.3; " in uniform.notes[-1]
    # No stack: ops are what there is to count, and the note says so.
    flat = make_plan(six_blocks(["a", "b", "c", "d"]), request(2, strategy="uniform"))
    assert [p.after for p in flat.sync_points] == ["b"]
    assert "4 ops counted: the cost file shows no stack of layers" in flat.notes[-1]
    # The comparison under another plan says what the rule counted.
    adaptive = make_plan(costs, request(2))
    report = render_plan(adaptive, baselines=compare_baselines(costs, request(2)))
    assert "  uniform: equal numbers of layers per stage (6 layers counted" in report


def test_sync_point_explanations_wrap_at_the_width_asked() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [5, 0.5, 5], beta=1.0))
    plan = make_plan(costs, request(2, communication_cost_threshold=0.1))
    whole = render_plan(plan)
    (line,) = [line for line in whole.splitlines() if line.startswith("  after op1: ")]
    assert len(line) > 60
    wrapped = render_plan(plan, width=60).splitlines()
    start = wrapped.index(line[:60].rsplit(" ", 1)[0])
    following = wrapped[start + 1 :]
    tail = following[: next(i for i, text in enumerate(following) if not text.startswith("    "))]
    assert tail and all(len(text) <= 60 for text in (wrapped[start], *tail))
    assert " ".join(text.strip() for text in (wrapped[start], *tail)) == line.strip()


def test_adaptive_reports_the_raised_threshold_and_the_cut_that_forced_it() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [5, 0.5, 5], beta=1.0))
    plan = make_plan(costs, request(2, communication_cost_threshold=0.1))
    assert plan.threshold.requested == 0.1
    assert plan.threshold.used == pytest.approx(0.25)  # 0.5 s over 2 s of compute
    assert plan.threshold.forced_by == "op1"
    assert any("raised it to 25%" in note for note in plan.notes)


def test_fixed_threshold_fails_with_the_least_threshold_that_would_do() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [5, 0.5, 5], beta=1.0))
    with pytest.raises(InfeasibleError) as caught:
        make_plan(costs, request(2, strategy="fixed", communication_cost_threshold=0.1), "m.json")
    assert caught.value.constraint == "threshold"
    assert "--threshold 0.25" in str(caught.value)
    assert str(caught.value).startswith("m.json: ")


def test_memory_that_no_plan_meets_is_named_with_what_would_fit() -> None:
    costs = parse_costs(cost_dict([1, 1, 1], [0, 0], params=[4, 4, 4], multiplier=1, memory=6))
    with pytest.raises(InfeasibleError, match="device memory 6 B") as caught:
        make_plan(costs, request(2, communication_cost_threshold=math.inf))
    assert caught.value.constraint == "memory"
    assert "needs 8 B" in str(caught.value)


@pytest.mark.parametrize(
    ("stages", "config", "what"),
    [
        (5, {}, "5 stages need at least 5 ops"),
        (3, {"min_sync_interval": 2}, "need at least 6 ops"),
    ],
)
def test_too_many_stages(stages: int, config: dict[str, object], what: str) -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [0, 0, 0]))
    with pytest.raises(InfeasibleError, match=what):
        make_plan(costs, request(stages, **config))


def test_too_few_admissible_cuts() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [0, None, None]))
    with pytest.raises(InfeasibleError, match="only 1 admissible cut"):
        make_plan(costs, request(3))


def test_manual_uses_exactly_the_pinned_cuts() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [0, 0, 0], pinned=[0]))
    plan = make_plan(costs, request(None, strategy="manual"))
    assert [p.after for p in plan.sync_points] == ["op0"]
    assert plan.sync_points[0].pinned
    assert "pinned by the user" in plan.sync_points[0].reason
    with pytest.raises(SyncpassError, match="make 2 stages, but 3 were asked"):
        make_plan(costs, request(3, strategy="manual"))


def test_pinned_cuts_are_kept_by_every_strategy() -> None:
    costs = parse_costs(cost_dict([5, 1, 1, 1, 1, 5], [0] * 5, pinned=[4]))
    for strategy in ("adaptive", "fixed", "uniform", "parameters", "time"):
        plan = make_plan(
            costs, request(3, strategy=strategy, communication_cost_threshold=math.inf)
        )
        assert "op4" in [p.after for p in plan.sync_points], strategy


def test_baselines_report_the_constraints_they_break() -> None:
    costs = parse_costs(cost_dict([1, 1, 1, 1], [0, 0, 0], params=[1, 1, 5, 5], memory=9))
    plans = compare_baselines(costs, request(2, communication_cost_threshold=math.inf))
    uniform = next(p for p in plans if p.strategy == "uniform")
    assert uniform.violations == ("stage 1 needs 10 B, over the device's 9 B",)
    # The optimiser's plan meets the limit where the rule breaks it.
    assert make_plan(costs, request(2)).stages[1].memory_bytes <= 9


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 20), min_size=2, max_size=12),
    st.lists(st.integers(0, 20), min_size=11, max_size=11),
    st.integers(2, 4),
)
def test_the_optimum_is_never_worse_than_a_legal_baseline(
    compute: list[int], live: list[int], stages: int
) -> None:
    n = len(compute)
    if stages > n:
        return
    costs = parse_costs(
        cost_dict([c / 4 for c in compute], [b / 8 for b in live[: n - 1]], training=True)
    )
    config = {"communication_cost_threshold": math.inf}
    exact = make_plan(costs, request(stages, strategy="fixed", **config))
    plan = make_plan(costs, request(stages, **config))
    for baseline in compare_baselines(costs, request(stages, **config)):
        assert not baseline.violations
        # The exact optimiser's bottleneck; adaptive's predicted step (it weighs the rules).
        assert exact.bottleneck_s <= baseline.bottleneck_s
        assert plan.predicted_step_s <= baseline.predicted_step_s


def test_best_stage_count_minimises_predicted_step(example_costs_path) -> None:  # type: ignore[no-untyped-def]
    costs = load_costs(example_costs_path)
    chosen = best_stage_count(costs, request(None), 6)
    others = []
    for stages in range(1, 7):
        try:
            others.append(make_plan(costs, request(stages)).predicted_step_s)
        except InfeasibleError:  # 1F1B with 4 micro-batches fills at most 4 stages
            assert stages > 4
    assert chosen.predicted_step_s == min(others)


def test_plan_file_round_trips(example_costs_path) -> None:  # type: ignore[no-untyped-def]
    costs = load_costs(example_costs_path)
    plan = make_plan(costs, request(4))
    assert parse_plan(plan_to_json(plan)) == plan
    # The model's settings the profile read go from the cost file into the plan file.
    settings = (("config.return_dict", True), ("transformer.config.use_cache", False))
    with_settings = make_plan(dataclasses.replace(costs, model_settings=settings), request(4))
    assert with_settings.model_settings == settings
    assert parse_plan(plan_to_json(with_settings)) == with_settings
    assert "model_settings" not in plan_to_json(plan)
    document = plan_to_json(plan, compare_baselines(costs, request(4)))
    assert {b["strategy"] for b in document["baselines"]} == {"uniform", "parameters", "time"}
    assert set(document) >= {
        "bottleneck_s",
        "threshold",
        "sync_points",
        "stages",
        "predicted_step_s",
        "strategy",
    }


def test_values_reach_only_the_next_stage() -> None:
    # A chain of six ops, with op1's value also used by op4 (a skip connection).
    data = cost_dict([1] * 6, [0] * 5)
    chain = [[f"op{t}", f"op{t + 1}"] for t in range(5)]
    data["edges"] = [["<input>", "op0"], *chain, ["op1", "op4"], ["op5", "<output>"]]
    costs = parse_costs(data)
    for stages in (2, 3, 4):
        plan = make_plan(costs, request(stages, communication_cost_threshold=math.inf))
        stage_of = {op: s.index for s in plan.stages for op in s.ops}
        assert stage_of["op4"] - stage_of["op1"] <= 1, stages
    # Without the dataflow the even split would put op1 and op4 two stages apart.
    del data["edges"]
    free = make_plan(parse_costs(data), request(3, communication_cost_threshold=math.inf))
    stage_of = {op: s.index for s in free.stages for op in s.ops}
    assert stage_of["op4"] - stage_of["op1"] == 2
    # A skip from the first op to the last leaves no room for a middle stage.
    data["edges"] = [*chain, ["op0", "op5"]]
    with pytest.raises(InfeasibleError, match="keeps every value within the next stage") as caught:
        make_plan(parse_costs(data), request(3, communication_cost_threshold=math.inf))
    assert caught.value.constraint == "dataflow"
    # The refusal names a value that the best plan without the rule sends too far.
    assert "for one, the value op0 makes is used by op5, 2 stages later" in str(caught.value)


def test_a_plan_the_next_stage_rule_holds_back_names_the_value() -> None:
    # A mask made first (op0) and used by every block: the rule packs the blocks together.
    # Then a norm and a head, which read only the blocks' output.
    data = cost_dict([0.001, 1, 1, 1, 1, 1, 1, 1, 0.5, 0.5], [0] * 9)
    data["ops"][0]["source"] = "model.py:12"
    blocks = [f"op{t}" for t in range(1, 8)]
    chain = [[a, b] for a, b in zip([*blocks, "op8"], [*blocks[1:], "op8", "op9"], strict=True)]
    data["edges"] = [["op0", block] for block in blocks] + chain
    plan = make_plan(parse_costs(data), request(4))
    held = [note for note in plan.notes if note.startswith("the next-stage rule holds")]
    assert len(held) == 1 and plan.notes[0] == held[0]
    assert "the value op0 makes (model.py:12) is used by op" in held[0]
    assert "make it a buffer of the model" in held[0]
    # A plan the rule does not change gets no such note.
    data["edges"] = chain
    assert not any(
        "next-stage rule" in note for note in make_plan(parse_costs(data), request(4)).notes
    )


def test_manual_plans_that_skip_a_stage_are_flagged() -> None:
    data = cost_dict([1, 1, 1, 1], [0, 0, 0], pinned=[0, 1])
    data["edges"] = [["op0", "op1"], ["op1", "op2"], ["op2", "op3"], ["op0", "op3"]]
    plan = make_plan(parse_costs(data), request(None, strategy="manual"))
    assert any("skip a stage" in violation for violation in plan.violations)


def test_errors_cross_process_boundaries_whole() -> None:
    import pickle

    from syncpass.core.errors import InfeasibleError, SyncpassError

    error = InfeasibleError("too many stages", "stages", "model.py:3")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, InfeasibleError)
    assert (copy.message, copy.constraint, copy.location) == error_fields(error)
    plain = pickle.loads(pickle.dumps(SyncpassError("bad", "f.py:1")))
    assert str(plain) == "f.py:1: bad"


def error_fields(error: object) -> tuple[str, str, str]:
    return (error.message, error.constraint, error.location)  # type: ignore[attr-defined]


def test_default_microbatches_divide_the_batch_as_runs_cut_it() -> None:
    from syncpass.plan.planner import default_microbatches

    assert default_microbatches(2, 12) == 6  # not 8: 12 rows do not cut into 8 equal ones
    assert default_microbatches(4, 8) == 8
    assert default_microbatches(3, 7) == 7
    assert default_microbatches(1, 3) == 3


def _step(costs: Costs, problem: Problem, cuts: tuple[int, ...]) -> float:
    return predict(costs, problem, cuts, 4, "1f1b").step_s


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=2, max_size=9),
    st.lists(st.integers(0, 40), min_size=8, max_size=8),
    st.lists(st.integers(0, 10), min_size=9, max_size=9),
    st.integers(2, 4),
    st.sampled_from([0.0, 0.05, 0.1, 0.3, math.inf]),
    st.sampled_from([None, 40.0, 80.0]),
)
def test_adaptive_never_predicts_a_slower_step_than_it_could_have(
    compute: list[int],
    live: list[int],
    params: list[int],
    stages: int,
    threshold: float,
    memory: float | None,
) -> None:
    """Over the thresholds where the exact optimiser's objective (bottleneck, then total
    communication) improves, the exact plan there (and the rules' plans that keep every
    other constraint): adaptive's predicted step is the least of them. Between two such
    thresholds the optimiser's own tie-break stands. A candidate with a stage that holds
    no weights (where the model has some) is not one: it is a plan for fewer stages."""
    n = len(compute)
    if stages > n:
        return
    data = cost_dict(
        [c / 1000 for c in compute],
        [b * 1000 for b in live[: n - 1]],
        backward=[2 * c / 1000 for c in compute],
        params=params[:n],
        alpha=1e-4,
        beta=2e7,
        memory=memory,
        training=True,
    )
    costs = parse_costs(data)
    asked = request(stages, communication_cost_threshold=threshold)
    try:
        plan = make_plan(costs, asked)
    except InfeasibleError:
        return
    problem = problem_from_costs(costs, asked.config, (), 4)
    first = solve(problem, stages, threshold, adaptive=True)
    assert not isinstance(first, Infeasible)
    ratios = _pair_values(problem, "ratio")
    assert ratios is not None
    candidates = sorted({float(r) for r in ratios if r > first.threshold_used} | {math.inf})
    weights = [op.param_bytes for op in costs.ops]

    def idle(cuts: tuple[int, ...]) -> bool:
        bounds = (0, *cuts, n)
        return any(weights) and any(not any(weights[a:b]) for a, b in itertools.pairwise(bounds))

    def idle_plan(made: Plan) -> bool:
        return idle(tuple(itertools.accumulate(len(stage.ops) for stage in made.stages[:-1])))

    steps = [_step(costs, problem, first.cuts)]
    best = (first.bottleneck, first.total_comm)
    for tau in candidates:
        found = solve(problem, stages, tau, adaptive=False)
        assert not isinstance(found, Infeasible)
        if (found.bottleneck, found.total_comm) < best:
            best = (found.bottleneck, found.total_comm)
            if not idle(found.cuts):
                steps.append(_step(costs, problem, found.cuts))
    for rule in BASELINE_STRATEGIES:
        cuts = baseline_cuts(problem, stages, rule, costs)
        if isinstance(cuts, Infeasible) or idle(cuts):
            continue
        ruled = make_plan(
            costs, request(stages, strategy=rule, communication_cost_threshold=math.inf)
        )
        if not ruled.violations:
            steps.append(ruled.predicted_step_s)
    assert plan.predicted_step_s == pytest.approx(min(steps), rel=1e-12)
    unlimited = make_plan(costs, request(stages, communication_cost_threshold=math.inf))
    if not idle_plan(unlimited):
        assert plan.predicted_step_s <= unlimited.predicted_step_s * (1 + 1e-12)
    for baseline in compare_baselines(costs, asked):
        if idle_plan(baseline):
            continue
        if all("over the threshold" in broken for broken in baseline.violations):
            assert plan.predicted_step_s <= baseline.predicted_step_s * (1 + 1e-12)
    assert plan.threshold.used >= threshold
    assert all(point.ratio <= plan.threshold.used for point in plan.sync_points)


def test_a_raise_for_speed_is_reported_with_both_thresholds_and_steps() -> None:
    # Two equal halves, but 4 KiB crosses the middle: within 10% the plan must cut after
    # op0 (a lopsided split); a 40% threshold buys the balanced one.
    data = cost_dict(
        [0.01, 0.01, 0.01, 0.01],
        [0.0, 8000.0, 0.0],
        backward=[0.02] * 4,
        alpha=0.0,
        beta=1e6,
        training=True,
    )
    costs = parse_costs(data)
    plan = make_plan(costs, request(2, communication_cost_threshold=0.1))
    assert [point.after for point in plan.sync_points] == ["op1"]
    tau = plan.threshold
    assert tau.raised_for_speed and tau.admitting == 0.1 and tau.used > 0.1
    assert tau.admitting_step_s is not None and tau.admitting_step_s > plan.predicted_step_s
    assert any("for speed" in note for note in plan.notes)
    assert parse_plan(plan_to_json(plan)) == plan
    fixed = make_plan(costs, request(2, strategy="fixed", communication_cost_threshold=0.1))
    assert [point.after for point in fixed.sync_points] != ["op1"]  # fixed keeps it hard


@pytest.mark.parametrize("seed", range(4))
def test_adaptive_on_a_large_model_is_no_slower_than_the_unconstrained_plan_or_a_rule(
    seed: int,
) -> None:
    """Above the walk's size (optimizer.WALK_OPS) adaptive weighs its first plan, the plan
    without a threshold and the rules'."""
    rng = random.Random(seed)
    n = WALK_OPS + 40
    compute = [rng.uniform(0.5, 8.0) / 1000 for _ in range(n)]
    data = cost_dict(
        compute,
        [rng.choice([1e3, 1e4, 1e5]) for _ in range(n - 1)],
        backward=[2 * c for c in compute],
        alpha=1e-4,
        beta=1e8,
        training=True,
    )
    costs = parse_costs(data)
    plan = make_plan(costs, request(4, communication_cost_threshold=0.02))
    rivals = [make_plan(costs, request(4, communication_cost_threshold=math.inf))]
    rivals += [b for b in compare_baselines(costs, request(4)) if not b.violations]
    with contextlib.suppress(InfeasibleError):
        rivals.append(
            make_plan(costs, request(4, strategy="fixed", communication_cost_threshold=0.02))
        )
    assert all(plan.predicted_step_s <= rival.predicted_step_s * (1 + 1e-12) for rival in rivals)


def test_stages_auto_never_plans_more_stages_than_devices() -> None:
    data = cost_dict([1.0] * 12, [0.0] * 11, backward=[2.0] * 12, training=True)
    data["hardware"]["devices"] = 2
    costs = parse_costs(data)
    plan = best_stage_count(costs, request(None), 8)
    assert len(plan.stages) <= 2
    (tried,) = [note for note in plan.notes if note.startswith("--stages auto, predicted step")]
    one = make_plan(costs, request(1)).predicted_step_s
    assert f"1: {seconds(one)}" in tried and "2: " in tried and "3: " not in tried
    assert f"{len(plan.stages)}: {seconds(plan.predicted_step_s)} (chosen)" in tried
    assert any(
        "tried 1 to 2 stage(s), not 8: the hardware has 2 device(s)" in n for n in plan.notes
    )
    unlimited = dict(data, hardware={k: v for k, v in data["hardware"].items() if k != "devices"})
    assert len(best_stage_count(parse_costs(unlimited), request(None), 8).stages) > 2
    # An explicit count beyond the devices is planned, with a warning in the notes.
    forced = make_plan(costs, request(4))
    assert len(forced.stages) == 4
    (shared,) = [note for note in forced.notes if "4 pipeline ranks on 2 device(s)" in note]
    # 12 ops of 3 s (forward and backward) shared by 2 devices: 18 s a step at least.
    assert "is for a device per rank" in shared
    found = re.search(r"over 2, (\d+(?:\.\d+)?) s a step \((\d+\.\d+)x the prediction\)", shared)
    assert found is not None, shared
    assert float(found.group(1)) >= 18.0
    assert float(found.group(2)) == pytest.approx(
        float(found.group(1)) / forced.predicted_step_s, rel=0.01
    )


@pytest.mark.parametrize("devices", [0, 1.5, True, "2"])
def test_devices_must_be_a_whole_number(devices: object) -> None:
    data = cost_dict([1.0, 1.0], [0.0])
    data["hardware"]["devices"] = devices
    with pytest.raises(SyncpassError, match=r"\$\.hardware\.devices"):
        parse_costs(data)


def test_devices_round_trip_through_the_cost_file() -> None:
    data = cost_dict([1.0, 1.0], [0.0])
    data["hardware"]["devices"] = 8
    costs = parse_costs(data)
    assert costs.hardware.devices == 8
    assert parse_costs(costs_to_json(costs)).hardware.devices == 8


def test_a_sync_points_explanation_says_which_sync_point_a_move_would_break() -> None:
    config = {"strategy": "fixed", "min_sync_interval": 1, "communication_cost_threshold": 0.06}
    data = cost_dict([1] * 6, [0.1, 0.1, 0.04, 0.1, 0.1], config=config)
    plan = make_plan(parse_costs(data), request(3, **config))
    assert [point.after for point in plan.sync_points] == ["op1", "op3"]
    first, second = (point.reason for point in plan.sync_points)
    # Moved one cut earlier, the sync point itself would cost too much.
    assert (
        "one cut earlier (after op0) would break a constraint: this sync point, moved there, "
        "costs 10% of the compute of the stage it closes" in first
    )
    # Moved one cut later, the stage the next one closes shrinks: that one is named as such.
    assert (
        "one cut later (after op2) would break a constraint: the next sync point (after op3) "
        "costs 10%" in first
    )
    assert "the sync point after" not in first + second


def test_stages_auto_tries_no_more_stages_than_the_model_has_ops() -> None:
    costs = parse_costs(cost_dict([1.0, 2.0, 3.0, 1.0, 2.0, 1.0], [1024] * 5))
    limit = auto_stage_limit(costs, 1_000_000)
    assert limit == 6
    plan = plan_for(costs, PlanRequest(stages=None, config=costs.config), "c.json", 1_000_000)
    assert "--stages auto tried 1 to 6 stage(s), not 1000000: the model has 6 op(s)" in plan.notes


def test_the_default_microbatches_keep_to_the_least_size_a_batch_norm_takes() -> None:
    from syncpass.plan.planner import default_microbatches

    assert default_microbatches(4, 8, min_size=2) == 4  # not 8 micro-batches of one sample
    assert default_microbatches(2, 12, min_size=4) == 3
    assert default_microbatches(4, 3, min_size=2) == 1  # none divides: the whole batch
    data = cost_dict([1, 2, 3, 4, 5, 6, 7, 8], training=True)
    data.update(batch_size=8, min_microbatch_size=2, min_microbatch_by="head.bn (net.py:9)")
    costs = parse_costs(data)
    plan = make_plan(costs, PlanRequest(stages=4, config=SyncConfig()))
    assert plan.microbatches == 4
    assert (
        "8 micro-batches would give 1 sample each; head.bn (net.py:9), a batch norm in "
        "training, needs at least 2 (more than one value per channel): using 4"
    ) in plan.notes
    # Without the floor the default is 8 and nothing is said.
    plain = make_plan(
        dataclasses.replace(costs, min_microbatch_size=1, min_microbatch_by=None),
        PlanRequest(stages=4, config=SyncConfig()),
    )
    assert plain.microbatches == 8
    assert not any("batch norm" in note for note in plain.notes)
    with pytest.raises(
        SyncpassError,
        match=r"--microbatches 8 cuts the batch of 8 into "
        r"micro-batches of 1 sample; head\.bn \(net\.py:9\).*use --microbatches 4$",
    ):
        make_plan(costs, PlanRequest(stages=4, config=SyncConfig(), microbatches=8))
    # GPipe takes fewer micro-batches than stages: every count with 2 samples or more works.
    with pytest.raises(SyncpassError, match=r"use --microbatches 1, 2 or 4$"):
        make_plan(
            costs, PlanRequest(stages=4, config=SyncConfig(), microbatches=8, schedule="gpipe")
        )
    assert (
        make_plan(costs, PlanRequest(stages=4, config=SyncConfig(), microbatches=4)).microbatches
        == 4
    )


def test_an_op_holding_more_than_a_stages_share_is_named_in_the_notes() -> None:
    data = cost_dict([1.0, 4.0, 1.0, 2.0, 2.0])
    data["ops"][1]["source"] = "model.py:12"
    costs = parse_costs(data)
    notes = make_plan(costs, request(4, communication_cost_threshold=math.inf)).notes
    (note,) = [note for note in notes if "holds" in note]
    assert note.startswith("op1 at model.py:12 holds 40% of the compute")
    assert "at 4 stages (25%)" in note
    # At 2 stages a stage's share (50%) is more than it: nothing to say.
    plan = make_plan(costs, request(2, communication_cost_threshold=math.inf))
    assert not any("holds" in note for note in plan.notes)


def test_a_plan_whose_stages_post_together_says_what_the_meetings_cost() -> None:
    # Equal stages in 1F1B post their transfers at the same moments after each of the
    # 4 micro-batches but the first and the last: 2 meetings, each stalling both ranks.
    data = cost_dict([1.0] * 4, backward=[2.0] * 4, training=True, alpha=0.01)
    plain = make_plan(parse_costs(data), request(2, communication_cost_threshold=math.inf))
    data["hardware"].update(meet_stall_s=0.05, meet_window_s=0.01, name="gloo here")
    stalled = make_plan(parse_costs(data), request(2, communication_cost_threshold=math.inf))
    assert [point.after for point in stalled.sync_points] == ["op1"]
    assert stalled.predicted_step_s == pytest.approx(plain.predicted_step_s + 2 * 0.05)
    (note,) = [note for note in stalled.notes if "meet" in note]
    assert note.startswith("4 batches of transfers a step are posted as the neighbouring rank")
    assert "gloo here's posts stall when they meet (50 ms at the same moment" in note
    assert "200 ms of the ranks' time in all" in note
    assert not any("meet" in note for note in plain.notes)


def test_a_faster_plan_with_a_stage_that_holds_no_weights_is_not_taken() -> None:
    # The first two ops hold no weights. The uniform rule gives the first stage only op0,
    # a rank that would just pass the batch on: a plan for one stage fewer. Meeting posts'
    # stalls on the balanced rest make it predict faster than any plan using all 4.
    data = cost_dict(
        [0.05, 1e-4, 1.0, 1.0, 1.0, 1.0],
        backward=[0.0, 0.0, 2.0, 2.0, 2.0, 2.0],
        params=[0, 0, 1e6, 1e6, 1e6, 1e6],
        training=True,
        alpha=0.01,
    )
    data["hardware"].update(meet_stall_s=1.0, meet_window_s=0.05)
    costs = parse_costs(data)
    config = SyncConfig().replace(communication_cost_threshold=math.inf)
    problem = problem_from_costs(costs, config)
    idle = baseline_cuts(problem, 4, "uniform", costs)
    assert idle == (1, 3, 4)  # stage 0: op0 alone
    plan = make_plan(costs, PlanRequest(stages=4, config=config, microbatches=8))
    assert predict(costs, problem, idle, 8, "1f1b").step_s < plan.predicted_step_s
    weights = {op.id: op.param_bytes for op in costs.ops}
    assert all(any(weights[op] for op in stage.ops) for stage in plan.stages)

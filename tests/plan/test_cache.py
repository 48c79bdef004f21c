"""One PlanCache serves the plan, its baselines and --stages auto: the same plans as
planning each from scratch, with no solve, rule or simulation done twice."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from costbuilder import cost_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.contracts.config import BASELINE_STRATEGIES, SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan import optimizer, planner, strategies
from syncpass.plan.planner import Plan, PlanCache, PlanRequest, compare_baselines, plan_for


@st.composite
def cost_files(draw: st.DrawFn) -> Costs:
    n = draw(st.integers(4, 40))
    compute = draw(st.lists(st.floats(0.01, 4.0), min_size=n, max_size=n))
    live = draw(st.lists(st.floats(0.0, 8.0), min_size=n - 1, max_size=n - 1))
    params = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    return parse_costs(
        cost_dict(
            compute,
            live,
            backward=[2 * c for c in compute],
            params=params,
            alpha=draw(st.sampled_from([0.0, 0.01])),
            beta=4.0,
            memory=draw(st.sampled_from([None, 4.0 * sum(params) / 3 + 8])),
            training=draw(st.booleans()),
        )
    )


def from_scratch(costs: Costs, request: PlanRequest, max_stages: int | None) -> tuple[Plan, ...]:
    plan = plan_for(costs, request, "", max_stages)
    if len(plan.stages) == 1:
        return (plan,)
    same = dataclasses.replace(request, stages=len(plan.stages), microbatches=plan.microbatches)
    baselines = []
    for rule in BASELINE_STRATEGIES:
        try:
            baselines.append(
                planner.make_plan(
                    costs, dataclasses.replace(same, config=same.config.replace(strategy=rule))
                )
            )
        except SyncpassError:
            continue
    return (plan, *baselines)


def with_cache(costs: Costs, request: PlanRequest, max_stages: int | None) -> tuple[Plan, ...]:
    cache = PlanCache(costs)
    plan = plan_for(costs, request, "", max_stages, cache)
    if len(plan.stages) == 1:
        return (plan,)
    same = dataclasses.replace(request, stages=len(plan.stages), microbatches=plan.microbatches)
    return (plan, *compare_baselines(costs, same, cache))


@settings(max_examples=60, deadline=None)
@given(cost_files(), st.integers(1, 5), st.booleans(), st.sampled_from([0.05, 0.5]))
def test_a_shared_cache_gives_the_plans_planning_from_scratch_gives(
    costs: Costs, stages: int, auto: bool, threshold: float
) -> None:
    request = PlanRequest(
        stages=None if auto else stages,
        config=SyncConfig().replace(communication_cost_threshold=threshold),
        schedule="gpipe",
    )
    max_stages = stages if auto else None
    try:
        expected = from_scratch(costs, request, max_stages)
    except SyncpassError as error:
        with pytest.raises(SyncpassError) as raised:
            with_cache(costs, request, max_stages)
        assert str(raised.value) == str(error)
        return
    assert with_cache(costs, request, max_stages) == expected


def test_the_plan_and_its_baselines_compute_nothing_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: Counter[tuple[Any, ...]] = Counter()

    def counted(name: str, function: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            # The problem by identity, the rest by value: the same question twice.
            calls[(name, id(args[1]), *args[2:])] += 1
            return function(*args)

        return wrapper

    monkeypatch.setattr(planner, "baseline_cuts", counted("rule", strategies.baseline_cuts))
    monkeypatch.setattr(planner, "predict", counted("step", planner.predict))
    monkeypatch.setattr(planner, "solve", counted("solve", optimizer.solve))
    compute = [1.0, 3.0, 2.0, 2.0, 5.0, 1.0, 1.0, 4.0, 2.0, 3.0]
    costs = parse_costs(cost_dict(compute, [1.0] * 9, alpha=0.01, beta=4.0, training=True))
    request = PlanRequest(stages=3, config=SyncConfig())
    plans = with_cache(costs, request, None)
    assert len(plans) == 1 + len(BASELINE_STRATEGIES)
    assert calls and max(calls.values()) == 1, calls

"""Every pipeline schedule, at every stage count per device it takes: syncpass's plan
against the even split of layers, predicted by simulating torch's own action order.

For each case (a cost file, a device count, a hardware profile) and each schedule of
``syncpass.contracts.config.SCHEDULES`` at each ``V`` (stages per device) it takes
(:func:`syncpass.plan.planner.stages_per_device_choices`: 1 for gpipe and 1f1b, 2 for
the V-shaped zbv and dualpipev, 1, 2 and 4 for the others), this prints

* the predicted step of syncpass's plan (strategy ``adaptive``) and of the ``uniform``
  rule (equal ops per stage: what torch's even split of layers does) for the same
  schedule and ``V``, and ``uni/sp``, the one over the other (above 1: syncpass's plan
  is faster);
* the bubble ratio of each (the mean share of the step a device sits idle);
* the wall time of planning it (a fresh :class:`~syncpass.plan.planner.PlanCache`, so
  nothing is shared with the rows before, torch's schedule order included);
* how many hard constraints (memory, pins; not the communication threshold) the
  uniform split breaks: such a step is one no legal plan could have.

Per case it also prints the best ``(schedule, V)`` of syncpass's plans and the best of
the uniform splits, each with its speedup over plain 1F1B (``V = 1``) on the uniform
split. Every case uses one micro-batch count ``M = 4 * devices``, which every schedule
takes: torch's interleaved schedules split ``M`` into ``M // devices`` rounds and
DualPipeV needs ``M >= 2 * devices``.

The cases: the bundled LM's cost file (``examples/costs/gpt_24x1024.costs.json``,
scaled to a batch of 32 sequences so that ``M`` fits it) on one NVLink node, and
decoder-only GPTs of 64 and 512 blocks estimated from FLOP counts
(``examples/make_example_costs.py``) on NVLink within a node and InfiniBand beyond.
The global batch is ``M`` at the largest device count, a sequence per micro-batch;
the lengths keep the LM head's logits, which the cost model holds for the whole batch,
within a device's memory. Nothing runs on a GPU: every step is the simulator's.

    PYTHONPATH=. python bench/bench_schedules.py            # about a minute on 2 cores
    PYTHONPATH=. python bench/bench_schedules.py --quick    # the bundled LM on 4 devices
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.backends.torch.schedules import schedule_order
from syncpass.contracts.config import SCHEDULES, SyncConfig
from syncpass.contracts.costs import Costs, load_costs, parse_costs
from syncpass.contracts.hardware import load_profile, retarget_hardware
from syncpass.core.errors import SyncpassError
from syncpass.core.units import seconds
from syncpass.plan.explain import broken_constraints
from syncpass.plan.optimizer import Infeasible
from syncpass.plan.planner import Plan, PlanCache, PlanRequest, make_plan, stages_per_device_choices
from syncpass.plan.retarget import retarget_batch

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "examples" / "costs" / "gpt_24x1024.costs.json"


@dataclass(frozen=True)
class Model:
    """A cost file to plan: the bundled one (``layers`` 0) or a GPT estimated from FLOPs."""

    label: str
    batch: int
    layers: int = 0
    width: int = 0
    seq: int = 0

    def costs(self, profile: str) -> Costs:
        if self.layers:
            estimate = _gpt_costs()(
                layers=self.layers, width=self.width, seq=self.seq, batch=self.batch
            )
            costs = parse_costs(estimate, self.label)
        else:
            costs = retarget_batch(load_costs(BUNDLED), self.batch)
        return retarget_hardware(costs, load_profile(profile))


#: (model, ((devices, hardware profile), ...))
CASES = (
    (Model("lm 24x1024 (bundled)", batch=32), ((4, "nvlink-8xh100"), (8, "nvlink-8xh100"))),
    (
        Model("gpt 64x4096", batch=128, layers=64, width=4096, seq=1024),
        ((8, "nvlink-8xh100"), (32, "ib-400g-h200")),
    ),
    (
        Model("gpt 512x4096", batch=256, layers=512, width=4096, seq=512),
        ((32, "ib-400g-h200"), (64, "ib-400g-h200")),
    ),
)
QUICK_CASES = ((Model("lm 24x1024 (bundled)", batch=16), ((4, "nvlink-8xh100"),)),)


def _gpt_costs() -> Callable[..., dict[str, Any]]:
    """The estimator the bundled cost file comes from."""
    spec = importlib.util.spec_from_file_location(
        "make_example_costs", REPO / "examples" / "make_example_costs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    estimator: Callable[..., dict[str, Any]] = module.gpt_costs
    return estimator


@dataclass(frozen=True)
class Row:
    """One schedule at one ``V``: syncpass's plan and the uniform split's (or why none)."""

    schedule: str
    per_device: int
    planned: Plan | str  # the plan, or why there is none
    uniform: Plan | str
    plan_s: float  # wall time of making ``planned``
    uniform_breaks: int  # hard constraints the uniform split breaks


def plan_row(costs: Costs, devices: int, microbatches: int, schedule: str, per_device: int) -> Row:
    cache = PlanCache(costs, schedule_order)
    request = PlanRequest(
        stages=devices,
        config=SyncConfig(),
        microbatches=microbatches,
        schedule=schedule,
        stages_per_device=per_device,
    )
    start = time.perf_counter()
    planned = _plan(costs, request, cache)
    plan_s = time.perf_counter() - start
    uniform_request = PlanRequest(
        stages=devices,
        config=SyncConfig().replace(strategy="uniform"),
        microbatches=microbatches,
        schedule=schedule,
        stages_per_device=per_device,
    )
    uniform = _plan(costs, uniform_request, cache)
    problem = cache.problem(uniform_request, microbatches)
    cuts = cache.baseline(problem, devices * per_device, "uniform")
    breaks = 0
    if not isinstance(cuts, Infeasible):
        ids = [op.id for op in costs.ops]
        breaks = len(broken_constraints(problem, cuts, math.inf, ids))
    return Row(schedule, per_device, planned, uniform, plan_s, breaks)


def _plan(costs: Costs, request: PlanRequest, cache: PlanCache) -> Plan | str:
    try:
        return make_plan(costs, request, cache=cache)
    except SyncpassError as error:
        return error.message


def _step(plan: Plan | str) -> str:
    return seconds(plan.predicted_step_s) if isinstance(plan, Plan) else "no plan"


def _ratio(row: Row) -> str:
    if isinstance(row.planned, Plan) and isinstance(row.uniform, Plan):
        return f"{row.uniform.predicted_step_s / row.planned.predicted_step_s:.3f}"
    return "-"


def _bubble(plan: Plan | str) -> str:
    return f"{plan.bubble_ratio:.1%}" if isinstance(plan, Plan) else "-"


HEADER = (
    f"{'schedule':18}{'V':>2}{'stages':>7}{'syncpass':>11}{'uniform':>11}{'uni/sp':>8}"
    f"{'bubble sp':>10}{'bubble uni':>11}{'plan time':>11}{'uni breaks':>11}"
)


def print_row(row: Row) -> None:
    stages = row.planned.stages if isinstance(row.planned, Plan) else None
    count = len(stages) if stages is not None else "-"
    print(
        f"{row.schedule:18}{row.per_device:>2}{count:>7}{_step(row.planned):>11}"
        f"{_step(row.uniform):>11}{_ratio(row):>8}{_bubble(row.planned):>10}"
        f"{_bubble(row.uniform):>11}{seconds(row.plan_s):>11}{row.uniform_breaks or '-':>11}"
    )
    for plan in (row.planned, row.uniform):
        if isinstance(plan, str):
            print(f"{'':20}no plan: {plan.split(';')[0]}")
            break


def print_best(rows: list[Row]) -> None:
    """The fastest (schedule, V) of syncpass's plans and of the uniform splits, each
    against 1F1B with one stage per device on the uniform split."""
    reference = next(r.uniform for r in rows if r.schedule == "1f1b" and r.per_device == 1)
    if not isinstance(reference, Plan):
        print("  no 1f1b uniform split to compare with")
        return
    for label, pick in (("syncpass", "planned"), ("uniform", "uniform")):
        plans = [(getattr(r, pick), r) for r in rows if isinstance(getattr(r, pick), Plan)]
        if not plans:
            print(f"  best {label}: none")
            continue
        best, row = min(plans, key=lambda entry: entry[0].predicted_step_s)
        speedup = reference.predicted_step_s / best.predicted_step_s
        print(
            f"  best {label:9}{row.schedule} V={row.per_device}: "
            f"{seconds(best.predicted_step_s)}, x{speedup:.3f} over 1f1b V=1 uniform "
            f"({seconds(reference.predicted_step_s)})"
        )


def run_case(model: Model, devices: int, profile: str) -> None:
    costs = model.costs(profile)
    microbatches = 4 * devices
    print(
        f"\n{model.label}: {len(costs.ops)} ops, batch {costs.batch_size}, {devices} devices "
        f"on {profile}, M = {microbatches} micro-batches "
        f"({costs.batch_size // microbatches} sequence(s) each)"
    )
    print(HEADER)
    rows = []
    for schedule in SCHEDULES:
        for per_device in stages_per_device_choices(schedule):
            row = plan_row(costs, devices, microbatches, schedule, per_device)
            print_row(row)
            rows.append(row)
    print_best(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the bundled LM on 4 devices")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    for model, runs in QUICK_CASES if args.quick else CASES:
        for devices, profile in runs:
            run_case(model, devices, profile)
    print(f"\ntotal {seconds(time.perf_counter() - start)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

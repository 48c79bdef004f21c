"""Plans for large pipelines on accelerator profiles: predicted step, efficiency, planning time.

Decoder-only transformer LMs, estimated from FLOP counts (``examples/make_example_costs.py``)
and scaled up, are planned for 8, 64 and 512 stages on the shipped hardware profiles
(one NVLink node for 8 stages, InfiniBand between nodes beyond), with syncpass and with
the rules people use (``uniform``, ``parameters``, ``time``), all scored by the same cost
model and schedule simulator (1F1B, four micro-batches per stage). Efficiency is the ideal
compute per device (total compute / stages) over the predicted bottleneck: 100% would be
perfectly balanced stages with free communication.

    python bench/bench_simulate.py
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncpass.config import SyncConfig
from syncpass.costs import Costs, parse_costs
from syncpass.errors import SyncpassError
from syncpass.hardware import load_profile, retarget_hardware
from syncpass.plan import Plan, PlanRequest, make_plan
from syncpass.units import seconds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: (label, layers, width, sequence, stages, hardware profile)
CASES = (
    ("gpt 48x4096", 48, 4096, 2048, 8, "nvlink-8xh100"),
    ("gpt 96x8192", 96, 8192, 2048, 64, "ib-200g-h100"),
    ("gpt 256x8192", 256, 8192, 2048, 512, "ib-400g-h100"),
)
STRATEGIES = ("adaptive", "uniform", "parameters", "time")


def _gpt_costs() -> Callable[..., dict[str, Any]]:
    """The estimator the bundled example cost file comes from."""
    spec = importlib.util.spec_from_file_location(
        "make_example_costs", EXAMPLES / "make_example_costs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    estimator: Callable[..., dict[str, Any]] = module.gpt_costs
    return estimator


def model(layers: int, width: int, seq: int, profile: str) -> Costs:
    estimated = parse_costs(
        _gpt_costs()(layers=layers, width=width, seq=seq, batch=32, flops_per_s=4e14)
    )
    return retarget_hardware(estimated, load_profile(profile))


def efficiency(costs: Costs, plan: Plan) -> float:
    total = sum(costs.op_compute_s(op) for op in costs.ops)
    return total / len(plan.stages) / plan.bottleneck_s


def main() -> int:
    header = f"{'model':14}{'stages':>7}  {'hardware':22}{'strategy':12}{'bottleneck':>11}{'step':>10}{'efficiency':>11}{'plan time':>11}  breaks"
    print(header)
    for label, layers, width, seq, stages, profile in CASES:
        costs = model(layers, width, seq, profile)
        for strategy in STRATEGIES:
            request = PlanRequest(
                stages=stages,
                config=SyncConfig().replace(strategy=strategy),
                microbatches=min(4 * stages, costs.batch_size),
                schedule="1f1b" if 4 * stages <= costs.batch_size else "gpipe",
            )
            start = time.perf_counter()
            try:
                plan = make_plan(costs, request)
            except SyncpassError as error:
                print(f"{label:14}{stages:>7}  {profile:22}{strategy:12}  no plan: {error.message}")
                continue
            took = time.perf_counter() - start
            print(
                f"{label:14}{stages:>7}  {profile:22}{strategy:12}"
                f"{seconds(plan.bottleneck_s):>11}{seconds(plan.predicted_step_s):>10}"
                f"{efficiency(costs, plan):>10.1%}{seconds(took):>11}  "
                f"{len(plan.violations) or '-'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

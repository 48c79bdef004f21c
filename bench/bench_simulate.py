"""Plans for large pipelines on accelerator profiles: predicted step, efficiency, planning time.

Two kinds of models, scaled up, are planned for 8, 64 and 512 stages on the shipped
hardware profiles (one NVLink node for 8 stages, InfiniBand between nodes beyond):
decoder-only transformer LMs estimated from FLOP counts
(``examples/make_example_costs.py``, attention and MLP as separate ops), and the
bundled examples themselves (``examples/*.py``) made deeper and wider by setting their
size constants, their costs estimated from the source by ``syncpass profile --static``
(nothing runs). Each is planned with syncpass and with the rules people use
(``uniform``, ``parameters``, ``time``), all scored by the same cost model and schedule
simulator (1F1B, four micro-batches per stage, GPipe where the batch is too small for
that). Efficiency is the ideal compute per device (total compute / stages) over the
predicted bottleneck: 100% would be perfectly balanced stages with free communication.

    python bench/bench_simulate.py
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.contracts.hardware import load_profile, retarget_hardware
from syncpass.core.errors import SyncpassError
from syncpass.core.units import seconds
from syncpass.plan.planner import Plan, PlanRequest, make_plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: (label, layers, width, sequence, stages, hardware profile)
CASES = (
    ("gpt 48x4096", 48, 4096, 2048, 8, "nvlink-8xh100"),
    ("gpt 96x8192", 96, 8192, 2048, 64, "ib-200g-h100"),
    ("gpt 256x8192", 256, 8192, 2048, 512, "ib-400g-h100"),
)
#: (label, example, size constants, input shape, depth, stages, hardware profile)
EXAMPLE_CASES = (
    ("resnet 224px", "resnet", {"SIZE": 224, "BATCH": 64}, "64x3x224x224", 2, 8, "nvlink-8xh100"),
    ("unet 256px", "unet", {"SIZE": 256, "BATCH": 32}, "32x3x256x256", 1, 4, "nvlink-8xh100"),
    (
        "lm 96x8192",
        "transformer_lm",
        {"LAYERS": 96, "WIDTH": 8192, "HEADS": 64, "SEQ": 2048, "BATCH": 32, "VOCAB": 50304},
        "32x2048",
        1,
        64,
        "ib-200g-h100",
    ),
    (
        "lm 600x8192",
        "transformer_lm",
        {"LAYERS": 600, "WIDTH": 8192, "HEADS": 64, "SEQ": 2048, "BATCH": 32, "VOCAB": 50304},
        "32x2048",
        1,
        512,
        "ib-400g-h100",
    ),
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


def example_model(
    name: str, constants: dict[str, int], shape: str, depth: int, profile: str
) -> Costs:
    """A bundled example with its size constants set, estimated from its source."""
    from syncpass.backends.torch.static import estimate_file

    text = (EXAMPLES / f"{name}.py").read_text()
    for constant, value in constants.items():
        text, count = re.subn(rf"^{constant} = \d+$", f"{constant} = {value}", text, flags=re.M)
        if count != 1:
            raise SystemExit(f"{name}.py has no line '{constant} = <number>' to scale")
    path = str(EXAMPLES / f"{name}.py")
    return estimate_file(path, text, None, shape, hardware=profile, depth=depth)


def efficiency(costs: Costs, plan: Plan) -> float:
    total = sum(costs.op_compute_s(op) for op in costs.ops)
    return total / len(plan.stages) / plan.bottleneck_s


def main() -> int:
    header = f"{'model':14}{'stages':>7}  {'hardware':22}{'strategy':12}{'bottleneck':>11}{'step':>10}{'efficiency':>11}{'plan time':>11}  breaks"
    print(header)
    cases = [
        (label, model(layers, width, seq, profile), stages, profile)
        for label, layers, width, seq, stages, profile in CASES
    ]
    cases += [
        (label, example_model(name, constants, shape, depth, profile), stages, profile)
        for label, name, constants, shape, depth, stages, profile in EXAMPLE_CASES
    ]
    for label, costs, stages, profile in cases:
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

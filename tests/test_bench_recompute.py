"""The recomputation benchmark's 70B-class cost file and its plans: the exact choice fits
with fewer blocks recomputed than "recompute every block", and a step no slower."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_script

BENCH = bench_script("bench_recompute")


def test_the_estimated_model_has_llama_70bs_parameters() -> None:
    data = BENCH.llama_70b_costs(1, "ib-400g-h100")
    parameters = sum(op["param_bytes"] for op in data["ops"]) / 2  # bf16
    assert 70.0e9 < parameters < 71.0e9  # Llama-3-70B: 70.6 billion
    assert len([op for op in data["ops"] if op["id"].startswith("layers.")]) == 80
    assert all(op["saved_bytes"] > op["input_bytes"] for op in data["ops"][1:-2])


@pytest.mark.slow  # plans 80 blocks three ways at 8 and at 64 stages: ~10 s
@pytest.mark.parametrize("case", BENCH.CASES, ids=lambda case: f"{case.stages}-stages")
def test_auto_fits_recomputing_fewer_blocks_than_all_and_is_no_slower(
    case: Any, tmp_path: Path
) -> None:
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps(BENCH.llama_70b_costs(case.microbatches, case.hardware)))
    argv = ["--costs", str(costs), "--stages", str(case.stages), "--schedule", "1f1b"]
    argv += ["--microbatches", str(case.microbatches), "--threshold", "inf"]
    argv += ["--optimizer-shards", str(case.optimizer_shards)]
    plans = {}
    for mode in BENCH.MODES:
        status, out = BENCH.planned([*argv, "--recompute", mode, "--json"])
        plans[mode] = json.loads(out) if status == 0 else None
    auto, every = plans["auto"], plans["all"]
    assert auto is not None and every is not None
    limit = BENCH.load_profile(case.hardware).hardware.device_memory_bytes
    assert max(stage["memory_bytes"] for stage in auto["stages"]) <= limit
    assert 0 < len(auto["checkpointed"]) < len(every["checkpointed"]) == 80
    assert auto["predicted_step_s"] <= every["predicted_step_s"]
    if plans["none"] is not None:  # storing everything fits only with worse cuts
        assert auto["bottleneck_s"] <= plans["none"]["bottleneck_s"]

"""The schedules benchmark, in its quick mode, plans every schedule at every V it takes."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from conftest import REPO

from syncpass.contracts.config import SCHEDULES
from syncpass.plan.planner import stages_per_device_choices


def bench_module() -> ModuleType:
    path = REPO / "bench" / "bench_schedules.py"
    spec = importlib.util.spec_from_file_location("bench_schedules", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_schedules"] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_prints_a_row_per_schedule_and_v(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_module().main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    words = [line.split() for line in lines]
    rows = {(w[0], w[1]) for w in words if w and w[0] in SCHEDULES}
    expected = {(s, str(v)) for s in SCHEDULES for v in stages_per_device_choices(s)}
    assert rows == expected
    assert not any("no plan" in line for line in lines)
    assert any(line.startswith("  best syncpass") for line in lines)

"""The schedules benchmark, in its quick mode, plans every schedule at every V it takes."""

from __future__ import annotations

import pytest
from conftest import bench_script

from syncpass.contracts.config import SCHEDULES
from syncpass.plan.planner import stages_per_device_choices


def test_quick_run_prints_a_row_per_schedule_and_v(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_script("bench_schedules").main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    words = [line.split() for line in lines]
    rows = {(w[0], w[1]) for w in words if w and w[0] in SCHEDULES}
    expected = {(s, str(v)) for s in SCHEDULES for v in stages_per_device_choices(s)}
    assert rows == expected
    assert not any("no plan" in line for line in lines)
    assert any(line.startswith("  best syncpass") for line in lines)

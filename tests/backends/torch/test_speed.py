"""The machine's speed: the profile records it, a run measures its own, and the prediction
beside the run is made at the run's speed."""

from __future__ import annotations

import dataclasses
import shutil
import statistics
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.torch.measure import _at_speed, _StepTimes
from syncpass.backends.torch.prediction import predict_stages_run
from syncpass.backends.torch.run import launch
from syncpass.cli import main
from syncpass.contracts.costs import load_costs
from syncpass.runtime.contracts import RunRequest


def test_each_timed_run_is_brought_to_the_probes_median_speed() -> None:
    # Two runs: the machine was at full speed around the first, at half around the second.
    steps = [
        _StepTimes((1.0, 2.0), (2.0, 4.0), (1.0, 2.0), (True, True)),
        _StepTimes((2.0, 4.0), (4.0, 8.0), None, None),
    ]
    probes = [1.0, 1.0, 2.0]  # before run 0, between, after run 1
    first, second = _at_speed(steps, probes, 1.0)
    assert first == steps[0]
    assert second.forward_s == pytest.approx((2.0 / 1.5, 4.0 / 1.5))
    assert second.backward_s == pytest.approx((4.0 / 1.5, 8.0 / 1.5))
    assert second.backward_input_s is None
    assert _at_speed([], probes, 1.0) == []


@pytest.mark.slow
def test_the_prediction_beside_a_run_is_at_the_speed_the_run_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "uneven_mlp.py"
    shutil.copy(REPO / "examples" / "uneven_mlp.py", source)
    costs_path = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--repeats", "2"]
    assert main([*argv, "--warmup", "0", "-o", str(costs_path)]) == 0
    costs = load_costs(costs_path)
    assert costs.speed_probe_s is not None and 0 < costs.speed_probe_s < 1
    out = tmp_path / "split.py"
    argv = ["rewrite", str(source), "--costs", str(costs_path), "--stages", "2", "-o", str(out)]
    assert main(argv) == 0
    capsys.readouterr()

    steps = 3
    result = launch(RunRequest(file=str(out), example=f"{out}:example", stages=2, steps=steps))
    probes = [probe for stage in result.stages for probe in stage.speed_probes_s]
    assert [len(stage.speed_probes_s) for stage in result.stages] == [steps, steps]
    assert all(0 < probe < 1 for probe in probes)
    text = out.read_text()
    prediction = predict_stages_run(text, str(out), costs, result)
    factor = statistics.median(probes) / costs.speed_probe_s
    assert prediction.speed_factor == pytest.approx(factor)
    # The same run against a profile taken on a machine twice as fast: every op time
    # doubles, so the predicted step grows, by at most twice (the link is the profile's).
    faster = dataclasses.replace(costs, speed_probe_s=costs.speed_probe_s / 2)
    doubled = predict_stages_run(text, str(out), faster, result)
    assert doubled.speed_factor == pytest.approx(2 * factor)
    assert (
        prediction.plan.predicted_step_s
        < doubled.plan.predicted_step_s
        <= 2 * prediction.plan.predicted_step_s * (1 + 1e-9)
    )
    # Without a probe in the cost file, the prediction is the profile's, as before; with
    # one, that figure is kept beside the scaled one.
    unprobed = predict_stages_run(
        text, str(out), dataclasses.replace(costs, speed_probe_s=None), result
    )
    assert (unprobed.speed_factor, unprobed.profile_speed_step_s) == (1.0, None)
    assert doubled.profile_speed_step_s == pytest.approx(unprobed.plan.predicted_step_s)

"""The whole pass on the bundled examples, as the README runs it: profile the model,
rewrite it for 2 and 4 stages, run the rewritten file split over gloo processes and
check that the loss and every gradient equal the unsplit model's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.contracts.costs import load_costs
from syncpass.plan.planfile import parse_plan

EXAMPLES = ("transformer_lm", "resnet", "unet", "uneven_mlp")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each example copied and profiled once: (source, cost file)."""
    folder = tmp_path_factory.mktemp("examples")
    result = {}
    for name in EXAMPLES:
        source = folder / f"{name}.py"
        shutil.copy(REPO / "examples" / f"{name}.py", source)
        costs = folder / f"{name}.costs.json"
        status = main(
            [
                "profile",
                str(source),
                "--example",
                "example",
                "-o",
                str(costs),
                "--repeats",
                "2",
                "--warmup",
                "1",
            ]
        )
        assert status == 0
        result[name] = (source, costs)
    return result


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "stages"), [("torch_stages", 2), ("torch_stages", 4), ("torch", 2)]
)
@pytest.mark.parametrize("name", EXAMPLES)
def test_profile_rewrite_run_verify(
    profiled: dict[str, tuple[Path, Path]], tmp_path: Path, name: str, backend: str, stages: int
) -> None:
    source, costs = profiled[name]
    measured = load_costs(costs)
    assert [op.id for op in measured.ops]  # the graph's ids, measured
    assert measured.hardware.flops_per_s and measured.hardware.flops_per_s > 0  # for --hardware
    rewritten = tmp_path / f"{name}_sync.py"
    report = tmp_path / "report.json"
    assert (
        main(
            [
                "rewrite",
                str(source),
                "--costs",
                str(costs),
                "--stages",
                str(stages),
                "-o",
                str(rewritten),
                "--report",
                str(report),
                "--backend",
                backend,
            ]
        )
        == 0
    )
    plan = parse_plan(json.loads(report.read_text())["plan"])
    assert len(plan.stages) == stages
    written = rewritten.read_text()
    assert written.count("# syncpass sync ") == stages - 1
    assert written.count("pipe_split()  # syncpass sync") == (
        stages - 1 if backend == "torch" else 0
    )
    run_report = tmp_path / "run.json"
    status = main(
        [
            "run",
            str(rewritten),
            "--stages",
            str(stages),
            "--verify",
            "--steps",
            "1",
            "--json-report",
            str(run_report),
            "--costs",
            str(costs),
        ]
    )
    assert status == 0
    figures = json.loads(run_report.read_text())
    assert figures["verify"]["ok"] is True
    # The cost model's prediction for the very sync points the file carries, beside the run.
    prediction = figures["prediction"]
    assert prediction["sync_points"] == [point.after for point in plan.sync_points]
    assert prediction["predicted_step_s"] > 0 and prediction["measured_step_s"] > 0


@pytest.mark.slow
def test_depth_2_places_sync_points_inside_sequential_stages(tmp_path: Path) -> None:
    source = tmp_path / "resnet.py"
    shutil.copy(REPO / "examples" / "resnet.py", source)
    costs = tmp_path / "resnet.costs.json"
    assert (
        main(
            [
                "profile",
                str(source),
                "-o",
                str(costs),
                "--depth",
                "2",
                "--repeats",
                "2",
                "--warmup",
                "1",
            ]
        )
        == 0
    )
    ids = [op.id for op in load_costs(costs).ops]
    assert "layer1.0" in ids and "layer1" not in ids  # planned per child
    rewritten = tmp_path / "resnet_sync.py"
    assert (
        main(
            [
                *("rewrite", str(source), "--costs", str(costs), "--stages", "4"),
                # A sync point inside layer1, whatever the timings say about the others.
                *("--cuts", "layer1.1", "-o", str(rewritten)),
            ]
        )
        == 0
    )
    text = rewritten.read_text()
    assert "x = self.layer1[:2](x)" in text and "x = self.layer1[2:](x)" in text
    assert main(["run", str(rewritten), "--stages", "4", "--verify", "--steps", "1"]) == 0

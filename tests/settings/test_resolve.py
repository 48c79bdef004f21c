"""One resolver: plan, rewrite, check, the codemod and parallelize plan one project alike.

The project sets every kind of setting at once (sync settings, stages = "auto",
hardware, the model entry's class), so an entry point that skipped or
reordered any of them would plan differently.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import libcst as cst
import pytest
from golden_cases import GOLDEN, read_case
from libcst.codemod import CodemodContext

from syncpass.cli import main
from syncpass.contracts.costs import load_costs
from syncpass.settings.resolve import Overrides, resolve_settings
from syncpass.transformers.codemod import PipelineSyncCommand

CASE = read_case(GOLDEN / "container_loop.py")

PYPROJECT = """\
[tool.syncpass]
strategy = "adaptive"
min_sync_interval = 2
communication_cost_threshold = 0.5
stages = "auto"
hardware = "pcie4-gpus"

[[tool.syncpass.models]]
source = "model.py"
generated = "model_pipeline.py"
costs = "model.costs.json"
model = "Tower"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "model.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, tmp_path / "model.costs.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plan_of(document: dict[str, object]) -> dict[str, object]:
    """The plan file's object without the baselines (only `plan` prints those)."""
    return {key: value for key, value in document.items() if key != "baselines"}


def test_the_five_entry_points_resolve_one_project_alike(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # syncpass plan, on the entry's cost file.
    assert main(["plan", "--costs", "model.costs.json", "--json"]) == 0
    planned = plan_of(json.loads(capsys.readouterr().out))
    assert planned["min_sync_interval"] == 2
    assert "PCIe" in str(planned["hardware"])
    # syncpass rewrite, on the entry's source.
    assert (
        main(
            [
                "rewrite",
                "model.py",
                "--costs",
                "model.costs.json",
                "--report",
                "r.json",
                "-o",
                "out.py",
            ]
        )
        == 0
    )
    rewritten = (project / "out.py").read_text()
    assert plan_of(json.loads((project / "r.json").read_text())["plan"]) == planned
    assert rewritten != CASE.source
    # syncpass check --fix writes the generated file: the same code.
    assert main(["check", "--fix", "--no-lint"]) == 0
    assert (project / "model_pipeline.py").read_text() == rewritten
    # The codemod, with no flags of its own.
    command = PipelineSyncCommand(CodemodContext(filename=str(project / "model.py")))
    tree = command.transform_module(cst.parse_module(CASE.source))
    assert tree.code == rewritten


def test_parallelize_resolves_as_the_others_do(project: Path) -> None:
    """parallelize's settings: the stage count is the world size; the rest from the project."""
    pytest.importorskip("torch")
    from syncpass.backends.torch.parallelize import resolve_parallel_settings

    costs = load_costs(project / "model.costs.json")
    here = resolve_settings(project / "model.py", Overrides(stages=3))
    there = resolve_parallel_settings(project / "model.py", 3, None)
    assert there.request(costs) == here.request(costs)
    assert there.retarget(costs) == here.retarget(costs)
    assert there.hardware == "pcie4-gpus"
    assert there.request(costs).config.min_sync_interval == 2
    mapping = resolve_parallel_settings(project / "model.py", 3, {"min_sync_interval": 1})
    assert mapping.request(costs).config.min_sync_interval == 1  # the caller's over the project's
    assert mapping.request(costs).config.communication_cost_threshold == 0.5


def test_flags_win_over_the_project_the_same_way_everywhere(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "plan",
                "--costs",
                "model.costs.json",
                "--json",
                "--stages",
                "2",
                "--min-sync-interval",
                "1",
            ]
        )
        == 0
    )
    planned = plan_of(json.loads(capsys.readouterr().out))
    assert planned["num_stages"] == 2 and planned["min_sync_interval"] == 1
    command = PipelineSyncCommand(
        CodemodContext(filename=str(project / "model.py")), stages=2, min_sync_interval=1
    )
    tree = command.transform_module(cst.parse_module(CASE.source))
    assert (
        main(
            [
                "rewrite",
                "model.py",
                "--costs",
                "model.costs.json",
                "--stages",
                "2",
                "--min-sync-interval",
                "1",
                "-o",
                "out.py",
            ]
        )
        == 0
    )
    assert tree.code == (project / "out.py").read_text()

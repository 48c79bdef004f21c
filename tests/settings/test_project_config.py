"""The project configuration: found like ruff finds its own, checked key by key, flags win."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.cli import main
from syncpass.contracts.config import SyncConfig
from syncpass.core.errors import SyncpassError
from syncpass.settings.project import (
    ModelEntry,
    ProjectConfig,
    find_project_config,
    load_project_config,
)
from syncpass.settings.resolve import Overrides, resolve_settings

PYPROJECT = """\
[project]
name = "demo"

[tool.syncpass]
strategy = "fixed"
min_sync_interval = 2
backend = "torch"
stages = 4
hardware = "pcie4-gpus"

[[tool.syncpass.models]]
source = "models/gpt.py"
generated = "models/gpt_pipeline.py"
costs = "models/gpt.costs.json"

[[tool.syncpass.models]]
source = "models/unet.py"
generated = "build/unet_pipeline.py"
costs = "costs/unet.json"
stages = "auto"
model = "UNet"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_reads_every_key_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    config = load_project_config(write(tmp_path / "pyproject.toml", PYPROJECT))
    assert config.path == tmp_path / "pyproject.toml"
    assert (config.sync.strategy, config.sync.min_sync_interval) == ("fixed", 2)
    assert config.sync_keys == ("strategy", "min_sync_interval")
    assert (config.backend, config.stages, config.hardware) == ("torch", 4, "pcie4-gpus")
    gpt, unet = config.models
    assert gpt == ModelEntry(
        source=tmp_path / "models/gpt.py",
        generated=tmp_path / "models/gpt_pipeline.py",
        costs=tmp_path / "models/gpt.costs.json",
        location=f"{tmp_path}/pyproject.toml:11",  # its [[tool.syncpass.models]] line
    )
    assert (unet.stages, unet.model, unet.costs) == ("auto", "UNet", tmp_path / "costs/unet.json")
    assert config.stages_for(gpt) == 4  # the project's
    assert config.stages_for(unet) == "auto"  # the entry's own wins


def test_settings_the_file_sets_go_over_the_cost_files_and_no_others(tmp_path: Path) -> None:
    config = load_project_config(write(tmp_path / "pyproject.toml", PYPROJECT))
    from_costs = SyncConfig(strategy="uniform", min_sync_interval=5, communication_cost_threshold=2)
    assert config.sync_over(from_costs) == SyncConfig("fixed", 2, 2)
    assert ProjectConfig().sync_over(from_costs) == from_costs


def test_a_toml_file_of_its_own_has_the_keys_at_the_top(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "")  # the project its paths stay inside
    path = write(
        tmp_path / "conf" / "sync.toml",
        'stages = 2\ncommunication_cost_threshold = inf\n\n[[models]]\nsource = "../m.py"\n'
        'generated = "../m_sync.py"\ncosts = "../m.json"\n',
    )
    config = load_project_config(path)
    assert config.stages == 2 and config.sync.communication_cost_threshold == float("inf")
    assert config.models[0].source == tmp_path / "conf" / ".." / "m.py"
    # The sync settings alone, as `plan/rewrite --config` always read them:
    assert load_project_config(path).sync_over(SyncConfig()).communication_cost_threshold == float(
        "inf"
    )


def test_found_in_the_nearest_pyproject_with_a_syncpass_table(tmp_path: Path) -> None:
    outer = write(tmp_path / "pyproject.toml", "[tool.syncpass]\nstages = 2\n")
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "syncpass-like"\n')  # no table
    model = write(tmp_path / "pkg" / "models" / "m.py", "")
    assert find_project_config(model) == outer
    assert find_project_config(model.parent) == outer
    inner = write(tmp_path / "pkg" / "models" / "pyproject.toml", "[tool.syncpass]\n")  # empty
    assert find_project_config(model) == inner
    assert resolve_settings(model).stages is None
    assert resolve_settings(model, Overrides(config=outer)).stages == 2  # --config wins


def test_nothing_found_gives_the_defaults(tmp_path: Path) -> None:
    model = write(tmp_path / "m.py", "")
    if find_project_config(tmp_path) is None:  # (a [tool.syncpass] above /tmp would count)
        assert resolve_settings(model).project is None


@pytest.mark.parametrize(
    ("text", "where", "message"),
    [
        (
            "[tool.syncpass]\nstages = 2\nstrategie = 'fixed'\n",
            ":3",
            "unknown setting 'strategie' in [tool.syncpass]; valid settings are strategy, "
            "min_sync_interval, communication_cost_threshold, backend, stages, schedule, stages_per_device, hardware, models",
        ),
        (
            "[tool.syncpass]\n\n[[tool.syncpass.models]]\nsource = 'a.py'\ngenerated = 'b.py'\n"
            "costs = 'c.json'\n\n[[tool.syncpass.models]]\nsource = 'a.py'\nsorce = 'b.py'\n",
            ":10",
            "unknown setting 'sorce' in [[tool.syncpass.models]] entry 2; valid settings are "
            "source, generated, costs, stages, model",
        ),
        ("[tool.syncpass]\nstages = 0\n", ":2", 'stages must be a whole number >= 1 or "auto"'),
        ("[tool.syncpass]\nbackend = 'tpu'\n", ":2", "backend must be one of torch"),
        ("[tool.syncpass]\nhardware = 'abacus'\n", ":2", "no hardware profile named 'abacus'"),
        ("[tool.syncpass]\nhardware = 'hw/mine.toml'\n", ":2", "no hardware profile file"),
        ("[tool.syncpass]\nmin_sync_interval = 0\n", ":2", "min_sync_interval must be at least 1"),
        (
            "[tool.syncpass]\n[[tool.syncpass.models]]\nsource = 'a.py'\n",
            ":2",
            "[[tool.syncpass.models]] entry 1 needs generated, costs",
        ),
        (
            "[[tool.syncpass.models]]\nsource = 'a.py'\ngenerated = 'a.py'\ncosts = 'c.json'\n",
            ":1",
            "source and generated are the same file",
        ),
        ("[tool.syncpass]\nmodels = 3\n", ":2", "models must be an array of tables"),
        (
            "[[tool.syncpass.models]]\nsource = 'a.py'\ngenerated = '/etc/hostname'\n"
            "costs = 'c.json'\n",
            ":3",
            "generated in [[tool.syncpass.models]] entry 1 must name a file inside the project",
        ),
        (
            "[[tool.syncpass.models]]\nsource = '../../a.py'\ngenerated = 'b.py'\n"
            "costs = 'c.json'\n",
            ":2",
            "source in [[tool.syncpass.models]] entry 1 must name a file inside the project",
        ),
        (
            "[tool.syncpass]\nhardware = '../hw.toml'\n",
            ":2",
            "hardware must name a file inside the project",
        ),
        ("[tool.syncpass\n", "", "not valid TOML"),
    ],
)
def test_bad_files_name_file_line_and_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, where: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "pyproject.toml", text)
    with pytest.raises(SyncpassError) as caught:
        load_project_config(Path("pyproject.toml"))
    assert caught.value.location == f"pyproject.toml{where}"
    assert message in caught.value.message


def write_costs(tmp_path: Path) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(cost_dict([1] * 8, [0] * 7)))
    return path


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", *args, "--json", "--no-baselines"]) == 0
    plan: dict[str, object] = json.loads(capsys.readouterr().out)
    return plan


def test_plan_takes_stages_and_settings_from_the_file_and_flags_win(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = write_costs(tmp_path)
    config = write(tmp_path / "sync.toml", "stages = 4\nmin_sync_interval = 2\n")
    plan = plan_json(capsys, "--costs", str(costs), "--config", str(config))
    assert (len(plan["stages"]), plan["min_sync_interval"]) == (4, 2)  # type: ignore[arg-type]
    plan = plan_json(
        capsys, "--costs", str(costs), "--config", str(config), "--stages", "2",
        "--min-sync-interval", "3",
    )  # fmt: skip
    assert (len(plan["stages"]), plan["min_sync_interval"]) == (2, 3)  # type: ignore[arg-type]


def test_plan_finds_the_pyproject_above_the_cost_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "pyproject.toml", "[tool.syncpass]\nstages = 3\nstrategy = 'uniform'\n")
    costs = write_costs(tmp_path)
    plan = plan_json(capsys, "--costs", str(costs))
    assert (len(plan["stages"]), plan["strategy"]) == (3, "uniform")  # type: ignore[arg-type]


def test_plan_reports_an_unknown_key_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = write_costs(tmp_path)
    config = write(tmp_path / "sync.toml", "stage = 4\n")
    assert main(["plan", "--costs", str(costs), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "sync.toml:1: unknown setting 'stage'" in err and "valid settings are" in err


def test_a_config_path_through_a_symlink_out_of_the_project_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    outside = write(tmp_path / "elsewhere" / "site.pth", "import os\n")
    write(project / "model.py", "")
    (project / "build").symlink_to(outside.parent, target_is_directory=True)
    text = "[[tool.syncpass.models]]\nsource = 'model.py'\ngenerated = 'build/site.pth'\n"
    write(project / "pyproject.toml", text + "costs = 'c.json'\n")
    monkeypatch.chdir(project)
    with pytest.raises(SyncpassError) as caught:
        load_project_config(Path("pyproject.toml"))
    assert caught.value.location == "pyproject.toml:3"
    assert f"which resolves to {outside}" in caught.value.message


def test_the_schedule_and_its_stages_per_device_come_from_the_file_unless_flags_say(
    tmp_path: Path,
) -> None:
    config_text = '[tool.syncpass]\nstages = 2\nschedule = "zbv"\n'
    write(tmp_path / "pyproject.toml", config_text)
    costs = write(tmp_path / "c.json", json.dumps(cost_dict([1.0] * 8, [0.0] * 7)))
    settings = resolve_settings(costs)
    request = settings.request(settings.retarget(load_costs_of(costs)))
    assert (request.schedule, request.stages, request.stages_per_device) == ("zbv", 2, 2)
    flagged = resolve_settings(costs, Overrides(schedule="interleaved-1f1b", stages_per_device=4))
    request = flagged.request(load_costs_of(costs))
    assert (request.schedule, request.stages_per_device) == ("interleaved-1f1b", 4)
    write(tmp_path / "pyproject.toml", config_text + "stages_per_device = 'auto'\n")
    request = resolve_settings(costs).request(load_costs_of(costs))
    assert request.stages_per_device is None  # plan_for tries what the schedule takes
    for bad, message in (
        ('schedule = "pipedream"', "schedule must be one of gpipe, 1f1b"),
        ("stages_per_device = 0", 'stages_per_device must be a whole number >= 1 or "auto"'),
    ):
        write(tmp_path / "pyproject.toml", f"[tool.syncpass]\n{bad}\n")
        with pytest.raises(SyncpassError, match=message) as raised:
            load_project_config(tmp_path / "pyproject.toml")
        assert raised.value.location.endswith("pyproject.toml:2")


def load_costs_of(path: Path):  # type: ignore[no-untyped-def]
    from syncpass.contracts.costs import load_costs

    return load_costs(path)

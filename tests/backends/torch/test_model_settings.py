"""Branches decided by the built model's settings: Hugging Face's older models take
``return_dict`` from their configuration and return early with a tuple when it is false.
The profile reads the setting off the model it builds, records it in the cost file, and
planning and rewriting decide the same branches from there (real torch, real libcst)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO
from once import shared

from syncpass.cli import main

MODEL = REPO / "tests" / "data" / "config_outputs.py"
LAYERS = [f"transformer.h.{index}" for index in range(6)]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    def profile(folder: Path) -> None:
        source = folder / MODEL.name
        shutil.copy(MODEL, source)
        argv = ["profile", str(source), "--example", f"{source}:example", "--backend"]
        argv += ["torch_stages", "--repeats", "1", "--warmup", "0"]
        argv += ["-o", str(folder / "costs.json")]
        assert main(argv) == 0

    folder = shared(tmp_path_factory, "settings", profile)
    return folder / MODEL.name, folder / "costs.json"


def test_the_profile_reads_the_settings_and_follows_the_base_model(
    profiled: tuple[Path, Path],
) -> None:
    _, costs = profiled
    document = json.loads(costs.read_text())
    assert document["model_settings"] == {
        "config.return_dict": True,
        "input:0": "Tensor",  # what the example passes for the forward's first parameter
        "transformer.config.output_hidden_states": False,
        # What each object handed to an __init__ is: a submodule of a class of the file
        # would be followed (here each is a configuration, which is not).
        "object:config": "Config",
        "object:transformer.config": "Config",
    }
    ids = [op["id"] for op in document["ops"]]
    assert all(layer in ids for layer in LAYERS) and "transformer" not in ids


def test_rewrite_from_the_costs_or_the_plan_decides_alike(
    profiled: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = profiled
    out = tmp_path / "sync.py"
    report = tmp_path / "report.json"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "4"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out), "--report", str(report)]) == 0
    err = capsys.readouterr().err
    assert "no branch of `if not return_dict:`" in err
    assert "self.config.return_dict=True" in err
    text = out.read_text()
    stages = text[text.index("# syncpass stages") :]
    assert "for block in self.transformer.h[" in stages
    assert "if not return_dict" not in stages  # neither early return runs in the stages
    plan = json.loads(report.read_text())["plan"]
    assert plan["model_settings"] == json.loads(costs.read_text())["model_settings"]
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan))
    again = tmp_path / "again.py"
    argv = ["rewrite", str(source), "--plan", str(saved), "--backend", "torch_stages"]
    assert main([*argv, "-o", str(again)]) == 0
    assert again.read_text() == text


def test_without_the_settings_the_cost_file_is_refused_clearly(
    profiled: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Removing the settings by hand: the analysis no longer follows the base model, so the
    # cost file's ops are not this source's, which rewrite says instead of planning.
    source, costs = profiled
    document = json.loads(costs.read_text())
    del document["model_settings"]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--costs", str(edited), "--stages", "2"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 2
    assert "transformer" in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture(scope="module")
def tuple_outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The model built with ``return_dict=False``, profiled: the base model returns a tuple
    of its hidden states and its accumulators (``None`` with the flags off)."""

    def profile(folder: Path) -> None:
        source = folder / "config_tuples.py"
        text = MODEL.read_text().replace("self.return_dict = True", "self.return_dict = False")
        text = text.replace(
            "return F.cross_entropy(output.logits", "return F.cross_entropy(output[0]"
        )
        source.write_text(text)
        argv = ["profile", str(source), "--example", f"{source}:example", "--backend"]
        argv += ["torch_stages", "--repeats", "1", "--warmup", "0"]
        argv += ["-o", str(folder / "costs.json")]
        assert main(argv) == 0

    folder = shared(tmp_path_factory, "tuple-outputs", profile)
    return folder / "config_tuples.py", folder / "costs.json"


def test_a_model_built_with_return_dict_false_is_planned_inside_its_base_model(
    tuple_outputs: tuple[Path, Path],
) -> None:
    # The base model's `if not return_dict: return tuple(...)` is taken and ends it there.
    _, costs = tuple_outputs
    document = json.loads(costs.read_text())
    assert document["model_settings"]["config.return_dict"] is False
    ids = [op["id"] for op in document["ops"]]
    assert all(layer in ids for layer in LAYERS) and "transformer" not in ids


@pytest.mark.slow
def test_the_stages_planned_inside_the_base_model_run_and_verify(
    profiled: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = profiled
    out = source.parent / "config_outputs_sync4.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "4"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "4", "--verify", "--steps", "1"]
    status = main([*argv, "--json-report", str(report)])
    assert status == 0, capsys.readouterr().err
    verify = json.loads(report.read_text())["verify"]
    assert verify["ok"] is True
    assert verify["parameters_compared"] == verify["model_parameters"]


@pytest.mark.slow
def test_the_tuple_returning_base_model_runs_split_and_verifies(
    tuple_outputs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = tuple_outputs
    out = source.parent / "config_tuples_sync.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "2"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    assert "# syncpass sync 1/1" in out.read_text()
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "2", "--verify", "--steps", "1"]
    status = main([*argv, "--json-report", str(report)])
    assert status == 0, capsys.readouterr().err
    verify = json.loads(report.read_text())["verify"]
    assert verify["ok"] is True
    assert verify["parameters_compared"] == verify["model_parameters"]

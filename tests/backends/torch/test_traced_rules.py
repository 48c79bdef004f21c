"""The traced form's rule, that a value reaches only the next stage, as torch's pipelining
enforces it: values that go by another name (``skip = x``) are followed, a refusal names
the value, and a plan the rule holds back says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO, without_meeting_stalls

from syncpass.cli import main

DATA = REPO / "tests" / "data"


def copied(tmp_path: Path, name: str) -> Path:
    source = tmp_path / name
    shutil.copy(DATA / name, source)
    return source


def rewrite(source: Path, out: Path, stages: int, backend: str) -> list[str]:
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    return [*argv, "--backend", backend, "-o", str(out)]


@pytest.mark.slow
def test_an_aliased_skip_connection_is_refused_where_torch_would_fail_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = copied(tmp_path, "aliased_skip.py")
    out = tmp_path / "sync.py"
    assert main(rewrite(source, out, 4, "torch")) == 2
    err = capsys.readouterr().err
    assert not out.exists()
    assert "no 4-stage plan keeps every value within the next stage" in err
    line = source.read_text().splitlines().index("        x = self.embed(x)") + 1
    assert f"the value embed makes ({source}:{line}) is used by operator.add@L" in err
    assert "use --backend torch_stages" in err and "use at most 3 stage(s)" in err

    # Three stages fit the rule, and torch's pipelining runs them.
    assert main(rewrite(source, out, 3, "torch")) == 0
    capsys.readouterr()
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "3", "--verify", "--json-report", str(report)]
    assert main([*argv, "--backend", "torch"]) == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["verify"]["ok"] is True

    # The eager form hands the value on to any later stage: four stages verify.
    assert main(rewrite(source, out, 4, "torch_stages")) == 0
    capsys.readouterr()
    argv = ["run", str(out), "--stages", "4", "--verify", "--json-report", str(report)]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["verify"]["ok"] is True


@pytest.mark.slow
def test_a_manual_plan_that_breaks_the_rule_is_refused_or_written_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = copied(tmp_path, "aliased_skip.py")
    text = source.read_text().replace(
        "import torch\n", "import torch\nfrom torch.distributed.pipelining import pipe_split\n", 1
    )
    text = text.replace("        skip = x\n", "        skip = x\n        pipe_split()\n", 1)
    text = text.replace("        x = x + skip\n", "        pipe_split()\n        x = x + skip\n", 1)
    source.write_text(text)
    out = tmp_path / "sync.py"
    manual = ["rewrite", str(source), "--strategy", "manual", "--backend", "torch", "-o", str(out)]
    # With an example, torch's tracer splits the model first: the plan is not written.
    assert main([*manual, "--example", f"{source}:example"]) == 2
    err = capsys.readouterr().err
    assert "stage 0's output 'embed' is read by stage 1 and stage 2" in err
    assert not out.exists()
    # Without one, the plan is written as asked, with the constraint it breaks.
    assert main([*manual, "--input-shape", "8x4x16"]) == 0
    err = capsys.readouterr().err
    assert "syncpass: warning: the plan breaks a constraint:" in err
    assert "skip a stage" in err
    # And run stops before torch's own error, at the sync point the value may not cross.
    status = main(["run", str(out), "--stages", "3", "--backend", "torch", "--timeout", "60"])
    err = capsys.readouterr().err
    assert status == 2
    lines = out.read_text().splitlines()
    second = [n for n, text in enumerate(lines, 1) if text.strip() == "pipe_split()"][1]
    assert f"{out}:{second}: rank 0: stage 0's output 'embed' is read by stage 1 and stage 2" in err
    assert "Backward of skip connections" not in err


@pytest.mark.slow
def test_an_input_read_late_and_a_none_argument_split_in_both_forms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = copied(tmp_path, "late_input.py")
    out = tmp_path / "sync.py"
    report = tmp_path / "run.json"
    # The eager stages hand tgt on to the stage that reads it; the None mask is the default.
    assert main(rewrite(source, out, 3, "torch_stages")) == 0
    capsys.readouterr()
    argv = ["run", str(out), "--stages", "3", "--verify", "--json-report", str(report)]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["verify"]["ok"] is True
    # torch's pipelining hands the inputs to the first stage only: the reader must be there.
    out.unlink()
    assert main(rewrite(source, out, 3, "torch")) == 2
    err = capsys.readouterr().err
    assert "a model input is used by dec" in err and not out.exists()
    assert "hands the model's inputs to the first stage only: read it there" in err
    assert main(rewrite(source, out, 2, "torch")) == 0
    capsys.readouterr()
    argv = ["run", str(out), "--stages", "2", "--verify", "--json-report", str(report)]
    assert main([*argv, "--backend", "torch"]) == 0, capsys.readouterr().err
    assert json.loads(report.read_text())["verify"]["ok"] is True


@pytest.mark.slow
def test_a_sync_point_the_tracer_refuses_is_planned_again_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The model returns a plain lookup into the encoder's output (HF BertModel's
    # `encoder_outputs.last_hidden_state`): the analysis sees the lookup as an op of the last
    # stage, torch's tracer sees the encoder's output read by the model's output.
    source = copied(tmp_path, "lookup_output.py")
    out = tmp_path / "sync.py"
    report = tmp_path / "plan.json"
    hardware = ["--hardware", str(without_meeting_stalls(tmp_path))]
    assert main([*rewrite(source, out, 2, "torch"), *hardware, "--report", str(report)]) == 0
    err = capsys.readouterr().err
    line = source.read_text().splitlines().index("        encoder_outputs = self.encoder(h)")
    assert (
        f"note: torch's tracer refused the sync point after encoder ({source}:{line + 1}: "
        "stage 0's output 'encoder' is read by stage 1 and the model's output"
    ) in err
    assert "planned again without it" in err
    points = [point["after"] for point in json.loads(report.read_text())["plan"]["sync_points"]]
    assert points and "encoder" not in points

    run_report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "2", "--verify", "--json-report", str(run_report)]
    assert main([*argv, "--backend", "torch"]) == 0, capsys.readouterr().err
    assert json.loads(run_report.read_text())["verify"]["ok"] is True


@pytest.mark.slow
def test_a_pinned_sync_point_the_tracer_refuses_is_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = copied(tmp_path, "lookup_output.py")
    text = source.read_text()
    call = "        encoder_outputs = self.encoder(h)\n"
    source.write_text(text.replace(call, call.rstrip("\n") + "  # syncpass: sync\n"))
    out = tmp_path / "sync.py"
    assert main(rewrite(source, out, 2, "torch")) == 2
    err = capsys.readouterr().err
    assert "torch's tracer confirms no such plan" in err and "planned again" not in err
    assert f"{source}:" in err and not out.exists()

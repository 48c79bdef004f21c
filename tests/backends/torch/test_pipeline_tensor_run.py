"""Pipeline stages and tensor parallelism together (``rewrite --strategy tensor --tp T
--stages S``, ``run --stages S --tp T``): the bundled LM rewritten for 2 tensor-parallel
ranks and split into 2 eager stages in one command, run on 2 x 2 gloo processes and
compared with the unsplit model; a file missing one collective fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import syncpass_process
from once import load_process, save_process

ROOT = Path(__file__).resolve().parents[3]
LM = ROOT / "examples" / "transformer_lm.py"
COLLECTIVE = "x = copy_to_tensor_parallel_region(x)"

pytestmark = pytest.mark.slow


def _made(folder: Path) -> None:
    model, staged = folder / "transformer_lm.py", folder / "lm_2d.py"
    model.write_text(LM.read_text())
    # One command: the tensor-parallel plan written in, then that source split into stages.
    rewritten = syncpass_process(
        "rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor",
        "--tp", "2", "--tp-placement", "megatron", "--stages", "2", "-o", str(staged),
    )  # fmt: skip
    save_process(folder / "rewrite.json", rewritten)
    # A profile of the written file is one of the tensor-parallel source (stages stripped).
    profiled = syncpass_process(
        "profile", str(staged), "--example", f"{staged}:example", "--repeats", "1",
        "--warmup", "0", "-o", str(folder / "costs.json"),
    )  # fmt: skip
    save_process(folder / "profile.json", profiled)
    text = staged.read_text()
    (folder / "lm_2d_missing.py").write_text(text.replace(COLLECTIVE, "x = x", 1))
    for name in ("lm_2d", "lm_2d_missing"):
        file = folder / f"{name}.py"
        ran = syncpass_process(
            "run", str(file), "--example", f"{file}:example", "--stages", "2", "--tp", "2",
            "--verify", "--steps", "1", "--json-report", str(folder / f"{name}.json"),
            "--costs", str(folder / "costs.json"),
        )  # fmt: skip
        save_process(folder / f"{name}.run.json", ran)


def test_a_tensor_parallel_file_split_into_stages_runs_on_2x2_ranks_and_verifies(
    tmp_path: Path,
) -> None:
    # One test for both files' runs: a second test would wait idle for them on another
    # worker.
    folder = tmp_path
    _made(folder)
    rewritten = load_process(folder / "rewrite.json")
    assert rewritten.returncode == 0, rewritten.stderr
    assert "Megatron-LM's placement" in rewritten.stderr and "2 stage(s)" in rewritten.stderr
    # The stages were planned with the blocks' time as one rank computes it.
    assert "note: tensor-parallel over 2 ranks: 6 op(s) computed as one rank's share" in (
        rewritten.stderr
    )
    assert sorted(path.name for path in folder.glob(".*syncpass-tp*")) == []  # cleaned up
    text = (folder / "lm_2d.py").read_text()
    # Both kinds of sync point in one source: the stages and the collectives.
    assert "class TransformerLMStage0(" in text and COLLECTIVE in text
    assert "TENSOR_PARALLEL_LAYOUT = {" in text
    ran = load_process(folder / "lm_2d.run.json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "each split over 2 tensor-parallel ranks (4 in all" in ran.stdout
    report = json.loads((folder / "lm_2d.json").read_text())
    assert report["verify"]["ok"] is True
    parameters = report["verify"]["parameters"]
    gathered = [check for check in parameters if "gathered" in check["note"]]
    assert gathered and all(check["ok"] for check in parameters)
    assert {check["stage"] for check in gathered} == {0, 1}  # split layers in both stages
    # --costs: the stages' times as one rank computes them, beside the run.
    assert load_process(folder / "profile.json").returncode == 0
    prediction = report["prediction"]
    assert prediction["predicted_step_s"] > 0 and prediction["measured_step_s"] > 0
    assert len(prediction["stages"]) == 2
    # 4 ranks: where the profile's machine has fewer cores, the least step of the ranks
    # sharing them is beside the prediction, which is for a device a rank.
    assert prediction["ranks"] == 4
    devices = json.loads((folder / "costs.json").read_text())["hardware"]["devices"]
    if devices is not None and devices < 4:
        assert prediction["shared_step_s"] >= prediction["predicted_step_s"]
        assert "here 4 ranks share fewer" in ran.stdout

    # A file that lost one collective in stage 0 fails there.
    ran = load_process(folder / "lm_2d_missing.run.json")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    report = json.loads((folder / "lm_2d_missing.json").read_text())
    assert report["verify"]["ok"] is False
    assert any(not check["ok"] and check["stage"] == 0 for check in report["verify"]["parameters"])

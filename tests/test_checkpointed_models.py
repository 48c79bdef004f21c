"""Models that already checkpoint their blocks (activation checkpointing) are planned with
each checkpointed region whole: every form people write (``checkpoint`` in the layer loop,
``checkpoint_sequential``, Hugging Face's ``gradient_checkpointing`` branch, torchtitan's
``checkpoint_wrapper``) is profiled, rewritten into eager stages that still checkpoint, run
split over gloo and verified against the unsplit model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO, hardware_as_profiled

from syncpass.cli import main

DATA = REPO / "tests" / "data"

#: Each model, the ops its forward is planned as (a checkpointed region is one op), the
#: statement that runs its regions and the text that checkpoints them there (``None``: the
#: modules themselves checkpoint, whoever calls them).
MODELS = {
    "checkpointed_blocks": (
        ("wte", *(f"blocks.{i}" for i in range(6)), "head"),
        "for block in self.blocks",
        "checkpoint(block, x, use_reentrant=False)",
    ),
    "checkpoint_sequential_mlp": (
        ("inp", "torch.utils.checkpoint.checkpoint_sequential@L27", "out"),
        "self.blocks",
        "checkpoint_sequential(self.blocks, 4, x, use_reentrant=False)",
    ),
    "gradient_checkpointing_decoder": (
        ("embed_tokens", "torch.ones_like@L42", *(f"layers.{i}" for i in range(6)), "lm_head"),
        "for decoder_layer in self.layers",
        "self._gradient_checkpointing_func(",
    ),
    "checkpoint_wrapped_layers": (
        ("tok_embeddings", *(f"layers.{i}" for i in range(6)), "output"),
        "self.layers.values()",
        None,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_checkpointed_regions_stay_whole_and_the_split_run_verifies(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops, runs, checkpoints = MODELS[name]
    source = tmp_path / f"{name}.py"
    shutil.copy(DATA / f"{name}.py", source)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "-o", str(costs)]
    assert main([*argv, "--repeats", "1", "--warmup", "0"]) == 0
    profiled = json.loads(costs.read_text())
    assert tuple(op["id"] for op in profiled["ops"]) == ops
    # The profile sees each region recompute in its backward (and nothing else), and a
    # region keeps no more than the checkpoint's inputs (checkpoint_sequential runs its
    # last segment without a checkpoint, so it keeps that segment's activations too).
    regions = {op_id for op_id in ops if op_id.startswith(("blocks", "layers", "torch.utils"))}
    for op in profiled["ops"]:
        assert op.get("recomputes", False) == (op["id"] in regions), op["id"]
        if op["id"] in regions and not op["id"].startswith("torch.utils"):
            assert op["saved_bytes"] <= op["input_bytes"], op
    stage_counts = (2, 3) if len(ops) > 3 else (2,)
    for stages in stage_counts:
        out = tmp_path / f"sync_{stages}.py"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", str(stages)]
        assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
        classes = out.read_text().split("\nclass ")
        stages_running = [body for body in classes if re.match(r"\w+Stage\d", body)]
        stages_running = [body for body in stages_running if runs in body]
        assert stages_running, "some stage runs the regions"
        if checkpoints is not None:
            # Each stage that runs regions still checkpoints them, as the model did.
            assert all(checkpoints in body for body in stages_running)
        report = tmp_path / f"run_{stages}.json"
        argv = ["run", str(out), "--stages", str(stages), "--verify", "--steps", "1"]
        status = main([*argv, "--json-report", str(report)])
        assert status == 0, capsys.readouterr().err
        assert json.loads(report.read_text())["verify"]["ok"] is True


@pytest.mark.slow  # profiles the LM, rewrites it and runs it on 2 gloo ranks: ~30 s
def test_recompute_written_runs_verifies_and_its_peak_memory_is_as_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundled LM under a device memory that no plan fits storing every activation:
    the rewrite checkpoints the chosen blocks, the split run matches the unsplit model, and
    each rank's measured peak is within 20% of the memory model's prediction for those
    cuts and that recomputation (and below what storing everything would need)."""
    from syncpass.contracts.costs import load_costs
    from syncpass.plan.recompute_plan import stage_memory_model

    source = REPO / "examples" / "transformer_lm.py"
    costs = tmp_path / "lm.costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "-o", str(costs)]
    assert main([*argv, "--repeats", "1", "--warmup", "0"]) == 0
    profiled = load_costs(costs)
    # 80% of what the best split storing everything needs: something must recompute.
    stored = stage_memory_model(profiled, ("blocks.2",), frozenset(), "gpipe", 8)
    limit = 0.8 * max(stage.total for stage in stored)
    hardware = tmp_path / "small.toml"
    hardware.write_text(hardware_as_profiled(profiled, limit))
    out = tmp_path / "lm_sync.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "2", "--schedule", "gpipe"]
    argv += ["--microbatches", "8", "--threshold", "inf", "--hardware", str(hardware)]
    assert main([*argv, "--recompute", "auto", "-o", str(out)]) == 0, capsys.readouterr().err
    assert "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)" in out.read_text()
    capsys.readouterr()
    assert main(["plan", *argv[2:], "--recompute", "auto", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "2", "--schedule", "gpipe", "--microbatches", "8"]
    argv += ["--verify", "--steps", "1", "--costs", str(costs), "--json-report", str(report)]
    assert main(argv) == 0, capsys.readouterr().err
    document = json.loads(report.read_text())
    assert document["verify"]["ok"] is True
    # The run's prediction reads the checkpoints off the stage classes: its step pays their
    # forwards again, as the plan's did.
    # At the profile's speed (the run's own speed probe scales the op times beside it).
    prediction = document["prediction"]
    assert (prediction["profile_speed_step_s"] or prediction["predicted_step_s"]) == pytest.approx(
        planned["predicted_step_s"], rel=1e-9
    )
    memory = document["prediction"]["memory"]
    assert len(memory) == 2
    for rank, figures in enumerate(memory):
        ratio = figures["predicted_bytes"] / figures["measured_bytes"]
        assert 0.8 <= ratio <= 1.2, (rank, figures)
        # Checkpointing freed what the plan says: below storing every activation.
        assert figures["measured_activation_bytes"] < stored[rank].activations, (rank, figures)
    assert "peak memory: rank 0" in capsys.readouterr().out

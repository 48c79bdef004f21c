"""``syncpass rewrite --recompute``: the blocks the plan recomputes are checkpointed in the
eager stages, one commented line each; a loop slice that recomputes only some of its
blocks is split into sub-slices; removing the sync points gives the file back; the
``pipe_split()`` form refuses. Planned from hand-built costs (nothing runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main

LM = REPO / "examples" / "transformer_lm.py"
LM_OPS = ("torch.arange@L101", "wte", *(f"blocks.{i}" for i in range(6)), "ln_f", "lm_head")
MIB = 1024 * 1024


def lm_costs(path: Path, memory: float = 4.5 * MIB) -> Path:
    """Costs of the bundled LM at a batch of 8: blocks of 1 ms forward (a little more each
    one deeper, so that the cheapest to recompute are the first), 2 ms backward, 200 KB of
    weights, 1 MiB saved or 64 KiB of input each; a device of ``memory`` bytes."""
    ops = []
    for op_id in LM_OPS:
        block = op_id.startswith("blocks.")
        depth = int(op_id.split(".")[1]) if block else 0
        ops.append(
            {
                "id": op_id,
                "compute_s": 0.001 + 0.0001 * depth if block else 0.0002,
                "backward_s": 0.002 if block else 0.0004,
                "param_bytes": 200_000 if block else 70_000,
                "out_bytes": 65536,
                "saved_bytes": MIB if block else 65536,
                "input_bytes": 65536,
            }
        )
    data = {
        "version": 1,
        "model": "TransformerLM",
        "batch_size": 8,
        "training": True,
        "memory_multiplier": 4,
        "hardware": {"alpha_s": 1e-4, "beta_bytes_per_s": 3e9, "device_memory_bytes": memory},
        "ops": ops,
        "cuts": [{"after": op_id, "live_bytes": 65536} for op_id in LM_OPS[:-1]],
        "containers": {"blocks": 6},
    }
    path.write_text(json.dumps(data))
    return path


def stage_class(text: str, index: int, model: str = "TransformerLM") -> str:
    """The source of ``<model>Stage<index>``."""
    found = re.search(rf"^class {model}Stage{index}\(.*?(?=^\S|\Z)", text, re.M | re.S)
    assert found is not None, text
    return found.group(0).rstrip() + "\n"


def rewrite(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["rewrite", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# No communication threshold: the plan is about memory here.
GPIPE = ["--stages", "2", "--schedule", "gpipe", "--microbatches", "8", "--threshold", "inf"]


def test_the_chosen_blocks_are_checkpointed_in_sub_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json")
    argv = [str(LM), "--costs", str(costs), *GPIPE, "--recompute", "auto"]
    status, out, err = rewrite(argv, capsys)
    assert status == 0, err
    # Each stage holds three blocks of 1 MiB stored for 8 micro-batches in flight, over the
    # 4.5 MiB device with the weights: two blocks each recompute, the cheapest (the first).
    assert stage_class(out, 0).endswith(
        '    recomputes = ("blocks.0", "blocks.1")\n'
        "\n"
        "    def forward(self, idx: torch.Tensor) -> torch.Tensor:\n"
        "        positions = torch.arange(idx.shape[1], device=idx.device)\n"
        "        x: torch.Tensor = self.wte(idx) + self.wpe(positions)\n"
        "        for block in self.blocks[:2]:\n"
        "            # syncpass recompute: blocks.0, blocks.1; frees 1.88 MiB, costs 2.1 ms/step\n"
        "            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
        "        for block in self.blocks[2:3]:\n"
        "            x = block(x)\n"
        "        return x  # syncpass sync 1/1: sends x; 64 KiB, 1.64 ms/step predicted\n"
    )
    assert stage_class(out, 1).endswith(
        '    recomputes = ("blocks.3", "blocks.4")\n'
        "\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        "        for block in self.blocks[3:5]:\n"
        "            # syncpass recompute: blocks.3, blocks.4; frees 1.88 MiB, costs 2.7 ms/step\n"
        "            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\n"
        "        for block in self.blocks[5:]:\n"
        "            x = block(x)\n"
        "        x = self.ln_f(x)\n"
        "        x = self.lm_head(x)\n"
        "        return x\n"
    )
    assert (
        "stage 0 recomputes blocks.0, blocks.1 (2.1 ms/step): storing every activation needs" in err
    )


def test_removing_the_sync_points_gives_the_file_back_and_a_second_rewrite_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json")
    written = tmp_path / "lm_sync.py"
    argv = [str(LM), "--costs", str(costs), *GPIPE, "--recompute", "auto"]
    assert rewrite([*argv, "-o", str(written)], capsys)[0] == 0
    again = [str(written), "--costs", str(costs), *GPIPE, "--recompute", "auto", "--check"]
    assert rewrite(again, capsys)[0] == 0
    back = tmp_path / "lm_back.py"
    roomy = lm_costs(tmp_path / "roomy.costs.json", memory=64 * MIB)  # one stage fits
    status, _, err = rewrite(
        [str(written), "--costs", str(roomy), "--stages", "1", "-o", str(back)], capsys
    )
    assert status == 0, err
    assert back.read_text() == LM.read_text()


def test_recompute_all_checkpoints_every_block_and_none_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json", memory=64 * MIB)
    base = [str(LM), "--costs", str(costs), *GPIPE]
    status, out, err = rewrite([*base, "--recompute", "all"], capsys)
    assert status == 0, err
    lines = re.findall(r"torch\.utils\.checkpoint\.checkpoint\((\w+), x", out)
    assert lines == ["block", "block"]  # one checkpointed loop per stage, no plain slice
    assert re.findall(r"recomputes = \(([^)]*)\)", out) == [
        '"blocks.0", "blocks.1", "blocks.2"',
        '"blocks.3", "blocks.4", "blocks.5"',
    ]
    status, out, err = rewrite([*base, "--recompute", "none"], capsys)
    assert status == 0, err
    assert "checkpoint" not in out and "recomputes" not in out


def test_one_stage_that_recomputes_is_written_as_one_stage_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One device, too little memory to store every block's activations: the plan
    # checkpoints, and the file gets the one stage class that carries the checkpoints
    # (a plan with no sync point wrote nothing, and the checkpoints were lost).
    # Storing everything needs 6.43 MiB (one micro-batch in flight): 6 MiB makes four
    # blocks recompute.
    costs = lm_costs(tmp_path / "lm.costs.json", memory=6 * MIB)
    one = [str(LM), "--costs", str(costs), "--stages", "1", "--microbatches", "8"]
    status, out, err = rewrite([*one, "--recompute", "auto"], capsys)
    assert status == 0, err
    assert "class TransformerLMStage1" not in out
    assert "# syncpass stages: TransformerLM.forward in 1 PipelineStage module\n" in out
    stage = stage_class(out, 0)
    assert '"""Stage 0 of 1 of TransformerLM.forward."""' in stage
    assert "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)" in stage
    assert 'recomputes = ("blocks.0", "blocks.1", "blocks.2", "blocks.3")' in stage
    status, out, err = rewrite([*one, "--recompute", "none", "--hardware", "nvlink-8xh100"], capsys)
    assert status == 0, err
    assert out == LM.read_text()  # nothing to recompute and no sync point: the file as it was


def test_a_plan_file_that_recomputes_rewrites_as_planning_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # plan --recompute writes the plan file (-o, or --json on stdout) with the ops it
    # checkpoints; rewrite --plan writes what rewrite --recompute writes from the costs.
    costs = lm_costs(tmp_path / "lm.costs.json")
    plan = tmp_path / "plan.json"
    args = ["--costs", str(costs), *GPIPE, "--recompute", "auto"]
    assert main(["plan", *args, "-o", str(plan)]) == 0
    report, _ = capsys.readouterr()
    assert "recompute chosen" in report
    assert main(["plan", *args, "--json"]) == 0
    printed, _ = capsys.readouterr()
    assert json.loads(printed) == json.loads(plan.read_text())
    # Two of each stage's three blocks, as test_the_chosen_blocks_are_checkpointed_in_sub_slices.
    checkpointed = {entry["op"] for entry in json.loads(printed)["checkpointed"]}
    assert checkpointed == {"blocks.0", "blocks.1", "blocks.3", "blocks.4"}
    status, planned, err = rewrite([str(LM), *args], capsys)
    assert status == 0, err
    status, out, err = rewrite([str(LM), "--plan", str(plan)], capsys)
    assert status == 0, err
    assert out == planned


def test_stages_auto_takes_the_count_whose_recomputing_plan_predicts_the_least_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json")
    args = ["--costs", str(costs), "--schedule", "gpipe", "--microbatches", "8"]
    args += ["--threshold", "inf", "--recompute", "auto"]
    steps = {}
    for count in range(1, 5):  # each count planned on its own, as a user would
        status = main(["plan", *args, "--stages", str(count), "--json"])
        out, _ = capsys.readouterr()
        if status == 0:
            steps[count] = json.loads(out)["predicted_step_s"]
    assert 1 not in steps and len(steps) >= 2  # one device cannot hold the LM at 4.5 MiB
    best = min(steps, key=steps.__getitem__)
    assert main(["plan", *args, "--stages", "auto", "--max-stages", "4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["num_stages"] == best
    assert plan["predicted_step_s"] == pytest.approx(steps[best], rel=1e-9)
    (note,) = [note for note in plan["notes"] if note.startswith("--stages auto")]
    assert f"--stages auto: {best} stage(s) predict the least step" in note
    assert "no plan fits at 1" in note
    status, out, err = rewrite([str(LM), *args, "--stages", "auto", "--max-stages", "4"], capsys)
    assert status == 0, err
    assert out.count("class TransformerLMStage") == best + 1  # the base class and a class a stage


def test_pipe_split_form_refuses_recompute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json")
    argv = [str(LM), "--costs", str(costs), *GPIPE, "--recompute", "auto", "--backend", "torch"]
    status, out, err = rewrite(argv, capsys)
    assert status == 2 and out == ""
    assert "cannot write activation checkpointing" in err and "torch_stages" in err


def test_no_plan_fits_even_recomputing_every_block_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json", memory=2 * MIB)
    status, out, err = rewrite(
        [str(LM), "--costs", str(costs), *GPIPE, "--recompute", "auto"], capsys
    )
    assert status == 2 and out == ""
    assert "no plan fits the device's memory even recomputing every block" in err


ENUMERATED = """\
from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        y: torch.Tensor = self.fc(x) * (1.0 if scale is None else scale)
        return y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.inp(x)
        for i, block in enumerate(self.blocks):
            h = block(h, scale=torch.full((), float(i + 1)))
        return h
"""


def test_an_enumerated_loop_with_keywords_keeps_its_index_and_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "net.py"
    source.write_text(ENUMERATED)
    ops = ["inp", *(f"blocks.{i}" for i in range(4))]
    data = {
        "version": 1,
        "model": "Net",
        "batch_size": 4,
        "training": True,
        "hardware": {"alpha_s": 0.0, "beta_bytes_per_s": 1e9, "device_memory_bytes": 3000},
        "ops": [
            {
                "id": op,
                "compute_s": 0.001 * (t + 1),
                "backward_s": 0.002,
                "saved_bytes": 1600 if t else 100,
                "input_bytes": 100,
            }
            for t, op in enumerate(ops)
        ],
        "cuts": [{"after": op, "live_bytes": 100} for op in ops[:-1]],
        "containers": {"blocks": 4},
    }
    costs = tmp_path / "net.costs.json"
    costs.write_text(json.dumps(data))
    argv = [str(source), "--costs", str(costs), "--stages", "2", "--schedule", "gpipe"]
    argv += ["--microbatches", "4", "--cuts", "blocks.1", "--strategy", "manual"]
    status, out, err = rewrite([*argv, "--recompute", "auto"], capsys)
    assert status == 0, err
    # Each stage stores 3,300 or 3,200 bytes, over 3,000: the cheaper block of each
    # recomputes. The index counts on in each sub-slice; the keyword goes through
    # checkpoint; a call too wide for one line is laid out one argument a line.
    assert "for i, block in enumerate(self.blocks[1:2], start=1):" in out
    assert stage_class(out, 1, "Net").endswith(
        '    recomputes = ("blocks.2",)\n'
        "\n"
        "    def forward(self, h: torch.Tensor) -> torch.Tensor:\n"
        "        for i, block in enumerate(self.blocks[2:3], start=2):\n"
        "            # syncpass recompute: blocks.2; frees 1.46 KiB, costs 4 ms/step\n"
        "            h = torch.utils.checkpoint.checkpoint(\n"
        "                block,\n"
        "                h,\n"
        "                scale=torch.full((), float(i + 1)),\n"
        "                use_reentrant=False,\n"
        "            )\n"
        "        for i, block in enumerate(self.blocks[3:], start=3):\n"
        "            h = block(h, scale=torch.full((), float(i + 1)))\n"
        "        return h\n"
    )
    lint(source.with_name("net_sync.py"), out)


def lint(path: Path, code: str) -> None:
    """``code`` written at ``path`` passes ruff and mypy as the project configures them."""
    from test_generated_lint import tool

    path.write_text(code)
    config = str(REPO / "pyproject.toml")
    for argv in (
        ("ruff", "check", "--no-cache", "--config", config, str(path)),
        ("ruff", "format", "--check", "--no-cache", "--config", config, str(path)),
        ("mypy", "--config-file", config, str(path)),
    ):
        checked = tool(*argv)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rewritten_lm_passes_the_projects_linters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = lm_costs(tmp_path / "lm.costs.json")
    status, out, err = rewrite(
        [str(LM), "--costs", str(costs), *GPIPE, "--recompute", "auto"], capsys
    )
    assert status == 0, err
    lint(tmp_path / "lm_sync.py", out)

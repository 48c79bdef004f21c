"""Eager stages on real gloo process groups: rewrite a model as real code is written
(a mask and a table for every block, a tied head, data-dependent branches), run it split
under torch's PipelineStage, and compare loss and every gradient with the unsplit model."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO, without_meeting_stalls

from syncpass.backends.torch.example import load_example
from syncpass.backends.torch.profile import check_model_file
from syncpass.cli import main
from syncpass.core.errors import SyncpassError

MODEL = REPO / "tests" / "data" / "masked_gpt.py"


def rewritten(tmp_path: Path, stages: int, capsys: pytest.CaptureFixture[str]) -> Path:
    source = tmp_path / "masked_gpt.py"
    shutil.copy(MODEL, source)
    out = tmp_path / f"masked_gpt_{stages}.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    # The tied embedding and head on the first and the last stage, whatever gloo's stall.
    argv += ["--hardware", str(without_meeting_stalls(tmp_path))]
    status = main([*argv, "--backend", "torch_stages", "-o", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "cannot trace" not in captured.err  # the eager form needs no tracer
    return out


def run_verified(path: Path, options: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    report = path.with_suffix(".json")
    status = main(["run", str(path), *options.split(), "--verify", "--json-report", str(report)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return json.loads(report.read_text())  # type: ignore[no-any-return]


def run_verified_whole(path: Path, options: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    """:func:`run_verified`, checked: verified, every weight of the model compared."""
    document = run_verified(path, options, capsys)
    assert document["verify"]["ok"] is True
    assert document["verify"]["parameters_compared"] == document["verify"]["model_parameters"]
    return document


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "schedule"), [(2, "gpipe"), (4, "1f1b")])
def test_masked_gpt_splits_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stages: int, schedule: str
) -> None:
    path = rewritten(tmp_path, stages, capsys)
    document = run_verified(path, f"--stages {stages} --schedule {schedule}", capsys)
    verify = document["verify"]
    assert verify["ok"] is True and verify["mismatches"] == 0
    assert verify["parameters_compared"] == verify["model_parameters"]
    assert len(verify["losses"]) == document["microbatches"]
    # The head is tied to the embedding: its two copies' gradients are summed, as unsplit.
    tied = [entry for entry in verify["parameters"] if "several stages" in entry.get("note", "")]
    assert sorted((entry["name"], entry["stage"]) for entry in tied) == [
        ("wte.weight", 0),
        ("wte.weight", stages - 1),
    ]
    # Each step gives both copies the sum of their gradients: they stay one weight.
    assert [(tied["name"], tied["stages"], tied["ok"]) for tied in verify["tied"]] == [
        ("wte.weight", [0, stages - 1], True)
    ]
    # Each stage holds only what it runs: every layer's parameters are on one stage only.
    by_name: dict[str, set[int]] = {}
    for entry in verify["parameters"]:
        by_name.setdefault(entry["name"], set()).add(entry["stage"])
    assert all(len(held) == 1 for name, held in by_name.items() if name != "wte.weight")
    assert all(stage["parameters"] > 0 for stage in document["stage_reports"])


@pytest.mark.slow
def test_a_stage_that_computes_something_else_fails_verification(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(tmp_path, 2, capsys)
    text = path.read_text()
    stage_one = text.index("class MaskedGPTStage1")
    tampered = text[:stage_one] + text[stage_one:].replace(
        "x = self.ln_f(x)", "x = self.ln_f(x) * 2", 1
    )
    assert tampered != text
    path.write_text(tampered)
    report = path.with_suffix(".json")
    status = main(["run", str(path), "--stages", "2", "--verify", "--json-report", str(report)])
    capsys.readouterr()
    assert status != 0
    assert json.loads(report.read_text())["verify"]["ok"] is False


@pytest.mark.slow
def test_a_stage_count_the_file_does_not_have_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(tmp_path, 2, capsys)
    status = main(["run", str(path), "--stages", "3", "--timeout", "60"])
    err = capsys.readouterr().err
    assert status == 2
    assert "the file has 2 stage classes (MaskedGPTStage0 .. MaskedGPTStage1)" in err
    assert "--stages asks for 3" in err


@pytest.mark.slow
def test_python_numbers_and_nones_cross_as_the_profile_saw_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "masked_gpt.py"
    text = MODEL.read_text().replace("x = self.ln_f(x)\n", "x = self.ln_f(x)[:, :seq]\n")
    text = text.replace(
        "        x = self.embed(idx)\n",
        "        cache = None if seq > 0 else mask  # None in training\n        x = self.embed(idx)\n",
    )
    text = text.replace("return self.head(x)", "return self.head(x) if cache is None else x")
    source.write_text(text)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--backend", "torch_stages"]
    assert main([*argv, "-o", str(costs)]) == 0
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "2"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    capsys.readouterr()
    written = out.read_text()
    assert "torch.as_tensor(seq, device=" in written  # an int crosses as a 0-d tensor
    assert "        seq = int(seq)  # the stage before sends it as a tensor\n" in written
    assert "        cache = None  # None when profiled: nothing to send\n" in written
    document = run_verified(out, "--stages 2", capsys)
    assert document["verify"]["ok"] is True

    # Without what the profile saw (a cost file from elsewhere), the number is sent as it
    # is, and the run stops at the line that sends it, naming it.
    data = json.loads(costs.read_text())
    for cut in data["cuts"]:
        cut.pop("kinds", None)
    costs.write_text(json.dumps(data))
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    capsys.readouterr()
    status = main(["run", str(out), "--stages", "2", "--timeout", "60"])
    err = capsys.readouterr().err
    assert status == 2
    lines = out.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip().startswith("return seq,"))
    assert f"{out}:{line}: rank 0: stage 0 sends seq (of type int) to stage 1" in err


@pytest.mark.slow
def test_a_tuple_of_tensors_and_a_shape_cross_every_stage_packed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A rotary table as a (cos, sin) pair and a shape, computed once and read after the
    # layers, as Hugging Face's Llama and GPT-2 do: a later stage receives them as tensors.
    source = tmp_path / "masked_gpt.py"
    text = MODEL.read_text().replace(
        "        rope = torch.cos(torch.arange(seq, device=idx.device)[:, None] * self.freqs)\n",
        "        angles = torch.arange(seq, device=idx.device)[:, None] * self.freqs\n"
        "        rope = (torch.cos(angles), torch.sin(angles))\n",
    )
    text = text.replace("x = block(x, mask, rope)", "x = block(x, mask, rope[0] + rope[1])")
    text = text.replace(
        "        x = self.embed(idx)\n", "        x = self.embed(idx)\n        shape = x.shape\n"
    )
    text = text.replace(
        "x = self.ln_f(x)\n", "x = self.ln_f(x).reshape(-1, shape[-1]).view(shape)\n"
    )
    # The model returns a dict, as Hugging Face's return a ModelOutput: the last stage does too.
    text = text.replace(
        "        return self.head(x)\n", '        return {"logits": self.head(x)}\n'
    )
    text = text.replace(
        "tokens[:, 1:], lm_loss", "tokens[:, 1:], lambda out, y: lm_loss(out['logits'], y)"
    )
    source.write_text(text)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "4"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    written = out.read_text()
    assert "        rope = (rope_0, rope_1,)  # the stage before sends its 2 tensors\n" in written
    assert (
        "        shape = torch.Size(shape.tolist())  # the stage before sends it as a tensor\n"
        in (written)
    )
    assert "*rope" in written
    run_verified_whole(out, "--stages 4", capsys)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "torch_stages"])
def test_layers_in_a_module_dict_split_and_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    # torchtitan's form: for layer in self.layers.values(), keys "0".."n-1".
    source = tmp_path / "module_dict_layers.py"
    shutil.copy(REPO / "tests" / "data" / "module_dict_layers.py", source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "3"]
    assert main([*argv, "--backend", backend, "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert "for layer in list(self.layers.values())[" in out.read_text()
    run_verified_whole(out, "--stages 3", capsys)


@pytest.mark.slow
def test_a_forward_that_delegates_to_a_method_is_planned_inside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "delegating_resnet.py"
    shutil.copy(REPO / "tests" / "data" / "delegating_resnet.py", source)
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "4"]
    # Planned as written, forward is one op: `return self._forward_impl(x)`.
    assert main([*argv, "--backend", "torch", "-o", str(tmp_path / "traced.py")]) == 2
    assert "the model has 1" in capsys.readouterr().err
    out = tmp_path / "eager.py"
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    capsys.readouterr()
    assert out.read_text().startswith(source.read_text().split("\n\ndef example")[0])
    run_verified_whole(out, "--stages 4", capsys)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "torch_stages"])
def test_unpacked_layer_pairs_with_the_last_held_out_split_and_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    source = tmp_path / "pair_layers.py"
    shutil.copy(REPO / "tests" / "data" / "pair_layers.py", source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "4"]
    assert main([*argv, "--backend", backend, "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert "for attn, ff in self.layers[" in out.read_text()
    run_verified_whole(out, "--stages 4", capsys)


BRANCHING = REPO / "tests" / "data" / "branching_vit.py"


@pytest.mark.slow
def test_a_branch_decided_by_defaults_and_an_init_flag_is_planned_inside_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # timm's forward_features: if attn_mask/is_causal ... elif self.grad_checkpointing ... else
    # x = self.blocks(x). Planned as written the if is one region; decided, the blocks split.
    source = tmp_path / "branching_vit.py"
    shutil.copy(BRANCHING, source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "3"]
    assert main([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "the stages run the else branch of `if attn_mask is not None or is_causal:`" in err
    assert "self.grad_checkpointing=False" in err
    assert "# syncpass: the else branch of" in out.read_text()
    assert "self.blocks[" in out.read_text()
    run_verified_whole(out, "--stages 3", capsys)


def test_a_model_that_takes_another_branch_than_init_sets_is_refused_at_the_if(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = tmp_path / "costs.json"
    example = f"{BRANCHING}:example_checkpointed"
    assert main(["profile", str(BRANCHING), "--example", example, "-o", str(costs)]) == 2
    err = capsys.readouterr().err
    assert f"{BRANCHING}:34: the stages run the else branch of" in err
    assert "self.grad_checkpointing = False as __init__ sets it" in err
    assert not costs.exists()


def test_the_examples_inputs_decide_the_branch_they_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The example passes a mask: `attn_mask is not None` holds, and the blocks run one by
    # one in the loop the stages cut.
    costs = tmp_path / "costs.json"
    example = f"{BRANCHING}:example_masked"
    argv = ["profile", str(BRANCHING), "--example", example, "--repeats", "1", "--warmup", "0"]
    assert main([*argv, "-o", str(costs)]) == 0, capsys.readouterr().err
    document = json.loads(costs.read_text())
    assert document["model_settings"]["input:1"] == "Tensor"
    assert [op["id"] for op in document["ops"]].count("blocks.3") == 1
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(BRANCHING), "--costs", str(costs), "--stages", "2", "-o", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "the if branch of `if attn_mask is not None or is_causal:`" in err
    assert "attn_mask=<passed>" in err
    assert "for blk in self.blocks[" in out.read_text()


REQUIRED_SCALE = """\
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x, scale=None):
        if scale is None:
            raise ValueError("pass a scale")
        x = self.a(x) * scale
        return self.b(x)


def example():
    inputs = (torch.randn(8, 4), torch.tensor(2.0))
    return Net(), inputs, torch.randint(0, 2, (8,)), F.cross_entropy
"""


def test_a_parameter_the_example_passes_is_not_taken_for_its_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Decided with scale's default, the stages would run the raise; the example passes a
    # scale, so `if scale is None:` takes no branch, and the forward profiles as it runs.
    source = tmp_path / "required_scale.py"
    source.write_text(REQUIRED_SCALE)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--backend"]
    assert main([*argv, "torch_stages", "--repeats", "1", "-o", str(costs)]) == 0
    assert json.loads(costs.read_text())["model_settings"]["input:1"] == "Tensor"
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "2", "-o", str(out)]
    assert main([*argv, "--backend", "torch_stages"]) == 0
    err = capsys.readouterr().err
    assert "no branch of `if scale is None:` at" in err and "scale=<passed>" in err
    assert "pass a scale" not in out.read_text().split("# syncpass stages")[1]


ZIPPED = REPO / "tests" / "data" / "zipped_layers.py"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "stages", "cuts", "piece"),
    [
        # The tracer form cannot hand the list of scales past a stage: 2 stages.
        ("torch", 2, "layers.2", "zip(self.layers[3:], self.norms[3:], scales[3:], strict=True)"),
        # The middle eager stage computes the scales again and runs a slice of the loop.
        (
            "torch_stages",
            3,
            "layers.1,layers.3",
            "zip(self.layers[2:4], self.norms[2:4], scales[2:4], strict=True)",
        ),
    ],
)
def test_layers_zipped_with_norms_and_a_local_list_split_and_verify(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    backend: str,
    stages: int,
    cuts: str,
    piece: str,
) -> None:
    source = tmp_path / "zipped_layers.py"
    shutil.copy(ZIPPED, source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    argv += ["--cuts", cuts, "--backend", backend, "-o", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert piece in out.read_text()
    run_verified_whole(out, f"--stages {stages}", capsys)


def test_zipped_containers_of_different_lengths_are_refused_at_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "zipped_layers.py"
    text = ZIPPED.read_text().replace(
        "nn.LayerNorm(width) for _ in range(depth)", "nn.LayerNorm(width) for _ in range(depth - 1)"
    )
    source.write_text(text)
    argv = [
        "profile",
        str(source),
        "--example",
        f"{source}:example",
        "-o",
        str(tmp_path / "c.json"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{source}:26: the loop zips self.layers (6 layers) with self.norms (5)" in err
    # Longer is fine: zip stops at the layers' end, as the index loops it stands for do.
    longer = text.replace("range(depth - 1)", "range(depth + 1)").replace(", strict=True", "")
    source.write_text(longer)
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_a_value_that_is_a_strided_view_crosses_as_a_contiguous_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # gloo sends only dense tensors: a block that returns a slice of a wider tensor (as
    # ViT's class-token pooling ``x[:, 0]`` does) must still cross every sync point.
    source = tmp_path / "masked_gpt.py"
    ending = "        return x + self.mlp(self.ln_2(x))\n"
    strided = "        y = x + self.mlp(self.ln_2(x))\n        return torch.cat([y, y], dim=2)[..., :width]\n"
    text = MODEL.read_text()
    assert ending in text
    source.write_text(text.replace(ending, strided))
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "3"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(out)]) == 0
    capsys.readouterr()
    document = run_verified(out, "--stages 3", capsys)
    assert document["verify"]["ok"] is True


@pytest.mark.slow
def test_a_mismatch_under_dropout_says_the_draws_may_explain_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "masked_gpt.py"
    text = MODEL.read_text()
    text = text.replace(
        "        self.ln_f = nn.LayerNorm(WIDTH)\n",
        "        self.ln_f = nn.LayerNorm(WIDTH)\n        self.drop = nn.Dropout(0.5)\n",
    )
    text = text.replace("        x = self.embed(idx)\n", "        x = self.drop(self.embed(idx))\n")
    source.write_text(text)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "2"]
    assert main([*argv, "-o", str(out)]) == 0
    capsys.readouterr()
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "2", "--verify", "--json-report", str(report)]
    assert main(argv) != 0
    out_text = capsys.readouterr().out
    verify = json.loads(report.read_text())["verify"]
    assert verify["ok"] is False
    assert "dropout in drop" in verify["randomness"]
    assert "note: the unsplit model's output differs between two runs" in out_text


ROPE_CACHE = REPO / "tests" / "data" / "rope_cache_gpt.py"


@pytest.mark.slow
def test_a_table_cheaper_to_slice_again_than_to_send_is_sliced_again_by_every_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The causal mask (256 KiB a micro-batch) is sliced out of each stage's own buffer
    # in microseconds; sending it would take about 90 us on the CPU link. Its size, an
    # int, crosses instead, and the plan and the sync comments say so.
    source = tmp_path / "rope_cache_gpt.py"
    shutil.copy(ROPE_CACHE, source)
    costs = tmp_path / "rc.costs.json"
    assert (
        main(
            [
                "profile",
                str(source),
                "--example",
                f"{source}:example",
                "--backend",
                "torch_stages",
                "-o",
                str(costs),
            ]
        )
        == 0
    )
    plan_file = tmp_path / "plan.json"
    out = tmp_path / "rc4.py"
    argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "4", "--backend"]
    # A sync point between every two blocks: a noisy profile once put the last one after
    # the last block, where the mask is no longer live. Whether each sends the mask or
    # has it sliced again is still the plan's choice.
    argv = [*argv, "torch_stages", "--strategy", "manual", "--cuts", "blocks.0,blocks.1,blocks.2"]
    status = main([*argv, "-o", str(out), "--report", str(plan_file)])
    assert status == 0, capsys.readouterr().err
    points = json.loads(plan_file.read_text())["plan"]["sync_points"]
    assert all("mask" in point["recomputed"] for point in points)
    text = out.read_text()
    assert text.count("mask = self.bias[:T, :T]") == 5  # the model's own, and every stage's
    assert text.count("computes mask again") == 3
    document = run_verified(out, "--stages 4", capsys)
    assert document["verify"]["ok"] is True

    # A plan that sends the mask across the first sync point and slices it again after
    # the second: the stage in between receives the size it does not use, to send it on.
    plan = json.loads(plan_file.read_text())["plan"]
    plan["sync_points"][0]["recomputed"] = []
    saved = tmp_path / "mixed.plan.json"
    saved.write_text(json.dumps(plan))
    mixed = tmp_path / "mixed.py"
    status = main(
        [
            "rewrite",
            str(source),
            "--plan",
            str(saved),
            "--backend",
            "torch_stages",
            "-o",
            str(mixed),
        ]
    )
    assert status == 0, capsys.readouterr().err
    stage1 = mixed.read_text().split("class RopeCacheGPTStage1")[1].split("class ")[0]
    assert "T = int(T)" in stage1 and "mask = self.bias" not in stage1
    assert run_verified(mixed, "--stages 4", capsys)["verify"]["ok"] is True


INHERITED = [REPO / "tests" / "data" / name for name in ("inherited_vit.py", "inherited_base.py")]


def inherited_project(tmp_path: Path) -> Path:
    """``inherited_vit.py`` and the module of its base, copied side by side."""
    for path in INHERITED:
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "inherited_vit.py"


def rewrite_inherited(tmp_path: Path, stages: int, capsys: pytest.CaptureFixture[str]) -> Path:
    source = inherited_project(tmp_path)
    out = tmp_path / f"inherited_vit_{stages}.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    status = main([*argv, "--model", "DistilledViT", "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "planned inside TinyBackbone.forward (inherited_base.py:47)" in err
    assert "self.forward_features (TinyBackbone's, inherited_base.py:34)" in err
    assert "the else branch of `if is_causal:` at inherited_base.py:36" in err
    return out


def test_a_forward_inherited_from_another_module_is_written_into_the_stages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # timm's DeiT: forward and forward_features come from the base's module, _embed and
    # forward_head from the model's own class; only the stage classes are added.
    out = rewrite_inherited(tmp_path, 3, capsys)
    text = out.read_text()
    original = (tmp_path / "inherited_vit.py").read_text()
    assert text.startswith(original.split("\n\ndef example")[0])
    stage0 = text[text.index("class DistilledViTStage0") : text.index("class DistilledViTStage1")]
    assert "def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:" in stage0
    assert "torch.cat((token, x), dim=1)" in stage0  # the override, not F.gelu
    assert "F.gelu" not in text and "checkpoint_sequential" not in text
    assert "# syncpass: the else branch of `if is_causal:` (inherited_base.py:36)" in stage0
    assert "self.head_dist(x[:, 0])" in text  # the overridden head, inlined
    assert (tmp_path / "inherited_base.py").read_text() == INHERITED[1].read_text()


def test_the_profile_checks_the_model_runs_the_base_forward_that_was_read(
    tmp_path: Path,
) -> None:
    source = inherited_project(tmp_path)
    model = load_example(f"{source}:example").model
    base = tmp_path / "inherited_base.py"
    check_model_file(model, source, "DistilledViT", ("TinyBackbone", base))
    with pytest.raises(SyncpassError, match=r"runs TinyBackbone.forward from .*, but the stages"):
        check_model_file(model, source, "DistilledViT", ("TinyBackbone", tmp_path / "other.py"))
    with pytest.raises(SyncpassError, match="the example's model is a DistilledViT from"):
        check_model_file(model, base, "DistilledViT", ("TinyBackbone", base))


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 3])
def test_a_forward_inherited_from_another_module_splits_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stages: int
) -> None:
    out = rewrite_inherited(tmp_path, stages, capsys)
    run_verified_whole(out, f"--stages {stages}", capsys)


@pytest.mark.slow
def test_a_stage_holds_the_modules_a_plain_object_it_uses_refers_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # torchtune's TiedLinear: the head is an object, not a module, that calls the
    # embedding's weight; the last stage keeps the embedding so that the weight is its own.
    source = tmp_path / "tied_object_head.py"
    shutil.copy(REPO / "tests" / "data" / "tied_object_head.py", source)
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "2"]
    assert main([*argv, "--in-place"]) == 0, capsys.readouterr().err
    example = load_example(f"{source}:example")
    model = example.model
    module = sys.modules[type(model).__module__]
    first, last = (getattr(module, f"TiedHeadLMStage{index}").of(model) for index in (0, 1))
    assert "tok_embeddings" not in last.keeps  # what the forward's slice reads, as written
    held = dict(last.named_parameters())
    assert held["tok_embeddings.weight"] is model.tok_embeddings.weight
    assert not any(name.startswith("layers.0.") for name in held)
    assert "norm.weight" not in dict(first.named_parameters())


@pytest.mark.slow
def test_other_splits_run_alongside_step_by_step_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two splits of one model: their timed steps alternate in one process group, each
    # verified and reported on its own (the JSON report nests the others').
    source = tmp_path / "tied_object_head.py"
    shutil.copy(REPO / "tests" / "data" / "tied_object_head.py", source)
    costs = tmp_path / "costs.json"
    assert main(["profile", str(source), "--example", f"{source}:example", "-o", str(costs)]) == 0
    files = []
    for strategy in ("adaptive", "parameters"):
        out = tmp_path / f"tied_{strategy}.py"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "2"]
        assert main([*argv, "--strategy", strategy, "-o", str(out)]) == 0
        files.append(out)
    capsys.readouterr()
    report = tmp_path / "run.json"
    argv = [
        "run",
        str(files[0]),
        "--stages",
        "2",
        "--steps",
        "3",
        "--verify",
        "--costs",
        str(costs),
    ]
    status = main([*argv, "--alongside", str(files[1]), "--json-report", str(report)])
    out = capsys.readouterr().out
    assert status == 0, out
    document = json.loads(report.read_text())
    (other,) = document["alongside"]
    for one, file in ((document, files[0]), (other, files[1])):
        assert one["verify"]["ok"] is True
        assert all(len(stage["step_times_s"]) == 3 for stage in one["stage_reports"])
        assert one["prediction"]["measured_step_s"] > 0
        assert f"== {file}" in out
    assert "alongside" not in other


def test_a_missing_file_alongside_is_refused_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "tied_object_head.py"
    shutil.copy(REPO / "tests" / "data" / "tied_object_head.py", source)
    missing = tmp_path / "other_split.py"
    assert main(["run", str(source), "--stages", "2", "--alongside", str(missing)]) == 2
    assert f"{missing}: no such file (--alongside names other model sources)" in (
        capsys.readouterr().err
    )


RECORDED = REPO / "tests" / "data" / "recorded_layers.py"


def _rewritten(tmp_path: Path, model: Path, stages: int, *options: str) -> Path:
    """The data model ``model``, copied into ``tmp_path``, rewritten into ``stages`` eager
    stages with ``options``: the file written."""
    source = tmp_path / model.name
    shutil.copy(model, source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    assert main([*argv, *options, "-o", str(out)]) == 0
    return out


def _split_at(tmp_path: Path, model: Path, cuts: str) -> tuple[Path, str]:
    """The data model ``model`` rewritten into 3 stages at ``cuts``: the file, and its stage
    classes' text."""
    out = _rewritten(tmp_path, model, 3, "--cuts", cuts)
    return out, out.read_text().split("# syncpass stages")[1]


@pytest.mark.slow
def test_a_loop_over_a_tuple_the_forward_builds_is_split_per_layer_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x-transformers' form: `for ind, (kind, (norm, proj, residual), scale) in
    # enumerate(zip(*variables))` over per-layer tuples the forward builds and reorders,
    # an iterator advanced inside, the first layer's dataclass kept for the later ones.
    out, text = _split_at(tmp_path, RECORDED, "layers.2,layers.4")
    assert "planned inside" not in capsys.readouterr().err
    header = "for ind, (kind, (norm, proj, residual), scale) in "
    comment = "  # syncpass: iteration i runs self.layers[i]"
    for piece in ("[:3]", "[3:5]", "[5:]"):
        assert f"{header}list(enumerate(zip(*variables, strict=True))){piece}:{comment}" in text
    # The tuple of modules is built again by each stage; the iterator crosses as what it
    # has left (nothing: the first layer took its one item); the dataclass as its tensor.
    assert text.count("variables = (self.layer_types, self.layers, self.layer_scales)") == 3
    assert text.count("extra = iter([])  # the same when profiled: nothing sent") == 2
    assert "first = Intermediate(values=first_0, kind='a')  # its 1 tensor(s) sent" in text
    document = run_verified_whole(out, "--stages 3", capsys)
    # Each stage holds its own layers only.
    held = {entry["name"]: entry["stage"] for entry in document["verify"]["parameters"]}
    assert held["layers.0.1.weight"] == 0 and held["layers.4.1.weight"] == 1
    assert held["layers.5.1.weight"] == 2


@pytest.mark.slow
def test_a_stage_that_builds_the_loops_tuple_and_runs_none_of_its_layers_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x-transformers split before its first layer: the first stage builds `variables` from
    # self.layers (which the next stage builds again) and runs no layer. It holds the
    # container with every layer None, not None itself.
    out, text = _split_at(tmp_path, RECORDED, "builtins.iter@L46,layers.2")
    first = text.split("Stage1(")[0]
    assert "variables = (self.layer_types, self.layers, self.layer_scales)" in first
    assert '"layers.(other stages\')"' in first
    document = run_verified_whole(out, "--stages 3", capsys)
    held = {entry["name"]: entry["stage"] for entry in document["verify"]["parameters"]}
    assert held["embed.weight"] == 0 and held["layers.0.1.weight"] == 1
    assert held["layers.5.1.weight"] == 2


SAME = REPO / "tests" / "data" / "same_tensor_sends.py"


@pytest.mark.slow
def test_a_tensor_under_two_names_is_sent_once_and_the_split_run_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # T5's decoder: encoder_hidden_states is encoder_outputs.last_hidden_state. Here a
    # dataclass's field and a tuple's item, each under a name of its own, cross every cut.
    out, text = _split_at(tmp_path, SAME, "layers.0,layers.2")
    assert text.count("return h, memory.states, *pair\n") == 2
    once = "context is memory.states, sent once; gate is pair[1], sent once"
    assert text.count(once) == 2
    assert text.count("context = memory.states  # the same tensor when profiled: sent once") == 2
    assert text.count("gate = pair[1]  # the same tensor when profiled: sent once") == 2
    # One tensor a stage receives, read under both names: its gradient is both reads'.
    run_verified_whole(out, "--stages 3", capsys)


HANDED = REPO / "tests" / "data" / "handed_stack.py"


@pytest.mark.slow
def test_a_stack_handed_to_init_and_called_through_a_local_function_splits_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # x-transformers' form: `TransformerWrapper(attn_layers=Decoder(...))` keeps the stack
    # it is given, and calls it through `def _attn_layers_forward(inp, **kwargs): return
    # self.attn_layers(inp, ..., return_hiddens=True, **kwargs)`; the stack's class
    # inherits a forward that returns early unless asked for its hiddens.
    source = tmp_path / "handed_stack.py"
    shutil.copy(HANDED, source)
    out = tmp_path / "sync.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "2"]
    assert main([*argv, "--cuts", "layers.layers.1", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "planned inside self.layers" in err
    assert "no branch of `if not return_hiddens:`" in err and "return_hiddens=True" in err
    stages = out.read_text().split("# syncpass stages")[1]
    assert "for layer in self.layers.layers[:2]:" in stages
    assert "for layer in self.layers.layers[2:]:" in stages
    assert "run_layers" not in stages  # the local function is followed, and goes
    assert 'scale = kwargs["scale"]' in stages  # the keywords it was handed, by name
    # The first stage holds the head it only tests with nothing in it.
    assert '"head.(only tested)"' in stages
    document = run_verified_whole(out, "--stages 2", capsys)
    assert document["verify"]["tied"] == []  # no stage holds another's layers or head


@pytest.mark.slow
def test_a_stage_that_sends_one_tuple_alone_returns_its_tensors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _rewritten(
        tmp_path, REPO / "tests" / "data" / "lone_tuple_send.py", 2, "--strategy", "manual"
    )
    capsys.readouterr()
    text = out.read_text()
    compile(text, str(out), "exec")  # ``return *outs`` would be a syntax error
    assert "return (*outs,)  # syncpass sync 1/1: sends outs;" in text
    run_verified_whole(out, "--stages 2", capsys)

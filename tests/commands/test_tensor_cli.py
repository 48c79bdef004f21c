"""`syncpass plan --strategy tensor --tp N` as a user runs it: report, JSON, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncpass.cli import main

REPO = Path(__file__).resolve().parents[2]
TENSOR_COSTS = REPO / "examples" / "costs" / "gpt_tp_4096.costs.json"


def _plan(*flags: str) -> list[str]:
    return ["plan", "--costs", str(TENSOR_COSTS), "--strategy", "tensor", *flags]


def test_the_report_lists_each_collective_and_the_hand_placements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_plan("--tp", "4", "--no-sequence-parallel")) == 0
    out = capsys.readouterr().out
    assert "syncpass tensor plan: gpt-4x4096 (tp 4, batch 1, training" in out
    assert "collectives: 11 forward, 9 backward" in out  # 2 per layer each way, head's
    assert "forward all-reduce of h.3.mlp.c_proj (after h.3.mlp.c_proj): P -> R, 16 MiB" in out
    for placement in ("syncpass", "megatron", "replicated"):
        assert f"\n  {placement} " in out


def test_json_goes_to_stdout_and_to_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tp.plan.json"
    assert main(_plan("--tp", "2", "--no-sequence-parallel", "--json", "-o", str(target))) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(target.read_text()) == printed
    assert printed["kind"] == "tensor" and printed["tp"] == 2
    assert printed["sequence_parallel"] == {"allowed": False, "used": False}
    assert {cost["name"] for cost in printed["baselines"]} == {"megatron", "replicated"}
    first = printed["collectives"][0]
    assert set(first) >= {"kind", "direction", "value", "bytes", "time_s", "where", "why"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tp", "0"), "--tp must be a whole number of devices >= 1, got 0"),
        (("--tp", "3"), "--tp 3 does not divide the 32 heads of h.0.attn.sdpa"),
        (("--tp", "16"), "--tp 16 needs 16 devices and the hardware has 8"),
        ((), "--strategy tensor needs --tp N"),
        (("--tp", "2", "--stages", "2"), "--stages is a pipeline setting"),
    ],
)
def test_a_bad_request_is_a_clear_error(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_plan(*flags)) == 2
    assert message in capsys.readouterr().err


def test_tp_without_the_tensor_strategy_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--costs", str(TENSOR_COSTS), "--tp", "2"]) == 2
    assert "add --strategy tensor" in capsys.readouterr().err


def test_a_cost_file_without_a_tensor_graph_says_so(
    example_costs_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["plan", "--costs", str(example_costs_path), "--strategy", "tensor", "--tp", "2"]) == 2
    )
    assert "has no tensor graph ($.tensor)" in capsys.readouterr().err


def test_rewrite_strategy_tensor_needs_the_example_and_writes_nothing_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.py"
    model.write_text("x = 1\n")
    out = tmp_path / "m_tp.py"
    argv = ["rewrite", str(model), "--costs", str(TENSOR_COSTS), "--strategy", "tensor"]
    assert main([*argv, "--tp", "2", "-o", str(out)]) == 2
    assert "give the model file and --example SPEC" in capsys.readouterr().err
    assert not out.exists()
    assert main(argv) == 2
    assert "--strategy tensor needs --tp N" in capsys.readouterr().err


def test_tp_style_without_the_tensor_strategy_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = REPO / "examples" / "transformer_lm.py"
    out = tmp_path / "lm.py"
    argv = ["rewrite", str(model), "--costs", str(TENSOR_COSTS), "--tp-style", "dtensor"]
    assert main([*argv, "-o", str(out)]) == 2
    assert "--tp-style writes a tensor-parallel plan: add --strategy tensor" in (
        capsys.readouterr().err
    )
    assert not out.exists()

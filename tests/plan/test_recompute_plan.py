"""``syncpass plan --recompute``: which blocks recompute, why, and the plans recomputing
nothing and every block beside it, on a small cost file built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.cli import main


def _stack(path: Path, memory: float) -> Path:
    """An embedding, six equal blocks (1 ms forward, 2 ms backward, 100 bytes of weights,
    800 bytes saved or 100 kept at a batch of 4) and a head; the cost file's batch is 4."""
    data = cost_dict(
        [0.001] * 8,
        [100.0] * 7,
        backward=[0.002] * 8,
        params=[0, *[100] * 6, 0],
        out=[100] * 8,
        alpha=0.0,
        beta=1e9,
        memory=memory,
        training=True,
    )
    data["batch_size"] = 4
    for t, op in enumerate(data["ops"]):
        op["id"] = ["embed", *(f"blocks.{i}" for i in range(6)), "head"][t]
        op["saved_bytes"] = 800.0 if 0 < t < 7 else 100.0
        op["input_bytes"] = 100.0
    for cut, op in zip(data["cuts"], data["ops"], strict=False):
        cut["after"] = op["id"]
    path.write_text(json.dumps(data))
    return path


def test_recompute_auto_recomputes_the_fewest_blocks_that_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2 stages, 4 micro-batches (200 bytes saved or 25 kept each), 1F1B: stage 0 keeps 2
    # micro-batches, stage 1 one. Storing, stage 0 holds at most 2 blocks (200 + 2 * 425 =
    # 1050) and stage 1 then 4 (400 + 825 > 1100): some block must recompute.
    costs = _stack(tmp_path / "costs.json", memory=1100.0)
    argv = ["plan", "--costs", str(costs), "--stages", "2", "--microbatches", "4"]
    assert main([*argv, "--recompute", "auto"]) == 0
    out = capsys.readouterr().out
    assert "1f1b keeps 2, 1 in flight per stage" in out
    assert "recompute chosen" in out and "recompute every block" in out
    assert "recompute nothing      no plan fits the device's memory" in out
    chosen = next(line for line in out.splitlines() if line.startswith("  recompute chosen"))
    every = next(line for line in out.splitlines() if line.startswith("  recompute every"))
    assert "2 block(s) recomputed" in chosen and "6 block(s) recomputed" in every
    assert "stage 0 recomputes 2 block(s): storing them all needs" in out


def test_recompute_none_when_memory_does_not_bind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = _stack(tmp_path / "costs.json", memory=1e9)
    argv = ["plan", "--costs", str(costs), "--stages", "2", "--recompute", "auto"]
    assert main(argv) == 0
    chosen = next(
        line for line in capsys.readouterr().out.splitlines() if "recompute chosen" in line
    )
    assert "0 block(s) recomputed" in chosen


def test_recompute_that_cannot_fit_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = _stack(tmp_path / "costs.json", memory=300.0)
    argv = ["plan", "--costs", str(costs), "--stages", "2", "--recompute", "all"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "even recomputing every block" in captured.out
    assert "no plan fits" in captured.err


def test_the_memory_model_takes_a_cut_after_a_nested_group_as_after_its_last_op() -> None:
    from syncpass.contracts.costs import parse_costs
    from syncpass.plan.recompute_plan import stage_memory_model

    data = cost_dict([1.0] * 5, [1.0] * 4, params=[1, 2, 4, 8, 16], out=[0] * 5)
    for op, name in zip(data["ops"], ["stem", "g.0.0", "g.0.1", "g.1.0", "head"], strict=True):
        op["id"] = name
    data["cuts"] = [
        dict(cut, after=name)
        for cut, name in zip(data["cuts"], ["stem", "g.0.0", "g.0.1", "g.1.0"], strict=True)
    ]
    data["groups"] = [{"id": "g.0", "ops": ["g.0.0", "g.0.1"]}]
    costs = parse_costs(data)
    by_group = stage_memory_model(costs, ("g.0",), frozenset(), "1f1b", 4, 1.0)
    by_op = stage_memory_model(costs, ("g.0.1",), frozenset(), "1f1b", 4, 1.0)
    assert by_group == by_op
    assert [stage.weights for stage in by_group] == [7.0, 24.0]

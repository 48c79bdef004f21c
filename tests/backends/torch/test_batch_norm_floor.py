"""Micro-batches a batch norm takes: the profile records the fewest samples every batch
norm in training needs (more than one value per channel), the planner's and `syncpass
run`'s default counts keep to it, and an asked count that breaks it is refused before any
stage starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO
from torch import nn

from syncpass.backends.torch.norms import WatchBatchNorms, smallest_microbatch
from syncpass.cli import main

MODEL = REPO / "tests" / "data" / "pooled_batchnorm.py"
POOLED_LINE = "        x = self.bn_pooled(self.mix(x))\n"


def _copy(tmp_path: Path) -> tuple[Path, int]:
    """The model copied into ``tmp_path``, and the line that calls ``bn_pooled``."""
    source = tmp_path / "pooled_batchnorm.py"
    shutil.copy(MODEL, source)
    line = source.read_text().splitlines(keepends=True).index(POOLED_LINE) + 1
    return source, line


def test_the_rule_counts_the_values_each_channel_is_normalised_over() -> None:
    assert smallest_microbatch(values=8, batch=8) == 2  # (8, C, 1, 1): one per sample
    assert smallest_microbatch(values=32, batch=8) == 1  # (8, C, 2, 2): four per sample
    assert smallest_microbatch(values=16, batch=16) == 2  # (16, C)
    assert smallest_microbatch(values=4, batch=8) == 3  # half a value per sample: 3 give 1.5


def test_batch_norms_in_training_are_watched_and_the_others_are_not() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wide = nn.BatchNorm2d(4)  # (N, 4, 2, 2): 4 values per sample
            self.flat = nn.BatchNorm1d(4)  # (N, 4): 1 value per sample
            self.frozen = nn.BatchNorm1d(4).eval()  # running statistics: no rule
            self.instance = nn.InstanceNorm2d(4)  # within one sample: no rule on the batch

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.instance(self.wide(x)).mean((2, 3))
            x = self.frozen(self.flat(x))
            # A direct call, (N * 2, 4): two values per sample.
            return nn.functional.batch_norm(torch.cat([x, x]), None, None, training=True)

    net = Net()
    with WatchBatchNorms(net) as watch:
        net(torch.randn(6, 4, 2, 2))
    who = [name.split(" (")[0] for name, _ in watch.seen]
    assert who == ["wide", "flat", "a batch_norm call"]
    assert [values for _, values in watch.seen] == [24, 6, 12]
    floor = watch.floor(6)
    assert floor.size == 2
    assert floor.by is not None and floor.by.startswith(f"flat ({__file__}:")
    assert not watch._hooks  # removed on leaving


def test_the_profile_records_the_least_microbatch_and_the_plan_keeps_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, line = _copy(tmp_path)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--repeats", "1"]
    assert main([*argv, "--warmup", "0", "-o", str(costs)]) == 0, capsys.readouterr().err
    data = json.loads(costs.read_text())
    assert data["batch_size"] == 8
    assert data["min_microbatch_size"] == 2
    assert data["min_microbatch_by"] == f"bn_pooled ({source}:{line})"

    plan_file = tmp_path / "plan.json"
    argv = ["plan", "--costs", str(costs), "--stages", "4", "-o", str(plan_file)]
    assert main(argv) == 0, capsys.readouterr().err
    plan = json.loads(plan_file.read_text())
    assert plan["microbatches"] == 4
    assert (
        f"8 micro-batches would give 1 sample each; bn_pooled ({source}:{line}), a batch norm "
        "in training, needs at least 2 (more than one value per channel): using 4"
    ) in plan["notes"]


@pytest.mark.slow
def test_run_takes_micro_batches_the_batch_norms_take_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = _copy(tmp_path)
    out = tmp_path / "pooled_4.py"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "4"]
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    line = out.read_text().splitlines(keepends=True).index(POOLED_LINE) + 1
    report = tmp_path / "report.json"
    argv = ["run", str(out), "--stages", "4", "--verify", "--timeout", "120"]
    status = main([*argv, "--json-report", str(report)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    document = json.loads(report.read_text())
    assert document["microbatches"] == 4
    assert document["verify"]["ok"] is True
    note = (
        f"8 micro-batches would give 1 sample each; bn_pooled ({out}:{line}), a batch norm in "
        "training, needs at least 2 (more than one value per channel): using 4"
    )
    assert document["notes"] == [note]
    assert f"note: {note}\n" in captured.out


@pytest.mark.slow
def test_run_refuses_an_asked_count_too_small_for_a_batch_norm_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, line = _copy(tmp_path)
    report = tmp_path / "report.json"
    argv = ["run", str(source), "--stages", "1", "--microbatches", "8", "--timeout", "60"]
    assert main([*argv, "--json-report", str(report)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--microbatches 8 cuts the batch of 8 into micro-batches of 1 sample; bn_pooled "
        f"({source}:{line}), a batch norm in training, needs at least 2"
    ) in err
    assert "use --microbatches 1, 2 or 4" in err
    assert "rank" not in err  # no stage process started
    assert not report.exists()

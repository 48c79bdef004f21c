"""`syncpass run` on real gloo process groups: the bundled examples, split by hand, verified.

Each example is copied into tmp_path with `pipe_split()` calls inserted between
statements of its forward, as the rewriter would place them, then run as
`syncpass run COPY --stages N --verify`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import textwrap
from math import inf
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.commands.run import register, request_from_args
from syncpass.core.errors import SyncpassError
from syncpass.runtime.contracts import (
    SCHEDULES,
    LossCheck,
    ParamCheck,
    RunRequest,
    RunResult,
    StageFigures,
    default_microbatches,
)
from syncpass.runtime.render import dumps_report, render_run

EXAMPLES = REPO / "examples"
IMPORT = "from torch import nn\n"
SPLIT_IMPORT = "from torch import nn\nfrom torch.distributed.pipelining import pipe_split\n"
TRANSFORMER_LOOP = "        for block in self.blocks:\n            x = block(x)\n"


def split_copy(
    tmp_path: Path,
    example: str,
    after: tuple[str, ...] = (),
    replace: tuple[str, str] = ("", ""),
    imports: str = "",
) -> Path:
    """A copy of ``examples/EXAMPLE.py`` with ``pipe_split()`` after each forward line in ``after``.

    ``replace`` rewrites one more piece of the source; ``imports`` are added to its imports.
    """
    source = (EXAMPLES / f"{example}.py").read_text()
    assert IMPORT in source
    source = source.replace(IMPORT, SPLIT_IMPORT + imports)
    for line in after:
        statement = f"        {line}\n"
        assert source.count(statement) == 1, line
        source = source.replace(statement, f"{statement}        pipe_split()\n")
    if replace[0]:
        assert source.count(replace[0]) == 1
        source = source.replace(*replace)
    path = tmp_path / f"{example}_split.py"
    path.write_text(source)
    return path


def resnet_split(tmp_path: Path, before_return: str = "") -> Path:
    """ResNet cut after layer2; ``before_return`` runs in ``example()`` before it returns."""
    replace = ("", "")
    if before_return:
        body = textwrap.indent(textwrap.dedent(before_return), "    ")
        replace = ("    return model, (images,)\n", body + "    return model, (images,)\n")
    imports = "import os\nimport time\n"
    return split_copy(tmp_path, "resnet", ("x = self.layer2(x)",), replace, imports)


def transformer_split(tmp_path: Path, cuts: tuple[int, ...]) -> Path:
    """The transformer with its block loop cut into slices, a pipe_split() between them."""
    bounds = [0, *cuts, None]
    loops = []
    for start, end in itertools.pairwise(bounds):
        part = f"{start}:{'' if end is None else end}"
        loops.append(f"        for block in self.blocks[{part}]:\n            x = block(x)\n")
    return split_copy(
        tmp_path, "transformer_lm", replace=(TRANSFORMER_LOOP, "        pipe_split()\n".join(loops))
    )


def run(
    capsys: pytest.CaptureFixture[str], path: Path, options: str, report: Path | None = None
) -> tuple[int, str, str]:
    """``syncpass run PATH OPTIONS [--json-report REPORT]``: (status, stdout, stderr)."""
    argv = ["run", str(path), *options.split()]
    if report is not None:
        argv += ["--json-report", str(report)]
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def verified_report(report: Path, stages: int) -> dict[str, Any]:
    document = json.loads(report.read_text())
    assert document["stages"] == stages
    verify = document["verify"]
    assert verify["ok"] is True
    assert verify["mismatches"] == 0
    # Every parameter of the model was compared, each in exactly one stage.
    assert verify["parameters_compared"] == verify["model_parameters"]
    names = [entry["name"] for entry in verify["parameters"]]
    assert len(names) == len(set(names)) == verify["model_parameters"]
    assert all(entry["stage"] >= 0 for entry in verify["parameters"])
    assert len(verify["losses"]) == document["microbatches"]
    assert sum(stage["parameters"] for stage in document["stage_reports"]) > 0
    for stage in document["stage_reports"]:
        assert stage["step_s"] > 0
        assert 0 <= stage["comm_wait_s"] <= stage["step_s"]
        assert len(stage["step_times_s"]) == document["steps"]
    return document


def test_register_adds_run_with_a_handler(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="syncpass")
    register(parser.add_subparsers(dest="command", required=True))
    model = tmp_path / "model.py"
    model.write_text("def example():\n    pass\n")
    args = parser.parse_args(["run", str(model), "--stages", "2"])
    assert callable(args.handler)
    assert (args.schedule, args.steps, args.threads, args.example) == (None, 3, 1, "example")
    # No --schedule means 1F1B for torch (JAX runs GPipe only).
    assert request_from_args(args).schedule == "1f1b"


def test_the_schedule_and_stages_per_rank_come_as_rewrite_reads_them(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="syncpass")
    register(parser.add_subparsers(dest="command", required=True))
    model = tmp_path / "model.py"
    model.write_text("def example():\n    pass\n")

    def request(*flags: str, schedules: tuple[str, ...] = SCHEDULES):  # type: ignore[no-untyped-def]
        args = parser.parse_args(["run", str(model), "--stages", "2", *flags])
        return request_from_args(args, schedules[0], schedules)

    # zbv and dualpipev hold two stages a rank unless told otherwise.
    assert request("--schedule", "zbv").stages_per_device == 2
    # The project's configuration, as plan and rewrite read it.
    config = '[tool.syncpass]\nschedule = "interleaved-1f1b"\nstages_per_device = 4\n'
    (tmp_path / "pyproject.toml").write_text(config)
    found = request()
    assert (found.schedule, found.stages_per_device) == ("interleaved-1f1b", 4)
    # Its count goes with its schedule: another schedule on the command line takes its own.
    assert request("--schedule", "1f1b").stages_per_device == 1
    with pytest.raises(SyncpassError, match=r"stages_per_device \(.*pyproject.toml:3\)"):
        (tmp_path / "pyproject.toml").write_text(config.replace('"interleaved-1f1b"', '"zbv"'))
        request()
    # A backend that runs no multi-stage schedule refuses in its own words, not these.
    (tmp_path / "pyproject.toml").unlink()
    assert request("--stages-per-device", "2", schedules=("gpipe",)).stages_per_device == 2


def test_default_microbatches_divide_the_batch() -> None:
    assert default_microbatches(8, 2) == 8
    assert default_microbatches(8, 4) == 8
    assert default_microbatches(12, 2) == 6
    assert default_microbatches(7, 1) == 1


def test_missing_file_is_an_error_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, tmp_path / "absent.py", "--stages 2")
    assert status == 2
    assert "absent.py: no such file" in err


def test_report_folder_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "absent" / "r.json"
    status, _, err = run(capsys, resnet_split(tmp_path), "--stages 2", out)
    assert status == 2
    assert f"{out}: the folder for --json-report does not exist" in err


def test_1f1b_needs_a_microbatch_per_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, resnet_split(tmp_path), "--stages 4 --microbatches 2")
    assert status == 2
    assert "1f1b needs --microbatches >= --stages" in err


def test_report_and_json_from_figures() -> None:
    request = RunRequest(file="m.py", example="m.py:example", stages=2, verify=True, steps=3)
    checks = (
        ParamCheck("a.weight", 0, 6, 0.0, 0.0, True, 1e-5, 1e-6),
        ParamCheck("b.weight", 1, 4, 2e-3, 0.5, False, 1e-5, 1e-6),
        ParamCheck("c.bias", 1, 2, inf, inf, False, 1e-5, 1e-6, "no gradient in the pipeline"),
    )
    stages = (
        StageFigures(0, 0, 6, 1, (0.3, 0.1, 0.2), (0.1, 0.05, 0.15), checks[:1]),
        StageFigures(
            1, 1, 6, 2, (0.2,) * 3, (0.1,) * 3, checks[1:], (LossCheck(0, 1.0, 1.0, True),)
        ),
    )
    result = RunResult(request, 8, 4, "gloo", "cpu", stages, model_parameters=3)
    # The median step is the middle one by time, and its figures add up.
    assert (stages[0].step_s, stages[0].compute_s) == (0.2, 0.15)
    assert stages[0].comm_wait_s == pytest.approx(0.05)
    assert not result.verified
    text = render_run(result)
    assert "gloo on cpu, 1 thread(s) per process" in text
    assert "device" not in text.splitlines()[2]  # a process per stage: its rank says which
    assert "verify: MISMATCH: 3 of 3 parameter(s) compared with the unsplit model (1 match)" in text
    assert "mismatch: b.weight (stage 1): max abs diff 0.002, max rel diff 0.5" in text
    assert "mismatch: c.bias (stage 1): no gradient in the pipeline" in text
    document = json.loads(dumps_report(result))
    assert document["stage_reports"][0]["step_s"] == 0.2
    assert document["verify"]["mismatches"] == 2
    assert document["verify"]["parameters"][2]["max_abs_diff"] is None  # JSON has no inf


@pytest.mark.slow
def test_transformer_two_stages_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys,
        transformer_split(tmp_path, (3,)),
        "--stages 2 --microbatches 4 --schedule gpipe --verify",
        report,
    )
    assert status == 0, err
    assert "verify: ok: 77 of 77 parameter(s)" in out
    document = verified_report(report, 2)
    names = {entry["name"]: entry["stage"] for entry in document["verify"]["parameters"]}
    assert names["wte.weight"] == 0 and names["blocks.2.mlp.proj.bias"] == 0
    assert names["blocks.3.ln_1.weight"] == 1 and names["lm_head.weight"] == 1


@pytest.mark.slow
def test_transformer_four_stages_1f1b_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys,
        transformer_split(tmp_path, (2, 4, 6)),
        "--stages 4 --microbatches 4 --steps 2 --verify",
        report,
    )
    assert status == 0, err
    document = verified_report(report, 4)
    assert [stage["stage"] for stage in document["stage_reports"]] == [0, 1, 2, 3]
    for stage in range(4):
        assert f"\n{stage}  " in out


@pytest.mark.slow
def test_resnet_two_stages_verified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    timeline = tmp_path / "timeline"
    options = f"--stages 2 --microbatches 2 --verify --timeline {timeline}"
    status, _, err = run(capsys, resnet_split(tmp_path), options, report)
    assert status == 0, err
    verified_report(report, 2)
    # The timed steps, profiled rank by rank: 3 steps of 2 forwards and 2 backwards each.
    profile = json.loads(timeline.with_suffix(".json").read_text())
    assert [rank["rank"] for rank in profile["ranks"]] == [0, 1]
    for rank in profile["ranks"]:
        assert rank["forward_calls"] == rank["backward_calls"] == 2 * 3
        assert 0 <= rank["comm_wait_ratio"] <= 1
        # Posting the transfers is a span of its own, counted as sync time, not compute.
        spans = {kind: sum(end - start for name, start, end in rank["spans"] if name == kind)
                 for kind in ("forward", "backward", "wait", "post")}  # fmt: skip
        assert spans["post"] > 0
        assert rank["sync_time_s"] == pytest.approx(spans["wait"] + spans["post"])
        assert rank["compute_s"] == pytest.approx(spans["forward"] + spans["backward"])
    assert timeline.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
    assert f"wrote {timeline}.json" in err


@pytest.mark.slow
def test_unet_skip_connections_cross_the_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # After the bottleneck, three encoder outputs must travel to stage 1 besides x.
    path = split_copy(tmp_path, "unet", after=("x = self.bottleneck(x)",))
    report = tmp_path / "report.json"
    status, _, err = run(
        capsys, path, "--stages 2 --microbatches 2 --schedule gpipe --verify", report
    )
    assert status == 0, err
    verified_report(report, 2)


@pytest.mark.slow
def test_verify_detects_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 1 builds its classifier 1% larger. Its own stage agrees with its own
    # reference, but the gradients it sends back to stage 0 are not the unsplit
    # model's: verify must catch that on stage 0.
    path = resnet_split(
        tmp_path,
        """\
        if os.environ["RANK"] == "1":
            with torch.no_grad():
                model.fc.weight.mul_(1.01)
        """,
    )
    report = tmp_path / "report.json"
    status, out, err = run(capsys, path, "--stages 2 --microbatches 2 --verify", report)
    assert status == 1, err
    assert "verify: MISMATCH" in out
    assert "mismatch: stem.0.weight (stage 0)" in out
    verify = json.loads(report.read_text())["verify"]
    assert verify["ok"] is False
    bad = [entry for entry in verify["parameters"] if not entry["ok"]]
    assert bad and all(entry["stage"] == 0 for entry in bad)
    assert verify["mismatches"] == len(bad)


@pytest.mark.slow
def test_wrong_stage_count_names_file_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = resnet_split(tmp_path)
    status, _, err = run(capsys, path, "--stages 3 --timeout 60")
    assert status == 2
    assert f"{path}: " in err
    assert "1 pipe_split() sync point(s), which make 2 stage(s); --stages asks for 3" in err


@pytest.mark.slow
def test_untraceable_model_reports_the_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = split_copy(
        tmp_path,
        "resnet",
        after=("x = self.layer2(x)",),
        replace=(
            "        x = self.layer3(x)\n",
            "        if x.sum() > 0:\n            x = self.layer3(x)\n",
        ),
    )
    status, _, err = run(capsys, path, "--stages 2 --timeout 60")
    assert status == 2
    line = path.read_text().splitlines().index("        if x.sum() > 0:") + 1
    assert f"{path}:{line}: rank 0: torch.distributed.pipelining could not trace the model" in err


@pytest.mark.slow
def test_a_failing_rank_is_reported_and_nothing_hangs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = resnet_split(
        tmp_path,
        """\
        if os.environ["RANK"] == "1":
            raise RuntimeError("no data on this host")
        """,
    )
    status, _, err = run(capsys, path, "--stages 2 --timeout 60")
    assert status == 2
    line = (
        path.read_text().splitlines().index('        raise RuntimeError("no data on this host")')
        + 1
    )
    assert f"{path}:{line}: rank 1: example() raised: RuntimeError: no data on this host" in err


@pytest.mark.slow
def test_the_whole_run_has_a_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = resnet_split(
        tmp_path,
        """\
        if os.environ["RANK"] == "1":
            time.sleep(60)
        """,
    )
    status, _, err = run(capsys, path, "--stages 2 --timeout 4")
    assert status == 2
    assert "timed out after 4 s (--timeout) with rank(s) " in err


TIED = """\
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import pipe_split


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(32, 16)
        self.body = nn.Linear(16, 16)
        self.head = nn.Linear(16, 32, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx)
        pipe_split()
        x = self.body(x)
        x = torch.tanh(x)
        pipe_split()
        logits = self.head(x)
        pipe_split()
        return logits / 2


def loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))


def example():
    tokens = torch.randint(0, 32, (4, 9))
    return TiedLM(), (tokens[:, :-1],), tokens[:, 1:], loss
"""


@pytest.mark.slow
def test_weights_tied_across_stages_are_compared_as_their_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tracer gives stages 0 and 2 each a copy of the tied weight; each copy
    # gets only its own stage's share of the gradient. Stage 3 holds no parameter (and
    # no optimizer): it joins the copies' all-reduce all the same, or its peers wait.
    path = tmp_path / "tied.py"
    path.write_text(TIED)
    report = tmp_path / "report.json"
    options = "--stages 4 --microbatches 4 --steps 1 --verify --timeout 120"
    status, out, err = run(capsys, path, options, report)
    assert status == 0, err
    assert "verify: ok: 3 of 3 parameter(s)" in out
    verify = json.loads(report.read_text())["verify"]
    copies = [entry for entry in verify["parameters"] if entry["name"] == "wte.weight"]
    assert [entry["stage"] for entry in copies] == [0, 2]
    assert all(entry["ok"] and "sum" in entry["note"] for entry in copies)


@pytest.mark.slow
def test_a_failure_mid_step_is_reported_not_its_echo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The loss fails on the last stage while stage 0 waits for its gradients;
    # stage 0 then fails too, with a lost connection, which must not be the report.
    path = transformer_split(tmp_path, (3,))
    good = "    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))\n"
    bad = "    return F.cross_entropy(logits, targets)\n"  # (batch, seq, vocab) logits: wrong shape
    source = path.read_text()
    assert source.count(good) == 1
    path.write_text(source.replace(good, bad))
    status, _, err = run(capsys, path, "--stages 2 --microbatches 2 --timeout 60")
    assert status == 2
    line = path.read_text().splitlines().index(bad.rstrip()) + 1
    assert f"{path}:{line}: rank 1: RuntimeError: Expected target size" in err
    assert "Connection closed" not in err


def test_one_process_of_several_stages_names_their_devices() -> None:
    """A run whose one process holds every stage (JAX) shows each stage's device, no thread count."""
    request = RunRequest(file="m.py", example="m.py:example", stages=2, schedule="gpipe")
    stages = tuple(
        StageFigures(index, 0, 6, 1, (0.2,) * 3, (0.1,) * 3, device=f"cpu:{index}")
        for index in range(2)
    )
    result = RunResult(request, 8, 4, "jax", "cpu", stages, 2, own_threads=False)
    text = render_run(result)
    assert "jax on cpu, CPU threads as the backend's runtime sizes them" in text
    assert text.splitlines()[2].split() == ["stage", "rank", "device", "params", "step",
                                            "compute", "comm", "wait", "wait/step"]  # fmt: skip
    assert text.splitlines()[4].split()[:3] == ["1", "0", "cpu:1"]
    document = json.loads(dumps_report(result))
    assert document["threads"] is None
    assert [stage["device"] for stage in document["stage_reports"]] == ["cpu:0", "cpu:1"]

"""`syncpass run` on real gloo process groups: the bundled examples, split by hand, verified.

Each example is copied into tmp_path with `pipe_split()` calls inserted between
statements of its forward, as the rewriter would place them, then run as
`syncpass run COPY --stages N --verify`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.runtime.command import build_parser, main, register
from syncpass.runtime.worker import default_microbatches

EXAMPLES = REPO / "examples"
IMPORT = "from torch import nn\n"
SPLIT_IMPORT = "from torch import nn\nfrom torch.distributed.pipelining import pipe_split\n"
TRANSFORMER_LOOP = "        for block in self.blocks:\n            x = block(x)\n"


def split_copy(
    tmp_path: Path, example: str, after: tuple[str, ...] = (), replace: tuple[str, str] = ("", "")
) -> Path:
    """A copy of ``examples/EXAMPLE.py`` with ``pipe_split()`` after each forward line in ``after``."""
    source = (EXAMPLES / f"{example}.py").read_text()
    assert IMPORT in source
    source = source.replace(IMPORT, SPLIT_IMPORT)
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


def transformer_split(tmp_path: Path, cuts: tuple[int, ...]) -> Path:
    """The transformer with its block loop cut into slices, a pipe_split() between them."""
    bounds = [0, *cuts, None]
    loops = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        part = f"{start}:{'' if end is None else end}"
        loops.append(f"        for block in self.blocks[{part}]:\n            x = block(x)\n")
    return split_copy(
        tmp_path, "transformer_lm", replace=(TRANSFORMER_LOOP, "        pipe_split()\n".join(loops))
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["run", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def verified_report(report: Path, stages: int) -> dict[str, object]:
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


def test_register_adds_run_with_a_handler() -> None:
    parser = argparse.ArgumentParser(prog="syncpass")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", "model.py", "--stages", "2"])
    assert callable(args.handler)
    assert (args.schedule, args.steps, args.threads, args.example) == ("1f1b", 3, 1, "example")


def test_default_microbatches_divide_the_batch() -> None:
    assert default_microbatches(8, 2) == 8
    assert default_microbatches(8, 4) == 8
    assert default_microbatches(12, 2) == 6
    assert default_microbatches(7, 1) == 1


def test_missing_file_is_an_error_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, str(tmp_path / "absent.py"), "--stages", "2")
    assert status == 2
    assert "absent.py: no such file" in err


def test_1f1b_needs_a_microbatch_per_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = split_copy(tmp_path, "resnet", after=("x = self.layer2(x)",))
    status, _, err = run(capsys, str(path), "--stages", "4", "--microbatches", "2")
    assert status == 2
    assert "1f1b needs --microbatches >= --stages" in err


def test_help_mentions_every_option() -> None:
    text = build_parser().parse_args
    assert text is not None


@pytest.mark.slow
def test_transformer_two_stages_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = transformer_split(tmp_path, (3,))
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys, str(path), "--stages", "2", "--microbatches", "4", "--schedule", "gpipe",
        "--verify", "--json-report", str(report),
    )  # fmt: skip
    assert status == 0, err
    assert "verify: ok: 77 of 77 parameter(s)" in out
    document = verified_report(report, 2)
    names = {entry["name"]: entry["stage"] for entry in document["verify"]["parameters"]}  # type: ignore[index]
    assert names["wte.weight"] == 0 and names["blocks.2.mlp.proj.bias"] == 0
    assert names["blocks.3.ln_1.weight"] == 1 and names["lm_head.weight"] == 1


@pytest.mark.slow
def test_transformer_four_stages_1f1b_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = transformer_split(tmp_path, (2, 4, 6))
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys, str(path), "--stages", "4", "--microbatches", "4", "--steps", "2",
        "--verify", "--json-report", str(report),
    )  # fmt: skip
    assert status == 0, err
    document = verified_report(report, 4)
    assert [stage["stage"] for stage in document["stage_reports"]] == [0, 1, 2, 3]  # type: ignore[index]
    for stage in range(4):
        assert f"\n{stage}  " in out


@pytest.mark.slow
def test_resnet_two_stages_verified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = split_copy(tmp_path, "resnet", after=("x = self.layer2(x)",))
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys, str(path), "--stages", "2", "--microbatches", "2", "--verify",
        "--json-report", str(report),
    )  # fmt: skip
    assert status == 0, err
    verified_report(report, 2)


@pytest.mark.slow
def test_unet_skip_connections_cross_the_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # After the bottleneck, three encoder outputs must travel to stage 1 besides x.
    path = split_copy(tmp_path, "unet", after=("x = self.bottleneck(x)",))
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys, str(path), "--stages", "2", "--microbatches", "2", "--schedule", "gpipe",
        "--verify", "--json-report", str(report),
    )  # fmt: skip
    assert status == 0, err
    verified_report(report, 2)


@pytest.mark.slow
def test_verify_detects_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 1 builds its classifier slightly differently. Its own stage is
    # consistent with its own reference, but the gradients it sends back to
    # stage 0 are not the unsplit model's: verify must catch it there.
    path = split_copy(
        tmp_path,
        "resnet",
        after=("x = self.layer2(x)",),
        replace=(
            "    return model, (images,)\n",
            "    if os.environ.get('RANK') == '1':\n"
            "        with torch.no_grad():\n"
            "            model.fc.weight.mul_(1.01)\n"
            "    return model, (images,)\n",
        ),
    )
    path.write_text(
        "import os\n" + path.read_text().replace("from __future__ import annotations\n", "")
    )
    report = tmp_path / "report.json"
    status, out, err = run(
        capsys, str(path), "--stages", "2", "--microbatches", "2", "--verify",
        "--json-report", str(report),
    )  # fmt: skip
    assert status == 1, err
    assert "verify: MISMATCH" in out
    assert "mismatch: stem.0.weight (stage 0)" in out
    document = json.loads(report.read_text())
    verify = document["verify"]
    assert verify["ok"] is False
    bad = {entry["name"] for entry in verify["parameters"] if not entry["ok"]}
    assert bad and all(document["verify"]["parameters"][0]["stage"] == 0 for _ in bad)
    assert all(entry["stage"] == 0 for entry in verify["parameters"] if not entry["ok"])


@pytest.mark.slow
def test_wrong_stage_count_names_file_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = split_copy(tmp_path, "resnet", after=("x = self.layer2(x)",))
    status, _, err = run(capsys, str(path), "--stages", "3", "--timeout", "60")
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
    status, _, err = run(capsys, str(path), "--stages", "2", "--timeout", "60")
    assert status == 2
    assert "could not trace the model" in err
    assert str(path) in err


@pytest.mark.slow
def test_a_failing_rank_is_reported_and_nothing_hangs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = split_copy(
        tmp_path,
        "resnet",
        after=("x = self.layer2(x)",),
        replace=(
            "    return model, (images,)\n",
            "    if os.environ.get('RANK') == '1':\n"
            "        raise RuntimeError('no data on this host')\n"
            "    return model, (images,)\n",
        ),
    )
    path.write_text(
        "import os\n" + path.read_text().replace("from __future__ import annotations\n", "")
    )
    status, _, err = run(capsys, str(path), "--stages", "2", "--timeout", "60")
    assert status == 2
    assert "rank 1: example() raised: RuntimeError: no data on this host" in err
    assert f"{path}:" in err


@pytest.mark.slow
def test_the_whole_run_has_a_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = split_copy(
        tmp_path,
        "resnet",
        after=("x = self.layer2(x)",),
        replace=(
            "    return model, (images,)\n",
            "    if os.environ.get('RANK') == '1':\n"
            "        time.sleep(60)\n"
            "    return model, (images,)\n",
        ),
    )
    path.write_text(
        "import os\nimport time\n"
        + path.read_text().replace("from __future__ import annotations\n", "")
    )
    status, _, err = run(capsys, str(path), "--stages", "2", "--timeout", "4")
    assert status == 2
    assert "timed out after 4 s" in err
    assert "rank(s) 0, 1 still running" in err or "rank(s) 1" in err

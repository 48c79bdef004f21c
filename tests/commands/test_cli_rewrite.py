"""`syncpass rewrite` as a user runs it: outputs, --check/--diff, exit codes, safety."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from golden_cases import GOLDEN, read_case

from syncpass.cli import main

CASE = read_case(GOLDEN / "container_loop.py")


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, Path]:
    source = tmp_path / "model.py"
    source.write_text(CASE.source)
    costs = tmp_path / "model.costs.json"
    shutil.copy(CASE.costs_path, costs)
    return source, costs


def rewrite(*args: str) -> int:
    # The golden files are the tracer form's: pipe_split() lines in forward.
    backend = [] if "--backend" in args else ["--backend", "torch"]
    return main(["rewrite", *args, *backend])


def test_writes_the_output_file_and_leaves_the_input(
    model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    out = tmp_path / "model_sync.py"
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3", "-o", str(out)) == 0
    assert out.read_text() == CASE.expected
    assert source.read_text() == CASE.source
    assert "wrote" in capsys.readouterr().err


def test_code_to_stdout_and_messages_to_stderr(
    model: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, costs = model
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(CASE.source.encode())))
    assert rewrite("-", "--costs", str(costs), "--stages", "3") == 0
    captured = capsys.readouterr()
    assert captured.out == CASE.expected
    assert "2 sync point(s)" in captured.err


def test_check_and_diff(
    model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3", "--check") == 1
    assert "would rewrite" in capsys.readouterr().err
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3", "--diff") == 0
    diff = capsys.readouterr().out
    assert diff.startswith(f"--- {source}\n+++ {source}\n")
    assert "+        pipe_split()  # syncpass sync 1/2" in diff
    out = tmp_path / "synced.py"
    out.write_text(CASE.expected or "")
    assert rewrite(str(out), "--costs", str(costs), "--stages", "3", "--check") == 0
    assert "is up to date" in capsys.readouterr().err
    # A stale generated file: planned for other stage counts.
    assert rewrite(str(out), "--costs", str(costs), "--stages", "2", "--check") == 1


def test_in_place_and_report(model: tuple[Path, Path], tmp_path: Path) -> None:
    source, costs = model
    report = tmp_path / "report.json"
    args = ["--costs", str(costs), "--stages", "3", "--report", str(report)]
    assert rewrite(str(source), "--in-place", *args) == 0
    assert source.read_text() == CASE.expected
    document = json.loads(report.read_text())
    assert len(document["plan"]["sync_points"]) == 2
    assert document["analysis"]["model_class"] == "Tower"
    assert [op["id"] for op in document["analysis"]["ops"]][:3] == ["embed", "blocks.0", "blocks.1"]
    assert rewrite(str(source), "--in-place", *args) == 0  # running it again changes nothing
    assert source.read_text() == CASE.expected


def test_a_file_its_formatter_laid_out_anew_is_up_to_date_and_left_as_it_is(
    model: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # A project whose formatter keeps 60 columns: it breaks up lines of the stage classes
    # syncpass wrote for 88. The file is still current (--check, the pre-commit hook), and
    # rewriting it in place leaves the formatter's layout, byte for byte.
    source, costs = model
    args = ["--costs", str(costs), "--stages", "3", "--backend", "torch_stages"]
    assert rewrite(str(source), "--in-place", *args) == 0
    written = source.read_text()
    formatter = [sys.executable, "-m", "ruff", "format", "--no-cache", "--line-length", "60"]
    subprocess.run([*formatter, str(source)], check=True, capture_output=True)
    formatted = source.read_text()
    assert formatted != written
    capsys.readouterr()
    assert rewrite(str(source), "--check", *args) == 0
    assert "is up to date" in capsys.readouterr().err
    assert rewrite(str(source), "--diff", *args) == 0
    assert capsys.readouterr().out == ""  # no diff of layout alone
    assert rewrite(str(source), "--in-place", *args) == 0
    assert source.read_text() == formatted
    # Another plan is other code: stale, and written.
    other = [*args[:3], "2", *args[4:]]
    assert rewrite(str(source), "--check", *other) == 1
    assert rewrite(str(source), "--in-place", *other) == 0
    assert source.read_text().count("# syncpass sync ") == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "the file is empty"),
        (b"\x00\x01binary", "binary file"),
        (b"class Tower(:\n    pass\n", "model.py:1: syntax error"),
        (b"x = 1\n", "no model class"),
        (
            b"class Tower:\n    def forward(self, x):\n        y = self.other(x)\n        return y\n",
            "the cost file does not match the source",
        ),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    model: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    message: str,
) -> None:
    source, costs = model
    source.write_bytes(content)
    out = tmp_path / "out.py"
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3", "-o", str(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith("syncpass: error: ") and message in err
    assert not out.exists()
    assert source.read_bytes() == content


def test_impossible_plan_exits_2(
    model: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    assert rewrite(str(source), "--costs", str(costs), "--stages", "40") == 2
    assert "40 stages need at least 40 ops" in capsys.readouterr().err


def test_rewrite_with_costs_imports_neither_torch_nor_user_code(model: tuple[Path, Path]) -> None:
    source, costs = model
    source.write_text(CASE.source + "\nraise SystemExit('user code ran')\n")
    probe = (
        "import sys\n"
        "from syncpass.cli import main\n"
        f"status = main(['rewrite', {str(source)!r}, '--costs', {str(costs)!r}, '--stages', '3', '--check'])\n"
        "sys.exit(10 + status if 'torch' in sys.modules else status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1, result.stderr  # 1: would change; not 11 (torch) nor user code


def test_the_source_steers_over_an_older_cost_file(
    model: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    pinned = CASE.source.replace("h = self.embed(x)", "h = self.embed(x)  # syncpass: sync")
    source.write_text(pinned)
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3") == 0
    out = capsys.readouterr().out
    assert "h = self.embed(x)  # syncpass: sync\n        pipe_split()  # syncpass sync 1/2" in out
    forbidden = CASE.source.replace(
        "for block in self.blocks:", "for block in self.blocks:  # syncpass: no-sync"
    )
    source.write_text(forbidden)
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3") == 0
    out = capsys.readouterr().out
    assert "self.blocks[" not in out  # no sync point between two iterations


def test_unwritable_targets_exit_2(
    model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    assert (
        rewrite(
            str(source), "--costs", str(costs), "--stages", "3", "-o", str(tmp_path / "no" / "x.py")
        )
        == 2
    )
    assert "no such folder" in capsys.readouterr().err
    assert rewrite(str(source), "--costs", str(costs), "--stages", "3", "--diff", "-o", "x.py") == 2
    assert "--diff prints the change instead of writing it" in capsys.readouterr().err


def test_outputs_never_replace_what_the_command_reads(
    model: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, costs = model
    link = tmp_path / "link.py"
    link.symlink_to(source)
    read_only = tmp_path / "locked.py"
    read_only.write_text("# mine\n")
    read_only.chmod(0o444)
    before = {path: path.read_bytes() for path in (source, costs, read_only)}
    planning = ["--costs", str(costs), "--stages", "3"]
    cases = [
        (["rewrite", str(source), *planning, "-o", str(source)], "-o names the input file"),
        (["rewrite", str(source), *planning, "-o", str(link)], "-o names the input file"),
        (["rewrite", str(source), *planning, "-o", str(costs)], "-o names the cost file"),
        (["rewrite", str(source), *planning, "--report", str(source)], "--report names the"),
        (["rewrite", str(source), *planning, "-o", str(read_only)], "is read-only"),
        (["plan", *planning, "-o", str(costs)], "-o names the cost file"),
        (["profile", str(source), "--example", f"{source}:x", "-o", str(link)], "-o names the"),
    ]
    for argv, message in cases:
        backend = ["--backend", "torch"] if argv[0] == "rewrite" else []
        assert main([*argv, *backend]) == 2, argv
        err = capsys.readouterr().err
        assert "syncpass: error: " in err and message in err, (argv, err)
        assert {path: path.read_bytes() for path in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model.py", "model.costs.json", "link.py", "locked.py"]
    )


def test_a_cost_file_survives_edits_above_the_forward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = read_case(GOLDEN / "regions_and_pins.py")
    assert "@L" in case.costs_path.read_text()  # ids that carry source lines
    edited = case.source.replace("import torch as t\n", "import torch as t\n\n# a new comment\n")
    source = tmp_path / "model.py"
    source.write_text(edited)
    assert rewrite(str(source), "--costs", str(case.costs_path), "--stages", "3") == 0
    out = capsys.readouterr().out
    assert out == (case.expected or "").replace(
        "import torch as t\n", "import torch as t\n\n# a new comment\n"
    )
    # An edit of the forward itself still asks for a new profile.
    source.write_text(edited.replace("z = F.gelu(self.b(y))", "z = F.gelu(self.q(y))"))
    assert rewrite(str(source), "--costs", str(case.costs_path), "--stages", "3") == 2
    assert "profile the model again" in capsys.readouterr().err

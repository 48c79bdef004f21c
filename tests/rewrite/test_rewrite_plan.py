"""`syncpass rewrite --plan`: a saved plan applied as it is, and refused when it is not this file's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from golden_cases import GOLDEN, read_case

from syncpass.cli import main

CASE = read_case(GOLDEN / "container_loop.py")


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The golden model, its cost file, and a plan made from them by `syncpass plan -o`."""
    source = tmp_path / "model.py"
    source.write_text(CASE.source)
    # The golden file is the tracer form's (pipe_split() in forward).
    (tmp_path / "pyproject.toml").write_text('[tool.syncpass]\nbackend = "torch"\n')
    costs = tmp_path / "model.costs.json"
    shutil.copy(CASE.costs_path, costs)
    plan = tmp_path / "model.plan.json"
    assert main(["plan", "--costs", str(costs), "--stages", "3", "-o", str(plan)]) == 0
    return source, costs, plan


def test_a_saved_plan_writes_what_planning_writes(
    project: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    source, costs, plan = project
    planned, applied = tmp_path / "planned.py", tmp_path / "applied.py"
    assert (
        main(["rewrite", str(source), "--costs", str(costs), "--stages", "3", "-o", str(planned)])
        == 0
    )
    assert main(["rewrite", str(source), "--plan", str(plan), "-o", str(applied)]) == 0
    assert applied.read_text() == planned.read_text() == CASE.expected
    # Applying it to its own output changes nothing.
    again = tmp_path / "again.py"
    assert main(["rewrite", str(applied), "--plan", str(plan), "-o", str(again)]) == 0
    assert again.read_text() == applied.read_text()


def test_a_plan_of_other_ops_is_refused_naming_the_op(
    project: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, _, plan = project
    document = json.loads(plan.read_text())
    first = document["stages"][0]["ops"][0]
    document["stages"][0]["ops"][0] = "not_an_op"
    other = tmp_path / "other.plan.json"
    other.write_text(json.dumps(document))
    out = tmp_path / "out.py"
    assert main(["rewrite", str(source), "--plan", str(other), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"op 0 is {first!r} here but 'not_an_op' in the plan" in err
    assert f"{source}:" in err  # at the op's line
    assert not out.exists()


def test_a_sync_point_where_the_source_allows_none_is_refused(
    project: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, _, plan = project
    text = source.read_text()
    # The source now forbids every sync point: a no-sync mark on each line of the forward.
    marked = "\n".join(
        line + "  # syncpass: no-sync"
        if line.strip().startswith(("x =", "for ", "return"))
        else line
        for line in text.splitlines()
    )
    source.write_text(marked + "\n")
    assert main(["rewrite", str(source), "--plan", str(plan)]) == 2
    assert "where the source allows none" in capsys.readouterr().err


def test_planning_flags_cannot_change_a_saved_plan(
    project: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    source, _, plan = project
    assert main(["rewrite", str(source), "--plan", str(plan), "--stages", "2"]) == 2
    assert "drop --stages" in capsys.readouterr().err

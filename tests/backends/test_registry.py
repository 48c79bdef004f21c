"""Backends and strategies from installed packages, found through real entry points.

Each test installs a small package the way pip leaves one on disk (the module
beside a ``.dist-info`` folder with ``entry_points.txt``) on a folder put on
``PYTHONPATH``, and runs the syncpass command line in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO
from golden_cases import GOLDEN, read_case

CASE = read_case(GOLDEN / "container_loop.py")

PLUGIN = '''
import dataclasses
import os
from pathlib import Path

import libcst as cst

from syncpass.backends.registry import load_backend

TORCH = load_backend("torch")


def last_cuts(problem, stages, costs):
    """The last admissible cuts: a deliberately naive rule."""
    admissible = [p for p in range(1, problem.num_ops) if problem.admissible[p]]
    return admissible[len(admissible) - (stages - 1):]


def wrong_count(problem, stages, costs):
    return [1]


def explodes(problem, stages, costs):
    raise RuntimeError("no idea")


def traced_insert(source, sites, path):
    Path(os.environ["DEMO_TRACE"]).write_text(path)
    return TORCH.insert(source, sites, path)


BACKEND = dataclasses.replace(
    TORCH, name="demo", description="the torch pass, leaving a trace that it ran",
    insert=traced_insert,
)


def garbage_insert(source, sites, path):
    module, warnings = TORCH.insert(source, sites, path)
    broken = cst.SimpleStatementLine([cst.Expr(cst.Name("def"))])
    return module.with_changes(body=[*module.body, broken]), warnings


GARBAGE = dataclasses.replace(TORCH, name="garbage", insert=garbage_insert)


def failing_analyse(text, path, known, name):
    raise RuntimeError("cannot read this")


FAILING = dataclasses.replace(TORCH, name="failing", analyse=failing_analyse)
NOT_A_SPEC = object()
'''

ENTRY_POINTS = """
[syncpass.strategies]
last_cuts = syncpass_demo_plugin:last_cuts
wrong_count = syncpass_demo_plugin:wrong_count
explodes = syncpass_demo_plugin:explodes
broken = syncpass_demo_plugin_missing:nothing
adaptive = syncpass_demo_plugin:last_cuts

[syncpass.backends]
demo = syncpass_demo_plugin:BACKEND
garbage = syncpass_demo_plugin:GARBAGE
failing = syncpass_demo_plugin:FAILING
not_a_spec = syncpass_demo_plugin:NOT_A_SPEC
"""


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    info = folder / "syncpass_demo_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (folder / "syncpass_demo_plugin.py").write_text(textwrap.dedent(PLUGIN))
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: syncpass-demo-plugin\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return folder


def syncpass(site: Path, *args: str, trace: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO / "tests")]))
    if trace is not None:
        env["DEMO_TRACE"] = str(trace)
    return subprocess.run(
        [sys.executable, "-m", "syncpass", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=site.parent,
        check=False,
    )


def test_an_installed_strategy_plans_and_is_reported_like_the_rules(site: Path) -> None:
    done = syncpass(
        site,
        "plan",
        "--costs",
        str(CASE.costs_path),
        "--stages",
        "3",
        "--strategy",
        "last_cuts",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["strategy"] == "last_cuts"
    cuts = [point["after"] for point in plan["sync_points"]]
    data = json.loads(CASE.costs_path.read_text())
    admissible = [cut["after"] for cut in data["cuts"]]
    assert cuts == admissible[-2:]
    assert any("installed package" in note for note in plan["notes"])


def test_a_plugin_cannot_take_a_built_in_name(site: Path) -> None:
    done = syncpass(site, "plan", "--costs", str(CASE.costs_path), "--stages", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["strategy"] == "adaptive"
    assert "installed package" not in done.stdout


@pytest.mark.parametrize(
    ("strategy", "message"),
    [
        ("wrong_count", "returned 1 cut(s) for 3 stages"),
        ("explodes", "strategy 'explodes' failed: RuntimeError: no idea"),
        ("broken", "failed to load: ModuleNotFoundError"),
    ],
)
def test_a_misbehaving_strategy_is_a_clear_error(site: Path, strategy: str, message: str) -> None:
    done = syncpass(
        site, "plan", "--costs", str(CASE.costs_path), "--stages", "3", "--strategy", strategy
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_an_installed_backend_rewrites(site: Path, tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text(CASE.source)
    shutil.copy(CASE.costs_path, tmp_path / "model.costs.json")
    trace = tmp_path / "trace.txt"
    args = ["rewrite", str(source), "--costs", str(tmp_path / "model.costs.json")]
    args += ["--stages", str(CASE.stages), "--model", "Tower", "--backend", "demo"]
    done = syncpass(site, *args, trace=trace)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CASE.expected
    assert trace.read_text() == str(source)


def test_unknown_names_list_the_installed_ones(site: Path) -> None:
    done = syncpass(site, "rewrite", "-", "--costs", "x.json", "--stages", "2", "--backend", "nope")
    assert done.returncode == 2
    assert "demo" in done.stderr and "torch" in done.stderr and "jax" in done.stderr


def test_an_installed_backend_whose_output_does_not_parse_writes_nothing(
    site: Path, tmp_path: Path
) -> None:
    source = tmp_path / "model.py"
    source.write_text(CASE.source)
    out = tmp_path / "out.py"
    args = ["rewrite", str(source), "--costs", str(CASE.costs_path), "--stages", "3"]
    done = syncpass(site, *args, "--model", "Tower", "--backend", "garbage", "-o", str(out))
    assert done.returncode == 2
    assert "does not parse" in done.stderr
    assert not out.exists()


def test_an_installed_backend_that_raises_is_an_error_naming_it_and_the_hook(
    site: Path, tmp_path: Path
) -> None:
    source = tmp_path / "model.py"
    source.write_text(CASE.source)
    args = ["rewrite", str(source), "--costs", str(CASE.costs_path), "--stages", "3"]
    done = syncpass(site, *args, "--backend", "failing")
    assert done.returncode == 2
    assert "backend 'failing' failed in analyse: RuntimeError: cannot read this" in done.stderr
    assert "Traceback" not in done.stderr
    done = syncpass(site, *args, "--backend", "not_a_spec")
    assert done.returncode == 2
    assert "is not a syncpass.backends.spec.Backend but a object" in done.stderr

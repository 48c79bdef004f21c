"""`syncpass check` and the pre-commit hook, run as a user runs them, on a small project."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.commands.check import CheckRequest, run_check

MODEL = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.l1 = nn.Linear(32, 32)
        self.l2 = nn.Linear(32, 32)
        self.l3 = nn.Linear(32, 32)
        self.l4 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(self.l1(x))
        x = torch.relu(self.l2(x))
        x = torch.relu(self.l3(x))
        x = torch.relu(self.l4(x))
        return self.head(x)
"""

PYPROJECT = """\
[project]
name = "demo"

[tool.syncpass]
stages = 3

[[tool.syncpass.models]]
source = "models/net.py"
generated = "models/net_pipeline.py"
costs = "models/net.costs.json"
"""


def net_costs() -> dict[str, Any]:
    """A cost file for :data:`MODEL`, built by hand: no profiling, no torch."""
    ids = ["stem", "l1", "l2", "l3", "l4", "head"]
    compute = [0.002, 0.004, 0.005, 0.003, 0.004, 0.004]
    return {
        "version": 1,
        "model": "Net",
        "batch_size": 8,
        "training": True,
        "memory_multiplier": 4,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "config": {
            "strategy": "adaptive",
            "min_sync_interval": 1,
            "communication_cost_threshold": 0.1,
        },
        "ops": [
            {"id": op, "compute_s": t, "backward_s": 2 * t, "param_bytes": 4096, "out_bytes": 1024}
            for op, t in zip(ids, compute, strict=True)
        ],
        "cuts": [{"after": op, "live_bytes": 65536} for op in ids[:-1]],
    }


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with one model entry and no generated file yet; the working folder."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "net.py").write_text(MODEL)
    (tmp_path / "models" / "net.costs.json").write_text(json.dumps(net_costs(), indent=2))
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(*args: str) -> int:
    return main(["check", *args])


def test_a_missing_generated_file_is_stale_and_fix_writes_what_rewrite_writes(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check() == 1
    out = capsys.readouterr().out
    assert out.startswith("models/net_pipeline.py: missing: it must be what `syncpass rewrite ")
    assert "--- /dev/null\n+++ models/net_pipeline.py\n" in out
    assert "+class NetStage1(NetStage):" in out  # the eager stages, the default backend
    assert "# syncpass sync 1/2: sends " in out
    assert not (project / "models" / "net_pipeline.py").exists()

    assert check("--fix") == 0
    assert "fixed models/net_pipeline.py" in capsys.readouterr().err
    generated = (project / "models" / "net_pipeline.py").read_text()
    # Exactly what the rewrite command writes (it reads the same [tool.syncpass]).
    assert main(["rewrite", "models/net.py", "--costs", "models/net.costs.json", "-o", "r.py"]) == 0
    assert (project / "r.py").read_text() == generated
    assert check() == 0
    assert "1 generated file(s) checked, all current" in capsys.readouterr().err


def test_a_rewrite_by_hand_uses_the_entrys_own_stages(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry_stages = PYPROJECT.replace(
        'costs = "models/net.costs.json"\n', 'costs = "models/net.costs.json"\nstages = 2\n'
    )
    (project / "pyproject.toml").write_text(entry_stages)
    out = "models/net_pipeline.py"
    assert main(["rewrite", "models/net.py", "--costs", "models/net.costs.json", "-o", out]) == 0
    assert (project / out).read_text().count("# syncpass sync") == 1  # 2 stages, not 3
    assert check() == 0


def test_a_stale_generated_file_gets_a_diff_naming_it(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check("--fix") == 0
    config = project / "pyproject.toml"
    config.write_text(PYPROJECT.replace("stages = 3", "stages = 2"))  # the plan changes
    capsys.readouterr()
    assert check() == 1
    out = capsys.readouterr().out
    assert out.startswith("models/net_pipeline.py: stale: ")
    assert "--stages 2 -o models/net_pipeline.py" in out
    assert "--- models/net_pipeline.py\n+++ models/net_pipeline.py\n@@" in out
    assert "-class NetStage2(NetStage):" in out
    assert "# syncpass sync 1/1: sends " in out
    assert check("--fix") == 0 and check() == 0


def test_a_generated_file_the_projects_formatter_laid_out_anew_is_current(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The formatter hook runs on the generated file too; at 60 columns it breaks up lines
    # syncpass wrote for 88. The hook must not call that stale after every commit.
    assert check("--fix") == 0
    generated = project / "models" / "net_pipeline.py"
    written = generated.read_text()
    formatter = [sys.executable, "-m", "ruff", "format", "--no-cache", "--line-length", "60"]
    subprocess.run([*formatter, str(generated)], check=True, capture_output=True)
    assert generated.read_text() != written
    capsys.readouterr()
    assert check() == 0
    assert "1 generated file(s) checked, all current" in capsys.readouterr().err
    # What differs in code, or in a comment's figures, is stale.
    generated.write_text(generated.read_text().replace("# syncpass sync 1/2: sends", "# sends"))
    assert check() == 1


def test_files_select_the_entries_they_belong_to(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "other.py").write_text("x = 1\n")
    (project / "__init__.py").write_text("")
    assert check("other.py", "__init__.py") == 0  # the (missing) generated file is not theirs
    for changed in ("models/net.py", "models/net.costs.json", "pyproject.toml"):
        assert check(changed) == 1, changed
        assert "models/net_pipeline.py: missing" in capsys.readouterr().out


def test_lint_findings_fail_the_check(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = project / "models" / "net.py"
    line = "x = torch.relu(self.l4(x))"
    source.write_text(MODEL.replace(line, f"{line} * float(x.norm()) + x.max().item()"))
    assert check("--fix") == 1  # the generated file is fixed; the findings remain
    out = capsys.readouterr().out
    assert "models/net.py:20:38: SP105 `float()` of a tensor" in out
    assert "models/net.py:20:56: SP101 `.item()`" in out
    assert "net_pipeline.py:" not in out  # the generated copy is not linted again
    assert check("--no-lint") == 0
    source.write_text(source.read_text().replace(".item()", ".item()  # noqa: SP101,SP105"))
    assert check("--fix") == 0


def test_python_files_outside_the_models_are_linted_when_given(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "layers.py").write_text(
        "import torch\n\n\nclass Gate(torch.nn.Module):\n    def forward(self, x):\n"
        "        if x.sum().item() > 0:\n            torch.cuda.synchronize()\n        return x\n"
    )
    assert check("layers.py") == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "layers.py:6:12: SP101 `.item()` copies a tensor value to the host and waits for all "
        "queued device work",
        "layers.py:7:13: SP107 `torch.cuda.synchronize()` blocks the host until the device is "
        "idle; a pipeline stage waiting here stalls every stage behind it",
    ]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda p: (p / "models" / "net.costs.json").write_text("{"),
            "models/net.costs.json: not valid JSON",
        ),
        (lambda p: (p / "models" / "net.py").unlink(), "models/net.py: no such file"),
        (
            lambda p: (p / "models" / "net.py").write_text("class Net(:\n"),
            "models/net.py:1: syntax error",
        ),
        (
            lambda p: (p / "pyproject.toml").write_text(PYPROJECT + "colour = 'blue'\n"),
            "pyproject.toml:11: unknown setting 'colour' in [[tool.syncpass.models]] entry 1",
        ),
        (
            lambda p: (p / "pyproject.toml").write_text(
                PYPROJECT.replace("stages = 3", "stages = 40")
            ),
            "40 stages need at least 40 ops",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_file(
    project: Path, capsys: pytest.CaptureFixture[str], damage: Any, message: str
) -> None:
    damage(project)
    assert check() == 2
    err = capsys.readouterr().err
    assert "syncpass: error: " in err and message in err, err
    assert not (project / "models" / "net_pipeline.py").exists()


@pytest.mark.parametrize("generated", ["/etc/hostname", "../outside.py"])
def test_fix_never_writes_outside_the_project(
    project: Path, capsys: pytest.CaptureFixture[str], generated: str
) -> None:
    outside = (project / generated).resolve()
    before = outside.read_bytes() if outside.exists() else None
    text = (project / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(text.replace("models/net_pipeline.py", generated))
    assert check("--fix") == 2
    err = capsys.readouterr().err
    assert (
        "pyproject.toml:9: generated in [[tool.syncpass.models]] entry 1 must name a file " in err
    )
    assert (outside.read_bytes() if outside.exists() else None) == before


def test_no_configuration_and_no_files_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_check(CheckRequest(start=tmp_path))
    if result.errors:  # (unless a [tool.syncpass] stands above the temporary folder)
        assert "no configuration" in str(result.errors[0]) and result.exit_status == 2


def test_an_explicit_config_file_and_flags(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pyproject.toml").unlink()
    (project / ".git").mkdir()  # the project the config's paths stay inside
    (project / "ci").mkdir()
    (project / "ci" / "sync.toml").write_text(
        'stages = 2\n[[models]]\nsource = "../models/net.py"\ngenerated = "../models/net_pipeline.py"\n'
        'costs = "../models/net.costs.json"\n'
    )
    assert check("--config", "ci/sync.toml", "--fix") == 0
    assert "2 stage(s)" in capsys.readouterr().err
    assert check("--config", "ci/sync.toml") == 0
    assert check("--config", "ci/sync.toml", "--strategy", "uniform") == 0  # the same cut
    # A hard threshold of 1% rules out the balanced cut (adaptive would raise it for speed).
    assert check("--config", "ci/sync.toml", "--strategy", "fixed", "--threshold", "0.01") == 1
    out = capsys.readouterr().out
    assert "--config ci/sync.toml --strategy fixed --threshold 0.01 -o models/" in out


def test_check_imports_neither_torch_nor_jax_nor_the_model(project: Path) -> None:
    source = project / "models" / "net.py"
    source.write_text(MODEL + "\nraise SystemExit(42)  # the model's code ran\n")
    probe = (
        "import sys\n"
        "from syncpass.cli import main\n"
        "status = main(['check', 'models/net.py'])\n"
        "heavy = [name for name in ('torch', 'jax') if name in sys.modules]\n"
        "sys.exit(10 + status if heavy else status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=project, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1, result.stderr  # missing generated file; not 11, 42 or a crash


def _git(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False
    )


@pytest.mark.slow
def test_pre_commit_refuses_a_stale_generated_file_until_fixed(project: Path) -> None:
    pytest.importorskip("pre_commit")
    yaml = pytest.importorskip("yaml")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    # The hook as the repository ships it, run from this installation (no download).
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "syncpass-check" and hook["entry"] == "syncpass check"
    local = {**hook, "language": "system"}
    (project / ".pre-commit-config.yaml").write_text(
        yaml.safe_dump({"repos": [{"repo": "local", "hooks": [local]}]})
    )
    env = {
        **os.environ,
        "PATH": sysconfig.get_path("scripts") + os.pathsep + os.environ.get("PATH", ""),
        "PRE_COMMIT_HOME": str(project.parent / "pre-commit-home"),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    assert _git(project, env, "init", "-q").returncode == 0
    installed = subprocess.run(
        [sys.executable, "-m", "pre_commit", "install"],
        cwd=project, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    # A generated file left from an older plan: stale.
    (project / "models" / "net_pipeline.py").write_text(MODEL)
    _git(project, env, "add", "-A")
    refused = _git(project, env, "commit", "-q", "-m", "add the model")
    assert refused.returncode != 0
    assert "models/net_pipeline.py: stale" in refused.stdout + refused.stderr
    assert _git(project, env, "rev-parse", "HEAD").returncode != 0  # nothing committed

    fixed = subprocess.run(
        ["syncpass", "check", "--fix"], cwd=project, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr
    _git(project, env, "add", "-A")
    accepted = _git(project, env, "commit", "-q", "-m", "add the model")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "syncpass check" in accepted.stdout + accepted.stderr  # the hook ran, and passed


@pytest.mark.slow
def test_pre_commit_runs_the_hook_from_the_syncpass_repository_at_a_commit(project: Path) -> None:
    # The README's remote form: `repo:` the syncpass repository, `rev:` a full commit sha
    # (the repository has no release tags to name).
    pytest.importorskip("pre_commit")
    yaml = pytest.importorskip("yaml")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {
        **os.environ,
        "PATH": sysconfig.get_path("scripts") + os.pathsep + os.environ.get("PATH", ""),
        "PRE_COMMIT_HOME": str(project.parent / "pre-commit-home"),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    head = _git(REPO, env, "rev-parse", "HEAD")
    if head.returncode != 0:
        pytest.skip("syncpass is not installed from a git checkout")
    sha = head.stdout.strip()
    # The hook as committed at that sha (the test's working tree may be ahead of it).
    assert _git(REPO, env, "cat-file", "-e", f"{sha}:.pre-commit-hooks.yaml").returncode == 0
    # language: system runs the syncpass installed here rather than pip-installing the
    # repository into pre-commit's own environment, which needs the package index.
    hook = {"id": "syncpass-check", "language": "system"}
    (project / ".pre-commit-config.yaml").write_text(
        yaml.safe_dump({"repos": [{"repo": str(REPO), "rev": sha, "hooks": [hook]}]})
    )
    assert _git(project, env, "init", "-q").returncode == 0
    _git(project, env, "add", "-A")
    pre_commit = [sys.executable, "-m", "pre_commit", "run", "--all-files"]
    refused = subprocess.run(pre_commit, cwd=project, env=env, capture_output=True, text=True)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "models/net_pipeline.py: missing" in refused.stdout
    assert main(["check", "--fix"]) == 0
    _git(project, env, "add", "-A")
    passed = subprocess.run(pre_commit, cwd=project, env=env, capture_output=True, text=True)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "syncpass check" in passed.stdout

"""syncpass inside other libcst pipelines: the library API and the codemod command."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from conftest import REPO
from golden_cases import GOLDEN, read_case

from syncpass.api import rewrite_module, rewrite_source
from syncpass.contracts.costs import load_costs

CASE = read_case(GOLDEN / "container_loop.py")


class RenameTower(cst.CSTTransformer):
    """Another pipeline stage: renames the model class."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        if updated.name.value == self.old:
            return updated.with_changes(name=cst.Name(self.new))
        return updated


class AddDocstringComment(cst.CSTTransformer):
    """A stage after syncpass: a header comment on the module."""

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(header=[cst.EmptyLine(comment=cst.Comment("# generated"))])


def test_rewrite_source_matches_the_command_line() -> None:
    result = rewrite_source(
        CASE.source,
        "model.py",
        costs=CASE.costs_path,
        stages=CASE.stages,
        sync_config=CASE.config,
        class_name=CASE.model,
        backend="torch",
    )
    assert result.ok and result.error is None
    assert result.code == CASE.expected
    assert result.module.code == CASE.expected
    assert result.plan is not None and len(result.plan.stages) == CASE.stages
    assert result.changed
    # Rewriting the rewritten code plans the same and changes nothing.
    again = rewrite_source(
        result.code,
        "model.py",
        costs=CASE.costs_path,
        stages=CASE.stages,
        sync_config=CASE.config,
        class_name=CASE.model,
        backend="torch",
    )
    assert again.ok and again.code == result.code and not again.changed


def test_chained_with_other_transforms_over_one_parsed_tree() -> None:
    tree = cst.parse_module(CASE.source)
    tree = tree.visit(RenameTower("Tower", "Model"))
    result = rewrite_module(
        tree,
        "model.py",
        costs=load_costs(CASE.costs_path),
        stages=CASE.stages,
        sync_config={"communication_cost_threshold": CASE.config.communication_cost_threshold},
        class_name="Model",
        backend="torch",
    )
    assert result.ok, result.error
    final = result.module.visit(AddDocstringComment())
    assert final.code.startswith("# generated\n")
    assert "class Model(nn.Module):" in final.code
    assert final.code.count("pipe_split()  # syncpass sync") == CASE.stages - 1
    # The same as renaming the command-line output: the stages commute.
    expected = cst.parse_module(CASE.expected or "").visit(RenameTower("Tower", "Model"))
    assert result.module.code == expected.code


@pytest.mark.parametrize(
    ("code", "options", "message", "where"),
    [
        ("class Broken(:\n", {}, "syntax error", "model.py:1"),
        (CASE.source, {"stages": 40}, "stages", None),
        (CASE.source, {"sync_config": {"colour": "red"}}, "unknown setting 'colour'", None),
        (CASE.source, {"stages": 0}, "stages must be at least 1", None),
    ],
)
def test_bad_input_comes_back_as_an_error_not_an_exception(
    code: str, options: dict[str, object], message: str, where: str | None
) -> None:
    arguments: dict[str, object] = {"stages": CASE.stages, "class_name": CASE.model}
    arguments.update(options)
    result = rewrite_source(code, "model.py", costs=CASE.costs_path, **arguments)  # type: ignore[arg-type]
    assert not result.ok and result.error is not None
    assert message in str(result.error).lower() or message in str(result.error)
    if where is not None:
        assert str(result.error).startswith(where)
    assert result.code == code  # the input, passed on unchanged
    assert result.plan is None and not result.changed


def test_a_failed_module_is_handed_back_as_it_came() -> None:
    tree = cst.parse_module(CASE.source)
    result = rewrite_module(tree, "model.py", costs="no/such.costs.json", stages=2)
    assert not result.ok and result.module is tree
    assert "no such cost file" in str(result.error)


@pytest.mark.slow
def test_the_codemod_rewrites_a_folder_with_libcst_tool(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "tower.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, models / "tower.costs.json")
    (models / "helpers.py").write_text("def forward_helper():\n    return 1\n")
    (models / "other.py").write_text("X = 1\n")
    untouched = {path.name: path.read_text() for path in models.iterdir()}
    init = subprocess.run(
        [sys.executable, "-m", "libcst.tool", "initialize", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert init.returncode == 0, init.stderr
    command = [
        *(sys.executable, "-m", "libcst.tool", "codemod", "--no-format", "-x"),
        "syncpass.transformers.codemod.PipelineSyncCommand",
        *("--stages", str(CASE.stages), "--model", "Tower", "--backend", "torch", "models"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (models / "tower.py").read_text() == CASE.expected
    assert (models / "other.py").read_text() == untouched["other.py"]
    assert (models / "helpers.py").read_text() == untouched["helpers.py"]
    assert "no cost file" in done.stderr
    # Run again: the rewritten file plans the same, so nothing changes.
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr
    assert (models / "tower.py").read_text() == CASE.expected


def readme_codemod_commands() -> list[list[str]]:
    """The README's codemod commands ("Inside other pipelines"), as a user types them."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("- A libcst codemod") :]
    block = section[section.index("```bash\n") + 8 : section.index("```\n", 8)]
    commands = [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]
    assert commands and all(command[:3] == ["python", "-m", "libcst.tool"] for command in commands)
    return [[sys.executable, *command[1:]] for command in commands]


@pytest.mark.slow
def test_the_readmes_codemod_steps_work_from_a_fresh_install(tmp_path: Path) -> None:
    # A fresh install has no black, which libcst's tool runs by default: the README's
    # steps must not need it.
    models = tmp_path / "models"
    models.mkdir()
    (models / "tower.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, models / "tower.costs.json")
    for command in readme_codemod_commands():
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
    assert (models / "tower.py").read_text().count("# syncpass sync") == 3


@pytest.mark.slow
def test_the_codemod_reports_a_refused_file_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, tmp_path / "a.costs.json")
    (tmp_path / "b.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, tmp_path / "b.costs.json")
    subprocess.run(
        [sys.executable, "-m", "libcst.tool", "initialize", "."], cwd=tmp_path, check=True
    )
    command = [
        *(sys.executable, "-m", "libcst.tool", "codemod", "--no-format", "-x"),
        "syncpass.transformers.codemod.PipelineSyncCommand",
        *("--stages", "40", "--model", "Tower", "a.py", "b.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "stages" in done.stderr
    assert (tmp_path / "a.py").read_text() == CASE.source  # nothing half-written


@pytest.mark.slow
def test_the_codemod_takes_its_settings_from_the_project_as_rewrite_does(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "tower.py").write_text(CASE.source)
    shutil.copy(CASE.costs_path, models / "tower.costs.json")
    (tmp_path / "pyproject.toml").write_text(
        "[tool.syncpass]\n"
        f"stages = {CASE.stages}\n"
        'backend = "torch"\n\n'
        "[[tool.syncpass.models]]\n"
        'source = "models/tower.py"\n'
        'generated = "models/tower_pipeline.py"\n'
        'costs = "models/tower.costs.json"\n'
        'model = "Tower"\n'
    )
    subprocess.run(
        [sys.executable, "-m", "libcst.tool", "initialize", "."], cwd=tmp_path, check=True
    )
    command = [
        *(sys.executable, "-m", "libcst.tool", "codemod", "--no-format", "-x"),
        *("syncpass.transformers.codemod.PipelineSyncCommand", "models/tower.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (models / "tower.py").read_text() == CASE.expected


@pytest.mark.slow
def test_the_codemod_writes_for_the_project_backend(tmp_path: Path) -> None:
    """A JAX project gets jax.device_put transfers, the same that `rewrite --backend jax` writes."""
    from syncpass.backends.jax.analysis import analyse_jax_model
    from syncpass.frontend.source import parse_source

    golden = (REPO / "tests" / "golden" / "jax" / "mlp_function.py").read_text()
    source = golden.split("# output:\n")[0]
    graph = analyse_jax_model(parse_source(source, "mlp.py"), "mlp.py", None, {}, source)
    costs = {
        "version": 1,
        "model": graph.model_class,
        "batch_size": 8,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": [{"id": op.id, "compute_s": 0.001, "backward_s": 0.002} for op in graph.ops],
        "cuts": [{"after": cut.after, "live_bytes": 65536} for cut in graph.cuts],
    }
    (tmp_path / "mlp.py").write_text(source)
    (tmp_path / "mlp.costs.json").write_text(json.dumps(costs))
    (tmp_path / "pyproject.toml").write_text('[tool.syncpass]\nbackend = "jax"\nstages = 2\n')
    expected = subprocess.run(
        [sys.executable, "-m", "syncpass", "rewrite", "mlp.py", "--costs", "mlp.costs.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "jax.device_put" in expected
    subprocess.run(
        [sys.executable, "-m", "libcst.tool", "initialize", "."], cwd=tmp_path, check=True
    )
    command = [
        *(sys.executable, "-m", "libcst.tool", "codemod", "--no-format", "-x"),
        *("syncpass.transformers.codemod.PipelineSyncCommand", "mlp.py"),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "mlp.py").read_text() == expected


def test_the_api_takes_the_schedules_own_stages_per_device() -> None:
    # zbv holds two stages a device: 2 devices, 4 stages, without saying so.
    common = {"costs": CASE.costs_path, "sync_config": CASE.config, "class_name": CASE.model}
    result = rewrite_source(CASE.source, "model.py", stages=2, schedule="zbv", **common)
    assert result.ok, result.error
    assert result.plan is not None and len(result.plan.stages) == 4
    assert [stage.device for stage in result.plan.stages] == [0, 1, 1, 0]
    refused = rewrite_source(
        CASE.source, "model.py", stages=2, schedule="zbv", stages_per_device=3, **common
    )
    assert refused.error is not None and "use 2" in str(refused.error)

"""Real model code, as its package ships it: installed from PyPI, copied into a project,
rewritten into eager stages (or, for Flax, JAX transfers), run split (over gloo; on CPU
devices for JAX) and verified against the unsplit model.

Each model's source file is copied unchanged with an ``example()`` appended (tiny random
configs); its imports come from the same pinned install. `bench/bench_corpus.py` prints the
table of these runs (ops found, stages, predicted and measured steps).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import REPO

from syncpass.backends.registry import load_backend
from syncpass.cli import main


def _bench_corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_corpus", REPO / "bench" / "bench_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_corpus"] = module
    spec.loader.exec_module(module)
    return module


CORPUS = _bench_corpus()
CASES = [(model, stages) for model in CORPUS.MODELS for stages in model.stages]
#: ``--meta`` builds torch models on the meta device; JAX has no such thing to count on.
TORCH_MODELS = [model for model in CORPUS.MODELS if model.backend != "jax"]


def syncpass(
    argv: list[str], isolated: bool, capsys: pytest.CaptureFixture[str], project: Path
) -> tuple[int, str]:
    """``syncpass ARGV``: its status and error output, in a fresh process (in ``project``)
    when ``isolated``."""
    if isolated:
        return CORPUS._quiet(argv, isolated=True, cwd=project)  # type: ignore[no-any-return]
    status = main(argv)
    return status, capsys.readouterr().err


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the corpus's packages go, once per session (one folder per set)."""
    return tmp_path_factory.mktemp("corpus-packages")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "stages"), CASES, ids=[f"{model.name}-{stages}" for model, stages in CASES]
)
def test_real_model_splits_into_eager_stages_and_verifies(
    packages: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: Any,
    stages: int,
) -> None:
    source = CORPUS.prepared(model, packages, tmp_path)
    original = source.read_text()
    out = tmp_path / f"{model.name}_sync.py"
    report = tmp_path / "plan.json"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", str(stages)]
    argv += [*model.model_arguments(), "-o", str(out), "--report", str(report)]
    status, err = syncpass(argv, model.isolated, capsys, tmp_path)
    assert status == 0, err
    assert source.read_text() == original
    rewritten = out.read_text()
    # The package's own code stays byte for byte: taking the sync points out gives it back.
    stripped = load_backend(model.backend).strip(rewritten, str(out), model.model or None)
    assert stripped == original
    assert rewritten.count("# syncpass sync ") == stages - 1
    # The layer stack inside self.transformer was found: its layers are ops.
    ops = [op["id"] for op in json.loads(report.read_text())["analysis"]["ops"]]
    assert sum(op.startswith(model.layers) for op in ops) == model.depth
    run_report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", str(stages), "--verify", "--timeout", "240"]
    argv += ["--backend", model.backend]
    status, err = syncpass(
        [*argv, "--json-report", str(run_report)], model.isolated, capsys, tmp_path
    )
    assert status == 0, err
    verify = json.loads(run_report.read_text())["verify"]
    assert verify["ok"] is True and verify["mismatches"] == 0
    assert verify["parameters_compared"] == verify["model_parameters"]


@pytest.mark.slow
@pytest.mark.parametrize("model", TORCH_MODELS, ids=[model.name for model in TORCH_MODELS])
def test_real_model_is_counted_on_fake_tensors(
    packages: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: Any
) -> None:
    """``profile --meta``: every layer of the stack counted, nothing run for real (Hugging
    Face's masks skip their data-dependent checks on fake tensors, as under torch.export)."""
    source = CORPUS.prepared(model, packages, tmp_path)
    costs = tmp_path / "meta.costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--meta"]
    status = main([*argv, "--hardware", "pcie4-gpus", "-o", str(costs)])
    assert status == 0, capsys.readouterr().err
    ops = json.loads(costs.read_text())["ops"]
    layers = [op for op in ops if op["id"].startswith(model.layers)]
    assert len(layers) == model.depth
    assert all(op["flops"] > 0 and op["param_bytes"] > 0 for op in layers)
    # Counted, not timed: layers that are alike cost the same.
    assert len({op["flops"] for op in layers}) == model.kinds

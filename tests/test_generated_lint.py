"""What syncpass writes into a model's file passes the project's own linters: every bundled
example rewritten at 2, 3 and 4 stages, in each form (torch's eager stages and
``pipe_split()``, JAX's ``device_put``), and the transformer's tensor-parallel plan in the
DTensor and the eager form, passes ``ruff check``, ``ruff format --check`` and ``mypy`` (strict) as
pyproject.toml configures them, as the examples themselves do."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from once import shared

from syncpass.cli import main

EXAMPLES = REPO / "examples"

TORCH = ("transformer_lm", "resnet", "unet", "uneven_mlp")
JAX = {"jax_mlp": None, "flax_lm": "TransformerLM"}
STAGES = (2, 3, 4)


#: The layer lists of the JAX examples, as the profile counts them.
JAX_SIZES = {"flax_lm": {"blocks": 4}}


def jax_costs(source: Path, model: str | None, out: Path) -> None:
    """Deterministic costs from the JAX example's graph (what its profile would rank)."""
    from syncpass.backends.jax.analysis import analyse_jax_model
    from syncpass.frontend.source import parse_source

    text = source.read_text()
    sizes = JAX_SIZES.get(source.stem, {})
    graph = analyse_jax_model(parse_source(text, str(source)), str(source), model, sizes, text)
    data = {
        "version": 1,
        "model": graph.model_class,
        "batch_size": 8,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": [
            # What an op keeps for its backward, and what recomputing it keeps instead: more
            # for a layer of a loop, the blocks a plan may recompute.
            {"id": op.id, "compute_s": 0.001 * (1 + index % 3), "backward_s": 0.002}
            | {"saved_bytes": 262144 if op.loop else 65536, "input_bytes": 65536}
            for index, op in enumerate(graph.ops)
        ],
        "cuts": [{"after": cut.after, "live_bytes": 65536 * len(cut.live)} for cut in graph.cuts],
        "containers": sizes,
    }
    out.write_text(json.dumps(data))


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of every bundled example's rewritten file, in every form and stage count,
    made once for the run."""
    return shared(tmp_path_factory, "generated", _write_every_form)


def _write_every_form(folder: Path) -> None:
    for name in TORCH:
        source = EXAMPLES / f"{name}.py"
        costs = folder / f"{name}.costs.json"
        argv = ["profile", str(source), "--example", f"{source}:example", "-o", str(costs)]
        assert main([*argv, "--repeats", "1", "--warmup", "0"]) == 0
        for backend in ("torch_stages", "torch"):
            for stages in STAGES:
                out = folder / f"{name}_{backend}_{stages}.py"
                argv = ["rewrite", str(source), "--costs", str(costs)]
                argv += ["--stages", str(stages), "--threshold", "inf", "--backend", backend]
                assert main([*argv, "-o", str(out)]) == 0
                assert "# syncpass sync" in out.read_text()
        if name == "unet":
            # A stage that sends one value a module call made (a type checker reads it as
            # Any): the first stage ends inside enc1, whatever the profile says.
            out = folder / "unet_one_value_sent.py"
            argv = ["rewrite", str(source), "--costs", str(costs), "--stages", "4"]
            argv += ["--strategy", "manual", "--cuts", "enc1.2,enc3.4,dec2.3"]
            assert main([*argv, "--threshold", "inf", "-o", str(out)]) == 0
            assert "skip1: torch.Tensor = self.enc1[:3](x)" in out.read_text()
    # The tensor-parallel plan in the DTensor form (torch's parallel styles).
    lm = EXAMPLES / "transformer_lm.py"
    out = folder / "transformer_lm_tp2_dtensor.py"
    argv = ["rewrite", str(lm), "--example", f"{lm}:example", "--strategy", "tensor"]
    argv += ["--tp", "2", "--hardware", str(REPO / "tests" / "data" / "fast_link.toml")]
    assert main([*argv, "--tp-style", "dtensor", "-o", str(out)]) == 0
    assert "TENSOR_PARALLEL_PLAN = {" in out.read_text()
    # ... and in the eager form, whose collectives import syncpass's runtime functions.
    out = folder / "transformer_lm_tp2_eager.py"
    assert main([*argv, "-o", str(out)]) == 0
    assert "reduce_from_tensor_parallel_region(" in out.read_text()
    if importlib.util.find_spec("jax") is not None:
        for name, model in JAX.items():
            costs = folder / f"{name}.costs.json"
            jax_costs(EXAMPLES / f"{name}.py", model, costs)
            for stages in STAGES:
                out = folder / f"{name}_jax_{stages}.py"
                argv = ["rewrite", "--backend", "jax", str(EXAMPLES / f"{name}.py")]
                argv += ["--costs", str(costs), "--stages", str(stages), "--threshold", "inf"]
                assert main([*argv, "-o", str(out)]) == 0
                assert "# syncpass sync" in out.read_text()
        # The Flax LM's blocks rematerialised (Flax's remat) beside 2 stages' transfers.
        out = folder / "flax_lm_jax_recompute.py"
        argv = ["rewrite", "--backend", "jax", str(EXAMPLES / "flax_lm.py"), "--stages", "2"]
        argv += ["--costs", str(folder / "flax_lm.costs.json"), "--threshold", "inf"]
        assert main([*argv, "--recompute", "all", "-o", str(out)]) == 0
        assert "nn.remat(lambda block, x: block(x))(block, x)" in out.read_text()
    for costs in folder.glob("*.json"):
        costs.unlink()


def tool(*argv: str) -> subprocess.CompletedProcess[str]:
    module = argv[0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, check=False
    )


@pytest.mark.slow  # profiles four examples, runs mypy over 30 files: about half a minute
def test_the_bundled_examples_rewritten_pass_ruff(written: Path) -> None:
    config = str(REPO / "pyproject.toml")
    # In a user's project syncpass is a third-party package: its import sorts among torch's.
    third_party = "lint.isort.known-third-party = ['syncpass']"
    checked = tool(
        "ruff", "check", "--no-cache", "--config", config, "--config", third_party, str(written)
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    formatted = tool("ruff", "format", "--check", "--no-cache", "--config", config, str(written))
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


@pytest.mark.slow
def test_the_eager_stages_are_laid_out_as_a_formatter_at_88_columns_lays_them_out(
    written: Path, tmp_path: Path
) -> None:
    # black's and ruff's default line length: a project that formats its files with either
    # gets the stage classes back as syncpass wrote them.
    stages = tmp_path / "stages"
    stages.mkdir()
    for path in sorted(written.glob("*_torch_stages_*.py")):
        text = path.read_text()
        classes = [
            ast.get_source_segment(text, node)
            for node in ast.parse(text).body
            if isinstance(node, ast.ClassDef) and re.fullmatch(r"\w+Stage\d*", node.name)
        ]
        assert len(classes) >= 3, path.name  # the base and two stages at least
        (stages / path.name).write_text("\n\n\n".join(map(str, classes)) + "\n")
    formatted = tool("ruff", "format", "--check", "--no-cache", "--line-length", "88", str(stages))
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr


@pytest.mark.slow
def test_the_bundled_examples_rewritten_pass_mypy(written: Path) -> None:
    files = sorted(str(path) for path in written.glob("*.py"))
    checked = tool("mypy", "--config-file", str(REPO / "pyproject.toml"), *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"in {len(files)} source file" in checked.stdout

"""The JAX backend: analysis, rewrite (golden files), and real runs over several JAX devices."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from syncpass.config import SyncConfig
from syncpass.costs import Costs, parse_costs
from syncpass.frontend.jax_analysis import analyse_jax_model
from syncpass.frontend.source import parse_source
from syncpass.plan import PlanRequest
from syncpass.rewrite_jax import rewrite_jax_source, strip_jax_sync_points

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOLDEN = Path(__file__).parent / "golden" / "jax"
MARKER = "# output:\n"
SIZES = {"TransformerLM": {"blocks": 4}, "Net": {"blocks": 4}}


def estimated_costs(text: str, path: str, name: str | None) -> Costs:
    """Deterministic costs from the source alone, as the torch golden cases make them."""
    module = parse_source(text, path)
    graph = analyse_jax_model(module, path, name, SIZES.get(name or "", {}), text)
    data = {
        "version": 1,
        "model": graph.model_class,
        "batch_size": 8,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": [
            {"id": op.id, "compute_s": 0.001 * (1 + index % 3), "backward_s": 0.002}
            for index, op in enumerate(graph.ops)
        ],
        "cuts": [{"after": cut.after, "live_bytes": 65536 * len(cut.live)} for cut in graph.cuts],
    }
    return parse_costs(data)


def rewrite(text: str, path: str, name: str | None, stages: int) -> str:
    costs = estimated_costs(strip_jax_sync_points(text, path, name), path, name)
    request = PlanRequest(
        stages=stages, config=SyncConfig().replace(communication_cost_threshold=float("inf"))
    )
    return rewrite_jax_source(text, path, costs, request, name).rewritten


CASES = [
    ("jax_mlp.py", None, "forward"),
    ("flax_lm.py", "TransformerLM", "TransformerLM"),
]


def test_mlp_ops_are_named_by_their_weights() -> None:
    text = (EXAMPLES / "jax_mlp.py").read_text()
    graph = analyse_jax_model(parse_source(text, "m.py"), "m.py", text=text)
    assert [op.id for op in graph.ops] == ["w1", "w2", "w3", "w4", "w5"]
    assert graph.inputs == ("x",)  # the weights never cross a sync point
    assert all(cut.live == ("h",) for cut in graph.cuts)
    assert (
        graph.ops[0].location.line
        == text.splitlines().index(
            '    h = jax.nn.gelu(x @ params["w1"] + params["b1"])  # (batch, 256)'
        )
        + 1
    )


def test_flax_call_is_read_like_a_torch_forward() -> None:
    text = (EXAMPLES / "flax_lm.py").read_text()
    graph = analyse_jax_model(
        parse_source(text, "lm.py"), "lm.py", "TransformerLM", {"blocks": 4}, text
    )
    ids = [op.id for op in graph.ops]
    assert ids[1:] == ["wte", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "head"]
    assert graph.inputs == ("tokens",)


@pytest.mark.parametrize(("file", "name", "model"), CASES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_rewrite_guarantees(file: str, name: str | None, model: str, stages: int) -> None:
    text = (EXAMPLES / file).read_text()
    out = rewrite(text, file, name, stages)
    if stages == 1:
        assert out == text
        return
    assert out.count("# syncpass sync") == stages - 1
    assert out.count("jax.device_put(") == stages - 1
    assert rewrite(out, file, name, stages) == out  # idempotent
    assert strip_jax_sync_points(out, file, name) == text  # strips back to the input
    kept = [line for line in out.splitlines() if "# syncpass sync" not in line]
    assert set(text.splitlines()) >= {line for line in kept if "self.blocks[" not in line}


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.py")), ids=lambda path: path.stem)
def test_golden(golden: Path) -> None:
    source, _, expected = golden.read_text().partition(MARKER)
    first = source.splitlines()[0]
    stages = int(first.split("--stages")[1].split()[0])
    name = first.split("--model")[1].split()[0] if "--model" in first else None
    assert rewrite(source, golden.name, name, stages) == expected


def test_adds_import_jax_when_missing_and_removes_it_again() -> None:
    text = (
        "from jax import numpy as jnp\n\n\n"
        "def forward(params, x):\n"
        '    h = jnp.tanh(x @ params["a"])\n'
        '    return h @ params["b"]\n'
    )
    out = rewrite(text, "f.py", None, 2)
    assert "import jax\n" in out
    assert "    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/1:" in out
    assert strip_jax_sync_points(out, "f.py") == text


def test_cli_rewrite_backend_jax_check(tmp_path: Path) -> None:
    from syncpass.cli import main
    from syncpass.costs import costs_to_json

    model = tmp_path / "mlp.py"
    model.write_text((EXAMPLES / "jax_mlp.py").read_text())
    costs = tmp_path / "mlp.costs.json"
    import json

    costs.write_text(json.dumps(costs_to_json(estimated_costs(model.read_text(), "m", None))))
    args = ["rewrite", str(model), "--backend", "jax", "--costs", str(costs), "--stages", "2"]
    assert main([*args, "--check"]) == 1
    assert main([*args, "--in-place"]) == 0
    assert main([*args, "--check"]) == 0
    assert "jax.device_put" in model.read_text()


def test_importing_syncpass_does_not_import_jax() -> None:
    code = (
        "import sys, syncpass, syncpass.cli, syncpass.rewrite_jax, syncpass.frontend.jax_analysis\n"
        "syncpass.cli.build_parser()\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("file", ["jax_mlp.py", "flax_lm.py"])
@pytest.mark.parametrize("stages", [2, 4])
def test_end_to_end_profile_rewrite_run_verify(file: str, stages: int, tmp_path: Path) -> None:
    """profile -> rewrite -> run --verify, on `stages` CPU devices."""
    model = tmp_path / file
    model.write_text((EXAMPLES / file).read_text())
    costs = tmp_path / "model.costs.json"
    syncpass = [sys.executable, "-m", "syncpass"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*syncpass, *args], capture_output=True, text=True, cwd=tmp_path, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("profile", "--backend", "jax", str(model), "-o", str(costs), "--repeats", "2")
    out = tmp_path / "model_sync.py"
    run(
        "rewrite", "--backend", "jax", str(model), "--costs", str(costs),
        "--stages", str(stages), "--threshold", "inf", "-o", str(out),
    )  # fmt: skip
    assert out.read_text().count("# syncpass sync") == stages - 1
    report = run("run", "--backend", "jax", "--stages", str(stages), "--verify", str(out))
    assert "verify: ok" in report
    for stage in range(stages):
        assert f"cpu:{stage}" in report

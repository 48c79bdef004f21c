"""`syncpass plan --hardware NAME` on cost files `syncpass profile` measured: every
bundled example, re-targeted to every shipped hardware profile, plans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.contracts.costs import load_costs
from syncpass.contracts.hardware import profile_names

#: Each bundled example and the backend that profiles it.
EXAMPLES = {
    "transformer_lm": "torch",
    "resnet": "torch",
    "unet": "torch",
    "uneven_mlp": "torch",
    "jax_mlp": "jax",
    "flax_lm": "jax",
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each example profiled once, as the README does it: its cost file."""
    folder = tmp_path_factory.mktemp("measured")
    result = {}
    for name, backend in EXAMPLES.items():
        source = REPO / "examples" / f"{name}.py"
        costs = folder / f"{name}.costs.json"
        example = ["--example", f"{source}:example"] if backend == "torch" else []
        subprocess.run(
            [sys.executable, "-m", "syncpass", "profile", "--backend", backend, str(source),
             *example, "-o", str(costs), "--repeats", "1"],
            check=True, capture_output=True, cwd=folder,
        )  # fmt: skip
        result[name] = costs
    return result


@pytest.mark.slow
@pytest.mark.parametrize("hardware", profile_names())
@pytest.mark.parametrize("name", EXAMPLES)
def test_measured_costs_plan_on_every_shipped_profile(
    measured: dict[str, Path], name: str, hardware: str, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = measured[name]
    if EXAMPLES[name] == "torch":  # what makes --hardware scale compute, and split the backward
        recorded = load_costs(costs)
        assert recorded.hardware.flops_per_s
        assert any(op.backward_input_s for op in recorded.ops)
    status = main(
        ["plan", "--costs", str(costs), "--stages", "2", "--hardware", hardware,
         "--backend", EXAMPLES[name] if EXAMPLES[name] == "jax" else "torch_stages"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "re-targeted from" in out
    assert "2 stage(s)" in out

"""`syncpass plan --hardware NAME` on cost files `syncpass profile` measured: every
bundled example, re-targeted to every shipped hardware profile, plans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from once import shared

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


def measured(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Example ``name`` profiled as the README does it, once for the whole run: its cost
    file."""
    source = REPO / "examples" / f"{name}.py"
    backend = EXAMPLES[name]

    def profile(folder: Path) -> None:
        example = ["--example", f"{source}:example"] if backend == "torch" else []
        subprocess.run(
            [sys.executable, "-m", "syncpass", "profile", "--backend", backend, str(source),
             *example, "-o", str(folder / "costs.json"), "--repeats", "1"],
            check=True, capture_output=True, cwd=folder,
        )  # fmt: skip

    return shared(tmp_path_factory, f"measured-{name}", profile) / "costs.json"


@pytest.mark.slow
@pytest.mark.parametrize("hardware", profile_names())
@pytest.mark.parametrize("name", EXAMPLES)
def test_measured_costs_plan_on_every_shipped_profile(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    hardware: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    costs = measured(name, tmp_path_factory)
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

"""One `--json-report` schema for every backend: torch and JAX runs, for real, side by side.

The torch run is the transformer LM cut into 2 stages (2 gloo processes); the
JAX run is `examples/jax_mlp.py` with a transfer written after its second layer
(2 CPU devices). Their documents must have the same keys, at the top, per stage
and under `verify`, as docs/run.md describes them once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_run import run, transformer_split

WIDEST = '    h = jax.nn.gelu(h @ params["w2"] + params["b2"])  # (batch, 512): the widest layer\n'
TRANSFER = "    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/1: by hand\n"


def jax_split(tmp_path: Path) -> Path:
    """``examples/jax_mlp.py`` with a sync point after the widest layer: 2 stages."""
    source = (REPO / "examples" / "jax_mlp.py").read_text()
    assert source.count(WIDEST) == 1
    path = tmp_path / "jax_mlp_split.py"
    path.write_text(source.replace(WIDEST, WIDEST + TRANSFER))
    return path


def keys(document: dict[str, Any]) -> dict[str, set[str]]:
    """The document's keys: at the top, of every stage report, and under ``verify``."""
    stages = [set(stage) for stage in document["stage_reports"]]
    assert all(stage == stages[0] for stage in stages)
    verify = document["verify"]
    return {
        "top": set(document),
        "stage": stages[0],
        "verify": set(verify),
        "parameter": set(verify["parameters"][0]),
        "loss": set(verify["losses"][0]),
    }


@pytest.mark.slow
def test_torch_and_jax_reports_have_the_same_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch_report = tmp_path / "torch.json"
    status, _, err = run(
        capsys,
        transformer_split(tmp_path, (3,)),
        "--stages 2 --microbatches 2 --schedule gpipe --steps 1 --verify",
        torch_report,
    )
    assert status == 0, err
    jax_report = tmp_path / "jax.json"
    done = subprocess.run(
        [sys.executable, "-m", "syncpass", "run", "--backend", "jax", "--stages", "2",
         "--microbatches", "2", "--steps", "1", "--verify", str(jax_split(tmp_path)),
         "--json-report", str(jax_report)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "jax on cpu" in done.stdout and "verify: ok: 10 of 10 parameter(s)" in done.stdout
    torch_document = json.loads(torch_report.read_text())
    jax_document = json.loads(jax_report.read_text())
    assert keys(torch_document) == keys(jax_document)
    assert (torch_document["backend"], jax_document["backend"]) == ("gloo", "jax")
    assert jax_document["schedule"] == "gpipe" and jax_document["threads"] is None
    assert [stage["device"] for stage in jax_document["stage_reports"]] == ["cpu:0", "cpu:1"]
    assert [stage["device"] for stage in torch_document["stage_reports"]] == [None, None]
    # Each weight leaf is checked on the stage that owns it.
    owners = {check["name"]: check["stage"] for check in jax_document["verify"]["parameters"]}
    assert owners["['w2']"] == 0 and owners["['w3']"] == 1

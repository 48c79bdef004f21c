"""`syncpass profile --meta`: the model built on torch's meta device, FLOPs and bytes counted,
nothing allocated or timed; compute from the hardware profile's FLOP/s."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.contracts.hardware import load_profile

MODEL = REPO / "tests" / "data" / "pair_layers.py"


def profile(tmp_path: Path, *extra: str) -> tuple[int, str, Path]:
    source = tmp_path / "pair_layers.py"
    shutil.copy(MODEL, source)
    out = tmp_path / "meta.costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "-o", str(out), *extra]
    return main(argv), str(source), out


def test_counts_flops_and_bytes_on_the_meta_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, out = profile(tmp_path, "--meta", "--hardware", "nvlink-8xh100")
    err = capsys.readouterr().err
    assert status == 0, err
    assert "counted on fake tensors (nothing timed)" in err
    costs = json.loads(out.read_text())
    rate = load_profile("nvlink-8xh100").hardware.flops_per_s
    assert rate is not None
    layers = [op for op in costs["ops"] if op["id"].startswith("layers.")]
    assert len(layers) == 6
    # Each pair is two 32x32 linears on a batch of 16: 2 * 16 * 32 * 32 FLOPs each.
    assert all(op["flops"] == 2 * 2 * 16 * 32 * 32 for op in layers)
    for op in costs["ops"]:
        assert op["compute_s"] == pytest.approx(op["flops"] / rate)
        assert op["backward_s"] == pytest.approx(2 * op["compute_s"])
    assert all(op["param_bytes"] == 2 * (32 * 32 + 32) * 4 for op in layers)
    # The inputs' gradients are one of each linear layer's two backward products; the
    # stem's input is data, which needs none.
    assert all(op["backward_input_s"] == op["backward_s"] / 2 for op in layers)
    assert costs["ops"][0]["id"] == "stem" and costs["ops"][0]["backward_input_s"] == 0
    assert costs["hardware"]["name"] == load_profile("nvlink-8xh100").hardware.name
    assert any("fake tensors" in note for note in costs["notes"])
    cut = next(cut for cut in costs["cuts"] if cut["after"] == "layers.2")
    assert cut["live_bytes"] == 16 * 32 * 4  # x, float32


def test_meta_needs_a_hardware_profile_and_excludes_static(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, out = profile(tmp_path, "--meta")
    assert status == 2
    assert "--meta needs --hardware" in capsys.readouterr().err
    status, _, _ = profile(tmp_path, "--meta", "--static", "--hardware", "nvlink-8xh100")
    assert status == 2
    assert "choose one" in capsys.readouterr().err
    assert not out.exists()

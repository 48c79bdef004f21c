"""The real-run benchmark's scaled copies of the examples stay in step with the examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.torch.analysis import analyse_model
from syncpass.frontend import parse_source


def bench_module() -> object:
    spec = importlib.util.spec_from_file_location("bench_real", REPO / "bench" / "bench_real.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_real"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "model_class"),
    [
        ("uneven_mlp", "UnevenMLP"),
        ("resnet", "ResNet"),
        ("unet", "UNet"),
        ("transformer_lm", "TransformerLM"),
    ],
)
def test_every_bench_model_scales_its_example(name: str, model_class: str, tmp_path: Path) -> None:
    bench = bench_module()
    model = bench.MODELS[name]  # type: ignore[attr-defined]
    text = bench.scaled_source(name, model)  # type: ignore[attr-defined]
    original = (REPO / "examples" / f"{name}.py").read_text()
    for constant, value in model.constants.items():
        assert f"\n{constant} = {value}\n" in text
    assert text != original
    # Only the constants changed: the forward, and so the op graph, is the example's.
    path = str(tmp_path / f"{name}.py")
    scaled = analyse_model(parse_source(text, path), path, model_class)
    plain = analyse_model(parse_source(original, path), path, model_class)
    assert [op.id for op in scaled.ops] == [op.id for op in plain.ops]

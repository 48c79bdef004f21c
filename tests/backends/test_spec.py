"""The built-in backends as specs: every hook the commands call, and a clear error for one missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.registry import load_backend
from syncpass.backends.spec import Backend
from syncpass.cli import main
from syncpass.core.errors import SyncpassError

EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("name", ["torch", "jax"])
def test_each_builtin_backend_is_one_spec_with_the_rewrite_hooks(name: str) -> None:
    backend = load_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert load_backend(name) is backend  # one spec per backend
    for hook in ("analyse", "insert", "remove", "strip", "measure", "run", "load_example"):
        assert callable(getattr(backend, hook)), hook
    assert backend.schedules


def test_the_torch_spec_loads_a_torch_example() -> None:
    torch = pytest.importorskip("torch")
    example = load_backend("torch").need("load_example", "")(
        f"{EXAMPLES / 'transformer_lm.py'}:example"
    )
    assert isinstance(example.model, torch.nn.Module)


@pytest.mark.slow
def test_the_jax_spec_loads_a_jax_example() -> None:
    pytest.importorskip("jax")
    example = load_backend("jax").need("load_example", "")(f"{EXAMPLES / 'jax_mlp.py'}:example")
    assert example.name == "forward"


def test_a_missing_hook_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(SyncpassError, match="the jax backend has no static estimator"):
        load_backend("jax").need("estimate", "give --costs")


def test_a_command_that_needs_a_missing_hook_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["profile", str(EXAMPLES / "jax_mlp.py"), "--backend", "jax", "--static"]
    assert main([*argv, "--input-shape", "16x32", "-o", str(tmp_path / "c.json")]) == 2
    assert "the jax backend has no static estimator" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()

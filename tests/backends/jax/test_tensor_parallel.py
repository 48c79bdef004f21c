"""Tensor parallelism for Flax models: the recorder's graph, the plan the rewrite writes, and
the rewritten model run under ``jax.shard_map`` on 2 and 4 CPU devices against the unsplit
model (loss, every gradient, and the collectives of the step's lowered program)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import syncpass_process
from once import load_process, save_process, shared

ROOT = Path(__file__).resolve().parents[3]
FLAX_LM = ROOT / "examples" / "flax_lm.py"
JAX_MLP = ROOT / "examples" / "jax_mlp.py"
FAST_LINK = ROOT / "tests" / "data" / "fast_link.toml"


def _rewrite(tp: int, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return syncpass_process(
        "rewrite", str(FLAX_LM), "--backend", "jax", "--example", f"{FLAX_LM}:example",
        "--strategy", "tensor", "--tp", str(tp), "--hardware", str(FAST_LINK), "-o", str(out),
        *extra,
    )  # fmt: skip


def _run(file: Path, tp: int) -> subprocess.CompletedProcess[str]:
    return syncpass_process(
        "run", str(file), "--backend", "jax", "--example", f"{file}:example", "--tp", str(tp),
        "--verify", "--steps", "1", "--json-report", str(file.with_suffix(".json")),
    )  # fmt: skip


def made(tp: int, factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """The Flax LM rewritten for ``tp`` devices and run, once in the whole run: the file and
    the two commands' results."""

    def make(folder: Path) -> None:
        out = folder / f"flax_lm_tp{tp}.py"
        rewritten = _rewrite(tp, out)
        save_process(folder / "rewrite.json", rewritten)
        assert rewritten.returncode == 0, rewritten.stderr
        save_process(folder / "run.json", _run(out, tp))

    folder = shared(factory, f"jax-tensor-{tp}", make)
    return folder / f"flax_lm_tp{tp}.py", {
        "rewrite": load_process(folder / "rewrite.json"),
        "run": load_process(folder / "run.json"),
    }


def test_runtime_functions_are_the_identity_outside_a_shard_map() -> None:
    import jax.numpy as jnp

    from syncpass.backends.jax import tensor_parallel as tp

    x = jnp.arange(6.0).reshape(2, 3)
    assert tp.tp_size() == 1
    for function in (
        tp.copy_to_tensor_parallel_region,
        tp.reduce_from_tensor_parallel_region,
        tp.gather_from_tensor_parallel_region,
    ):
        assert function(x) is x


def test_shard_variables_splits_columns_rows_and_puts_a_row_bias_on_the_first_device() -> None:
    import jax.numpy as jnp

    from syncpass.backends.jax.tensor_parallel import shard_variables, unshard_gradients

    variables = {
        "params": {
            "blocks_0": {
                "fc": {"kernel": jnp.ones((4, 8)), "bias": jnp.ones(8)},
                "proj": {"kernel": jnp.ones((8, 4)), "bias": jnp.full(4, 2.0)},
            },
            "ln": {"scale": jnp.ones(4)},
        }
    }
    layout = {"blocks_*.fc": "column", "blocks_*.proj": "row"}
    arrays, specs = shard_variables(variables, layout, 2)
    block = specs["params"]["blocks_0"]
    assert tuple(block["fc"]["kernel"]) == (None, "tp")
    assert tuple(block["fc"]["bias"]) == ("tp",)
    assert tuple(block["proj"]["kernel"]) == ("tp", None)
    assert tuple(specs["params"]["ln"]["scale"]) == ()
    bias = arrays["params"]["blocks_0"]["proj"]["bias"]
    assert bias.tolist() == [2.0] * 4 + [0.0] * 4  # the first device adds it, once
    back = unshard_gradients(arrays, layout, 2)
    assert back["params"]["blocks_0"]["proj"]["bias"].tolist() == [2.0] * 4


def test_the_recorder_follows_the_flax_lm_module_by_module() -> None:
    from syncpass.backends.jax.example import load_jax_example
    from syncpass.backends.jax.tensor_record import record_jax_tensor_graph

    recording = record_jax_tensor_graph(
        load_jax_example(f"{FLAX_LM}:example"), FLAX_LM, flops_per_s=5e10
    )
    graph = recording.graph
    fc, proj, head = graph.op("blocks_0.fc"), graph.op("blocks_0.proj"), graph.op("head")
    assert (fc.kind, fc.in_features, fc.out_features) == ("linear", 64, 256)
    assert (proj.in_features, proj.out_features) == (256, 64)
    assert (head.kind, head.out_features) == ("linear", 256)
    assert graph.op("blocks_0.ln_2").kind == "norm"
    assert graph.op("wte").kind == "embedding"
    # Flax's attention: its projections, and its own work between them as one op.
    attention = graph.op("blocks_0.attn")
    assert (attention.kind, attention.heads) == ("attention", 4)
    assert attention.inputs == ("blocks_0.attn.query", "blocks_0.attn.key", "blocks_0.attn.value")
    query, out = graph.op("blocks_0.attn.query"), graph.op("blocks_0.attn.out")
    assert (query.kind, query.in_features, query.out_features) == ("linear", 64, 64)
    assert out.inputs == ("blocks_0.attn",) and out.in_features == 64
    assert fc.source == f"{FLAX_LM}:47" and fc.module == "blocks_0.fc"
    assert fc.inputs == ("blocks_0.ln_2",)
    assert graph.outputs == ("loss",) and graph.op("loss").inputs == ("head", "targets")
    # The inlined gelu is point-wise ops between fc and proj, all of fc's shape.
    between = graph.ops[graph.index["blocks_0.fc"] + 1 : graph.index["blocks_0.proj"]]
    assert between and {op.kind for op in between} <= {"elementwise", "add"}
    assert recording.module("blocks_0.fc") is not None
    assert recording.module("blocks_0.fc").owner_cls == "Block"  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_flax_lm_splits_as_megatron_and_verifies(
    tp: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out, done = made(tp, tmp_path_factory)
    rewrite, run = done["rewrite"], done["run"]
    assert isinstance(rewrite, subprocess.CompletedProcess)
    assert isinstance(run, subprocess.CompletedProcess)
    text = out.read_text()
    original = FLAX_LM.read_text().splitlines()
    # From the costs, not a rule: attention by heads, fc by columns, proj by rows; two
    # all-reduces a layer forward.
    assert (
        "self.attn = nn.MultiHeadDotProductAttention(num_heads=self.heads // tp_size(), "
        "qkv_features=64 // tp_size())"
    ) in text
    assert (
        "x = x + reduce_from_tensor_parallel_region(self.attn(copy_to_tensor_parallel_region(h), "
        "h, mask=mask))"
    ) in text
    assert "self.fc = nn.Dense(4 * self.width // tp_size())" in text
    assert "self.proj = nn.Dense(self.width)" in text  # a row split keeps its features
    assert (
        "x = x + reduce_from_tensor_parallel_region(self.proj(nn.gelu(self.fc("
        "copy_to_tensor_parallel_region(self.ln_2(x))))))"
    ) in text
    assert '"blocks_*.fc": "column"' in text and '"blocks_*.proj": "row"' in text
    assert '"blocks_*.attn.query": "column"' in text and '"blocks_*.attn.out": "row"' in text
    assert "# syncpass tensor: all-reduce of proj's partial sums (row-split)" in text
    # Everything else is byte for byte the original.
    kept = [line for line in text.splitlines() if line in original]
    assert len(kept) >= len(original) - 6
    assert run.returncode == 0, run.stdout + run.stderr
    assert "verify: ok: 69 parameter(s) compared" in run.stdout
    assert "collectives: match" in run.stdout
    report = json.loads(out.with_suffix(".json").read_text())
    counts = dict(report["ranks"][0]["counts"])
    assert counts["forward all-reduce"] == 8  # two per layer: after attn's out and proj
    # Per layer: one at each of query, key, value and fc (JAX sums each projection's input
    # gradient); one at the head.
    assert counts["backward all-reduce"] == 17
    assert report["engine"].startswith("JAX CPU device(s)")


@pytest.mark.slow
def test_a_file_missing_its_all_reduce_fails_the_run(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out, _ = made(2, tmp_path_factory)
    broken = tmp_path / "broken.py"
    text = out.read_text()
    assert "x = x + reduce_from_tensor_parallel_region(self.proj(" in text
    broken.write_text(
        text.replace(
            "x = x + reduce_from_tensor_parallel_region(self.proj(nn.gelu(self.fc("
            "copy_to_tensor_parallel_region(self.ln_2(x))))))",
            "x = x + self.proj(nn.gelu(self.fc(copy_to_tensor_parallel_region(self.ln_2(x)))))",
        )
    )
    done = _run(broken, 2)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "collectives: MISMATCH" in done.stdout
    assert "verify: MISMATCH" in done.stdout


def test_jax_tensor_rewrite_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    dtensor = _rewrite(2, tmp_path / "x.py", "--tp-style", "dtensor")
    assert dtensor.returncode == 2 and "--backend jax writes one form" in dtensor.stderr
    function = syncpass_process(
        "rewrite", str(JAX_MLP), "--backend", "jax", "--example", f"{JAX_MLP}:example",
        "--strategy", "tensor", "--tp", "2", "-o", str(tmp_path / "y.py"),
    )  # fmt: skip
    assert function.returncode == 2
    assert "write it as a flax.linen Module" in function.stderr
    assert not (tmp_path / "x.py").exists() and not (tmp_path / "y.py").exists()

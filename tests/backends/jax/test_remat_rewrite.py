"""``syncpass rewrite --backend jax --recompute``: the blocks the plan recomputes are
rematerialised where the model's file calls them (Flax's ``remat`` for a submodule,
``jax.checkpoint`` for a plain function), one commented line each, a loop slice split
where only some of its blocks recompute; removing what syncpass wrote gives the file back
byte for byte; what the rewrite cannot wrap is refused, nothing written. Planned from
hand-built costs (nothing runs here; ``test_jax.py``'s end-to-end run verifies the
gradients of a rematerialised Flax LM)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.jax.rewrite import strip_jax_sync_points
from syncpass.cli import main

LM = REPO / "examples" / "flax_lm.py"
LM_OPS = ("jax.numpy.arange@L68", "wte", *(f"blocks.{i}" for i in range(4)), "ln_f", "head")
MIB = 1024 * 1024
# No communication threshold, GPipe's 4 micro-batches all in flight: the plan is about memory.
PLAN = ["--backend", "jax", "--schedule", "gpipe", "--microbatches", "4", "--threshold", "inf"]


def costs_file(path: Path, ops: tuple[str, ...], memory: float, blocks: tuple[str, ...]) -> Path:
    """``blocks`` of 1 ms forward, 1 MiB saved and 64 KiB of input; the other ops 0.2 ms and
    as much saved as read; a device of ``memory``."""
    rows = []
    for depth, op_id in enumerate(ops):
        block = op_id in blocks
        rows.append(
            {
                "id": op_id,
                "compute_s": 0.001 + 0.0001 * depth if block else 0.0002,
                "backward_s": 0.002,
                "param_bytes": 100_000,
                "out_bytes": 65536,
                "saved_bytes": MIB if block else 65536,
                "input_bytes": 65536,
            }
        )
    data = {
        "version": 1,
        "model": "TransformerLM" if "blocks.0" in blocks else "forward",
        "batch_size": 8,
        "training": True,
        "memory_multiplier": 4,
        "hardware": {"alpha_s": 1e-4, "beta_bytes_per_s": 3e9, "device_memory_bytes": memory},
        "ops": rows,
        "cuts": [{"after": op_id, "live_bytes": 65536} for op_id in ops[:-1]],
    }
    path.write_text(json.dumps(data))
    return path


def rewrite(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(["rewrite", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_flax_blocks_the_plan_recomputes_are_rematerialised_in_their_loop_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two blocks stored for 4 micro-batches in flight do not fit in 3 MiB with the weights:
    # each stage recomputes one of its two, the cheaper (the first).
    costs = costs_file(tmp_path / "lm.costs.json", LM_OPS, 3 * MIB, LM_OPS[2:6])
    argv = [str(LM), "--costs", str(costs), *PLAN, "--stages", "2", "--recompute", "auto"]
    status, out, err = rewrite(argv, capsys)
    assert status == 0, err
    assert "stage 0 recomputes blocks.0 " in err and "stage 1 recomputes blocks.2 " in err
    lines = [line.strip() for line in out.splitlines()]
    loops = [line for line in lines if line.startswith("for block")]
    assert loops == [
        "for block in self.blocks[:1]:",
        "for block in self.blocks[1:2]:",
        "for block in self.blocks[2:3]:",
        "for block in self.blocks[3:]:",
    ]
    bodies = [lines[lines.index(loop) + 1 : lines.index(loop) + 3] for loop in loops]
    remat = "x = nn.remat(lambda block, x: block(x))(block, x)"
    for body, block in ((bodies[0], 0), (bodies[2], 2)):
        assert body[0].startswith(f"# syncpass recompute: blocks.{block}; frees ")
        assert body[1] == remat
    assert bodies[1][0] == bodies[3][0] == "x = block(x)"
    assert out.count("nn.remat(") == 2
    # The sync point is between the two stages' slices.
    (sync,) = [at for at, line in enumerate(lines) if line.startswith("x = jax.device_put(")]
    assert lines.index(loops[1]) < sync < lines.index(loops[2])
    # Removing what syncpass wrote gives the file back, the stripped loop whole again.
    assert strip_jax_sync_points(out, "lm_sync.py") == LM.read_text()


def test_a_plain_jax_function_checkpoints_its_calls_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mlp.py"
    source.write_text(
        textwrap.dedent(
            """\
            import jax.numpy as jnp


            def layer(p, h, training=False):
                return jnp.tanh(h @ p["w"]) if training else h @ p["w"]


            def forward(params, x):
                h = layer(params["l0"], x)
                h = layer(params["l1"], h)  # the wide one
                h = layer(params["l2"], h, training=True)
                return h @ params["out"]
            """
        )
    )
    ops = ("l0", "l1", "l2", "out")
    costs = costs_file(tmp_path / "mlp.costs.json", ops, 64 * MIB, ops[:3])
    argv = [str(source), "--costs", str(costs), *PLAN, "--stages", "2", "--recompute", "all"]
    status, out, err = rewrite([*argv, "--cuts", "l1"], capsys)
    assert status == 0, err
    lines = [line.strip() for line in out.splitlines()]
    calls = [line for line in lines if "jax.checkpoint(" in line]
    assert calls == [
        'h = jax.checkpoint(layer)(params["l0"], x)',
        'h = jax.checkpoint(layer)(params["l1"], h)  # the wide one',
        # A Python value it passes is closed over: jax.checkpoint would trace it.
        'h = jax.checkpoint(lambda: layer(params["l2"], h, training=True))()',
    ]
    # Each has its comment above (too wide beside it; a comment of the user's stays).
    for call, op in zip(calls, ops, strict=False):
        assert lines[lines.index(call) - 1].startswith(f"# syncpass recompute: {op}; frees ")
    assert "import jax  # syncpass sync: imported for the transfers" in out
    assert strip_jax_sync_points(out, "mlp_sync.py") == source.read_text()


def test_a_statement_that_calls_no_function_by_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mlp = REPO / "examples" / "jax_mlp.py"
    ops = ("w1", "w2", "w3", "w4", "w5")
    costs = costs_file(tmp_path / "mlp.costs.json", ops, 64 * MIB, ops[:4])
    out_file = tmp_path / "mlp_sync.py"
    argv = [str(mlp), "--costs", str(costs), *PLAN, "--stages", "2", "--recompute", "all"]
    status, out, err = rewrite([*argv, "-o", str(out_file)], capsys)
    assert status == 2 and out == "" and not out_file.exists()
    assert "w1: the JAX rewrite rematerialises a statement that calls one function by its " in err
    assert "name (f(...)), and this one calls 0" in err
    assert str(mlp) in err


def test_a_scan_over_stacked_layers_recomputes_its_steps_in_sub_scans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The canonical JAX layer stack, one ``jax.lax.scan`` over stacked weights: a piece
    whose layers recompute scans ``jax.checkpoint(step)``, split where only some do."""
    scan = REPO / "tests" / "data" / "jax_scan_layers.py"
    ops = ("jax.numpy.tril@L24", "embed", *(f"layers.{i}" for i in range(6)), "head")
    costs = costs_file(tmp_path / "scan.costs.json", ops, 3.5 * MIB, ops[2:8])
    document = json.loads(costs.read_text())
    costs.write_text(json.dumps({**document, "model": "forward"}))
    argv = [str(scan), "--costs", str(costs), *PLAN, "--stages", "2", "--recompute", "auto"]
    status, out, err = rewrite(argv, capsys)
    assert status == 0, err
    assert "stage 0 recomputes layers.0, layers.1 " in err
    assert "stage 1 recomputes layers.3, layers.4 " in err
    lines = [line.strip() for line in out.splitlines()]
    # Each piece is laid out one argument a line (too wide for one): its step is the line
    # after the opening one, its slice the one after the carry.
    opened = [index for index, line in enumerate(lines) if line.startswith("x, _ = jax.lax.scan(")]
    step = "functools.partial(block, mask=mask)"
    slices = ["w[:2]", "w[2:3]", "w[3:5]", "w[5:]"]
    assert all(
        lines[index + 3].startswith(f"jax.tree.map(lambda w: {part},")
        for index, part in zip(opened, slices, strict=True)
    )
    checkpointed = [lines[index + 1] == f"jax.checkpoint({step})," for index in opened]
    assert checkpointed == [True, False, True, False]
    for index, ops_named in ((opened[0], "layers.0, layers.1"), (opened[2], "layers.3, layers.4")):
        assert lines[index - 1].startswith(f"# syncpass recompute: {ops_named}; ")
    assert strip_jax_sync_points(out, "scan_sync.py") == scan.read_text()

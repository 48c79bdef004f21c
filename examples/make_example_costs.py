"""Write the bundled example cost files from first-principles estimates.

The figures are estimates, not measurements: each op's time is its FLOP
count at a sustained rate, its sizes follow from the layer shapes. They are
realistic enough to show how plans differ; ``syncpass profile`` measures a
real model instead. Run ``python examples/make_example_costs.py`` to
regenerate ``examples/costs/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent / "costs"
FP32 = 4


def gpt_costs(
    layers: int = 24,
    width: int = 1024,
    seq: int = 1024,
    vocab: int = 50257,
    batch: int = 8,
    flops_per_s: float = 50e12,
) -> dict[str, Any]:
    """A decoder-only transformer LM, one op per attention and per MLP block.

    Attention and MLP alternate with a large embedding (many parameters, no
    compute) and a large LM head (both), so rules that balance op counts or
    parameter bytes misplace the sync points.
    """
    tokens = batch * seq
    activation = tokens * width * FP32

    def op(name: str, flops: float, params: float, out: float) -> dict[str, Any]:
        forward = flops / flops_per_s
        return {
            "id": name,
            "compute_s": forward,
            "backward_s": 2 * forward,  # grads of inputs and of weights
            "param_bytes": params * FP32,
            "out_bytes": out,
            "flops": flops,
        }

    ops = [op("wte", 0.0, vocab * width + seq * width, activation)]
    for index in range(layers):
        attention_flops = 2 * tokens * 4 * width * width + 2 * 2 * batch * seq * seq * width
        ops.append(op(f"blocks.{index}.attn", attention_flops, 4 * width * width, activation))
        ops.append(
            op(f"blocks.{index}.mlp", 2 * tokens * 8 * width * width, 8 * width * width, activation)
        )
    ops.append(op("ln_f", 5.0 * tokens * width, 2 * width, activation))
    ops.append(op("lm_head", 2.0 * tokens * width * vocab, vocab * width, tokens * vocab * FP32))
    # Between any two ops only the residual stream (batch, seq, width) is live.
    cuts = [{"after": entry["id"], "live_bytes": activation} for entry in ops[:-1]]
    return {
        "version": 1,
        "model": f"gpt-{layers}x{width}",
        "batch_size": batch,
        "training": True,
        "memory_multiplier": 4,
        "hardware": {
            "name": "8 GPUs over PCIe 4.0 (estimate)",
            "alpha_s": 1e-05,
            "beta_bytes_per_s": 16e9,
            "device_memory_bytes": 24 * 2**30,
            "flops_per_s": flops_per_s,
        },
        "config": {
            "strategy": "adaptive",
            "min_sync_interval": 1,
            "communication_cost_threshold": 0.1,
        },
        "ops": ops,
        "cuts": cuts,
    }


def main() -> None:
    HERE.mkdir(exist_ok=True)
    target = HERE / "gpt_24x1024.costs.json"
    target.write_text(json.dumps(gpt_costs(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

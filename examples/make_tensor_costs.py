"""Write the bundled tensor-parallel example cost file from first-principles estimates.

``examples/costs/gpt_tp_4096.costs.json`` is a 4-layer GPT at Llama-7B-class widths
(width 4096, 32 heads, sequence 2048, batch 1, bf16) on one 8x H100 NVLink node: its
tensor graph (``$.tensor``) says what ``syncpass plan --strategy tensor`` needs, each
op's time its FLOP count (or bytes moved) at a sustained rate; its pipeline ops are the
same figures summed per block, so ``--stages`` plans it too. Run
``python examples/make_tensor_costs.py`` to regenerate it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syncpass.contracts.costs import Costs, CutCost, Hardware, OpCost, costs_to_json
from syncpass.contracts.hardware import load_profile
from syncpass.contracts.tensor import TensorGraph, TransformerShape, transformer_graph

HERE = Path(__file__).parent / "costs"


def _block(op_id: str) -> str:
    """The pipeline op a tensor op belongs to: ``h.3.attn.q_proj`` -> ``h.3``; the embedding
    before the layers, the final norm, head and loss after them."""
    parts = op_id.split(".")
    if parts[0] == "h":
        return ".".join(parts[:2])
    return "embed" if op_id in ("idx", "wte") else "head"


def costs_for(graph: TensorGraph, hardware: Hardware, model: str) -> Costs:
    """A cost file holding ``graph``, with one pipeline op per block."""
    blocks: dict[str, list[float]] = {}
    for op in graph.ops:
        totals = blocks.setdefault(_block(op.id), [0.0, 0.0, 0.0, 0.0])
        totals[0] += op.compute_s
        totals[1] += op.backward_s
        totals[2] += op.param_bytes
        totals[3] = op.out_bytes
    ops = tuple(
        OpCost(name, compute_s=f, backward_s=b, param_bytes=p, out_bytes=o)
        for name, (f, b, p, o) in blocks.items()
    )
    residual = graph.op("wte").out_bytes
    cuts = tuple(CutCost(op.id, residual) for op in ops[:-1])
    return Costs(
        batch_size=graph.batch_size,
        training=True,
        memory_multiplier=4,
        hardware=hardware,
        ops=ops,
        cuts=cuts,
        model=model,
        tensor=graph,
    )


def gpt_tp_costs() -> dict[str, Any]:
    hardware = load_profile("nvlink-8xh100").hardware
    assert hardware.flops_per_s is not None
    shape = TransformerShape(layers=4, width=4096, heads=32, sequence=2048, batch_size=1)
    graph = transformer_graph(shape, flops_per_s=hardware.flops_per_s)
    return costs_to_json(costs_for(graph, hardware, "gpt-4x4096"))


def main() -> None:
    HERE.mkdir(exist_ok=True)
    target = HERE / "gpt_tp_4096.costs.json"
    target.write_text(json.dumps(gpt_tp_costs(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()

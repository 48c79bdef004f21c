"""syncpass's tensor-parallel plan against Megatron-LM's hand placement and against
replicating every layer, for GPT sizes from 125M to a 70B-class width, at TP 2, 4 and 8
on the shipped GPU profiles: the predicted step of each, and how much faster syncpass's
is.

The tensor graphs are first-principles estimates (:func:`~syncpass.contracts.tensor.
transformer_graph`: each op's FLOPs at the profile's rate, bytes from the shapes, bf16),
the whole stack (embedding, every block, the head and its loss), one sequence a step
per tensor-parallel group; all three placements are scored by the same cost model
(:mod:`syncpass.plan.tensor_optimizer`), Megatron's with its two all-reduces a block
forward and two backward, the embedding by vocabulary and the head by columns
(:mod:`syncpass.plan.tensor_baselines`). Nothing runs on a GPU: this is what the plan
predicts for the profiles, to be read beside a measured run on such a machine.

    PYTHONPATH=. python bench/bench_tensor.py [--hardware nvlink-8xh100,pcie4-gpus] [--json]
        [--sizes 125M,6.7B] [--no-sequence-parallel]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from syncpass.contracts.hardware import load_profile
from syncpass.contracts.tensor import TransformerShape, transformer_graph
from syncpass.core.errors import SyncpassError
from syncpass.plan.tensor_plan import PlanCost, plan_cost_to_json
from syncpass.plan.tensor_planner import TensorRequest, link_for, plan_tensor


@dataclass(frozen=True)
class Size:
    """A GPT size: its name and decoder shape."""

    name: str
    shape: TransformerShape


#: GPT-3's table (Brown et al., 2020) for the small ones, Llama-3-70B's width and heads
#: (grouped-query attention, 8 key/value heads) for the largest.
SIZES = (
    Size("125M", TransformerShape(layers=12, width=768, heads=12, sequence=2048)),
    Size("350M", TransformerShape(layers=24, width=1024, heads=16, sequence=2048)),
    Size("1.3B", TransformerShape(layers=24, width=2048, heads=16, sequence=2048)),
    Size("6.7B", TransformerShape(layers=32, width=4096, heads=32, sequence=2048)),
    Size("13B", TransformerShape(layers=40, width=5120, heads=40, sequence=2048)),
    Size(
        "70B-class",
        TransformerShape(layers=80, width=8192, heads=64, kv_heads=8, sequence=4096, vocab=128256),
    ),
)
TPS = (2, 4, 8)
HARDWARE = ("nvlink-8xh100", "pcie4-gpus")


@dataclass(frozen=True)
class Row:
    """One size at one tensor-parallel degree on one profile: each placement's cost."""

    size: str
    hardware: str
    tp: int
    syncpass: PlanCost
    megatron: PlanCost
    replicated: PlanCost

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "hardware": self.hardware,
            "tp": self.tp,
            "syncpass": plan_cost_to_json(self.syncpass),
            "megatron": plan_cost_to_json(self.megatron),
            "replicated": plan_cost_to_json(self.replicated),
        }


def planned(size: Size, hardware: str, tp: int, sequence_parallel: bool = True) -> Row | str:
    """``size`` planned for ``tp`` devices of ``hardware``, beside the two hand placements;
    or why no plan is made (no layout fits the device's memory)."""
    profile = load_profile(hardware).hardware
    assert profile.flops_per_s is not None
    graph = transformer_graph(size.shape, flops_per_s=profile.flops_per_s)
    try:
        request = TensorRequest(tp, sequence_parallel=sequence_parallel, explain=False)
        plan = plan_tensor(graph, link_for(profile), request)
    except SyncpassError as error:
        return f"{size.name} on {hardware} at tp {tp}: {error.message}"
    baselines = {cost.name: cost for cost in plan.baselines}
    return Row(size.name, hardware, tp, plan.cost, baselines["megatron"], baselines["replicated"])


def _ms(cost: PlanCost) -> str:
    return f"{cost.step_s * 1e3:9.2f}" + ("" if cost.fits else "*")


def render(rows: list[Row], refused: list[str]) -> str:
    lines = [
        f"{'model':10} {'hardware':14} {'tp':>3} {'syncpass':>10} {'megatron':>10} "
        f"{'replicated':>11} {'vs megatron':>12} {'vs replicated':>14}  collectives fwd/bwd",
    ]
    for row in rows:
        lines.append(
            f"{row.size:10} {row.hardware:14} {row.tp:3d} {_ms(row.syncpass):>10} "
            f"{_ms(row.megatron):>10} {_ms(row.replicated):>11} "
            f"{row.megatron.step_s / row.syncpass.step_s:11.3f}x "
            f"{row.replicated.step_s / row.syncpass.step_s:13.3f}x  "
            f"{row.syncpass.forward_collectives}/{row.syncpass.backward_collectives} "
            f"(megatron {row.megatron.forward_collectives}/{row.megatron.backward_collectives})"
        )
    lines.append(
        "steps in ms a training step (forward and backward) of one sequence; * does not fit "
        "the device's memory"
    )
    lines += refused
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default=",".join(HARDWARE))
    parser.add_argument("--sizes", default=",".join(size.name for size in SIZES))
    parser.add_argument("--json", action="store_true", help="the rows as JSON")
    parser.add_argument(
        "--no-sequence-parallel",
        action="store_true",
        help="plan without splitting the values between the layers by sequence",
    )
    args = parser.parse_args(argv)
    wanted = args.sizes.split(",")
    made = [
        planned(size, hardware, tp, not args.no_sequence_parallel)
        for hardware in args.hardware.split(",")
        for size in SIZES
        if size.name in wanted
        for tp in TPS
        if size.shape.heads % tp == 0  # attention splits by heads (GPT-3 125M's 12 at TP 8)
    ]
    rows = [row for row in made if isinstance(row, Row)]
    refused = [row for row in made if isinstance(row, str)]
    if args.json:
        document = {"rows": [row.to_json() for row in rows], "refused": refused}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(render(rows, refused))
    return 0


if __name__ == "__main__":
    sys.exit(main())

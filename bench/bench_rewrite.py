"""Speed of ``syncpass rewrite --costs`` against a bare libcst parse and print.

A generated model file of about 5,000 lines (helper functions and classes, and a
model whose forward runs a few hundred ops and a loop over a layer container) is
rewritten for 8 stages from a cost file, and checked again once rewritten (the
``--check`` of a pre-commit hook), in the same run as a bare
``libcst.parse_module(text).code`` of the same file. The pass must take at most
3x the bare parse and print. No torch is imported and no model code runs.

    python bench/bench_rewrite.py [--lines 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import libcst as cst

from syncpass.backends.torch.analysis import analyse_model, loop_containers
from syncpass.backends.torch.backend import BACKEND as TORCH
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.frontend import parse_source
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import rewrite_text

TARGET_RATIO = 3.0
LAYERS = 48


def helper_block(index: int) -> str:
    """Filler a real model file has: a helper function and a small module class."""
    return f'''

def scale_{index}(x, factor: float = {index}.0):
    """Scale ``x`` (helper {index})."""
    if factor == 0:
        raise ValueError("factor must not be zero")
    # keep the comment and the odd spacing: ( x )
    return x * ( factor / 2 )


class Adapter{index}(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        y = self.proj(x)
        y = F.gelu(y)
        return self.norm(y + x)
'''


def model_class(statements: int) -> str:
    lines = [
        "",
        "",
        "class BigModel(nn.Module):",
        "    def __init__(self, width: int = 64) -> None:",
        "        super().__init__()",
        f"        self.blocks = nn.ModuleList([Adapter0(width) for _ in range({LAYERS})])",
    ]
    lines += [f"        self.layer{i} = nn.Linear(width, width)" for i in range(statements)]
    lines += ["", "    def forward(self, x):", "        h = x"]
    half = statements // 2
    for i in range(half):
        lines.append(f"        h = torch.relu(self.layer{i}(h))  # layer {i}")
    lines += ["        for block in self.blocks:", "            h = block(h)"]
    for i in range(half, statements):
        lines.append(f"        h = self.layer{i}(h) + h")
    lines.append("        return h")
    return "\n".join(lines) + "\n"


def generated_model(target_lines: int) -> str:
    header = '"""A generated model file."""\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n'
    statements = 300
    body = model_class(statements)
    blocks: list[str] = []
    index = 0
    while (header + "".join(blocks) + body).count("\n") < target_lines:
        blocks.append(helper_block(index))
        index += 1
    return header + "".join(blocks) + body


def synthetic_costs(text: str) -> Costs:
    """Costs for every op of the generated model (no measurement: this times the pass)."""
    module = parse_source(text, "big_model.py")
    sizes = {name: LAYERS for name in loop_containers(module, "BigModel", "big_model.py")}
    graph = analyse_model(module, "big_model.py", "BigModel", sizes)
    ops = [
        {"id": op.id, "compute_s": 1e-3 * (1 + i % 7), "backward_s": 2e-3, "param_bytes": 16384}
        for i, op in enumerate(graph.ops)
    ]
    cuts = [{"after": cut.after, "live_bytes": 262144 * len(cut.live)} for cut in graph.cuts]
    return parse_costs(
        {
            "version": 1,
            "model": "BigModel",
            "batch_size": 32,
            "training": True,
            "memory_multiplier": 4,
            "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
            "ops": ops,
            "cuts": cuts,
        }
    )


def best_and_median(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    text = generated_model(args.lines)
    costs = synthetic_costs(text)
    request = PlanRequest(stages=8, config=SyncConfig())
    rewritten = rewrite_text(text, "big_model.py", TORCH, request, costs).rewritten
    assert rewrite_text(rewritten, "big_model.py", TORCH, request, costs).rewritten == rewritten

    bare = best_and_median(lambda: cst.parse_module(text).code, args.repeats)
    first = best_and_median(
        lambda: rewrite_text(text, "big_model.py", TORCH, request, costs), args.repeats
    )
    again = best_and_median(
        lambda: rewrite_text(rewritten, "big_model.py", TORCH, request, costs), args.repeats
    )
    print(
        f"model file: {text.count(chr(10))} lines, {len(costs.ops)} ops in forward, "
        f"{len(costs.cuts)} candidate cuts, 8 stages; best / median of {args.repeats}"
    )
    print(f"{'':34}{'best':>10}{'median':>10}{'ratio':>8}")
    rows = [
        ("bare libcst parse + print", bare),
        ("rewrite (plain source)", first),
        ("rewrite --check (rewritten source)", again),
    ]
    worst = 0.0
    for name, (best, median) in rows:
        ratio = median / bare[1]
        if name != rows[0][0]:
            worst = max(worst, ratio)
        print(f"{name:34}{best:>9.3f}s{median:>9.3f}s{ratio:>7.2f}x")
    verdict = "MET" if worst <= TARGET_RATIO else "NOT MET"
    print(f"target: at most {TARGET_RATIO:.0f}x the bare parse and print: {verdict} ({worst:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

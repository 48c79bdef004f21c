"""Speed of ``syncpass rewrite --costs`` against a bare libcst parse and print.

A generated model file (helper functions and small module classes, and a model
whose forward runs a few hundred ops and a loop over a layer container) is
rewritten for 8 stages from a cost file, in both torch forms (``pipe_split()``
marks, backend ``torch``, and the eager stage classes, backend
``torch_stages``), and checked again once rewritten (the ``--check`` of a
pre-commit hook), in the same run as a bare ``libcst.parse_module(text).code``
of the same file. It runs at two sizes, the second grown the same way (more
helpers): the pass must take at most 3x the bare parse and print at about 4,500
lines and at most 2x at 20,000 lines, which it can only do if its cost grows
with the file and not with classes x file. The rewrites are timed in rounds
with the bare round trip, and each ratio is the median of the rounds' ratios, so
that a shared machine's changing load weighs on both sides. No torch is imported
and no model code runs.

    python bench/bench_rewrite.py [--lines 4500 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import libcst as cst

from syncpass.backends.registry import load_backend
from syncpass.backends.spec import Backend
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import rewrite_text
from syncpass.rewrite.source import KnownOps

#: The most the whole rewrite may take, as a multiple of the bare parse and print,
#: by file size: (lines up to, ratio). Larger files must come closer to the bare
#: round trip, since the work the pass adds to it is the model's, not the file's.
TARGETS = ((10_000, 3.0), (None, 2.0))
LAYERS = 48
FORMS = (("pipe_split", "torch"), ("eager stages", "torch_stages"))


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


def target_ratio(lines: int) -> float:
    """The most the rewrite may take at ``lines`` lines, as a multiple of the bare round trip."""
    return next(ratio for bound, ratio in TARGETS if bound is None or lines <= bound)


def synthetic_costs(text: str, backend: Backend) -> Costs:
    """Costs for every op of the generated model as ``backend`` plans it (no
    measurement: this times the pass)."""
    known = KnownOps("BigModel", (), (("blocks", LAYERS),))
    graph = backend.analyse(text, "big_model.py", known, "BigModel").graph
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


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_size(lines: int, repeats: int) -> bool:
    """Time both forms on a file of about ``lines`` lines and print the table: whether
    both met the target for that size.

    Each round times the bare round trip and then every rewrite, one after the other,
    and a rewrite's ratio is the median over rounds of its time over that round's bare
    time: on a shared machine the load moves between rounds, and so a ratio compares
    times taken under the same load."""
    text = generated_model(lines)
    request = PlanRequest(stages=8, config=SyncConfig())
    runs: dict[str, Callable[[], object]] = {
        "bare libcst parse + print": lambda: cst.parse_module(text).code
    }
    sizes = []
    for form, name in FORMS:
        backend = load_backend(name)
        costs = synthetic_costs(text, backend)
        rewritten = rewrite_text(text, "big_model.py", backend, request, costs).rewritten
        again = rewrite_text(rewritten, "big_model.py", backend, request, costs).rewritten
        assert again == rewritten, f"{form}: a second rewrite changed the file"
        sizes.append(f"{form} {len(costs.ops)} ops")
        runs[f"{form}: rewrite"] = partial(
            rewrite_text, text, "big_model.py", backend, request, costs
        )
        runs[f"{form}: rewrite --check"] = partial(
            rewrite_text, rewritten, "big_model.py", backend, request, costs
        )
    times: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(repeats):
        for label, run in runs.items():
            times[label].append(timed(run))
    bare = times["bare libcst parse + print"]
    count = text.count(chr(10))
    target = target_ratio(count)
    print(
        f"model file: {count} lines, {', '.join(sizes)} in forward, "
        f"8 stages; best / median of {repeats} rounds"
    )
    print(f"{'':36}{'best':>10}{'median':>10}{'ratio':>8}")
    met = True
    for label, taken in times.items():
        ratio = statistics.median(t / b for t, b in zip(taken, bare, strict=True))
        verdict = ""
        if taken is not bare:
            verdict = "  MET" if ratio <= target else "  NOT MET"
            met = met and ratio <= target
        best, median = min(taken), statistics.median(taken)
        print(f"{label:36}{best:>9.3f}s{median:>9.3f}s{ratio:>7.2f}x{verdict}")
    verdict = "MET" if met else "NOT MET"
    print(f"target at {count} lines: at most {target:.0f}x the bare parse and print: {verdict}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, nargs="+", default=[4500, 20000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = []
    for lines in args.lines:
        results.append(bench_size(lines, args.repeats))
        print()
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

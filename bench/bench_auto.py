"""`--stages auto` checked for real: the stage count it picks, against the fastest one `run` finds.

Each bundled example, scaled as in ``bench_real.py``, is profiled once on this machine
(so the cost file records its devices: the cores, one thread per stage), planned with
``--stages auto``, and rewritten for every stage count from 1 to ``--max-stages``; every
one runs as a real pipeline over gloo (1F1B, ``max(4, stages)`` micro-batches), several
rounds in rotated order, keeping each count's fastest median step. It prints the
measured step per stage count, the count auto picked, the fastest, and the pick's step
over the fastest (the target: within 10%).

    python bench/bench_auto.py [--steps 5] [--rounds 2] [--max-stages 4] [--examples resnet,unet]

Everything runs on this machine's CPU; figures move with the load on it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real import MICROBATCHES, MODELS, quietly, scaled_source  # type: ignore[import-not-found]

TARGET = 1.10


def picked_stages(folder: Path, name: str, costs: Path, depth: int) -> int:
    """The stage count ``rewrite --stages auto`` writes."""
    out = folder / f"{name}_auto.py"
    argv = ["rewrite", str(folder / f"{name}.py"), "--costs", str(costs), "--stages", "auto"]
    if quietly([*argv, "--depth", str(depth), "-o", str(out)]) != 0:
        raise SystemExit(f"planning {name} with --stages auto failed")
    return len(re.findall(r"# syncpass sync ", out.read_text())) + 1


def measured_steps(
    folder: Path, name: str, costs: Path, depth: int, counts: range, steps: int, rounds: int
) -> dict[int, float]:
    """Each stage count's fastest median step over ``rounds`` rotated rounds."""
    files = {}
    for stages in counts:
        target = folder / f"{name}_{stages}.py"
        argv = ["rewrite", str(folder / f"{name}.py"), "--costs", str(costs)]
        argv += ["--stages", str(stages), "--depth", str(depth), "-o", str(target)]
        if quietly(argv) == 0:
            files[stages] = target
    best: dict[int, float] = {}
    order = list(files)
    for round_index in range(rounds):
        shift = round_index % len(order)
        for stages in order[shift:] + order[:shift]:
            report = folder / f"{name}_{stages}.json"
            argv = ["run", str(files[stages]), "--stages", str(stages), "--steps", str(steps)]
            argv += ["--microbatches", str(max(MICROBATCHES, stages))]
            if quietly([*argv, "--json-report", str(report)]) != 0:
                continue
            document = json.loads(report.read_text())
            step = max(stage["step_s"] for stage in document["stage_reports"])
            best[stages] = min(best.get(stages, step), step)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-stages", type=int, default=4)
    parser.add_argument("--examples", default=",".join(MODELS))
    args = parser.parse_args()
    names = args.examples.split(",")
    counts = range(1, args.max_stages + 1)
    header = "".join(f"{f'{s} stage(s)':>12}" for s in counts)
    print(f"{'example':16}{header}{'auto':>6}{'fastest':>9}{'auto/fastest':>14}")
    met = 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in names:
            model = MODELS[name]
            (folder / f"{name}.py").write_text(scaled_source(name, model))
            costs = folder / f"{name}.costs.json"
            argv = ["profile", str(folder / f"{name}.py"), "--depth", str(model.depth)]
            if quietly([*argv, "-o", str(costs)]) != 0:
                raise SystemExit(f"profiling {name} failed")
            auto = picked_stages(folder, name, costs, model.depth)
            steps = measured_steps(
                folder, name, costs, model.depth, counts, args.steps, args.rounds
            )
            fastest = min(steps, key=steps.__getitem__)
            ratio = steps[auto] / steps[fastest] if auto in steps else float("nan")
            met += ratio <= TARGET
            cells = "".join(
                f"{steps[s] * 1e3:>10.1f}ms" if s in steps else f"{'failed':>12}" for s in counts
            )
            print(f"{name:16}{cells}{auto:>6}{fastest:>9}{ratio:>13.2f}x")
    print()
    print(
        f"auto within {TARGET - 1:.0%} of the fastest measured stage count: {met} of {len(names)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

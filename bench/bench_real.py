"""Plans run for real: syncpass against the rules people use, measured in one run.

Each bundled example is profiled once, then planned for 2 stages with syncpass
(``adaptive``) and with the ``uniform``, ``parameters`` and ``time`` rules on the
same costs; every plan is written into the source and run as a real pipeline over
gloo processes (1F1B, 4 micro-batches, a few steps after a warm-up), with the cost
model's prediction beside it. It prints the measured step time of each plan, the
speedup of syncpass over each rule, and predicted/measured.

    python bench/bench_real.py [--steps 5] [--rounds 3] [--examples transformer_lm,resnet,unet]

Everything runs on this machine's CPU; figures move with the load on it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from syncpass.cli import main as syncpass

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STRATEGIES = ("adaptive", "uniform", "parameters", "time")


def quietly(argv: list[str]) -> int:
    """Run a syncpass command, keeping its output out of the table."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return syncpass(argv)


def measure(
    folder: Path, name: str, stages: int, steps: int, rounds: int
) -> list[tuple[str, float, float, str]]:
    """(strategy, measured step, predicted step, sync points) for each strategy.

    Every plan runs ``rounds`` times, in a rotated order each round, and keeps its
    fastest median step: on a shared machine the load drifts, and whichever plan
    ran first or last would otherwise carry it.
    """
    source = folder / f"{name}.py"
    shutil.copy(EXAMPLES / f"{name}.py", source)
    costs = folder / f"{name}.costs.json"
    if quietly(["profile", str(source), "-o", str(costs)]) != 0:
        raise SystemExit(f"profiling {name} failed")
    planned: dict[str, Path] = {}
    for strategy in STRATEGIES:
        target = folder / f"{name}_{strategy}.py"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", str(stages)]
        if quietly([*argv, "--strategy", strategy, "-o", str(target)]) == 0:
            planned[strategy] = target
    best: dict[str, float] = {}
    prediction: dict[str, dict[str, Any]] = {}
    for round_index in range(rounds):
        order = STRATEGIES[round_index % 4 :] + STRATEGIES[: round_index % 4]
        for strategy in (s for s in order if s in planned):
            report = folder / f"{name}_{strategy}.json"
            argv = ["run", str(planned[strategy]), "--stages", str(stages)]
            argv += ["--microbatches", "4", "--steps", str(steps), "--costs", str(costs)]
            if quietly([*argv, "--json-report", str(report)]) != 0:
                continue
            prediction[strategy] = json.loads(report.read_text())["prediction"]
            measured = prediction[strategy]["measured_step_s"]
            best[strategy] = min(best.get(strategy, math.inf), measured)
    rows = []
    for strategy in STRATEGIES:
        if strategy not in best:
            rows.append((strategy, math.nan, math.nan, "no plan or failed run"))
            continue
        found = prediction[strategy]
        cuts = ", ".join(found["sync_points"])
        rows.append((strategy, best[strategy], found["predicted_step_s"], cuts))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", default="transformer_lm,resnet,unet")
    args = parser.parse_args()
    print(
        f"{'example':16}{'strategy':12}{'measured':>10}{'syncpass speedup':>18}"
        f"{'predicted':>11}{'pred/meas':>11}  sync points"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.examples.split(","):
            rows = measure(Path(scratch), name, args.stages, args.steps, args.rounds)
            ours = rows[0][1]
            for strategy, measured, predicted, cuts in rows:
                speedup = "-" if strategy == "adaptive" else f"{measured / ours:.2f}x"
                print(
                    f"{name:16}{strategy:12}{measured * 1e3:>8.1f}ms{speedup:>18}"
                    f"{predicted * 1e3:>9.2f}ms{predicted / measured:>11.2f}  {cuts}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

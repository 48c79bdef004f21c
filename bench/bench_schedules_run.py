"""One stage per rank against several: 1F1B on 2 ranks x 1 stage against interleaved 1F1B on
2 ranks x 2 stages, measured for real with ``syncpass run``.

``examples/transformer_lm.py``, scaled as in ``bench_real.py``, is profiled once, then
rewritten (eager stages) to 2 stages and to 4; 1F1B runs the 2-stage file (``--stages 2``),
the multi-stage schedules the 4-stage one (``--stages 2 --stages-per-device 2``), with the
same micro-batches. The runs alternate (A, B, A, B, ... for ``--rounds`` rounds), so drift in
the machine's load falls on both; each run's step is its slowest rank's median step
(``--json-report``: ``stage_reports[].step_s``), and the table shows each schedule's median
over the rounds, its compute share, and its step over 1F1B's.

    python bench/bench_schedules_run.py [--rounds 5] [--steps 5] [--microbatches 8]
                                        [--schedules interleaved-1f1b,zbv]

Everything runs on this machine's CPU, one thread per process; figures move with its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real import MODELS, quietly, scaled_source  # type: ignore[import-not-found]

NAME = "transformer_lm"
BASELINE = "1f1b"


def rewrite(folder: Path, costs: Path, stages: int) -> Path:
    out = folder / f"{NAME}_{stages}.py"
    argv = ["rewrite", str(folder / f"{NAME}.py"), "--costs", str(costs), "--stages", str(stages)]
    if quietly([*argv, "-o", str(out)]) != 0:
        raise SystemExit(f"rewriting {NAME} to {stages} stages failed")
    return out


def run_once(
    path: Path, schedule: str, per_device: int, steps: int, microbatches: int
) -> dict[str, Any]:
    """One ``syncpass run``: the slowest rank's median step and its compute."""
    report = path.with_name(f"{path.stem}_{schedule}.json")
    argv = ["run", str(path), "--stages", "2", "--stages-per-device", str(per_device)]
    argv += ["--schedule", schedule, "--steps", str(steps), "--microbatches", str(microbatches)]
    if quietly([*argv, "--json-report", str(report)]) != 0:
        raise SystemExit(f"syncpass run {schedule} failed; run it by hand to see why")
    ranks = json.loads(report.read_text())["stage_reports"]
    slowest = max(ranks, key=lambda rank: rank["step_s"])
    return {"step_s": slowest["step_s"], "compute_s": max(r["compute_s"] for r in ranks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--schedules", default="interleaved-1f1b")
    args = parser.parse_args()
    others = [name for name in args.schedules.split(",") if name]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / f"{NAME}.py").write_text(scaled_source(NAME, MODELS[NAME]))
        costs = folder / "costs.json"
        argv = ["profile", str(folder / f"{NAME}.py"), "--example", f"{folder / NAME}.py:example"]
        if quietly([*argv, "-o", str(costs)]) != 0:
            raise SystemExit(f"profiling {NAME} failed")
        files = {1: rewrite(folder, costs, 2), 2: rewrite(folder, costs, 4)}
        plan = [(BASELINE, 1), *((schedule, 2) for schedule in others)]
        steps: dict[str, list[float]] = {name: [] for name, _ in plan}
        computes: dict[str, list[float]] = {name: [] for name, _ in plan}
        for _ in range(args.rounds):
            for schedule, per_device in plan:  # alternated: A, B, A, B, ...
                figures = run_once(
                    files[per_device], schedule, per_device, args.steps, args.microbatches
                )
                steps[schedule].append(figures["step_s"])
                computes[schedule].append(figures["compute_s"])
    baseline = statistics.median(steps[BASELINE])
    scale = MODELS[NAME].constants
    print(
        f"{NAME} ({', '.join(f'{k}={v}' for k, v in scale.items())}), 2 ranks, "
        f"{args.microbatches} micro-batches, {args.steps} timed steps a run, {args.rounds} "
        "alternating rounds; median over the rounds of the slowest rank's median step"
    )
    print(
        f"{'schedule':<18} {'stages':>8} {'step':>9} {'compute':>9} {'min..max':>17} {'ratio':>6}"
    )
    for schedule, per_device in plan:
        median = statistics.median(steps[schedule])
        compute = statistics.median(computes[schedule])
        spread = f"{min(steps[schedule]) * 1e3:.1f}..{max(steps[schedule]) * 1e3:.1f} ms"
        print(
            f"{schedule:<18} {f'2 x {per_device}':>8} {median * 1e3:>6.1f} ms "
            f"{compute * 1e3:>6.1f} ms {spread:>17} {median / baseline:>6.2f}"
        )
    print(f"ratio: step over {BASELINE}'s; took {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

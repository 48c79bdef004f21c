"""Plans run for real: syncpass against the rules people use, measured in one run.

Each bundled example, scaled up to the size of a real job's ops (the test-sized
examples take a few milliseconds per step, which the runtime's own per-call
costs dominate), is profiled once, then planned for 2 stages with syncpass
(``adaptive``) and with the ``uniform``, ``parameters`` and ``time`` rules on the
same costs; every distinct plan is written into the source and run as a real
pipeline over gloo processes (1F1B, 4 micro-batches, a few steps after a
warm-up), several rounds in rotated order, with the cost model's prediction
beside it. It prints the measured step time of each plan (the fastest round's
median step, and the spread between rounds), the speedup of syncpass over each
rule, predicted/measured, and whether the targets are met.

    python bench/bench_real.py [--steps 5] [--rounds 3] [--examples uneven_mlp,resnet,unet,transformer_lm]

Everything runs on this machine's CPU; figures move with the load on it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.cli import main as syncpass

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
STRATEGIES = ("adaptive", "uniform", "parameters", "time")
MICROBATCHES = 4


@dataclass(frozen=True)
class BenchModel:
    """A bundled example, scaled by setting its module constants, and how to profile it."""

    constants: dict[str, int]
    depth: int = 1
    uneven: str = ""  # what makes a rule go wrong on it, when something does


MODELS = {
    "uneven_mlp": BenchModel({"BATCH": 512}, uneven="compute sits in the first layers"),
    "resnet": BenchModel(
        {"SIZE": 64, "BATCH": 16}, depth=2, uneven="parameters sit where the compute is not"
    ),
    "unet": BenchModel({"SIZE": 64, "BATCH": 16}),
    "transformer_lm": BenchModel({"WIDTH": 256, "SEQ": 128, "BATCH": 16}),
}


@dataclass(frozen=True)
class Row:
    strategy: str
    measured_s: float  # fastest round's median step; nan when the plan failed
    spread: float  # slowest round over fastest round, for the same plan
    predicted_s: float
    sync_points: str


def scaled_source(name: str, model: BenchModel) -> str:
    """The example's source with its size constants set to the benchmark's."""
    text = (EXAMPLES / f"{name}.py").read_text()
    for constant, value in model.constants.items():
        text, count = re.subn(rf"^{constant} = \d+$", f"{constant} = {value}", text, flags=re.M)
        if count != 1:
            raise SystemExit(f"{name}.py has no line '{constant} = <number>' to scale")
    return text


def quietly(argv: list[str]) -> int:
    """Run a syncpass command, keeping its output out of the table."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return syncpass(argv)


def measure(folder: Path, name: str, stages: int, steps: int, rounds: int) -> list[Row]:
    """One row per strategy; strategies that chose the same sync points share one plan.

    Every distinct plan runs ``rounds`` times, in a rotated order each round, and keeps
    its fastest median step: on a shared machine the load drifts, and whichever plan
    ran first or last would otherwise carry it.
    """
    model = MODELS[name]
    microbatches = max(MICROBATCHES, stages)  # 1F1B needs one per stage at least
    source = folder / f"{name}.py"
    source.write_text(scaled_source(name, model))
    costs = folder / f"{name}.costs.json"
    argv = ["profile", str(source), "--depth", str(model.depth), "-o", str(costs)]
    if quietly(argv) != 0:
        raise SystemExit(f"profiling {name} failed")
    planned: dict[str, Path] = {}  # strategy -> rewritten file, one file per distinct plan
    by_text: dict[str, Path] = {}
    for strategy in STRATEGIES:
        target = folder / f"{name}_{strategy}.py"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", str(stages)]
        argv += ["--microbatches", str(microbatches), "--depth", str(model.depth)]
        if quietly([*argv, "--strategy", strategy, "-o", str(target)]) == 0:
            planned[strategy] = by_text.setdefault(target.read_text(), target)
    files = list(dict.fromkeys(planned.values()))
    times: dict[Path, list[float]] = {file: [] for file in files}
    prediction: dict[Path, dict[str, Any]] = {}
    for round_index in range(rounds):
        shift = round_index % len(files) if files else 0
        for file in files[shift:] + files[:shift]:
            report = file.with_suffix(".json")
            argv = ["run", str(file), "--stages", str(stages), "--microbatches"]
            argv += [str(microbatches), "--steps", str(steps), "--costs", str(costs)]
            if quietly([*argv, "--json-report", str(report)]) != 0:
                continue
            prediction[file] = json.loads(report.read_text())["prediction"]
            times[file].append(prediction[file]["measured_step_s"])
    rows = []
    for strategy in STRATEGIES:
        chosen = planned.get(strategy)
        if chosen is None or not times[chosen]:
            rows.append(Row(strategy, math.nan, math.nan, math.nan, "no plan or failed run"))
            continue
        found = prediction[chosen]
        rows.append(
            Row(
                strategy,
                min(times[chosen]),
                max(times[chosen]) / min(times[chosen]),
                found["predicted_step_s"],
                ", ".join(found["sync_points"]),
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", default=",".join(MODELS))
    args = parser.parse_args()
    names = args.examples.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown example(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    print(
        f"{'example':16}{'strategy':12}{'measured':>10}{'spread':>8}{'syncpass speedup':>18}"
        f"{'predicted':>11}{'pred/meas':>11}  sync points"
    )
    ratios: list[float] = []
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in names:
            rows = measure(Path(scratch), name, args.stages, args.steps, args.rounds)
            ours = rows[0]
            for row in rows:
                speedup = (
                    "-"
                    if row.strategy == "adaptive"
                    else f"{row.measured_s / ours.measured_s:.2f}x"
                )
                print(
                    f"{name:16}{row.strategy:12}{row.measured_s * 1e3:>8.1f}ms{row.spread:>8.2f}"
                    f"{speedup:>18}{row.predicted_s * 1e3:>9.1f}ms"
                    f"{row.predicted_s / row.measured_s:>11.2f}  {row.sync_points}"
                )
                if math.isfinite(row.measured_s):
                    ratios.append(row.predicted_s / row.measured_s)
            verdicts.append(verdict(name, rows))
    print()
    within = sum(abs(ratio - 1) <= PREDICTION_TOLERANCE for ratio in ratios)
    print(
        f"predictions within {PREDICTION_TOLERANCE:.0%} of measurement: {within} of "
        f"{len(ratios)} runs (predicted/measured {min(ratios, default=math.nan):.2f} .. "
        f"{max(ratios, default=math.nan):.2f})"
    )
    for line in verdicts:
        print(line)
    return 0


PREDICTION_TOLERANCE = 0.25
CLEAR_SPEEDUP = 1.2


def verdict(name: str, rows: list[Row]) -> str:
    """Whether syncpass's plan met the targets on this example."""
    ours, rules = rows[0], [row for row in rows[1:] if math.isfinite(row.measured_s)]
    if not rules or not math.isfinite(ours.measured_s):
        return f"{name}: no comparison (a plan failed)"
    best = min(rules, key=lambda row: row.measured_s)
    worst = max(rules, key=lambda row: row.measured_s)
    noise = max(ours.spread, best.spread) - 1
    against_best = best.measured_s / ours.measured_s
    line = (
        f"{name}: {against_best:.2f}x the best rule ({best.strategy}); "
        f"round-to-round spread {noise:.0%}: "
        + ("not slower beyond noise" if against_best >= 1 - noise else "SLOWER beyond noise")
    )
    uneven = MODELS[name].uneven
    if uneven:
        speedup = worst.measured_s / ours.measured_s
        met = "MET" if speedup >= CLEAR_SPEEDUP else "NOT MET"
        line += f"; {uneven}: {speedup:.2f}x over {worst.strategy} (target {CLEAR_SPEEDUP}x: {met})"
    return line


if __name__ == "__main__":
    sys.exit(main())

"""Planning speed: syncpass's exact optimiser against a pure-Python dynamic program.

What is measured
----------------
For each (number of ops ``n``, number of stages ``S``) in the table, a random
but realistic planning instance is generated in memory (the seed is printed,
so a run can be repeated): ops with lognormal compute times, parameter and
output bytes, an admissible cut after every op with varying live bytes, a
link with alpha = 20 us and beta = 5 GB/s, a device memory limit that binds
(1.5 x the model's memory / S, but never below 1.25 x the largest op, which
must fit on a device alone), training, memory_multiplier 4,
min_sync_interval 1, and threshold 0.1 with the adaptive strategy. The
instance is written as a version-1 cost-file dict and goes through
``parse_costs`` and ``problem_from_costs``, the same path ``syncpass plan``
takes.

Two things are timed on each instance:

* ``solve(problem, S, 0.1, adaptive=True)``: best and median of 3 runs
  (``time.perf_counter``). Building the problem is not timed.
* A straightforward pure-Python dynamic program of the same model, in the
  plain-lists-and-loops style of DeepSpeed's partitioner: ``dp[s][j] =
  min_i max(dp[s-1][i], time(i, j))`` over every legal start ``i``, checking
  the interval, memory, pin, admissible-cut and threshold constraints, with
  prefix sums for stage compute. It runs under the threshold the optimiser
  ended up using (``solution.threshold_used``) and only finds the
  bottleneck (no tie-break). It costs O(S n^2) loop iterations, so it runs
  only where its estimated time (loop count x the per-iteration cost
  measured so far) fits ``--baseline-budget``; elsewhere the table shows the
  estimate as a lower bound (">=").

Where the dynamic program runs, its bottleneck must equal the optimiser's
(relative tolerance 1e-9); the script exits with status 1 on any mismatch.

Then the whole command is timed as a user runs it: ``syncpass plan --costs FILE
--stages S`` in a fresh interpreter (report, explanations and the three
baselines included), best and median of 3, on cost files written to a temporary
directory from the same random models (:data:`COMMAND_TARGETS`: the batch is
large enough for 1F1B's micro-batches, the memory limit binds as above). The
command runs with this checkout first on ``PYTHONPATH``; a command that fails
makes the exit status 1.

Wall-clock targets are printed as MET / NOT MET and never change the exit
status.

How to run
----------
    python bench/bench_plan.py                  # full table (about a minute)
    python bench/bench_plan.py --quick          # n = 100 and 1,000 only (commands too)
    python bench/bench_plan.py --baseline-budget 10 --seed 7
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from syncpass.contracts.costs import parse_costs
from syncpass.plan.optimizer import Infeasible, Problem, Solution, score_cuts, solve
from syncpass.plan.problem import problem_from_costs

ALPHA_S = 2e-5
BETA_BYTES_PER_S = 5e9
MEMORY_MULTIPLIER = 4
MIN_SYNC_INTERVAL = 1
THRESHOLD = 0.1
# The limit is this many times an even share of the model's memory, so the
# fullest stage may hold at most 50% more than average.
MEMORY_SLACK = 1.5
# ...but never below this multiple of the largest op, which must fit alone.
LARGEST_OP_SLACK = 1.25
REPEATS = 3
DEFAULT_SEED = 20240611
DEFAULT_BUDGET_S = 60.0
# Baseline runs shorter than this per-iteration sample say more about
# interpreter start-up noise than about the loop, so they do not calibrate.
MIN_CALIBRATION_ITERATIONS = 100_000

SIZES = (100, 1000, 10000)
QUICK_SIZES = (100, 1000)
STAGE_COUNTS = (2, 8, 64, 256)
# (n, S, seconds): the optimiser should plan these within the time given.
TARGETS = ((1000, 64, 1.0), (10000, 8, 10.0), (10000, 256, 3.0))


@dataclass(frozen=True)
class CommandTarget:
    """One ``syncpass plan`` run to time: on the random model of ``n`` ops, a cost file
    whose memory limit is the one for ``memory_stages`` stages and whose batch is
    ``batch``, planned with ``args``; it should take less than ``limit_s``."""

    label: str
    n: int
    args: tuple[str, ...]
    memory_stages: int
    batch: int
    limit_s: float


COMMAND_TARGETS = (
    CommandTarget("n=1,000 --stages 64", 1000, ("--stages", "64"), 64, 64, 0.5),
    CommandTarget("n=10,000 --stages 8", 10000, ("--stages", "8"), 8, 8, 1.0),
    CommandTarget("n=10,000 --stages 256", 10000, ("--stages", "256"), 256, 256, 3.0),
    # S x V = 256 stages for real: torch's interleaved order on 64 devices, 4 stages each
    # (the first of the three runs reads the order from torch, the others from the cache).
    CommandTarget(
        "n=10,000 --stages 64 interleaved x4",
        10000,
        ("--stages", "64", "--schedule", "interleaved-1f1b", "--stages-per-device", "4"),
        64,
        256,
        3.0,
    ),
    CommandTarget(
        "n=1,000 --stages auto --max-stages 64",
        1000,
        ("--stages", "auto", "--max-stages", "64"),
        64,
        256,
        3.0,
    ),
    # The same, with memory for 8 stages: every count from 1 to 64 admits a plan.
    CommandTarget(
        "  same, memory for 8 stages",
        1000,
        ("--stages", "auto", "--max-stages", "64"),
        8,
        256,
        3.0,
    ),
)

INF = math.inf


# --- instances -------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """One random model: its ops and cuts as cost-file entries."""

    n: int
    ops: list[dict[str, Any]]
    cuts: list[dict[str, Any]]
    total_memory: float
    largest_op_memory: float


def random_model(rng: np.random.Generator, n: int) -> Model:
    """Ops with uneven costs, like the layers of a real network.

    Compute is lognormal (a few ops dominate, as large matmuls do next to
    norms and activations); about 30% of ops hold no parameters; what crosses
    a cut is the op's output plus, sometimes, values kept alive by skip
    connections, so cuts differ in price.
    """
    forward = rng.lognormal(math.log(2e-4), 1.0, n)
    backward = forward * rng.uniform(1.5, 2.5, n)
    has_params = rng.random(n) < 0.7
    params = np.where(has_params, np.round(rng.lognormal(math.log(4e6), 1.0, n)), 0.0)
    outputs = np.round(rng.lognormal(math.log(4e6), 0.5, n))
    live = np.round(outputs[:-1] * rng.uniform(1.0, 3.0, n - 1))
    ops = [
        {
            "id": f"layer{index}",
            "compute_s": fwd,
            "backward_s": bwd,
            "param_bytes": param,
            "out_bytes": out,
        }
        for index, (fwd, bwd, param, out) in enumerate(
            zip(forward.tolist(), backward.tolist(), params.tolist(), outputs.tolist(), strict=True)
        )
    ]
    cuts = [
        {"after": f"layer{index}", "live_bytes": live_bytes}
        for index, live_bytes in enumerate(live.tolist())
    ]
    memory = MEMORY_MULTIPLIER * params + outputs
    return Model(
        n=n,
        ops=ops,
        cuts=cuts,
        total_memory=float(memory.sum()),
        largest_op_memory=float(memory.max()),
    )


def memory_limit(model: Model, stages: int) -> float:
    """A device memory limit that binds but still admits an S-stage plan."""
    return max(
        MEMORY_SLACK * model.total_memory / stages, LARGEST_OP_SLACK * model.largest_op_memory
    )


def cost_file(model: Model, stages: int, batch: int = 8) -> dict[str, Any]:
    """The instance as a version-1 cost file (see ``docs/formats.md``)."""
    return {
        "version": 1,
        "model": f"random-{model.n}",
        "batch_size": batch,
        "training": True,
        "memory_multiplier": MEMORY_MULTIPLIER,
        "hardware": {
            "name": "benchmark link",
            "alpha_s": ALPHA_S,
            "beta_bytes_per_s": BETA_BYTES_PER_S,
            "device_memory_bytes": memory_limit(model, stages),
        },
        "config": {
            "strategy": "adaptive",
            "min_sync_interval": MIN_SYNC_INTERVAL,
            "communication_cost_threshold": THRESHOLD,
        },
        "ops": model.ops,
        "cuts": model.cuts,
    }


def build_problem(model: Model, stages: int) -> Problem:
    """The optimiser's arrays, built the way ``syncpass plan`` builds them."""
    costs = parse_costs(cost_file(model, stages), f"<random n={model.n} S={stages}>")
    return problem_from_costs(costs, costs.config)


# --- timing the optimiser --------------------------------------------------------


@dataclass(frozen=True)
class SolveTiming:
    result: Solution | Infeasible
    best_s: float
    median_s: float


def time_solve(problem: Problem, stages: int) -> SolveTiming:
    times: list[float] = []
    result: Solution | Infeasible | None = None
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = solve(problem, stages, THRESHOLD, adaptive=True)
        times.append(time.perf_counter() - start)
    assert result is not None
    return SolveTiming(result=result, best_s=min(times), median_s=statistics.median(times))


# --- the pure-Python baseline ----------------------------------------------------


def first_starts(pinned: Sequence[bool]) -> list[int]:
    """For each end ``j``, the earliest start: the last pinned cut before ``j``.

    A stage may not step over a pinned cut, so it starts at or after it.
    """
    starts = [0] * len(pinned)
    last_pin = 0
    for j in range(1, len(pinned)):
        starts[j] = last_pin
        if pinned[j]:
            last_pin = j
    return starts


def prefix_sums(values: Sequence[float]) -> list[float]:
    # A running sum in order, as numpy's cumsum does, so stage figures match.
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums


def dp_bottleneck(problem: Problem, stages: int, tau: float) -> float:
    """Least bottleneck over S-stage plans, by an O(S n^2) pure-Python DP.

    ``inf`` when no plan meets the constraints. Every input is turned into a
    plain list first: this is the cost of planning without numpy.
    """
    n = problem.num_ops
    prefix_p = prefix_sums(problem.op_compute.tolist())
    prefix_q = prefix_sums(problem.op_memory.tolist())
    comm: list[float] = problem.cut_comm.tolist()
    admissible: list[bool] = problem.admissible.tolist()
    start_of = first_starts(problem.pinned.tolist())
    min_ops = problem.min_ops
    limit = problem.memory_limit

    previous = [INF] * (n + 1)
    previous[0] = 0.0
    for stage in range(1, stages + 1):
        current = [INF] * (n + 1)
        # Only the last stage ends at n; the others end at an admissible cut.
        ends = [n] if stage == stages else [j for j in range(1, n) if admissible[j]]
        for j in ends:
            p_j, q_j, comm_j = prefix_p[j], prefix_q[j], comm[j]
            closes_cut = j < n
            best = INF
            for i in range(start_of[j], j - min_ops + 1):
                reached = previous[i]
                if reached >= best:  # also skips unreachable starts (inf)
                    continue
                if q_j - prefix_q[i] > limit:
                    continue
                compute = p_j - prefix_p[i]
                # The threshold test as the optimiser defines it: 0/0 = 0, x/0 = inf.
                if closes_cut and comm_j != 0.0:
                    ratio = comm_j / compute if compute > 0.0 else INF
                    if ratio > tau:
                        continue
                stage_time = compute + (comm[i] + comm_j)
                worst = reached if reached > stage_time else stage_time
                if worst < best:
                    best = worst
            current[j] = best
        previous = current
    return previous[n]


def dp_iterations(problem: Problem, stages: int) -> int:
    """How many times the DP's inner loop body runs: the estimate's unit of work."""
    n = problem.num_ops
    start_of = np.array(first_starts(problem.pinned.tolist()), dtype=np.int64)
    window = np.maximum(0, np.arange(n + 1) - problem.min_ops + 1 - start_of)
    per_middle_stage = int(window[1:n][problem.admissible[1:n]].sum())
    return (stages - 1) * per_middle_stage + int(window[n])


@dataclass(frozen=True)
class BaselineTiming:
    seconds: float
    estimated: bool  # True: not run; ``seconds`` is the estimate
    bottleneck: float | None = None


class Baseline:
    """Runs the DP where it fits the budget, and learns its per-iteration cost."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.seconds_per_iteration: float | None = None

    def calibrate(self, problem: Problem) -> None:
        """A first per-iteration cost from a short run, before any cell is tried."""
        stages = 3
        start = time.perf_counter()
        dp_bottleneck(problem, stages, INF)
        elapsed = time.perf_counter() - start
        self.seconds_per_iteration = elapsed / max(1, dp_iterations(problem, stages))

    def run(self, problem: Problem, stages: int, tau: float) -> BaselineTiming:
        iterations = dp_iterations(problem, stages)
        assert self.seconds_per_iteration is not None, "calibrate first"
        estimate = iterations * self.seconds_per_iteration
        if estimate > self.budget_s:
            return BaselineTiming(seconds=estimate, estimated=True)
        # Cheap cells get the optimiser's best-of-3 too; long ones run once.
        repeats = REPEATS if estimate * REPEATS < 1.0 else 1
        times: list[float] = []
        bottleneck = INF
        for _ in range(repeats):
            start = time.perf_counter()
            bottleneck = dp_bottleneck(problem, stages, tau)
            times.append(time.perf_counter() - start)
        self._learn(min(times), iterations)
        return BaselineTiming(seconds=min(times), estimated=False, bottleneck=bottleneck)

    def _learn(self, seconds: float, iterations: int) -> None:
        # The cheapest iteration seen on a real-sized run keeps the estimates
        # lower bounds, which is what the ">=" in the table promises.
        if iterations < MIN_CALIBRATION_ITERATIONS:
            return
        rate = seconds / iterations
        if self.seconds_per_iteration is None or rate < self.seconds_per_iteration:
            self.seconds_per_iteration = rate


# --- one cell of the table -------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    n: int
    stages: int
    solve: SolveTiming
    baseline: BaselineTiming | None  # None when the optimiser found no plan
    agree: str
    tau_used: float | None
    memory_use: float | None  # the fullest stage's share of the memory limit


def agreement(result: Solution | Infeasible, baseline: BaselineTiming) -> str:
    if baseline.estimated:
        return "-"
    assert baseline.bottleneck is not None
    if isinstance(result, Infeasible):
        return "ok" if baseline.bottleneck == INF else "MISMATCH"
    if math.isclose(baseline.bottleneck, result.bottleneck, rel_tol=1e-9):
        return "ok"
    return "MISMATCH"


def measure(model: Model, stages: int, baseline: Baseline) -> Cell:
    problem = build_problem(model, stages)
    timing = time_solve(problem, stages)
    result = timing.result
    if isinstance(result, Infeasible):
        # Without a used threshold the requested one is the fair comparison.
        dp = baseline.run(problem, stages, THRESHOLD)
        return Cell(model.n, stages, timing, dp, agreement(result, dp), None, None)
    dp = baseline.run(problem, stages, result.threshold_used)
    fullest = max(stage.memory for stage in score_cuts(problem, result.cuts).stages)
    return Cell(
        n=model.n,
        stages=stages,
        solve=timing,
        baseline=dp,
        agree=agreement(result, dp),
        tau_used=result.threshold_used,
        memory_use=fullest / problem.memory_limit,
    )


# --- output ----------------------------------------------------------------------


def seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    if value < 1.0:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def speedup(ratio: float) -> str:
    # Below 1 the pure-Python DP was faster; keep two figures so that shows.
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:,.0f}x"


def row(cell: Cell) -> str:
    dp = cell.baseline
    assert dp is not None
    ratio_text = speedup(dp.seconds / cell.solve.best_s)
    if dp.estimated:
        dp_text = f">= {seconds(dp.seconds)} (estimated)"
        ratio_text = f">= {ratio_text}"
    else:
        dp_text = seconds(dp.seconds)
    tau = "-" if cell.tau_used is None else f"{cell.tau_used:.4g}"
    memory = "-" if cell.memory_use is None else f"{cell.memory_use:.0%}"
    if isinstance(cell.solve.result, Infeasible):
        tau = f"infeasible ({cell.solve.result.constraint})"
    return (
        f"{cell.n:>6,} {cell.stages:>3} {seconds(cell.solve.best_s):>10} "
        f"{seconds(cell.solve.median_s):>10} {dp_text:>26} {ratio_text:>12} "
        f"{cell.agree:>8} {tau:>8} {memory:>6}"
    )


HEADER = (
    f"{'n':>6} {'S':>3} {'syncpass':>10} {'median':>10} {'pure-Python DP':>26} "
    f"{'speedup':>12} {'agree':>8} {'tau used':>8} {'mem':>6}"
)


def report_targets(cells: Sequence[Cell]) -> None:
    print("\nTargets (syncpass best of 3; wall clock is informative only):")
    for n, stages, limit_s in TARGETS:
        label = f"  n={n:,} S={stages} under {limit_s:g} s"
        cell = next((c for c in cells if c.n == n and c.stages == stages), None)
        if cell is None:
            print(f"{label}: not measured in this run")
            continue
        verdict = "MET" if cell.solve.best_s < limit_s else "NOT MET"
        print(
            f"{label}: {verdict} (best {seconds(cell.solve.best_s)}, "
            f"median {seconds(cell.solve.median_s)})"
        )


# --- timing the whole command ----------------------------------------------------


@dataclass(frozen=True)
class CommandTiming:
    target: CommandTarget
    best_s: float
    median_s: float
    error: str | None = None


def time_command(target: CommandTarget, model: Model, folder: Path) -> CommandTiming:
    """``syncpass plan`` on the target's cost file, as a subprocess, best of 3."""
    path = folder / f"random-{model.n}-memory{target.memory_stages}-batch{target.batch}.json"
    path.write_text(json.dumps(cost_file(model, target.memory_stages, target.batch)))
    root = Path(__file__).resolve().parent.parent
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(root), *filter(None, [environment.get("PYTHONPATH")])]
    )
    environment["SYNCPASS_CACHE_DIR"] = str(folder / "cache")  # cold for the first run
    command = [sys.executable, "-m", "syncpass", "plan", "--costs", str(path), *target.args]
    times: list[float] = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run = subprocess.run(
            command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        times.append(time.perf_counter() - start)
        if run.returncode != 0:
            error = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "no message"
            return CommandTiming(target, min(times), min(times), f"exit {run.returncode}: {error}")
    return CommandTiming(target, min(times), statistics.median(times))


def report_commands(timings: Sequence[CommandTiming]) -> None:
    print(
        "\nWhole command, `syncpass plan --costs FILE ...` in a fresh interpreter "
        "(best / median of 3; wall clock is informative only):"
    )
    width = max(len(timing.target.label) for timing in timings)
    for timing in timings:
        label = timing.target.label.ljust(width)
        limit = f"under {timing.target.limit_s:g} s"
        if timing.error is not None:
            print(f"  {label}  FAILED ({timing.error})")
            continue
        verdict = "MET" if timing.best_s < timing.target.limit_s else "NOT MET"
        print(
            f"  {label}  {seconds(timing.best_s):>9} {seconds(timing.median_s):>9}  "
            f"{limit}: {verdict}"
        )


# --- main ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time syncpass's optimiser against a pure-Python DP of the same model."
    )
    parser.add_argument("--quick", action="store_true", help="only n = 100 and 1,000")
    parser.add_argument(
        "--baseline-budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help="run the pure-Python DP only where its estimated time fits (default %(default)g)",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    rng = np.random.default_rng(args.seed)
    print(f"seed {args.seed}; pure-Python DP budget {args.baseline_budget:g} s per cell")
    print(
        f"link alpha {ALPHA_S:g} s, beta {BETA_BYTES_PER_S:g} B/s; training; "
        f"memory_multiplier {MEMORY_MULTIPLIER}; min_sync_interval {MIN_SYNC_INTERVAL}; "
        f"threshold {THRESHOLD:g} (adaptive)"
    )
    print(
        f"memory limit = max({MEMORY_SLACK:g} x model memory / S, "
        f"{LARGEST_OP_SLACK:g} x largest op); 'mem' is the fullest stage's share of it"
    )
    models = [random_model(rng, n) for n in sizes]
    baseline = Baseline(args.baseline_budget)
    baseline.calibrate(build_problem(models[0], 3))

    print()
    print(HEADER)
    cells: list[Cell] = []
    for model in models:
        for stages in STAGE_COUNTS:
            if stages > model.n:
                continue
            cell = measure(model, stages, baseline)
            cells.append(cell)
            print(row(cell), flush=True)

    report_targets(cells)
    by_size = {model.n: model for model in models}
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as folder:
        timings = [
            time_command(target, by_size[target.n], Path(folder))
            for target in COMMAND_TARGETS
            if target.n in by_size
        ]
    report_commands(timings)
    status = 0
    mismatches = [cell for cell in cells if cell.agree == "MISMATCH"]
    if mismatches:
        print(f"\n{len(mismatches)} cell(s) where the DP and the optimiser disagree")
        status = 1
    if any(timing.error is not None for timing in timings):
        print("\na command failed")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

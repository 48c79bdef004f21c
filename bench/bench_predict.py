"""Predictions a user can bet a training run on: the plan's step against the measured one.

Each model (the bundled examples at their shipped size, and five models of the corpus as
their packages ship them) is profiled once in the eager form, then planned for 2 stages
by syncpass (``adaptive``) and by the three rules on the same costs (``uniform``,
``parameters``, ``time``). Every distinct plan is written out and run as a real pipeline
over gloo processes (1F1B, the default micro-batch count, one thread a rank): all of a
model's plans in one run, their steps taken in turn (``syncpass run FILE --alongside
OTHER ...``), several runs; each plan keeps the median of its runs' median steps. It
prints predicted against measured, how many come within 25%, and whether the measured
order of the plans is the predicted one wherever the prediction puts more than 10%
between two plans. The prediction is at the speed the run measured (``speed``: the
ranks' speed probe over the profile's, docs/run.md); ``profile`` is predicted over
measured at the profile's speed, as it would be without the probe. ``busy`` is the
busiest stage's predicted busy time over its measured compute: near 1 where ``pred/meas``
is low, the step lost its time in the transfers, not the compute.

    python bench/bench_predict.py [--rounds 3] [--steps 8] [--models resnet,hf_gpt2,...]

The machine's other work moves every figure: the script asks the kernel to schedule its
processes before others' (a scheduling group of nice -20, where it may; it says whether
it could), and the rounds' spread says how much noise is left.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("uneven_mlp", "resnet", "unet", "transformer_lm")
#: Models kept beside the bench: the conv net of the report behind issue 27.
BENCH_MODELS = ("convnet",)
CORPUS_MODELS = ("hf_gpt2", "hf_llama", "hf_bert", "tv_resnet", "timm_vit")
STRATEGIES = ("adaptive", "uniform", "parameters", "time")
TOLERANCE = 0.25  # |predicted / measured - 1| at most this
ORDER_GAP = 0.10  # the order of two plans is checked where the prediction separates them so


def _corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_corpus", ROOT / "bench" / "bench_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_corpus"] = module
    spec.loader.exec_module(module)
    return module


CORPUS = _corpus()


def scheduled_first() -> bool:
    """Put this process (and what it starts) in a scheduling group of nice -20, where the
    kernel allows it: with autogroup scheduling, a plain ``nice`` only ranks processes of
    one session, and every other session's work would share the cores equally. The group
    is the session's, so the script runs in a session of its own (:func:`own_session`)."""
    try:
        Path("/proc/self/autogroup").write_text("-20")
    except OSError:
        return False
    return True


def own_session() -> int | None:
    """Run this script again as the leader of a new session (``setsid``), so that raising
    its scheduling group raises nothing else; its exit status, or None when it already
    leads one (or ``setsid`` is missing)."""
    if (
        os.getsid(0) == os.getpid()
        or os.environ.get("SYNCPASS_BENCH_SESSION")
        or not shutil.which("setsid")
    ):
        return None
    env = {**os.environ, "SYNCPASS_BENCH_SESSION": "1"}
    return subprocess.run(
        ["setsid", "--wait", sys.executable, *sys.argv], env=env, check=False
    ).returncode


@dataclass(frozen=True)
class Project:
    """A model copied into a project folder, and how its commands are run."""

    name: str
    source: Path
    arguments: tuple[str, ...]  # --backend/--model
    isolated: bool  # run in a fresh process in its folder (another transformers)

    @property
    def run_arguments(self) -> tuple[str, ...]:
        """The arguments ``syncpass run`` takes of :attr:`arguments`: the backend (the stage
        classes name the model)."""
        return (
            self.arguments[: self.arguments.index("--model")]
            if "--model" in self.arguments
            else self.arguments
        )


@dataclass(frozen=True)
class Row:
    model: str
    strategy: str
    sync_points: str
    predicted_s: float
    measured_s: float  # the median of the rounds' median steps; nan when it failed
    spread: float  # slowest round over fastest
    # The prediction at the profile's speed (the op times as measured), and the median of
    # the rounds' speed factors (the run's speed probe over the profile's; 1 without one).
    profile_speed_s: float = math.nan
    speed_factor: float = math.nan
    # The busiest stage's predicted busy time (ops and runtime overhead) over its measured
    # forward and backward (and update): below 1, the ranks computed slower than profiled;
    # near 1 with pred/meas low, the step lost its time in the transfers.
    busy_ratio: float = math.nan

    @property
    def ratio(self) -> float:
        return self.predicted_s / self.measured_s

    @property
    def profile_ratio(self) -> float:
        return self.profile_speed_s / self.measured_s


def syncpass(project: Project, argv: list[str]) -> tuple[int, str]:
    """``syncpass ARGV`` for ``project``: its status and error output."""
    return CORPUS._quiet(argv, isolated=project.isolated, cwd=project.source.parent)  # type: ignore[no-any-return]


def example_project(name: str, folder: Path) -> Project:
    source = folder / name / f"{name}.py"
    source.parent.mkdir(parents=True)
    home = ROOT / ("bench" if name in BENCH_MODELS else "examples")
    source.write_text((home / f"{name}.py").read_text())
    return Project(name, source, (), isolated=False)


def corpus_project(name: str, packages: Path, folder: Path) -> Project:
    (model,) = [model for model in CORPUS.MODELS if model.name == name]
    source = CORPUS.prepared(model, packages, folder)
    return Project(name, source, tuple(model.model_arguments()), model.isolated)


def measure(project: Project, stages: int, rounds: int, steps: int) -> list[Row]:
    """One row per strategy (strategies that chose the same sync points share a run)."""
    source, folder = project.source, project.source.parent
    example = f"{source}:example"
    costs = folder / "costs.json"
    status, err = syncpass(
        project,
        ["profile", str(source), "--example", example, *project.arguments, "-o", str(costs)],
    )
    if status != 0:
        print(f"{project.name}: profile failed: {err.strip().splitlines()[-1:]}", file=sys.stderr)
        return []
    by_text: dict[str, Path] = {}
    planned: dict[str, Path] = {}
    for strategy in STRATEGIES:
        target = folder / f"{source.stem}_{strategy}.py"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", str(stages)]
        argv += [*project.arguments, "--strategy", strategy, "-o", str(target)]
        if syncpass(project, argv)[0] == 0:
            planned[strategy] = by_text.setdefault(target.read_text(), target)
    files = list(dict.fromkeys(planned.values()))
    medians: dict[Path, list[float]] = {file: [] for file in files}
    predicted: dict[Path, list[float]] = {file: [] for file in files}
    at_profile: dict[Path, list[float]] = {file: [] for file in files}
    busy: dict[Path, list[float]] = {file: [] for file in files}
    factors: list[float] = []
    reports: dict[Path, dict[str, Any]] = {}
    for round_index in range(rounds):
        if not files:
            break
        # One run of every plan: their steps taken in turn (syncpass run --alongside).
        report = folder / f"round_{round_index}.json"
        argv = ["run", str(files[0]), "--example", f"{files[0]}:example", "--stages", str(stages)]
        argv += [*project.run_arguments, "--steps", str(steps), "--costs", str(costs)]
        if len(files) > 1:
            argv += ["--alongside", *map(str, files[1:])]
        status, err = syncpass(project, [*argv, "--json-report", str(report)])
        if status != 0:
            print(f"{project.name}: run failed: {err.strip()[-300:]}", file=sys.stderr)
            continue
        document = json.loads(report.read_text())
        for file, one in zip(files, [document, *document.get("alongside", [])], strict=True):
            prediction = one["prediction"]
            reports[file] = prediction
            medians[file].append(prediction["measured_step_s"])
            predicted[file].append(prediction["predicted_step_s"])
            unscaled = prediction["profile_speed_step_s"]
            at_profile[file].append(
                prediction["predicted_step_s"] if unscaled is None else unscaled
            )
            busy[file].append(busy_ratio(one))
        factors.append(document["prediction"]["speed_factor"])
    rows = []
    for strategy in STRATEGIES:
        chosen = planned.get(strategy)
        if chosen is None or not medians[chosen]:
            rows.append(
                Row(project.name, strategy, "no plan or failed", math.nan, math.nan, math.nan)
            )
            continue
        found = medians[chosen]
        rows.append(
            Row(
                project.name,
                strategy,
                ", ".join(reports[chosen]["sync_points"]),
                statistics.median(predicted[chosen]),
                statistics.median(found),
                max(found) / min(found),
                statistics.median(at_profile[chosen]),
                statistics.median(factors),
                statistics.median(busy[chosen]),
            )
        )
    return rows


def busy_ratio(report: dict[str, Any]) -> float:
    """Of a run's JSON report: the predicted busy time of the stage that computed longest
    over its measured compute (nan without both)."""
    measured = [stage.get("compute_s") for stage in report.get("stage_reports", [])]
    predicted = [stage.get("predicted_time_s") for stage in report["prediction"].get("stages", [])]
    if not measured or len(measured) != len(predicted) or None in measured or None in predicted:
        return math.nan
    busiest = max(range(len(measured)), key=measured.__getitem__)
    return float(predicted[busiest]) / float(measured[busiest]) if measured[busiest] else math.nan


def order_checks(rows: list[Row]) -> tuple[int, list[str]]:
    """How many pairs of distinct plans the prediction separates by more than
    :data:`ORDER_GAP`, and those whose measured order is the other one."""
    distinct = {row.sync_points: row for row in rows if math.isfinite(row.measured_s)}
    checked, wrong = 0, list[str]()
    for one, other in itertools.combinations(distinct.values(), 2):
        fast, slow = sorted((one, other), key=lambda row: row.predicted_s)
        if slow.predicted_s <= fast.predicted_s * (1 + ORDER_GAP):
            continue
        checked += 1
        if slow.measured_s < fast.measured_s:
            wrong.append(
                f"{fast.model}: {fast.strategy} predicted {slow.predicted_s / fast.predicted_s:.2f}x "
                f"faster than {slow.strategy}, measured {fast.measured_s / slow.measured_s:.2f}x slower"
            )
    return checked, wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--models", default=",".join((*EXAMPLES, *BENCH_MODELS, *CORPUS_MODELS)))
    args = parser.parse_args()
    relaunched = own_session()
    if relaunched is not None:
        return relaunched
    names = args.models.split(",")
    unknown = sorted(set(names) - set(EXAMPLES) - set(BENCH_MODELS) - set(CORPUS_MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}")
    first = scheduled_first()
    print(
        f"{args.stages} stages, {args.rounds} rounds of {args.steps} steps; scheduled before "
        f"other work: {'yes' if first else 'no (not permitted): figures carry the load'}"
    )
    print(
        f"{'model':16}{'strategy':12}{'predicted':>11}{'measured':>11}{'spread':>8}"
        f"{'pred/meas':>11}{'speed':>7}{'profile':>9}{'busy':>6}  sync points"
    )
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in names:
            project = (
                example_project(name, folder)
                if name in EXAMPLES or name in BENCH_MODELS
                else corpus_project(name, folder / "packages", folder)
            )
            found = measure(project, args.stages, args.rounds, args.steps)
            for row in found:
                print(
                    f"{row.model:16}{row.strategy:12}{row.predicted_s * 1e3:>9.1f}ms"
                    f"{row.measured_s * 1e3:>9.1f}ms{row.spread:>8.2f}{row.ratio:>11.2f}"
                    f"{row.speed_factor:>7.2f}{row.profile_ratio:>9.2f}{row.busy_ratio:>6.2f}"
                    f"  {row.sync_points}",
                    flush=True,
                )
            rows += found
    measured = [row for row in rows if math.isfinite(row.measured_s)]
    within = [row for row in measured if abs(row.ratio - 1) <= TOLERANCE]
    print()
    print(
        f"predicted within {TOLERANCE:.0%} of measured: {len(within)} of {len(measured)} runs "
        f"(predicted/measured {min((r.ratio for r in measured), default=math.nan):.2f} .. "
        f"{max((r.ratio for r in measured), default=math.nan):.2f})"
    )
    unscaled = [row for row in measured if abs(row.profile_ratio - 1) <= TOLERANCE]
    print(
        f"at the profile's speed (no speed probe): {len(unscaled)} of {len(measured)} within "
        f"{TOLERANCE:.0%} (predicted/measured "
        f"{min((r.profile_ratio for r in measured), default=math.nan):.2f} .. "
        f"{max((r.profile_ratio for r in measured), default=math.nan):.2f})"
    )
    checked, wrong = 0, list[str]()
    for _, group in itertools.groupby(rows, key=lambda row: row.model):
        count, bad = order_checks(list(group))
        checked, wrong = checked + count, wrong + bad
    print(
        f"measured order as predicted: {checked - len(wrong)} of {checked} pairs of plans "
        f"predicted more than {ORDER_GAP:.0%} apart"
    )
    for line in wrong:
        print(f"  out of order: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

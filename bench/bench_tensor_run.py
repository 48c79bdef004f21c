"""syncpass's tensor-parallel plan against Megatron-LM's placement, measured on this machine.

Each model is rewritten for ``--tp`` ranks twice from the same source: with the
optimiser's layouts (``--tp-placement syncpass``) and with Megatron-LM's hand placement
written the same way (``--tp-placement megatron``: each pair's first linear by columns,
the second by rows, the rest whole). Both files run in one ``syncpass run --tp N
--alongside`` over gloo, their timed steps taken in turn (the order rotated each step),
several runs; each keeps the median of its runs' steps (a run's step: its slowest rank's
median). The model is profiled once and each run given the cost file (``run --costs``):
each placement's step as the cost model predicts it from the layouts the file carries, on
the profile's tensor graph and the local CPU's link (``--hardware`` plans the layouts
for another; the prediction stays the cost file's).
It prints predicted beside measured, and whether the measured order is the predicted one
where the prediction puts more than 10% between them.

    python bench/bench_tensor_run.py [--models transformer_lm,llama_block,gated_mlp]
                                     [--tp 2] [--rounds 3] [--steps 10] [--hardware NAME]

On a 2-core machine ``--tp 2`` gives each rank a core; more ranks share them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {
    "transformer_lm": ROOT / "examples" / "transformer_lm.py",
    "llama_block": ROOT / "tests" / "data" / "llama_block.py",
    "gated_mlp": ROOT / "tests" / "data" / "gated_mlp.py",
}
PLACEMENTS = ("syncpass", "megatron")
ORDER_GAP = 0.10


@dataclass(frozen=True)
class Placement:
    name: str
    file: Path
    split: str  # "18 of 125 op(s) split"


def syncpass(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncpass", *argv], capture_output=True, text=True, check=False
    )


def rewritten(
    model: Path, placement: str, tp: int, hardware: str | None, folder: Path
) -> Placement:
    """``model`` rewritten with ``placement``'s layouts."""
    out = folder / f"{model.stem}_{placement}.py"
    argv = ["rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor"]
    argv += ["--tp", str(tp), "--tp-placement", placement, "-o", str(out)]
    if hardware is not None:
        argv += ["--hardware", hardware]
    done = syncpass(*argv)
    if done.returncode != 0:
        raise SystemExit(f"{model.stem} {placement}: rewrite failed: {done.stderr.strip()}")
    summary = done.stderr.strip().splitlines()[-1]
    split = re.search(r"\d+ of \d+ op\(s\) split", summary)
    assert split is not None, summary
    return Placement(placement, out, split[0])


def profiled(model: Path, folder: Path) -> Path:
    """``model``'s cost file, its tensor graph included (on the local CPU's profile)."""
    costs = folder / f"{model.stem}.costs.json"
    done = syncpass("profile", str(model), "--example", f"{model}:example", "-o", str(costs))
    if done.returncode != 0:
        raise SystemExit(f"{model.stem}: profile failed: {done.stderr.strip()}")
    return costs


def measured(
    placements: list[Placement], costs: Path, tp: int, steps: int, folder: Path
) -> list[tuple[float, float]]:
    """One run of every placement, their steps in turn: each one's (predicted, measured)
    step, measured as its slowest rank's median."""
    report = folder / "report.json"
    first, *others = placements
    argv = ["run", str(first.file), "--tp", str(tp), "--steps", str(steps), "--costs", str(costs)]
    argv += ["--alongside", *(str(other.file) for other in others)]
    done = syncpass(*argv, "--json-report", str(report))
    if done.returncode != 0:
        raise SystemExit(f"run failed: {done.stdout[-400:]} {done.stderr[-400:]}")
    document = json.loads(report.read_text())
    return [
        (one["prediction"]["predicted_step_s"], one["prediction"]["measured_step_s"])
        for one in (document, *document["alongside"])
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--hardware", default=None)
    options = parser.parse_args()
    names = options.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    print(
        f"tp {options.tp}, {options.rounds} runs of {options.steps} steps, the placements' "
        "steps in turn"
    )
    print(
        f"{'model':16}{'placement':11}{'predicted':>11}{'measured':>11}{'spread':>8}"
        f"{'pred/meas':>11}  layouts"
    )
    checked = held = 0
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for name in names:
            placements = [
                rewritten(MODELS[name], placement, options.tp, options.hardware, folder)
                for placement in PLACEMENTS
            ]
            costs = profiled(MODELS[name], folder)
            runs = [
                measured(placements, costs, options.tp, options.steps, folder)
                for _ in range(options.rounds)
            ]
            predicted = [runs[0][index][0] for index in range(2)]
            steps = [statistics.median(run[index][1] for run in runs) for index in range(2)]
            for index, placement in enumerate(placements):
                found = [run[index][1] for run in runs]
                print(
                    f"{name:16}{placement.name:11}{predicted[index] * 1e3:>9.1f}ms"
                    f"{steps[index] * 1e3:>9.1f}ms{max(found) / min(found):>8.2f}"
                    f"{predicted[index] / steps[index]:>11.2f}  {placement.split}",
                    flush=True,
                )
            fast, slow = sorted((0, 1), key=lambda i: predicted[i])
            if predicted[slow] > predicted[fast] * (1 + ORDER_GAP):
                checked += 1
                held += steps[fast] <= steps[slow]
            print(
                f"{'':16}measured megatron/syncpass {steps[1] / steps[0]:.2f}x, predicted "
                f"{predicted[1] / predicted[0]:.2f}x"
            )
    print(
        f"measured order as predicted: {held} of {checked} model(s) whose placements the "
        f"prediction puts more than {ORDER_GAP:.0%} apart"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

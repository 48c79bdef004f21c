"""syncpass's tensor-parallel plan against Megatron-LM's placement, measured on this machine.

Each model is rewritten for ``--tp`` ranks twice from the same source: with the
optimiser's layouts (``--tp-placement syncpass``) and with Megatron-LM's hand placement
written the same way (``--tp-placement megatron``: each pair's first linear by columns,
the second by rows, the rest whole). Both files run in one ``syncpass run --tp N
--alongside`` over gloo, their timed steps taken in turn (the order rotated each step),
several runs; each keeps the median of its runs' steps (a run's step: its slowest rank's
median). It prints the predicted step of each placement (the rewrite's figure on the
hardware profile, the local CPU's by default) beside the measured one, and whether the
measured order is the predicted one where the prediction puts more than 10% between them.

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
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass(frozen=True)
class Placement:
    name: str
    file: Path
    predicted_s: float
    split: str  # "18 of 125 op(s) split"


def syncpass(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncpass", *argv], capture_output=True, text=True, check=False
    )


def rewritten(
    model: Path, placement: str, tp: int, hardware: str | None, folder: Path
) -> Placement:
    """``model`` rewritten with ``placement``'s layouts; its predicted step from the summary."""
    out = folder / f"{model.stem}_{placement}.py"
    argv = ["rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor"]
    argv += ["--tp", str(tp), "--tp-placement", placement, "-o", str(out)]
    if hardware is not None:
        argv += ["--hardware", hardware]
    done = syncpass(*argv)
    if done.returncode != 0:
        raise SystemExit(f"{model.stem} {placement}: rewrite failed: {done.stderr.strip()}")
    summary = done.stderr.strip().splitlines()[-1]
    step = re.search(r"predicted step ([\d.]+) (s|ms|us|ns)", summary)
    split = re.search(r"\d+ of \d+ op\(s\) split", summary)
    assert step is not None and split is not None, summary
    return Placement(placement, out, float(step[1]) * _UNITS[step[2]], split[0])


def measured(placements: list[Placement], tp: int, steps: int, folder: Path) -> list[float]:
    """One run of every placement, their steps in turn: each one's step (slowest rank)."""
    report = folder / "report.json"
    first, *others = placements
    argv = ["run", str(first.file), "--tp", str(tp), "--steps", str(steps)]
    argv += ["--alongside", *(str(other.file) for other in others)]
    done = syncpass(*argv, "--json-report", str(report))
    if done.returncode != 0:
        raise SystemExit(f"run failed: {done.stdout[-400:]} {done.stderr[-400:]}")
    document = json.loads(report.read_text())
    return [
        max(rank["step_s"] for rank in one["ranks"]) for one in (document, *document["alongside"])
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
            runs = [measured(placements, options.tp, options.steps, folder)]
            runs += [
                measured(placements, options.tp, options.steps, folder)
                for _ in range(options.rounds - 1)
            ]
            steps = [statistics.median(run[index] for run in runs) for index in range(2)]
            for index, placement in enumerate(placements):
                found = [run[index] for run in runs]
                print(
                    f"{name:16}{placement.name:11}{placement.predicted_s * 1e3:>9.1f}ms"
                    f"{steps[index] * 1e3:>9.1f}ms{max(found) / min(found):>8.2f}"
                    f"{placement.predicted_s / steps[index]:>11.2f}  {placement.split}",
                    flush=True,
                )
            ours, theirs = placements
            fast, slow = sorted((0, 1), key=lambda i: placements[i].predicted_s)
            if placements[slow].predicted_s > placements[fast].predicted_s * (1 + ORDER_GAP):
                checked += 1
                held += steps[fast] <= steps[slow]
            print(
                f"{'':16}measured megatron/syncpass {steps[1] / steps[0]:.2f}x, predicted "
                f"{theirs.predicted_s / ours.predicted_s:.2f}x"
            )
    print(
        f"measured order as predicted: {held} of {checked} model(s) whose placements the "
        f"prediction puts more than {ORDER_GAP:.0%} apart"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

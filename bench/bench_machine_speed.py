"""How steady this machine is: one bundled example's training step (forward, loss and
backward, one thread) timed in a loop, in several fresh processes one after another.

A prediction's level can be no steadier than the machine it is checked on. On a virtual
machine whose cores its host shares, whole processes (and stretches of one) run at one of
two speeds; this prints each process's step times so that a reader sees it:

    python bench/bench_machine_speed.py [--model unet] [--processes 4] [--steps 30]

Each line is one process: every third step's time, then the median of the steps after
the first five, and the fastest step. The ratio of the slowest median to the fastest is
the spread no profile statistic can remove (the README's predictions section).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What one process runs: the example's model and inputs, the default loss of syncpass
#: (the mean square of the output), forward and backward, timed per step.
LOOP = """
import importlib.util, json, sys, time
import torch
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("example_model", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model, args = module.example()[:2]
times = []
for _ in range(int(sys.argv[2])):
    started = time.perf_counter()
    model(*args).float().pow(2).mean().backward()
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""


def step_times(model: str, steps: int) -> list[float]:
    """One fresh process's step times, in seconds."""
    source = ROOT / "examples" / f"{model}.py"
    done = subprocess.run(
        [sys.executable, "-c", LOOP, str(source), str(steps)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(value) for value in done.stdout.strip().strip("[]").split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="unet", help="a bundled example (examples/NAME.py)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    options = parser.parse_args()
    medians = []
    for process in range(options.processes):
        times = step_times(options.model, options.steps)
        median = statistics.median(times[5:] or times)
        medians.append(median)
        shown = " ".join(f"{value * 1e3:.0f}" for value in times[::3])
        print(
            f"process {process}: {shown} ms; median {median * 1e3:.1f} ms, "
            f"fastest {min(times) * 1e3:.1f} ms"
        )
    print(f"slowest median / fastest median: {max(medians) / min(medians):.2f}")


if __name__ == "__main__":
    main()

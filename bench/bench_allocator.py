"""What glibc's allocator costs a weight-heavy stage: the backward of a stack shaped like
torchvision ResNet-18's ``layer4`` (convolutions of 256 and 512 channels at 4x4 and 2x2,
9 MiB of weight gradient each) at 2 samples, one thread, timed in fresh processes, each
with glibc's defaults or with the setting every syncpass profile and rank runs with
(``syncpass.runtime.processes.steady_allocator``). The two kinds take turns:

    python bench/bench_allocator.py [--processes 3] [--steps 14]

Each line is one process: its median backward over the steps after the first two and its
slowest; the last line the ratio of the two kinds' medians (docs/profile.md, "The
allocator it measures with").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

#: One process: the stack, its backward timed with gradients kept, as a pipeline's
#: micro-batches after the first add to them; ``STEADY`` sets the allocator first.
LOOP = """
import statistics, sys, time
if STEADY:
    from syncpass.runtime.processes import steady_allocator
    assert steady_allocator()
import torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
stack = nn.Sequential(
    nn.Conv2d(256, 512, 3, stride=2, padding=1), nn.ReLU(),
    nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(),
    nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(),
    nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(),
)
head = nn.Linear(512, 10)
x = torch.randn(2, 256, 4, 4, requires_grad=True)
times = []
for _ in range(STEPS):
    loss = head(stack(x).mean(dim=(2, 3))).square().mean()
    start = time.perf_counter()
    loss.backward()
    times.append(time.perf_counter() - start)
kept = times[2:]
print(statistics.median(kept), max(kept))
"""


def one(steady: bool, steps: int) -> tuple[float, float]:
    code = LOOP.replace("STEADY", str(steady)).replace("STEPS", str(steps))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    median, slowest = done.stdout.split()
    return float(median), float(slowest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args()
    medians: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.processes):
        for steady in (False, True):
            median, slowest = one(steady, args.steps)
            medians[steady].append(median)
            kind = "steady " if steady else "default"
            print(f"{kind}  backward {median * 1e3:6.1f} ms, slowest {slowest * 1e3:6.1f} ms")
    default, steadied = statistics.median(medians[False]), statistics.median(medians[True])
    print(
        f"default over steady: {default / steadied:.2f}x ({default * 1e3:.1f} against "
        f"{steadied * 1e3:.1f} ms, medians of the processes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

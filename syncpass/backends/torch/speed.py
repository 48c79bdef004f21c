"""The machine's speed at a moment: one fixed workload, timed.

A virtual machine whose cores its host shares runs whole processes, and stretches of
one, at one of two speeds (``bench/bench_machine_speed.py`` shows it: 1.5x apart here).
Op times measured at one speed and a run at the other cannot agree, and no statistic of
the profile's own repeats can say which speed a later run gets. So ``syncpass profile``
times this probe beside its timed runs (each run's op times are brought to the probe's
median, and the median is written to the cost file as ``speed_probe_s``), and ``syncpass
run`` times it on each rank between its timed steps: the prediction beside a run is the
cost model's at the speed the run had (:func:`syncpass.plan.retarget.retarget_speed`).

The workload is a small training step of its own (two linear layers, a GELU, a mean
square loss, forward and backward) on the threads torch has: the kinds of work a
model's step is made of, short enough (about 1 ms a repeat on one core here) to run
between steps without moving them.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from syncpass.contracts.hardware import cpu_devices

#: Rows and width of the probe's step: small enough to stay in a core's cache.
ROWS, WIDTH = 128, 256
REPEATS = 5


class SpeedProbe:
    """The probe's tensors, built once (their allocation is not timed)."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(ROWS, WIDTH, generator=generator)
        self.first = torch.randn(WIDTH, WIDTH, generator=generator, requires_grad=True)
        self.second = torch.randn(WIDTH, WIDTH, generator=generator, requires_grad=True)

    def _step(self) -> None:
        hidden = torch.nn.functional.gelu(self.inputs @ self.first)
        torch.autograd.backward((hidden @ self.second).pow(2).mean())
        self.first.grad = self.second.grad = None

    def time_s(self, repeats: int = REPEATS) -> float:
        """The median of ``repeats`` timed steps, after one untimed."""
        self._step()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            self._step()
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    def on_ranks(self, ranks: int, threads: int) -> list[float]:
        """The probe timed on every rank of the default process group (each calls it):
        all at once, as their steps run, where each rank has cores of its own; else one
        rank after another, since predictions count ranks sharing cores apart. This rank's
        time, in a list (empty on none)."""
        dist.barrier()
        together = ranks <= cpu_devices(threads)
        found = []
        for turn in range(1 if together else ranks):
            if together or turn == dist.get_rank():
                found.append(self.time_s())
            dist.barrier()
        return found

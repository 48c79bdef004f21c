"""Predict the step time of a pipeline schedule by simulating it.

The simulated machine: each stage is one worker that runs its schedule's
actions in order. An action is one micro-batch's forward ``F`` or backward
``B`` on that stage, together with its transfers: ``F`` receives the
activations from the previous stage, computes, and sends its own on; ``B``
receives the gradient from the next stage, computes, and sends the gradient
back. Transfers keep the worker busy (no overlap of compute and
communication, as with gloo on CPU or one NCCL stream), and a receive ends
no earlier than the matching send, so a receiver that is ready first waits.

Per micro-batch, bytes are the full batch's divided by the number of
micro-batches ``M`` and so is compute, except its fixed part (what each call
costs whatever its batch), which every micro-batch pays in full, as it pays
the pipeline runtime's overhead per action; the link latency ``alpha`` is paid
in full by every transfer, so more micro-batches shrink the bubble but add
latency and overhead.

Schedules:

* ``gpipe``: every forward, then every backward (micro-batches in order);
* ``1f1b``: stage ``s`` of ``S`` runs ``S - s - 1`` forwards to fill the
  pipe, then alternates one forward and one backward, then drains.

This module is pure Python and imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from syncpass.contracts.config import SCHEDULES


@dataclass(frozen=True)
class StageLoad:
    """A stage's full-batch work: forward and backward compute in seconds.

    ``forward_fixed_s`` and ``backward_fixed_s`` are the parts every call pays
    whatever its batch; ``overhead_s`` is the runtime's own time per action.
    """

    forward_s: float
    backward_s: float
    forward_fixed_s: float = 0.0
    backward_fixed_s: float = 0.0
    overhead_s: float = 0.0

    def forward_microbatch_s(self, microbatches: int) -> float:
        """One micro-batch's forward, of ``microbatches`` per step."""
        variable = self.forward_s - self.forward_fixed_s
        return self.forward_fixed_s + variable / microbatches + self.overhead_s

    def backward_microbatch_s(self, microbatches: int) -> float:
        """One micro-batch's backward, of ``microbatches`` per step."""
        variable = self.backward_s - self.backward_fixed_s
        return self.backward_fixed_s + variable / microbatches + self.overhead_s


@dataclass(frozen=True)
class Link:
    """The link behind a stage boundary: ``alpha_s + bytes / beta`` per transfer."""

    alpha_s: float
    beta_bytes_per_s: float
    batch_bytes: float  # what crosses it forward for the full batch
    grad_bytes: float | None = None  # the gradients sent back: ``batch_bytes`` when None
    backward: bool = True  # whether any gradient comes back across it

    def transfer_s(self, microbatches: int) -> float:
        return self.alpha_s + self.batch_bytes / microbatches / self.beta_bytes_per_s

    def backward_transfer_s(self, microbatches: int) -> float:
        """A micro-batch's gradients sent back (nothing at all when none comes back)."""
        if not self.backward:
            return 0.0
        grad_bytes = self.batch_bytes if self.grad_bytes is None else self.grad_bytes
        return self.alpha_s + grad_bytes / microbatches / self.beta_bytes_per_s


@dataclass(frozen=True)
class StageTimeline:
    """What one stage did during the simulated step."""

    compute_s: float
    sync_s: float  # busy in transfers
    idle_s: float  # waiting: pipeline bubble and waits for a partner


@dataclass(frozen=True)
class Prediction:
    """Simulated step of one schedule."""

    schedule: str
    microbatches: int
    step_s: float
    stages: tuple[StageTimeline, ...]

    @property
    def comm_wait_ratio(self) -> float:
        """``sync_time / step time`` of the stage that spends most in transfers."""
        if self.step_s <= 0:
            return 0.0
        return max(stage.sync_s for stage in self.stages) / self.step_s

    @property
    def bubble_ratio(self) -> float:
        """Mean share of the step that stages sit idle."""
        if self.step_s <= 0:
            return 0.0
        return sum(stage.idle_s for stage in self.stages) / (len(self.stages) * self.step_s)


def stage_order(
    schedule: str, stage: int, stages: int, microbatches: int, training: bool
) -> list[tuple[str, int]]:
    """The actions stage ``stage`` runs, in order: ``("F", m)`` and ``("B", m)``."""
    forwards = [("F", m) for m in range(microbatches)]
    if not training:
        return forwards
    backwards = [("B", m) for m in range(microbatches)]
    if schedule == "gpipe":
        return forwards + backwards
    if schedule != "1f1b":
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    warmup = min(stages - stage - 1, microbatches)
    order = forwards[:warmup]
    for m in range(microbatches - warmup):
        order.append(forwards[warmup + m])
        order.append(backwards[m])
    order.extend(backwards[microbatches - warmup :])
    return order


def simulate(
    loads: tuple[StageLoad, ...],
    links: tuple[Link, ...],
    microbatches: int,
    schedule: str,
    training: bool,
) -> Prediction:
    """Simulate one training (or inference) step; ``links[s]`` joins stage ``s`` and ``s + 1``."""
    stages = len(loads)
    if len(links) != stages - 1:
        raise ValueError("there must be one link between each pair of neighbouring stages")
    if microbatches < 1:
        raise ValueError("microbatches must be at least 1")
    transfer = [link.transfer_s(microbatches) for link in links]
    transfer_back = [link.backward_transfer_s(microbatches) for link in links]
    forward_work = [load.forward_microbatch_s(microbatches) for load in loads]
    backward_work = [load.backward_microbatch_s(microbatches) for load in loads]
    orders = [
        [kind == "F" for kind, _ in stage_order(schedule, s, stages, microbatches, training)]
        for s in range(stages)
    ]
    # Each stage runs its forwards, and its backwards, in micro-batch order, so the k-th
    # forward (backward) a stage has finished is micro-batch k's: end times by count.
    forward_end: list[list[float]] = [[] for _ in range(stages)]
    backward_end: list[list[float]] = [[] for _ in range(stages)]
    clock = [0.0] * stages
    position = [0] * stages
    sync = [0.0] * stages
    compute = [0.0] * stages
    remaining = sum(len(order) for order in orders)
    last = stages - 1
    # An action's end depends only on the actions before it (its stage's previous one
    # and its partner's), so any order that respects them gives the same times: each
    # stage runs until it waits, and a stage that moved wakes its neighbours.
    waiting = list(range(stages - 1, -1, -1))
    queued = [True] * stages
    while waiting:
        s = waiting.pop()
        queued[s] = False
        order, done_f, done_b = orders[s], forward_end[s], backward_end[s]
        upstream = forward_end[s - 1] if s > 0 else None
        downstream = backward_end[s + 1] if s < last else None
        recv_f = transfer[s - 1] if s > 0 else 0.0
        send_f = transfer[s] if s < last else 0.0
        recv_b = transfer_back[s] if s < last else 0.0  # gradients back over the same links
        send_b = transfer_back[s - 1] if s > 0 else 0.0
        at = started = position[s]
        while at < len(order):
            if order[at]:
                m = len(done_f)
                recv, send, work = recv_f, send_f, forward_work[s]
                if upstream is None:
                    start = clock[s]
                elif m < len(upstream):
                    # A receive overlaps the matching send, so it starts no
                    # earlier than the send's start (end - transfer).
                    start = max(clock[s], upstream[m] - recv)
                else:
                    break
                end = start + recv + work + send
                done_f.append(end)
            else:
                m = len(done_b)
                recv, send, work = recv_b, send_b, backward_work[s]
                if downstream is None:
                    if m >= len(done_f):
                        break
                    start = max(clock[s], done_f[m])
                elif m < len(downstream):
                    start = max(clock[s], downstream[m] - recv)
                else:
                    break
                end = start + recv + work + send
                done_b.append(end)
            clock[s] = end
            sync[s] += recv + send
            compute[s] += work
            at += 1
        position[s] = at
        remaining -= at - started
        if at > started:
            for neighbour in (s + 1, s - 1):
                if 0 <= neighbour < stages and not queued[neighbour]:
                    queued[neighbour] = True
                    waiting.append(neighbour)
    if remaining:
        raise RuntimeError("schedule deadlocked; this is a bug in syncpass")
    step = max(clock) if clock else 0.0
    timelines = tuple(
        StageTimeline(compute_s=compute[s], sync_s=sync[s], idle_s=step - compute[s] - sync[s])
        for s in range(stages)
    )
    return Prediction(schedule=schedule, microbatches=microbatches, step_s=step, stages=timelines)

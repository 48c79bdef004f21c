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

Schedules with one stage per device (:func:`stage_order`, :func:`simulate`):

* ``gpipe``: every forward, then every backward (micro-batches in order);
* ``1f1b``: stage ``s`` of ``S`` runs ``S - s - 1`` forwards to fill the
  pipe, then alternates one forward and one backward, then drains.

Schedules with ``V`` stages per device (:func:`simulate_order`) run the order a
:class:`ScheduleOrder` gives: each device's actions as torch's schedule class
computes them (``syncpass.backends.torch.schedules``; this module does not derive
them again). Besides ``F`` and ``B`` they may split a backward into ``I``, the
gradient of the stage's inputs (which the stage before waits for), and ``W``, its
weights' gradient (which nobody waits for: the zero-bubble schedules fill the
bubble with it). A transfer between two stages on one device costs nothing.

A link may also say that two posts across it that meet stall (:attr:`Link.meet_stall_s`:
gloo on a CPU, where a rank that posts its transfers as its neighbour posts its own can
block for milliseconds). Then the step is simulated twice: the first pass gives each
device's batches of posts, and the second delays the action after each batch by the stall,
weighted by how close the neighbour's nearest batch across the same link came
(:func:`meeting_stalls`, :func:`meeting_stall_s`).

This module is pure Python and imports nothing heavy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from syncpass.contracts.config import SCHEDULES, SINGLE_STAGE_SCHEDULES


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
    input_gradient_s: float | None = None  # the inputs' part of backward_s; None: half

    def forward_microbatch_s(self, microbatches: int) -> float:
        """One micro-batch's forward, of ``microbatches`` per step."""
        variable = self.forward_s - self.forward_fixed_s
        return self.forward_fixed_s + variable / microbatches + self.overhead_s

    def backward_microbatch_s(self, microbatches: int) -> float:
        """One micro-batch's backward, of ``microbatches`` per step."""
        variable = self.backward_s - self.backward_fixed_s
        return self.backward_fixed_s + variable / microbatches + self.overhead_s

    def split_backward_microbatch_s(self, microbatches: int) -> tuple[float, float]:
        """One micro-batch's backward run apart: the inputs' gradient (``I``) and the
        weights' (``W``), each an action of its own, so each pays the overhead."""
        whole = self.backward_microbatch_s(microbatches) - self.overhead_s
        if self.backward_s <= 0 or self.input_gradient_s is None:
            share = 0.5
        else:
            share = min(1.0, self.input_gradient_s / self.backward_s)
        return whole * share + self.overhead_s, whole * (1 - share) + self.overhead_s


@dataclass(frozen=True)
class Link:
    """The link behind a stage boundary: ``alpha_s + bytes / beta`` per transfer."""

    alpha_s: float
    beta_bytes_per_s: float
    batch_bytes: float  # what crosses it forward for the full batch
    grad_bytes: float | None = None  # the gradients sent back: ``batch_bytes`` when None
    backward: bool = True  # whether any gradient comes back across it
    # Two posts across the link that meet: the stall of posts at the same moment, and how
    # far apart (in the simulated times) two posts may be and still stall (Hardware's).
    meet_stall_s: float = 0.0
    meet_window_s: float = 0.0

    @property
    def stalls(self) -> bool:
        """Whether posts across the link that meet stall (:func:`meeting_stall_s`)."""
        return self.meet_stall_s > 0 and self.meet_window_s > 0

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
    """Simulated step of one schedule: ``stages`` holds one timeline per device (with one
    stage per device, per stage). ``actions``, when asked for, holds what each device ran,
    in the order it ran it, with its times (:class:`TimedAction`)."""

    schedule: str
    microbatches: int
    step_s: float
    stages: tuple[StageTimeline, ...]
    actions: tuple[tuple[TimedAction, ...], ...] = ()
    # Batches of posts that met the neighbour's and stalled (:func:`meeting_stalls`), over
    # every device, and the time they added to the devices' transfers in all.
    stalled_posts: int = 0
    stalled_s: float = 0.0

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
    """Simulate one training (or inference) step; ``links[s]`` joins stage ``s`` and ``s + 1``.
    Over links whose meeting posts stall, :func:`simulate_order` runs the same order twice."""
    stages = len(loads)
    if len(links) != stages - 1:
        raise ValueError("there must be one link between each pair of neighbouring stages")
    if microbatches < 1:
        raise ValueError("microbatches must be at least 1")
    if any(link.stalls for link in links):
        as_order = single_stage_order(schedule, stages, 1, microbatches, training)
        return simulate_order(loads, links, as_order)
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


# --- schedules given as each device's order of actions ---------------------------


class Action(NamedTuple):
    """One compute action: ``kind`` (``F`` forward, ``B`` backward, ``I`` the inputs'
    gradient, ``W`` the weights') of micro-batch ``microbatch`` on stage ``stage``."""

    kind: str
    stage: int
    microbatch: int


class TimedAction(NamedTuple):
    """An action as the simulation ran it: busy from ``start_s`` to ``end_s``, its
    transfers included (it receives for its first ``recv_s`` and sends for its last
    ``send_s``); ``ready_s`` is when what it waited for was there."""

    action: Action
    ready_s: float
    start_s: float
    end_s: float
    recv_s: float = 0.0
    send_s: float = 0.0


@dataclass(frozen=True)
class ScheduleOrder:
    """What each device runs, in order, for one step: ``actions[d]`` for device ``d``;
    ``stage_device[s]`` is the device of stage ``s``."""

    schedule: str
    microbatches: int
    stage_device: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]

    def __post_init__(self) -> None:
        devices = len(self.actions)
        if sorted(set(self.stage_device)) != list(range(devices)):
            raise ValueError("every device must hold a stage, and every stage sit on a device")
        seen: set[Action] = set()
        for device, actions in enumerate(self.actions):
            for action in actions:
                if action.kind not in ("F", "B", "I", "W"):
                    raise ValueError(f"unknown action kind {action.kind!r}")
                if not 0 <= action.stage < len(self.stage_device):
                    raise ValueError(f"action {action} names no stage")
                if self.stage_device[action.stage] != device:
                    raise ValueError(f"action {action} runs on device {device}, not its stage's")
                if not 0 <= action.microbatch < self.microbatches or action in seen:
                    raise ValueError(f"action {action} is out of range or listed twice")
                seen.add(action)
        training = any(action.kind != "F" for action in seen)
        for stage in range(len(self.stage_device)):
            for m in range(self.microbatches):
                if Action("F", stage, m) not in seen:
                    raise ValueError(f"no forward of micro-batch {m} on stage {stage}")
                split = Action("I", stage, m) in seen and Action("W", stage, m) in seen
                if training and (Action("B", stage, m) in seen) == split:
                    raise ValueError(
                        f"micro-batch {m} on stage {stage} needs one backward: B, or I and W"
                    )

    @property
    def devices(self) -> int:
        return len(self.actions)

    @property
    def stages(self) -> int:
        return len(self.stage_device)


#: Where a plan gets a schedule's order from: ``(schedule, devices, stages_per_device,
#: microbatches, training)``; the torch backend's is torch's own
#: (``syncpass.backends.torch.schedules.schedule_order``).
OrderSource = Callable[[str, int, int, int, bool], "ScheduleOrder"]


def single_stage_order(
    schedule: str, devices: int, stages_per_device: int, microbatches: int, training: bool
) -> ScheduleOrder:
    """The order of ``gpipe`` or ``1f1b`` (:func:`stage_order`) as a :class:`ScheduleOrder`;
    the schedules with several stages per device take theirs from the engine."""
    if schedule not in SINGLE_STAGE_SCHEDULES:
        raise ValueError(
            f"{schedule}'s order is torch's: syncpass.backends.torch.schedules.schedule_order"
        )
    if stages_per_device != 1:
        raise ValueError(f"{schedule} holds one stage per device")
    return ScheduleOrder(
        schedule=schedule,
        microbatches=microbatches,
        stage_device=tuple(range(devices)),
        actions=tuple(
            tuple(
                Action(kind, s, m)
                for kind, m in stage_order(schedule, s, devices, microbatches, training)
            )
            for s in range(devices)
        ),
    )


def simulate_order(
    loads: tuple[StageLoad, ...],
    links: tuple[Link, ...],
    order: ScheduleOrder,
    record: bool = False,
) -> Prediction:
    """Simulate one step of ``order``; ``loads[s]`` is stage ``s``'s work and ``links[s]``
    joins stage ``s`` and ``s + 1``. With ``record`` the prediction keeps each action's
    times (a test checks them against the order and its dependencies). Over links whose
    meeting posts stall (:attr:`Link.stalls`) it runs twice: the second pass delays the
    actions after the first pass's batches of posts that met (:func:`meeting_stalls`).
    """
    if not any(link.stalls for link in links):
        return _run_order(loads, links, order, record, {})
    first = _run_order(loads, links, order, True, {})
    return _run_order(loads, links, order, record, meeting_stalls(first, order, links))


def _run_order(
    loads: tuple[StageLoad, ...],
    links: tuple[Link, ...],
    order: ScheduleOrder,
    record: bool,
    stalls: Mapping[tuple[int, int], float],
) -> Prediction:
    """:func:`simulate_order`'s pass: ``stalls[(d, i)]`` delays device ``d``'s ``i``-th
    action by that long after the device's clock (its posts stalled).

    The machine is :func:`simulate`'s, with devices for stages: a device runs its actions
    in order, each with its transfers (none between two stages on the device); an ``F``
    waits for the stage before's ``F`` of the micro-batch, a ``B`` or ``I`` for the stage
    after's ``B`` or ``I`` (on the last stage, for its own ``F``), a ``W`` for its ``I``.
    """
    stages, devices, microbatches = order.stages, order.devices, order.microbatches
    if len(loads) != stages or len(links) != stages - 1:
        raise ValueError("one load per stage and one link between neighbouring stages")
    if microbatches < 1:
        raise ValueError("microbatches must be at least 1")
    where = order.stage_device
    local = [where[s] == where[s + 1] for s in range(stages - 1)]
    forward_link = [
        0.0 if local[s] else links[s].transfer_s(microbatches) for s in range(stages - 1)
    ]
    backward_link = [
        0.0 if local[s] else links[s].backward_transfer_s(microbatches) for s in range(stages - 1)
    ]
    forward_work = [load.forward_microbatch_s(microbatches) for load in loads]
    backward_work = [load.backward_microbatch_s(microbatches) for load in loads]
    split = [load.split_backward_microbatch_s(microbatches) for load in loads]
    unset = -1.0
    forward_end = [[unset] * microbatches for _ in range(stages)]
    grad_end = [[unset] * microbatches for _ in range(stages)]  # B or I: the inputs' gradient
    clock = [0.0] * devices
    sync = [0.0] * devices
    compute = [0.0] * devices
    position = [0] * devices
    last = stages - 1
    remaining = sum(len(actions) for actions in order.actions)
    timed: list[list[TimedAction]] = [[] for _ in range(devices)]
    # A device runs until it waits; one that moved wakes the devices of the stages next to
    # its own (any order that respects each action's predecessors gives the same times).
    neighbours = [
        sorted(
            {
                where[t]
                for s in range(stages)
                if where[s] == d
                for t in (s - 1, s + 1)
                if 0 <= t < stages
            }
            - {d}
        )
        for d in range(devices)
    ]
    waiting = list(range(devices - 1, -1, -1))
    queued = [True] * devices
    while waiting:
        d = waiting.pop()
        queued[d] = False
        actions = order.actions[d]
        at = started = position[d]
        while at < len(actions):
            kind, s, m = actions[at]
            recv = send = 0.0
            ready = 0.0
            if kind == "F":
                start = clock[d]
                if s > 0:
                    ready = forward_end[s - 1][m]
                    if ready == unset:
                        break
                    recv = forward_link[s - 1]
                    start = max(start, ready - recv)
                if s < last:
                    send = forward_link[s]
                work = forward_work[s]
            elif kind == "W":
                ready = grad_end[s][m]
                if ready == unset:
                    break
                start, work = max(clock[d], ready), split[s][1]
            else:
                if s == last:
                    ready = forward_end[s][m]
                    if ready == unset:
                        break
                    start = max(clock[d], ready)
                else:
                    ready = grad_end[s + 1][m]
                    if ready == unset:
                        break
                    recv = backward_link[s]
                    start = max(clock[d], ready - recv)
                if s > 0:
                    send = backward_link[s - 1]
                work = backward_work[s] if kind == "B" else split[s][0]
            stall = stalls.get((d, at), 0.0)
            if stall:
                start = max(start, clock[d] + stall)
                sync[d] += stall
            end = start + recv + work + send
            if kind == "F":
                forward_end[s][m] = end
            elif kind != "W":
                grad_end[s][m] = end
            if record:
                timed[d].append(TimedAction(actions[at], ready, start, end, recv, send))
            clock[d] = end
            sync[d] += recv + send
            compute[d] += work
            at += 1
        position[d] = at
        remaining -= at - started
        if at > started:
            for other in neighbours[d]:
                if not queued[other]:
                    queued[other] = True
                    waiting.append(other)
    if remaining:
        raise RuntimeError(f"the {order.schedule} order deadlocked; this is a bug in syncpass")
    step = max(clock) if clock else 0.0
    timelines = tuple(
        StageTimeline(compute_s=compute[d], sync_s=sync[d], idle_s=step - compute[d] - sync[d])
        for d in range(devices)
    )
    return Prediction(
        schedule=order.schedule,
        microbatches=microbatches,
        step_s=step,
        stages=timelines,
        actions=tuple(tuple(device) for device in timed) if record else (),
        stalled_posts=sum(stall > 0 for stall in stalls.values()),
        stalled_s=sum(stalls.values()),
    )


def meeting_stall_s(link: Link, apart_s: float) -> float:
    """The expected stall of a post across ``link`` whose neighbour's nearest post across
    it is ``apart_s`` away in the simulated times: ``meet_stall_s`` for posts at the same
    moment, falling linearly to 0 at ``meet_window_s`` apart: a triangle of the height and
    the area of the stall curve ``syncpass calibrate`` measures, whose two processes'
    compute jitters as a pipeline's does."""
    if not link.stalls:
        return 0.0
    return link.meet_stall_s * max(0.0, 1.0 - abs(apart_s) / link.meet_window_s)


def meeting_stalls(
    first: Prediction, order: ScheduleOrder, links: tuple[Link, ...]
) -> dict[tuple[int, int], float]:
    """Each device's stalled posts in ``first`` (a pass with its actions recorded), as
    ``(device, index of the action the post delays)``.

    A device posts as each action's compute ends: its sends, with the next action's
    receives in one batch, as torch's schedules post them (the first action's receives at
    the step's start). The simulation runs a batch's sends before its receives, where
    gloo runs them at once, so a batch is the span from the compute's end to the sends'
    end, and two batches are as far apart as their spans. A batch stalls once, delaying
    the next action, by the largest :func:`meeting_stall_s` over its links, each against
    the nearest batch over the same link of the device across it.
    """
    batches: dict[tuple[int, int], list[tuple[float, float, int]]] = {}  # (device, link)
    for device, timed in enumerate(first.actions):
        span = (0.0, 0.0)  # the batch before the action: the previous one's sends
        sent: int | None = None  # the link the previous action sent over
        for index, action in enumerate(timed):
            kind, stage, _ = action.action
            over = {sent} if sent is not None else set()
            if action.recv_s:
                over.add(stage - 1 if kind == "F" else stage)
            for link in over:
                batches.setdefault((device, link), []).append((*span, index))
            span = (action.end_s - action.send_s, action.end_s)
            sent = (stage if kind == "F" else stage - 1) if action.send_s else None
        if sent is not None:  # the last sends delay nothing (-1), but may meet the other's
            batches.setdefault((device, sent), []).append((*span, -1))
    where = order.stage_device
    stalls: dict[tuple[int, int], float] = {}
    for (device, link), mine in batches.items():
        other = where[link + 1] if where[link] == device else where[link]
        theirs = sorted(batches.get((other, link), []))
        starts = [start for start, _, _ in theirs]
        for start, end, index in mine:
            if index < 0:
                continue
            at = bisect.bisect_left(starts, start)
            apart = min(
                (
                    max(0.0, theirs[near][0] - end, start - theirs[near][1])
                    for near in (at - 1, at)
                    if 0 <= near < len(theirs)
                ),
                default=math.inf,
            )
            stall = meeting_stall_s(links[link], apart)
            if stall > stalls.get((device, index), 0.0):
                stalls[(device, index)] = stall
    return stalls

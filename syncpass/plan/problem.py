"""Building the optimiser's problem from a cost file: per-op compute and memory, per-cut
communication, admissible and pinned cuts, and how far each value reaches."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import INPUT, OUTPUT
from syncpass.core.errors import SyncpassError
from syncpass.plan.optimizer import Problem


def problem_from_costs(
    costs: Costs,
    config: SyncConfig,
    pinned: tuple[str, ...] = (),
    microbatches: int = 1,
    carries_values: bool = False,
    refused_kinds: tuple[str, ...] = (),
    stages_per_device: int = 1,
) -> Problem:
    """The optimiser's arrays for ``costs``; ``pinned`` op ids must have cuts.

    Costs are per step of ``microbatches`` micro-batches: each micro-batch pays
    every op's fixed part and every transfer's latency. With ``carries_values``
    a value may reach any later stage (each stage between sends it on, and every
    cut's live bytes already count it); otherwise only the next one. A cut where a
    value of one of ``refused_kinds`` crosses is not admissible (pinning it is an error).
    With ``stages_per_device`` stages on a device, each stage may use that share of its
    memory: a sufficient condition for the device's sum, which keeps the memory bound a
    bound on one stage (the exact optimiser's); a plan that fits only with unequal shares
    is not found.
    """
    n = len(costs.ops)
    index = costs.op_index
    cut_comm = np.zeros(n + 1)
    admissible = np.zeros(n + 1, dtype=bool)
    pins = np.zeros(n + 1, dtype=bool)
    unsendable = costs.unsendable(refused_kinds)
    refused: dict[str, str] = {}
    for cut in costs.cuts:
        position = index[cut.after] + 1
        if cut.after in unsendable:
            refused[cut.after] = ", ".join(unsendable[cut.after])
            if cut.pinned:
                raise SyncpassError(
                    f"the sync point pinned after {cut.after!r} cannot be: "
                    f"{refused[cut.after]} would cross it and the stages send only tensors, "
                    "numbers and shapes; move the pin, or compute those values after it"
                )
            continue
        admissible[position] = True
        cut_comm[position] = costs.cut_comm_s(cut, microbatches)
        pins[position] = cut.pinned
    for op_id in pinned:
        if op_id not in index:
            known = ", ".join(cut.after for cut in costs.cuts[:12])
            more = ", ..." if len(costs.cuts) > 12 else ""
            raise SyncpassError(
                f"cannot pin a sync point after {op_id!r}: no op has that id; "
                f"admissible cuts follow {known}{more}"
            )
        position = index[op_id] + 1
        if op_id in refused:
            raise SyncpassError(
                f"cannot pin a sync point after {op_id!r}: {refused[op_id]} would cross it "
                "and the stages send only tensors, numbers and shapes"
            )
        if not admissible[position]:
            raise SyncpassError(
                f"cannot pin a sync point after {op_id!r}: the cost file lists no cut there"
            )
        pins[position] = True
    memory = costs.hardware.device_memory_bytes
    if memory is not None:
        # A device holds stages_per_device stages: each may use its share.
        memory = memory / stages_per_device
    return Problem(
        last_use=None if carries_values else last_use_positions(costs),
        op_compute=np.array(
            [costs.op_compute_s(op, microbatches) for op in costs.ops], dtype=np.float64
        ),
        op_memory=np.array([costs.op_memory_bytes(op) for op in costs.ops], dtype=np.float64),
        cut_comm=cut_comm,
        admissible=admissible,
        pinned=pins,
        min_ops=config.min_sync_interval,
        memory_limit=math.inf if memory is None else float(memory),
    )


def last_use_positions(costs: Costs) -> npt.NDArray[np.int64] | None:
    """``Problem.last_use`` from the cost file's def-use edges (``None`` without edges)."""
    if not costs.edges:
        return None
    n = len(costs.ops)
    index = costs.op_index
    furthest = np.arange(n + 1, dtype=np.int64)  # by producer position; inputs at 0
    for producer, consumer in costs.edges:
        source = 0 if producer == INPUT else index[producer] + 1
        target = index[consumer] + 1 if consumer != OUTPUT else n if source == 0 else n + 1
        furthest[source] = max(furthest[source], target)
    # The inputs count from position 0: torch's pipelining hands the model's inputs to
    # the first stage only, so every op that reads one runs there. The output counts as
    # past the last op (n + 1): torch returns what the last stage makes, so every value
    # the model returns is made there (an input it returns leaves one stage: n).
    return np.maximum.accumulate(furthest)


@dataclass(frozen=True)
class FarValue:
    """A value that ``cuts`` make cross more than one sync point: made by op ``producer``
    (or a model input), used by ``consumer`` (or the model's output), ``stages`` stages
    later. The value torch's traced pipelining cannot send."""

    producer: str
    consumer: str
    stages: int

    def describe(self, costs: Costs) -> str:
        """``the value torch.ones@L55 makes (model.py:55) is used by blocks.5 (model.py:60)``."""
        sources = {op.id: op.source for op in costs.ops}

        def where(op_id: str) -> str:
            return f" ({sources[op_id]})" if sources.get(op_id) else ""

        made = (
            "a model input"
            if self.producer == INPUT
            else f"the value {self.producer} makes{where(self.producer)}"
        )
        used = (
            "the model's output"
            if self.consumer == OUTPUT
            else f"{self.consumer}{where(self.consumer)}"
        )
        return f"{made} is used by {used}, {self.stages} stages later"


def far_reaching_value(costs: Costs, cuts: Sequence[int]) -> FarValue | None:
    """The value that reaches furthest past the next stage under ``cuts`` (cut positions:
    after op ``j``), from the cost file's def-use edges; ``None`` when every value reaches
    at most the next stage."""
    index = costs.op_index
    n = len(costs.ops)
    ordered = sorted(cuts)

    def stage(position: int) -> int:  # op at position k (1-based) runs in this stage
        return bisect.bisect_left(ordered, position)

    furthest: FarValue | None = None
    for producer, consumer in costs.edges:
        made = 0 if producer == INPUT else stage(index[producer] + 1)
        used = stage(n) + 1 if consumer == OUTPUT else stage(index[consumer] + 1)
        apart = used - made
        if apart > 1 and (furthest is None or apart > furthest.stages):
            furthest = FarValue(producer, consumer, apart)
    return furthest

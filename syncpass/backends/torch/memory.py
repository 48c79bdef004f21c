"""Each rank's peak memory in ``syncpass run``, to set beside the plan's memory model.

On a GPU it is ``torch.cuda.max_memory_allocated``: every byte the caching allocator handed
out, workspace and transient buffers included. On the CPU torch keeps no such figure, so a
rank counts what the plan's memory model counts, as it runs
(``docs/formats.md``, "Recomputation"):

* its parameters, their gradients and the optimizer's state (each storage once);
* the activations autograd saves for the backward, per micro-batch in flight: a
  ``saved_tensors_hooks`` pack hook around each forward the schedule runs records the
  storage of every tensor saved (parameters and buffers left out, each storage once), and
  the micro-batch's backward releases them. A checkpointed block (``checkpoint(...,
  use_reentrant=False)``) saves only its inputs there; what it recomputes in the backward is
  transient and not counted, as the model does not count it.

The peak is the most of those bytes alive after any forward or backward of the checked
(warm-up) step, with the gradients and the optimizer's state counted whole, as the model
counts them. What it leaves out, as the model does: the outputs of one op kept only by the
next op's inputs, the transient memory of a backward, the pipeline's send and receive
buffers.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.pipelining.stage import _PipelineStageBase

#: What the peak on a CPU counts, for the report.
CPU_MEASURE = (
    "parameters, gradients, optimizer state and the activations saved for backward per "
    "micro-batch in flight (saved_tensors_hooks), each storage once"
)
CUDA_MEASURE = "torch.cuda.max_memory_allocated"
#: Device bytes per parameter byte in ``syncpass run``: it trains with plain SGD, which keeps
#: the weights and their gradients and no state (Adam, which cost files assume with 4, keeps
#: two moments more).
RUN_MEMORY_MULTIPLIER = 2


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the storages of ``tensors``, each once."""
    return sum(dict(_storage(tensor) for tensor in tensors).values())


@dataclass
class MemoryMeter:
    """Counts a CPU rank's saved activations per micro-batch as its schedule runs (while
    ``on``), and the peak of everything counted."""

    on: bool = False
    weights: set[int] = field(default_factory=set)  # storages of parameters and buffers
    static: Callable[[], int] = lambda: 0  # parameters, gradients, optimizer state
    live: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    peak_activations: int = 0
    peak_bytes: int = 0

    def pack(self, key: tuple[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        """The pack hook of micro-batch ``key`` (stage, micro-batch): records and keeps."""

        def packed(tensor: torch.Tensor) -> torch.Tensor:
            pointer, nbytes = _storage(tensor)
            if pointer not in self.weights and nbytes:
                self.live.setdefault(key, {})[pointer] = nbytes
            return tensor

        return packed

    def activations(self) -> int:
        alive: dict[int, int] = {}
        for storages in self.live.values():
            alive.update(storages)
        return sum(alive.values())

    def sample(self) -> None:
        activations = self.activations()
        self.peak_activations = max(self.peak_activations, activations)
        self.peak_bytes = max(self.peak_bytes, self.static() + activations)


def _unpacked(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def watch_memory(stage: _PipelineStageBase, meter: MemoryMeter) -> None:
    """Count what ``stage``'s forwards save, per micro-batch, until its backward (torch
    2.13's schedules: ``forward_one_chunk`` runs a micro-batch's forward,
    ``backward_one_chunk`` its backward, or its inputs' part under the zero-bubble
    schedules, after which the weights' part keeps some: counted released, a lower bound
    there)."""
    index = stage.stage_index
    forward = stage.forward_one_chunk
    backward = stage.backward_one_chunk
    forward_signature = inspect.signature(forward)
    backward_signature = inspect.signature(backward)

    @functools.wraps(forward)
    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        if not meter.on:
            return forward(*args, **kwargs)
        chunk = int(next(iter(forward_signature.bind(*args, **kwargs).arguments.values())))
        with torch.autograd.graph.saved_tensors_hooks(meter.pack((index, chunk)), _unpacked):
            result = forward(*args, **kwargs)
        meter.sample()
        return result

    @functools.wraps(backward)
    def counted_backward(*args: Any, **kwargs: Any) -> Any:
        result = backward(*args, **kwargs)
        if meter.on:
            chunk = int(next(iter(backward_signature.bind(*args, **kwargs).arguments.values())))
            meter.sample()  # the gradients exist now
            meter.live.pop((index, chunk), None)
        return result

    stage.forward_one_chunk = counted_forward  # type: ignore[method-assign]
    stage.backward_one_chunk = counted_backward  # type: ignore[method-assign]


def static_bytes(
    parameters: Callable[[], list[torch.nn.Parameter]],
    buffers: Callable[[], list[torch.Tensor]],
    optimizer: Callable[[], torch.optim.Optimizer | None],
) -> Callable[[], int]:
    """What a rank holds whatever the micro-batches: parameters and buffers, gradients
    (counted whole, as the model counts them, whether allocated yet or not) and the
    optimizer's state."""

    def counted() -> int:
        held = [*parameters(), *buffers()]
        gradients = sum(p.numel() * p.element_size() for p in parameters())
        found = optimizer()
        state = [
            value
            for entry in (found.state.values() if found is not None else ())
            for value in entry.values()
            if isinstance(value, torch.Tensor)
        ]
        return storage_bytes(held) + gradients + storage_bytes(state)

    return counted

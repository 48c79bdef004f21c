"""The smallest micro-batch a model's batch norms take, from the shapes they see.

A batch norm in training normalises each channel over the batch and every spatial
position: over ``N * H * W`` values for an input of shape ``(N, C, H, W)``. torch
refuses one value (``Expected more than 1 value per channel when training``), so a
batch norm whose input is ``(N, C)`` or ``(N, C, 1, 1)`` (a ResNet's last block on
small images) fails on micro-batches of one sample. :class:`WatchBatchNorms` records
every batch norm a forward runs in training, and :func:`smallest_microbatch` is the
rule; the profile (for the cost file) and ``syncpass run`` (for its default count)
both take the figure from here.

Instance and group norms normalise within one sample: their rule (more than one
spatial value) does not depend on the micro-batch, so they set no floor.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_TORCH_FOLDER = str(Path(torch.__file__).parent)


@dataclass(frozen=True)
class MicrobatchFloor:
    """The smallest micro-batch (samples) every training batch norm takes, and ``by``:
    the one that needs the most (``"layer4.1.bn2 (resnet.py:96)"``), ``None`` when no
    batch norm needs more than one sample."""

    size: int = 1
    by: str | None = None


def smallest_microbatch(values: int, batch: int) -> int:
    """The fewest samples a batch norm takes that normalised each channel over
    ``values`` values on a batch of ``batch`` samples.

    Its values per channel grow with the micro-batch (``values / batch`` per sample,
    whatever the input's layout: ``(N, C, L)``, or ``(N * T, C)`` after a reshape), and
    torch needs more than one: ``m * values / batch > 1``.
    """
    return batch // values + 1 if values > 0 else batch + 1


class WatchBatchNorms(TorchFunctionMode):
    """While active, records every ``batch_norm`` that runs in training (the modules
    of ``model``, named by their path in it, and direct calls of
    ``torch.nn.functional.batch_norm``) with the values per channel it normalised over.

    ``with WatchBatchNorms(model) as watch: model(*args)``, then ``watch.floor(batch)``.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.seen: list[tuple[str, int]] = []  # (who, values per channel), in call order
        self._running: list[str] = []  # the batch norm modules being called, innermost last
        self._hooks: list[Any] = []

    def __enter__(self) -> WatchBatchNorms:
        for name, module in self.model.named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                self._hooks.append(module.register_forward_pre_hook(self._enter_module(name)))
                self._hooks.append(module.register_forward_hook(self._leave_module))
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _enter_module(self, name: str) -> Any:
        def entered(module: torch.nn.Module, args: Any) -> None:
            self._running.append(f"{name or 'the model'}{_caller()}")

        return entered

    def _leave_module(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._running:
            self._running.pop()

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.batch_norm:
            training = args[5] if len(args) > 5 else kwargs.get("training", False)
            data = args[0] if args else kwargs.get("input")
            if training and isinstance(data, torch.Tensor) and data.dim() >= 2:
                # (N, C, *spatial): each channel is normalised over N * prod(spatial) values.
                values = data.numel() // data.shape[1] if data.shape[1] else 0
                who = self._running[-1] if self._running else f"a batch_norm call{_caller()}"
                self.seen.append((who, values))
        return func(*args, **kwargs)

    def floor(self, batch: int) -> MicrobatchFloor:
        """The smallest micro-batch of a batch of ``batch`` samples that every recorded
        batch norm takes (the first to need the most names it)."""
        found = MicrobatchFloor()
        for who, values in self.seen:
            size = smallest_microbatch(values, batch)
            if size > found.size:
                found = MicrobatchFloor(size, who)
        return found


def _caller() -> str:
    """`` (file:line)`` of the innermost frame outside torch (the line that called the
    batch norm), or ``""``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith((_TORCH_FOLDER, __file__)):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return ""
    return f" ({frame.f_code.co_filename}:{frame.f_lineno})"


def batch_norm_floor(model: torch.nn.Module, args: tuple[Any, ...], batch: int) -> MicrobatchFloor:
    """The floor the batch norms of ``model`` set for a batch of ``batch`` samples: one
    forward on ``args`` without gradients, watched (:class:`WatchBatchNorms`). The batch
    norms' running statistics take one more step, as in any training forward."""
    with torch.no_grad(), WatchBatchNorms(model) as watch:
        model(*args)
    return watch.floor(batch)

"""Loading a torch example: a model and one batch of inputs, built by a function of the user's.

An example is named ``PATH.py:FUNC`` or ``package.module:FUNC``. ``FUNC`` takes
no arguments and returns either ``(model, args)`` or ``(model, args, target,
loss_fn)``: an ``nn.Module``, a tuple with the model's positional inputs for
one full batch, a target tensor whose first dimension is the batch, and
``loss_fn(output, target) -> scalar tensor``. Without a loss the default is
:func:`default_loss`, ``output.float().pow(2).mean()`` (summed over the outputs
when the forward returns several), which depends on every output element.

``torch.manual_seed(0)`` runs before ``FUNC``, so every process that loads the
same example builds the same weights and inputs. torch is imported only when
an example is loaded: importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from syncpass.core.errors import SyncpassError
from syncpass.runtime.example import (
    factory_origin,
    find_factory,
    import_user_file,
    import_user_module,
    is_path,
    located_failure,
    split_spec,
)

if TYPE_CHECKING:
    import torch

EXPECTED = "(model, args) or (model, args, target, loss_fn)"


@dataclass(frozen=True)
class Example:
    """A model with one batch of inputs, and how to turn its output into a loss.

    ``target`` is ``None`` when the example gives no loss; ``loss_fn`` is then
    :func:`default_loss`, which ignores the target. ``origin`` is the factory's
    ``"file:line"``.
    """

    model: torch.nn.Module
    args: tuple[Any, ...]
    target: torch.Tensor | None
    loss_fn: Callable[[Any, Any], torch.Tensor]
    spec: str
    origin: str = ""


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """``output.float().pow(2).mean()``, summed over the outputs if there are several.

    ``target`` is ignored; it is accepted so that the function can stand where a
    ``loss_fn(output, target)`` is expected.
    """
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    total: torch.Tensor = outputs[0].float().pow(2).mean()
    for extra in outputs[1:]:
        total = total + extra.float().pow(2).mean()
    return total


def _check_result(result: Any, name: str, origin: str, spec: str) -> Example:
    import torch

    def wrong(detail: str) -> SyncpassError:
        return SyncpassError(f"{name}() must return {EXPECTED}; {detail}", origin)

    if not isinstance(result, tuple) or len(result) not in (2, 4):
        size = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise wrong(f"it returned {size}")
    model, args = result[0], result[1]
    if not isinstance(model, torch.nn.Module):
        raise wrong(f"the model has type {type(model).__name__}, not torch.nn.Module")
    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise wrong(f"args has type {type(args).__name__}, not a tuple of inputs such as (x,)")
    if len(result) == 2:
        return Example(model, args, None, default_loss, spec, origin)
    target, loss_fn = result[2], result[3]
    if not isinstance(target, torch.Tensor):
        raise wrong(
            f"target has type {type(target).__name__}, not a tensor whose first dimension is the batch"
        )
    if not callable(loss_fn):
        raise wrong(f"loss_fn has type {type(loss_fn).__name__}, not a function(output, target)")
    return Example(model, args, target, loss_fn, spec, origin)


def load_example(spec: str) -> Example:
    """Import ``PATH.py:FUNC`` or ``package.module:FUNC``, seed torch, call ``FUNC()`` and check it.

    A file is imported under a private module name (never one a real package
    could own) with its own folder on ``sys.path``. Every failure is a
    :class:`~syncpass.core.errors.SyncpassError` located at the user's file (and line).
    """
    import torch

    source, name = split_spec(spec)
    module = import_user_file(source) if is_path(source) else import_user_module(source)
    where = source if is_path(source) else (getattr(module, "__file__", None) or source)
    function = find_factory(module, name, where)
    origin = factory_origin(function, where)
    torch.manual_seed(0)
    try:
        result = function()
    except Exception as error:
        raise located_failure(
            error, origin.rpartition(":")[0], origin, f"{name}() raised"
        ) from None
    return _check_result(result, name, origin, spec)

"""Loading a torch example: a model and one batch of inputs, built by a function of the user's.

An example is named ``PATH.py:FUNC`` or ``package.module:FUNC``. ``FUNC`` takes
no arguments and returns either ``(model, args)`` or ``(model, args, target,
loss_fn)``: an ``nn.Module``, a tuple with the model's positional inputs for
one full batch, a target tensor whose first dimension is the batch, and
``loss_fn(output, target) -> scalar tensor``. Without a loss the default is
:func:`default_loss`: the mean square of every floating-point tensor the forward
returns, found inside tuples, lists, dicts and dataclasses (a Hugging Face
``ModelOutput``), summed. It depends on every output element; it takes them all, not
only the first as Hugging Face's ``output[0]`` convention would, so that every
weight that shapes an output (a pooler beside the last hidden state) gets a gradient
to verify. :func:`default_loss_terms` names what it took, for the report.

``torch.manual_seed(0)`` runs before ``FUNC``, so every process that loads the
same example builds the same weights and inputs. torch is imported only when
an example is loaded: importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
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


def output_tensors(output: Any, path: str = "output") -> list[tuple[str, torch.Tensor]]:
    """The floating-point tensors inside ``output``, each with the expression that reads
    it (``output[0]``, ``output.last_hidden_state``, ``output["logits"]``), in order.

    Tuples, lists, dicts (a ``ModelOutput`` is one: its ``None`` fields are left out)
    and dataclasses are walked; integer tensors, ``None`` and other values are skipped.
    """
    import torch

    if isinstance(output, torch.Tensor):
        return [(path, output)] if output.is_floating_point() or output.is_complex() else []
    found: list[tuple[str, torch.Tensor]] = []
    if isinstance(output, Mapping):
        # A dataclass that is also a mapping (ModelOutput) reads as attributes.
        attribute = dataclasses.is_dataclass(output)
        for key, value in output.items():
            inner = f"{path}.{key}" if attribute and isinstance(key, str) else f"{path}[{key!r}]"
            found += output_tensors(value, inner)
    elif isinstance(output, (tuple, list)):
        for index, value in enumerate(output):
            found += output_tensors(value, f"{path}[{index}]")
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        for field in dataclasses.fields(output):
            found += output_tensors(getattr(output, field.name), f"{path}.{field.name}")
    return found


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """The mean square of every floating-point tensor of ``output``, summed (see
    :func:`output_tensors`).

    ``target`` is ignored; it is accepted so that the function can stand where a
    ``loss_fn(output, target)`` is expected.
    """
    tensors = output_tensors(output)
    if not tensors:
        raise SyncpassError(
            f"the default loss needs a floating-point tensor in the model's output, and it "
            f"returned {type(output).__name__} with none; give the example a loss: "
            f"return (model, args, target, loss_fn)"
        )
    total: torch.Tensor = tensors[0][1].float().pow(2).mean()
    for _, extra in tensors[1:]:
        total = total + extra.float().pow(2).mean()
    return total


def default_loss_terms(output: Any) -> str:
    """What :func:`default_loss` takes of ``output``, for the report: ``mean square of
    output[0] + output[1]``."""
    names = [name for name, _ in output_tensors(output)]
    shown = " + ".join(names[:6]) + (f" + {len(names) - 6} more" if len(names) > 6 else "")
    return f"mean square of {shown}"


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

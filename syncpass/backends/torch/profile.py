"""``syncpass profile`` and ``rewrite --example`` for torch: load the example, measure its model.

:func:`measure` is the torch backend's measure hook; it is the one place where
the user's code runs to profile a torch model
(:mod:`syncpass.backends.torch.measure` does the timing). Importing this
module imports no torch; calling :func:`measure` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from syncpass.backends.spec import MeasureRequest
from syncpass.core.errors import SyncpassError

if TYPE_CHECKING:
    import torch

    from syncpass.backends.torch.example import Example
    from syncpass.contracts.costs import Costs
    from syncpass.contracts.graph import OpGraph

#: Progress lines appear only once profiling has taken this long.
PROGRESS_AFTER_S = 2.0


@dataclass(frozen=True)
class AnalysedSource:
    """What the profile analyses, as the backend gives it once the model is built: ``text``,
    and for a model class that inherits its forward, ``inherited``: the base class whose
    forward it is and that class's file (:func:`check_model_file`)."""

    text: str
    inherited: tuple[str, Path] | None = None


def measure(
    request: MeasureRequest,
    check_tracer: bool = True,
    refine: Callable[[OpGraph, torch.nn.Module, tuple[Any, ...]], OpGraph] | None = None,
    expand: Callable[[torch.nn.Module, tuple[Any, ...]], AnalysedSource] | None = None,
) -> Costs:
    """The measure hook: :func:`measure_file` with the request's settings.

    ``check_tracer`` asks torch's tracer whether it takes the model: the
    ``pipe_split()`` form needs it, the eager stages do not. ``refine`` is the
    backend's last word on the op graph (``profile_costs``); ``expand`` gives the
    source to analyse from the built model and the example's inputs (the eager form's
    expanded forward, whose branches may read the model's settings), instead of the
    request's text, and may refuse them before anything runs.
    """
    return measure_file(
        request.file,
        request.text,
        request.example,
        request.model,
        request.repeats,
        request.warmup,
        request.threads,
        request.depth,
        check_tracer and request.meta is None,
        request.meta,
        refine,
        expand,
    )


class ProgressReporter:
    """Writes progress lines to ``stream``, but only once ``after_s`` seconds have passed.

    A quick profile stays silent; a slow one says what it is doing.
    """

    def __init__(self, stream: TextIO, after_s: float = PROGRESS_AFTER_S) -> None:
        self.stream = stream
        self.after_s = after_s
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed >= self.after_s:
            print(f"syncpass profile: {message} ({elapsed:.1f} s)", file=self.stream, flush=True)


def check_model_file(
    model: torch.nn.Module,
    file: Path,
    class_name: str | None,
    inherited: tuple[str, Path] | None = None,
) -> None:
    """The example's model must run the forward written in FILE, not a copy elsewhere.

    With ``inherited`` (``(base, its file)``: the analysis planned ``class_name``'s forward
    as the one it inherits from ``base``), the model must be a ``class_name`` of FILE
    whose forward is ``base``'s, from that file."""
    if inherited is not None and class_name is not None:
        _check_inherited(model, file, class_name, *inherited)
        return
    for cls in type(model).__mro__:
        if "forward" in vars(cls):
            break
    else:  # pragma: no cover - nn.Module defines forward
        return
    if class_name is not None and cls.__name__ != class_name:
        return  # the analysis reports the class mismatch, naming both classes
    code = getattr(inspect.unwrap(vars(cls)["forward"]), "__code__", None)
    if code is None:
        return
    defined_in = Path(code.co_filename)
    if defined_in.resolve() != file.resolve():
        raise SyncpassError(
            f"the example's model runs {cls.__name__}.forward from {defined_in}, not from this "
            "file; profile that file, or make the example build its model from this one",
            str(file),
        )


def _check_inherited(
    model: torch.nn.Module, file: Path, class_name: str, base: str, base_file: Path
) -> None:
    named = next((cls for cls in type(model).__mro__ if cls.__name__ == class_name), None)
    if named is None:
        return  # the analysis reports the class mismatch, naming both classes
    defined_in = _class_file(named)
    if defined_in is not None and defined_in.resolve() != file.resolve():
        raise SyncpassError(
            f"the example's model is a {class_name} from {defined_in}, not from this file; "
            "profile that file, or make the example build its model from this one",
            str(file),
        )
    for cls in named.__mro__:
        if "forward" in vars(cls):
            break
    else:  # pragma: no cover - nn.Module defines forward
        return
    code = getattr(inspect.unwrap(vars(cls)["forward"]), "__code__", None)
    runs = Path(code.co_filename) if code is not None else None
    if cls.__name__ != base or (runs is not None and runs.resolve() != base_file.resolve()):
        where = f" from {runs}" if runs is not None else ""
        raise SyncpassError(
            f"the example's {class_name} runs {cls.__name__}.forward{where}, but the stages were "
            f"planned from {base}.forward in {base_file}, as the file's imports name it: "
            "run syncpass with the import path the model is built with",
            str(file),
        )


def _class_file(cls: type) -> Path | None:
    """The file ``cls`` is defined in, as its module says (or its methods' code)."""
    try:
        return Path(inspect.getfile(cls))
    except (TypeError, OSError):
        pass
    for member in vars(cls).values():
        code = getattr(inspect.unwrap(member), "__code__", None) if callable(member) else None
        if code is not None:
            return Path(code.co_filename)
    return None


def measure_file(
    file: Path,
    text: str,
    example: str,
    class_name: str | None,
    repeats: int = 5,
    warmup: int = 2,
    threads: int = 1,
    depth: int = 1,
    check_tracer: bool = True,
    meta: str | None = None,
    refine: Callable[[OpGraph, torch.nn.Module, tuple[Any, ...]], OpGraph] | None = None,
    expand: Callable[[torch.nn.Module, tuple[Any, ...]], AnalysedSource] | None = None,
) -> Costs:
    """Load the example named by ``example`` and profile the model of ``file`` with it
    (analysed as ``text``, or as what ``expand`` gives for the built model).

    The one place where user code runs, for ``profile`` and ``rewrite --example``.
    It also asks torch's tracer whether it takes the model
    (:mod:`syncpass.backends.torch.traceable`): a model it cannot trace gets a
    warning now and a note in its cost file, which every plan of it shows.
    """
    from syncpass.frontend.source import parse_source
    from syncpass.runtime.example import example_for_file

    parse_source(text, str(file))  # a syntax error is reported before any user code runs
    spec = example_for_file(file, example)
    progress = ProgressReporter(sys.stderr)
    progress("loading the example" + (" as fake tensors" if meta else ""))
    hardware = None
    counting: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if meta is not None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        from syncpass.contracts.hardware import load_profile

        hardware = load_profile(meta).hardware
        if hardware.flops_per_s is None:
            raise SyncpassError(
                f"--meta counts FLOPs: the hardware profile {meta!r} gives no flops_per_s to "
                "turn them into time"
            )
        # Fake tensors: shapes, dtypes and devices, no storage (torch.export's way of running a
        # model). Unlike the bare meta device, code that asks whether it is being traced
        # (Hugging Face's masks) sees a fake tensor and skips its data-dependent checks.
        counting = FakeTensorMode(allow_non_fake_inputs=True)
    from syncpass.backends.torch.example import default_loss, default_loss_terms, load_example
    from syncpass.backends.torch.measure import profile_costs

    loaded = load_example(spec) if meta is None else fake_example(spec, counting)
    inherited = None
    if expand is not None:
        analysed = expand(loaded.model, tuple(loaded.args))
        text, inherited = analysed.text, analysed.inherited
    with counting:
        check_model_file(loaded.model, file, class_name, inherited)

        default_terms: list[str] = []  # what the default loss took, from the first output

        def loss(output: Any) -> torch.Tensor:
            if loaded.loss_fn is default_loss and not default_terms:
                default_terms.append(default_loss_terms(output))
            return loaded.loss_fn(output, loaded.target)

        costs = profile_costs(
            text,
            str(file),
            loaded.model,
            loaded.args,
            loss,
            class_name=class_name,
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            progress=progress,
            depth=depth,
            small_batch=None
            if meta
            else smaller_batch(loaded.args, loaded.target, loaded.loss_fn, loaded.model),
            counted_on=hardware,
            refine=refine,
        )
    if meta is None:
        from syncpass.backends.torch.tensor_record import record_into_costs

        progress("recording the tensor graph")
        costs = record_into_costs(costs, loaded, costs.hardware.flops_per_s)
    if default_terms:
        note = f"the example gives no loss: the default loss is the {default_terms[0]}"
        costs = dataclasses.replace(costs, notes=(*costs.notes, note))
    failure = None
    if check_tracer:
        progress("checking that torch's tracer takes the model")
        from syncpass.backends.torch.traceable import tracer_failure

        failure = tracer_failure(loaded.model, loaded.args, file)
    if failure is not None:
        note = (
            f"torch.distributed.pipelining.pipeline() cannot trace this model ({failure}); "
            "the pipe_split() stages syncpass writes are built by that tracer, so `syncpass run` "
            "cannot run them until the line is changed; the eager stages of --backend "
            "torch_stages need no tracer"
        )
        costs = dataclasses.replace(costs, notes=(*costs.notes, note))
    for note in costs.notes:
        print(f"syncpass: warning: {note}", file=sys.stderr)
    return costs


def fake_example(spec: str, mode: contextlib.AbstractContextManager[Any]) -> Example:
    """The example with no data: built on the meta device, then given fake CPU tensors
    (under ``mode``, a ``FakeTensorMode``) for its weights, buffers, inputs and target.

    Building on the meta device is how torchtitan and timm make a model without memory;
    a constructor that computes a value on an explicit ``device="cpu"`` (timm's drop-path
    rates, ``torch.linspace(...).item()``) still can, where under fake tensors nothing
    has a value. The buffers have no values either: nothing counted depends on them.
    """
    import torch
    from torch.utils._pytree import tree_map

    from syncpass.backends.torch.example import load_example

    with torch.device("meta"):
        loaded = load_example(spec)

    def fake(value: Any) -> Any:
        return torch.empty_like(value, device="cpu") if isinstance(value, torch.Tensor) else value

    with mode:
        loaded.model.to_empty(device="cpu")
        args, target = tree_map(fake, loaded.args), tree_map(fake, loaded.target)
    return dataclasses.replace(loaded, args=args, target=target)


def smaller_batch(
    args: tuple[Any, ...],
    target: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    model: torch.nn.Module | None = None,
) -> tuple[tuple[Any, ...], Callable[[Any], torch.Tensor]] | None:
    """The first eighth of the example's batch (:data:`SMALL_BATCH_DIVISOR`; at least one
    sample, and at least what ``model``'s batch norms in training take, the smallest
    micro-batch a plan runs), with its loss, or ``None`` when it cannot be cut (a batch
    under 2, a floor of the whole batch, or inputs or target without the batch dimension).
    A ``None`` target (the default loss, which ignores it) stays ``None``."""
    import torch

    from syncpass.backends.torch.measure import SMALL_BATCH_DIVISOR
    from syncpass.backends.torch.norms import batch_norm_floor

    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0:
        return None
    size = int(tensors[0].shape[0])
    small = max(1, size // SMALL_BATCH_DIVISOR)
    if model is not None and any(
        isinstance(module, torch.nn.modules.batchnorm._BatchNorm) for module in model.modules()
    ):
        small = max(small, batch_norm_floor(model, args, size).size)
    if small >= size:
        return None

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            return value[:small]
        return value

    if target is not None and not (
        isinstance(target, torch.Tensor) and target.dim() > 0 and target.shape[0] == size
    ):
        return None
    small_args = tuple(cut(value) for value in args)
    small_target = None if target is None else target[:small]

    def small_loss(output: Any) -> torch.Tensor:
        return loss_fn(output, small_target)

    return small_args, small_loss

"""The unsplit reference for ``syncpass run --verify``, and the comparison with it.

The reference runs the original model on the same micro-batches the schedule
uses, one forward and one backward per micro-batch, so gradients accumulate in
``.grad`` in the same order. ``ScheduleGPipe`` and ``Schedule1F1B`` with
``scale_grads=True`` (torch's default, which this runtime keeps) divide every
stage gradient by the number of micro-batches once the last backward is done
(``PipelineStage.scale_grads``); the reference does the same. For a loss that
averages over its micro-batch, that makes the gradient the one of the whole
batch's mean loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from syncpass.runtime.contracts import LossCheck, ParamCheck

# (rtol, atol) by dtype. float32 on CPU reproduces the unsplit model bit for bit
# in practice (same kernels, same accumulation order), so the tight pair leaves
# room only for a traced graph that reorders a reduction. The half-precision
# pairs are torch.testing's defaults for those dtypes.
CPU_TOLERANCES: Mapping[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}
# On CUDA, cuDNN may pick a different (or a nondeterministic, atomics-based)
# algorithm for the traced stage than for the eager model, and convolutions may
# use TF32: float32 needs a looser bound there.
CUDA_FLOAT32 = (1e-4, 1e-5)


def tolerances(
    dtype: torch.dtype, device: torch.device, rtol: float | None, atol: float | None
) -> tuple[float, float]:
    """The ``(rtol, atol)`` for gradients of ``dtype`` on ``device``; given values win."""
    default = CPU_TOLERANCES.get(dtype, CPU_TOLERANCES[torch.float32])
    if device.type == "cuda" and dtype == torch.float32:
        default = CUDA_FLOAT32
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol)


@dataclass(frozen=True)
class Reference:
    """The unsplit model's per-micro-batch losses and its (scaled) gradients by name."""

    losses: tuple[float, ...]
    gradients: Mapping[str, torch.Tensor | None]
    shapes: Mapping[str, tuple[torch.Size, torch.dtype]]


def run_reference(
    model: nn.Module,
    arg_chunks: Sequence[tuple[Any, ...]],
    target_chunks: Sequence[Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    grad_scale: int,
) -> Reference:
    """Forward and backward ``model`` on each micro-batch in order, then divide by ``grad_scale``."""
    model.zero_grad(set_to_none=True)
    losses = []
    for args, target in zip(arg_chunks, target_chunks, strict=True):
        loss = loss_fn(model(*args), target)
        torch.autograd.backward(loss)
        losses.append(float(loss.detach()))
    # Matches PipelineStage.scale_grads, which divides only when the factor is not 1.
    if grad_scale != 1:
        for parameter in model.parameters():
            if parameter.grad is not None:
                parameter.grad.div_(grad_scale)
    named = list(model.named_parameters(remove_duplicate=False))
    return Reference(
        losses=tuple(losses),
        gradients={name: parameter.grad for name, parameter in named},
        shapes={name: (parameter.shape, parameter.dtype) for name, parameter in named},
    )


def randomness(model: nn.Module, args: tuple[Any, ...]) -> str | None:
    """Why ``model``'s forward on ``args`` draws random numbers, or ``None`` when it draws
    none: torch's generators are as they were after it, and two runs with different seeds
    give the same output.

    A split run draws its random numbers (dropout masks, stochastic depth, an RNG in
    forward) in another order than the unsplit model, so its gradients need not match;
    this says so beside a mismatch. Watching the generators catches draws that happened
    not to change this output (stochastic depth that kept every block of one micro-batch).
    The random state is left as it was.
    """
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        before = _generator_states()
        first = output_tensors(model(*args))
        drew = any(
            not torch.equal(old, new) for old, new in zip(before, _generator_states(), strict=True)
        )
        torch.manual_seed(2)
        second = output_tensors(model(*args))
    same = len(first) == len(second) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, second, strict=True)
    )
    if same and not drew:
        return None
    dropouts = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0 and module.training
    ]
    shown = ", ".join(dropouts[:3]) + (
        f" and {len(dropouts) - 3} more" if len(dropouts) > 3 else ""
    )
    what = f"dropout in {shown}" if dropouts else "random numbers drawn in forward"
    seen = (
        "the unsplit model's output differs between two runs with different seeds"
        if not same
        else "the unsplit model's forward draws random numbers"
    )
    return (
        f"{seen} ({what}): the split run draws them in another order, so a mismatch may "
        "be randomness, not the split; verify with dropout and stochastic depth off (p=0, "
        "or model.eval() in the example)"
    )


def _generator_states() -> list[torch.Tensor]:
    """The states of torch's CPU generator and, when in use, the CUDA ones."""
    states = [torch.random.get_rng_state()]
    in_use = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if in_use:
        states += list(torch.cuda.get_rng_state_all())
    return states


def output_tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a model's output: a tensor, a tuple, a dict or a dataclass of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in output_tensors(item)]
    if isinstance(value, tuple | list):
        return [t for item in value for t in output_tensors(item)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return [t for f in fields for t in output_tensors(getattr(value, f.name))]
    return []


def canonical_names(model: nn.Module) -> dict[str, str]:
    """Every name a parameter is reachable by (tied weights have several) -> its first name."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        aliases[name] = first.setdefault(id(parameter), name)
    return aliases


def compare(
    actual: torch.Tensor | None, expected: torch.Tensor | None, rtol: float, atol: float
) -> tuple[float, float, bool, str]:
    """``(max_abs, max_rel, ok, note)`` for one gradient; a missing gradient on one side fails."""
    if actual is None or expected is None:
        if actual is None and expected is None:
            return 0.0, 0.0, True, "no gradient in either"
        side = "the pipeline" if actual is None else "the unsplit model"
        return float("inf"), float("inf"), False, f"no gradient in {side}"
    if actual.shape != expected.shape:
        return (
            float("inf"),
            float("inf"),
            False,
            f"shape {tuple(actual.shape)} != {tuple(expected.shape)}",
        )
    a = actual.detach().to("cpu", torch.float64)
    b = expected.detach().to("cpu", torch.float64)
    ok = bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())
    if a.numel() == 0:
        return 0.0, 0.0, ok, ""
    diff = (a - b).abs().nan_to_num(nan=0.0)
    nonzero = b != 0
    max_rel = float((diff[nonzero] / b[nonzero].abs()).max()) if bool(nonzero.any()) else 0.0
    return float(diff.max()), max_rel, ok, ""


def check_losses(
    pipeline_losses: Sequence[torch.Tensor], reference: Reference, rtol: float, atol: float
) -> tuple[LossCheck, ...]:
    """The last stage's per-micro-batch losses against the reference's."""
    checks = []
    for index, (loss, expected) in enumerate(zip(pipeline_losses, reference.losses, strict=False)):
        value = float(loss.detach())
        ok = abs(value - expected) <= atol + rtol * abs(expected)
        checks.append(LossCheck(index, value, expected, ok))
    if len(pipeline_losses) != len(reference.losses):
        checks.append(LossCheck(len(checks), float("nan"), float("nan"), False))
    return tuple(checks)


def stage_parameter_names(
    stage_module: nn.Module, identity: Mapping[int, str], aliases: Mapping[str, str]
) -> dict[str, str]:
    """Stage parameter name -> the original model's (canonical) name, or ``""`` if none.

    The tracer moves the original ``nn.Parameter`` objects into the stage
    (torch 2.13 also keeps their original dotted names), so identity finds
    them; a parameter used by several stages is copied per stage and is
    matched by name instead.
    """
    names = {}
    for name, parameter in stage_module.named_parameters(remove_duplicate=False):
        names[name] = identity.get(id(parameter)) or aliases.get(name, "")
    return names


def _failed(name: str, stage: int, numel: int, rtol: float, atol: float, note: str) -> ParamCheck:
    inf = float("inf")
    return ParamCheck(name, stage, numel, inf, inf, False, rtol, atol, note)


def check_stage(
    stage_index: int,
    stage_module: nn.Module,
    names: Mapping[str, str],
    replicated: Mapping[str, torch.Tensor],
    reference: Reference,
    device: torch.device,
    rtol: float | None,
    atol: float | None,
    gathered: Mapping[str, torch.Tensor] | None = None,
) -> tuple[ParamCheck, ...]:
    """Compare every parameter gradient of one stage with the reference's.

    ``replicated`` holds, for parameters that several stages hold copies of,
    the gradient summed over those copies: that sum is what the unsplit model
    computes. ``gathered`` holds, for parameters split over tensor-parallel ranks, the
    whole gradient gathered from them.
    """
    gathered = gathered or {}
    checks = []
    seen = set()
    for local, parameter in stage_module.named_parameters():
        original = names.get(local, "")
        if original and original in seen:  # a weight tied within the stage
            continue
        seen.add(original)
        rel, abs_ = tolerances(parameter.dtype, device, rtol, atol)
        if not original:
            checks.append(
                _failed(local, stage_index, parameter.numel(), rel, abs_, "not in the model")
            )
            continue
        gradient = replicated.get(original, gathered.get(original, parameter.grad))
        max_abs, max_rel, ok, note = compare(gradient, reference.gradients[original], rel, abs_)
        if original in replicated:
            note = "held by several stages; compared as the sum over them"
        elif original in gathered:
            note = "split over the tensor-parallel ranks; gathered"
        checks.append(
            ParamCheck(
                original, stage_index, parameter.numel(), max_abs, max_rel, ok, rel, abs_, note
            )
        )
    return tuple(checks)


def sum_replicated(
    groups: Iterable[Mapping[str, str]],
    own: Mapping[str, nn.Module],
    aliases: Mapping[str, str],
    reference: Reference,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """All-reduce the gradients of parameters that several stages hold copies of.

    ``groups`` is ``Pipe.replicated_params`` (stage submodule name -> the
    parameter's name there), the same on every rank, so every rank joins the
    same collectives in the same order. ``own`` maps the names of the stages this
    rank holds (one, or several under a schedule with several stages per rank) to
    their modules; the copies they hold are added up before the all-reduce. Returns
    original name -> summed gradient for the copies this rank holds.
    """
    local = {
        submodule: dict(stage_module.named_parameters(remove_duplicate=False))
        for submodule, stage_module in own.items()
    }
    ordered = sorted(groups, key=lambda group: sorted(group.values()))
    summed: dict[str, torch.Tensor] = {}
    for group in ordered:
        first = sorted(group.values())[0]
        original = aliases.get(first, first)
        if original not in reference.shapes:
            continue  # not a model parameter: check_stage reports it; every rank skips it alike
        shape, dtype = reference.shapes[original]
        buffer = torch.zeros(shape, dtype=dtype, device=device)
        held = False
        for submodule, name in group.items():
            parameter = local.get(submodule, {}).get(name)
            if submodule in local:
                held = True
            if parameter is not None and parameter.grad is not None:
                buffer += parameter.grad.detach()
        dist.all_reduce(buffer)
        if held:
            summed[original] = buffer
    return summed


def check_unplaced(
    covered: Iterable[str], aliases: Mapping[str, str], reference: Reference
) -> tuple[ParamCheck, ...]:
    """Parameters of the model that no stage holds: fine only if the model gives them no gradient."""
    covered = set(covered)
    checks = []
    for name in sorted(set(aliases.values()) - covered):
        gradient = reference.gradients[name]
        numel = reference.shapes[name][0].numel()
        if gradient is None:
            checks.append(
                ParamCheck(name, -1, numel, 0.0, 0.0, True, 0.0, 0.0, "in no stage; unused")
            )
        else:
            note = "in no stage, but the unsplit model gives it a gradient"
            checks.append(_failed(name, -1, numel, 0.0, 0.0, note))
    return tuple(checks)

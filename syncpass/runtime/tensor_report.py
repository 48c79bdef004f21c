"""The report of a tensor-parallel run (``syncpass run --tp N``), whichever backend ran it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from syncpass.runtime.contracts import TensorRunResult
from syncpass.runtime.prediction import TensorRunPrediction, render_tensor_prediction

#: Split sums add in another order than whole ones: the default tolerances of a check.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5


def render_tensor_run(
    result: TensorRunResult, predictions: Sequence[TensorRunPrediction] = ()
) -> str:
    """The report of a tensor-parallel run, then each of its ``alongside`` files', each
    with its prediction where ``predictions`` has one (``run --costs``)."""
    parts = [_render_one(one) for one in (result, *result.alongside)]
    parts = [
        part + (render_tensor_prediction(predictions[i]) if i < len(predictions) else "")
        for i, part in enumerate(parts)
    ]
    if not result.alongside:
        return parts[0]
    return "\n".join(
        f"== {one.request.file}{' (steps taken in turn with the others)' if i == 0 else ''}\n{part}"
        for i, (one, part) in enumerate(zip((result, *result.alongside), parts, strict=True))
    )


def _render_one(result: TensorRunResult) -> str:
    from syncpass.core.units import seconds

    request = result.request
    lines = [f"syncpass run: {Path(request.file).name} on {request.tp} {result.engine}"]
    expected = ", ".join(f"{count} {kind}" for kind, count in result.expected) or "none"
    unit = "device" if result.one_program else "rank"
    for rank in result.ranks:
        ran = ", ".join(f"{count} {kind}" for kind, count in rank.counts) or "none"
        timed = f" (median of {rank.timed_steps})" if rank.timed_steps else " (one step)"
        who = "every device (one program)" if result.one_program else f"rank {rank.rank}"
        lines.append(
            f"  {who}: loss {rank.loss:.6g}, step {seconds(rank.step_s)}{timed}, "
            f"{rank.split} split weight(s); collectives: {ran}"
        )
    verdict = "match" if result.collectives_match else "MISMATCH"
    lines.append(f"collectives: {verdict}: the plan has {expected} per {unit}")
    if request.verify:
        checks = [check for rank in result.ranks for check in rank.checks]
        bad = [check for check in checks if not check.ok]
        worst = max((check.max_abs for check in checks), default=0.0)
        loss_diff = max(abs(rank.loss - (rank.reference_loss or 0.0)) for rank in result.ranks)
        names = {check.name for check in checks}
        ok = "ok" if result.verified else "MISMATCH"
        rtol = DEFAULT_RTOL if request.rtol is None else request.rtol
        atol = DEFAULT_ATOL if request.atol is None else request.atol
        lines.append(
            f"verify: {ok}: {len(names)} parameter(s) compared with the unsplit model "
            f"({len(names - {c.name for c in bad})} match; split ones gathered from the "
            f"{unit}s), loss on {request.tp if result.one_program else len(result.ranks)} "
            f"{unit}(s); rtol {rtol:g}, atol {atol:g}"
        )
        lines.append(f"  max abs diff {worst:.3g}; loss max abs diff {loss_diff:.3g}")
        for check in bad[:10]:
            lines.append(
                f"  MISMATCH {check.name}"
                + ("" if result.one_program else f" (rank {check.stage})")
                + f": max abs diff {check.max_abs:.3g}"
            )
    return "\n".join(lines) + "\n"

"""The ``syncpass run`` report: a per-stage table (per rank, with the stages it holds, where a
rank holds several), the verification summary, and its JSON form."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from syncpass.core.units import num_bytes, percent, seconds
from syncpass.runtime.contracts import ParamCheck, RunResult

REPORT_VERSION = 1
MISMATCHES_SHOWN = 10


def _table(rows: Sequence[Sequence[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return [
        "  ".join(
            cell.rjust(widths[col]) if col in right else cell.ljust(widths[col])
            for col, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _figure(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"


def _tolerance_text(checks: Sequence[ParamCheck]) -> str:
    pairs = sorted({(check.rtol, check.atol) for check in checks if check.stage >= 0})
    return ", ".join(f"rtol {rtol:g}, atol {atol:g}" for rtol, atol in pairs) or "-"


def render_verification(result: RunResult) -> list[str]:
    """The verification summary lines (empty without ``--verify``)."""
    if not result.request.verify:
        return []
    checks = result.checks
    compared = [check for check in checks if check.stage >= 0]
    names = {check.name for check in compared}
    bad = [check for check in checks if not check.ok]
    losses = result.loss_checks
    bad_losses = [check for check in losses if not check.ok]
    finite = [check for check in compared if not math.isinf(check.max_abs)]
    max_abs = max((check.max_abs for check in finite), default=0.0)
    max_rel = max((check.max_rel for check in finite), default=0.0)
    loss_diff = max((abs(c.pipeline - c.reference) for c in losses), default=0.0)
    verdict = "ok" if result.verified else "MISMATCH"
    lines = [
        f"verify: {verdict}: {len(names)} of {result.model_parameters} parameter(s) compared "
        f"with the unsplit model ({len(names - {c.name for c in compared if not c.ok})} match), "
        f"{len(losses) - len(bad_losses)} of {len(losses)} micro-batch loss(es) match; "
        f"{_tolerance_text(compared)}",
        f"  max abs diff {_figure(max_abs)}, max rel diff {_figure(max_rel)}; "
        f"loss max abs diff {_figure(loss_diff)}",
    ]
    for check in bad[:MISMATCHES_SHOWN]:
        where = f"stage {check.stage}" if check.stage >= 0 else "no stage"
        detail = f"max abs diff {_figure(check.max_abs)}, max rel diff {_figure(check.max_rel)}"
        if math.isinf(check.max_abs) and check.note:
            detail = check.note
        elif check.note:
            detail += f" ({check.note})"
        lines.append(f"  mismatch: {check.name} ({where}): {detail}")
    if len(bad) > MISMATCHES_SHOWN:
        lines.append(f"  ... and {len(bad) - MISMATCHES_SHOWN} more mismatching parameter(s)")
    for tied in result.tied:
        where = f"{tied.name}'s copies on stages {', '.join(map(str, tied.stages))}"
        if tied.ok:
            lines.append(
                f"  tied: {where} equal after {tied.steps} step(s) (each step gives every copy "
                "the sum of their gradients)"
            )
        else:
            lines.append(
                f"  mismatch: tied {where} {_figure(tied.max_abs)} apart after {tied.steps} step(s)"
            )
    if result.randomness is not None and not result.verified:
        lines.append(f"  note: {result.randomness}")
    for loss in bad_losses:
        lines.append(
            f"  mismatch: loss of micro-batch {loss.microbatch}: pipeline {loss.pipeline:.9g}, "
            f"unsplit {loss.reference:.9g}"
        )
    return lines


def _held(result: RunResult) -> bool:
    """Whether a rank held several stages: then the rows are ranks."""
    return any(len(figures.stages_held) > 1 for figures in result.stages)


def _stages_text(result: RunResult) -> str:
    count = result.stage_count
    tp = result.request.tp
    split = (
        ""
        if tp == 1
        else f", each split over {tp} tensor-parallel ranks ({result.request.ranks} in all; "
        "the figures are each stage's first)"
    )
    if not _held(result):
        return f"{count} stage(s){split}"
    ranks = len(result.stages)
    return (
        f"{count} stage(s) on {ranks} rank(s), {result.request.stages_per_device} per rank{split}"
    )


def render_run(result: RunResult) -> str:
    """The text report: the run's settings, one row per stage (per rank, with the stages it
    holds, where ranks hold several), the verification summary."""
    request = result.request
    header = (
        f"syncpass run: {request.file}, example {request.example}, {_stages_text(result)}, "
        f"{request.schedule}, {result.microbatches} micro-batch(es) of "
        f"{result.batch // result.microbatches}, {request.steps} step(s) after 1 warm-up, "
        f"{result.backend} on {result.device}, {_threads_text(result)}"
    )
    # One process holding several stages names each stage's device beside its rank.
    devices = any(stage.device for stage in result.stages)
    held = _held(result)
    head = ["stage", "rank", "device", "params", "step", "compute", "comm wait", "wait/step"]
    if held:
        head[:2] = ["rank", "stages"]
    rows = [head if devices else [name for name in head if name != "device"]]
    for stage in result.stages:
        first = [str(stage.stage), str(stage.rank)]
        if held:
            first = [str(stage.rank), ", ".join(map(str, stage.stages_held))]
        rows.append(
            [
                *first,
                *([stage.device or "-"] if devices else []),
                f"{stage.parameters:,}",
                seconds(stage.step_s),
                seconds(stage.compute_s),
                seconds(stage.comm_wait_s),
                percent(stage.comm_wait_s / stage.step_s) if stage.step_s > 0 else "-",
            ]
        )
    slowest = max(result.stages, key=lambda stage: stage.compute_s)
    shift = 1 if devices else 0
    lines = [header, "", *_table(rows, frozenset(col + shift for col in (2, 3, 4, 5, 6)))]
    if held:
        lines += [
            "figures of each rank's median step, its stages together; comm wait: the part of the",
            "step not spent in its stages' own forward, backward, loss or update (waiting for",
            "neighbours, bubbles);",
            f"most compute: rank {slowest.rank}, stages "
            f"{', '.join(map(str, slowest.stages_held))} ({seconds(slowest.compute_s)})",
        ]
    else:
        lines += [
            "figures of each stage's median step; comm wait: the part of the step not spent in the",
            "stage's own forward, backward, loss or update (waiting for neighbours, bubbles);",
            f"most compute: stage {slowest.stage} ({seconds(slowest.compute_s)})",
        ]
    lines += _memory_lines(result)
    for note in result.order_notes:
        lines.append(f"note: not the order syncpass plans with: {note}")
    lines += [f"note: {note}" for note in result.notes]
    verification = render_verification(result)
    if verification:
        lines += ["", *verification]
    return "\n".join(lines) + "\n"


def _memory_lines(result: RunResult) -> list[str]:
    """Each rank's peak memory, and what measures it."""
    measured = [stage for stage in result.stages if stage.peak_memory_bytes is not None]
    if not measured:
        return []
    peaks = []
    for stage in measured:
        assert stage.peak_memory_bytes is not None
        saved = stage.peak_activation_bytes
        peaks.append(
            f"rank {stage.rank} {num_bytes(stage.peak_memory_bytes)}"
            + ("" if saved is None else f" (activations {num_bytes(saved)})")
        )
    return [f"peak memory: {', '.join(peaks)}; measured as {measured[0].memory_measure}"]


def _threads_text(result: RunResult) -> str:
    if result.own_threads:
        return f"{result.request.threads} thread(s) per process"
    return "CPU threads as the backend's runtime sizes them"


def _number(value: float) -> float | None:
    # JSON has no infinity: a comparison that could not be made is null.
    return None if math.isinf(value) or math.isnan(value) else value


def report_document(result: RunResult) -> dict[str, Any]:
    """The ``--json-report`` document as a JSON-ready dict (times in seconds)."""
    request = result.request
    document: dict[str, Any] = {
        "version": REPORT_VERSION,
        "file": request.file,
        "example": request.example,
        "stages": result.stage_count,
        "ranks": len(result.stages),
        "stages_per_device": request.stages_per_device,
        "schedule": request.schedule,
        "batch": result.batch,
        "microbatches": result.microbatches,
        "steps": request.steps,
        "backend": result.backend,
        "device": result.device,
        "threads": request.threads if result.own_threads else None,
        "stage_reports": [
            {
                "stage": stage.stage,
                "rank": stage.rank,
                "stages": list(stage.stages_held),
                "device": stage.device or None,
                "parameters": stage.parameters,
                "parameter_tensors": stage.parameter_tensors,
                "step_s": stage.step_s,
                "compute_s": stage.compute_s,
                "comm_wait_s": stage.comm_wait_s,
                "step_times_s": list(stage.step_times_s),
                "compute_times_s": list(stage.compute_times_s),
                "actions": [list(action) for action in stage.actions],
                "peak_memory_bytes": stage.peak_memory_bytes,
                "peak_activation_bytes": stage.peak_activation_bytes,
                "memory_measure": stage.memory_measure or None,
                "speed_probes_s": list(stage.speed_probes_s),
            }
            for stage in result.stages
        ],
        "order_notes": list(result.order_notes),
        "notes": list(result.notes),
        "verify": None,
    }
    if request.verify:
        checks = result.checks
        document["verify"] = {
            "ok": result.verified,
            "randomness": result.randomness,
            "model_parameters": result.model_parameters,
            "parameters_compared": len({c.name for c in checks if c.stage >= 0}),
            "mismatches": sum(not check.ok for check in checks),
            "max_abs_diff": max((_number(c.max_abs) or 0.0 for c in checks), default=0.0),
            "max_rel_diff": max((_number(c.max_rel) or 0.0 for c in checks), default=0.0),
            "parameters": [
                {
                    "name": check.name,
                    "stage": check.stage,
                    "numel": check.numel,
                    "max_abs_diff": _number(check.max_abs),
                    "max_rel_diff": _number(check.max_rel),
                    "rtol": check.rtol,
                    "atol": check.atol,
                    "ok": check.ok,
                    "note": check.note,
                }
                for check in checks
            ],
            "tied": [
                {
                    "name": tied.name,
                    "stages": list(tied.stages),
                    "steps": tied.steps,
                    "max_abs_diff": _number(tied.max_abs),
                    "atol": tied.atol,
                    "ok": tied.ok,
                }
                for tied in result.tied
            ],
            "losses": [
                {
                    "microbatch": loss.microbatch,
                    "pipeline": _number(loss.pipeline),
                    "reference": _number(loss.reference),
                    "ok": loss.ok,
                }
                for loss in result.loss_checks
            ],
        }
    return document


def dumps_report(result: RunResult) -> str:
    """The ``--json-report`` file's text."""
    return json.dumps(report_document(result), indent=2) + "\n"

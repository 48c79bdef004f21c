"""Confirm a rewrite with the engine's own splitter before it is written.

``rewrite --example`` hands the rewritten source to the backend's ``confirm`` hook
(torch's tracer for ``--backend torch``). A sync point the splitter refuses
(:class:`~syncpass.core.errors.SplitRefused`: a value it makes would cross to more than
the next stage, which the analysis could not see, such as a model output that is a plain
lookup into a stage's output) is planned again without, up to :data:`MAX_REFUSALS`
times, each refusal a note. The user's own sync points (pinned, ``--strategy manual``)
are never moved: a refusal there is the error.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from syncpass.backends.spec import Backend, Confirm, Confirmation
from syncpass.contracts.costs import Costs
from syncpass.core.errors import InfeasibleError, SplitRefused, SyncpassError
from syncpass.rewrite.driver import RewriteResult, rewrite_text
from syncpass.runtime.example import example_location
from syncpass.runtime.guard import call_guarded
from syncpass.settings.resolve import Settings

#: How many sync points the engine's splitter may refuse before ``rewrite`` gives up.
MAX_REFUSALS = 4


def confirm_split(
    backend: Backend,
    confirm: Confirm,
    result: RewriteResult,
    path: str,
    example: str,
    timeout_s: float,
) -> None:
    """Split the rewritten model with the engine's own splitter (on the example, in a
    process of its own); raises when it cannot."""
    if len(result.plan.stages) < 2:
        return
    print("syncpass: confirming the split with torch's tracer", file=sys.stderr)
    where = {op.id: str(op.location) for op in result.graph.ops}
    call_guarded(
        confirm,
        Confirmation(
            text=result.rewritten,
            path=path,
            example=example,
            stages=len(result.plan.stages),
            sync_points=tuple(
                (point.after, where.get(point.after, path)) for point in result.plan.sync_points
            ),
        ),
        what="the example (split by torch's tracer)",
        timeout_s=timeout_s,
        preload=backend.preload,
        location=example_location(path, example),
    )


def confirmed_rewrite(
    backend: Backend,
    confirm: Confirm,
    result: RewriteResult,
    costs: Costs,
    settings: Settings,
    path: str,
    example: str,
    timeout_s: float,
) -> tuple[RewriteResult, tuple[str, ...]]:
    """The rewrite once the engine's splitter takes it, and a note per sync point it
    refused. When planning again fails too, the error is the first refusal, then why."""
    refused: list[SplitRefused] = []
    while True:
        try:
            confirm_split(backend, confirm, result, path, example, timeout_s)
            break
        except SplitRefused as refusal:
            pinned = {point.after for point in result.plan.sync_points if point.pinned}
            if result.plan.strategy == "manual" or refusal.after in pinned:
                raise _replanned(refused, refusal) if refused else refusal from None
            refused.append(refusal)
            if len(refused) > MAX_REFUSALS:
                raise _replanned(refused[:-1], refusal) from None
        except SyncpassError as error:
            raise _replanned(refused, error) if refused else error from None
        vetoed = {refusal.after for refusal in refused}
        try:
            result = rewrite_text(
                result.original,
                path,
                backend,
                settings.request(costs),
                dataclasses.replace(
                    costs, cuts=tuple(cut for cut in costs.cuts if cut.after not in vetoed)
                ),
                class_name=settings.model,
                max_stages=settings.auto_limit,
            )
        except InfeasibleError as error:
            raise _replanned(refused, error) from None
    notes = tuple(
        f"torch's tracer refused the sync point after {refusal.after} ({refusal.location}: "
        f"{refusal.reason}); planned again without it"
        for refusal in refused
    )
    return result, notes


def _replanned(refused: Sequence[SplitRefused], error: SyncpassError) -> SyncpassError:
    """The first refusal, then what planning again without the refused sync points met."""
    first = refused[0]
    points = ", ".join(refusal.after for refusal in refused)
    return SyncpassError(
        f"{first.message}. Planned again without the sync point(s) after {points}: {error}",
        first.location,
    )

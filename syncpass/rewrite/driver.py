"""The rewrite driver: plan, then apply the plan through a backend's hooks.

The pass, step by step, the same for every backend:

1. the backend analyses the source (:attr:`Backend.analyse`): the sync points
   an earlier run wrote are taken out, so a rewritten file plans exactly like
   the original (idempotence), and the model's op graph is built;
2. the cost file is matched to that graph (same ops, same order) and the
   source's own steering applied (:mod:`syncpass.frontend.match`);
3. :func:`~syncpass.plan.planner.plan_for` plans (any strategy of :mod:`syncpass.plan`), or a saved
   plan is checked against the graph (:func:`check_saved_plan`);
4. :func:`apply_plan` has the backend insert one sync statement per sync point,
   each with a one-line comment, and verifies before anything is written: the
   output parses, and removing the inserted statements gives back the input.

Transformers carry out a plan; they never decide. Nothing here imports torch
or jax, runs the user's code or writes files.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass

from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import LoopIteration, OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.core.samecode import same_code
from syncpass.core.units import num_bytes, seconds
from syncpass.frontend.match import match_costs, steer_by_source
from syncpass.frontend.source import SourceForm
from syncpass.plan.planner import Plan, PlanCache, PlanRequest, plan_for
from syncpass.plan.recompute_plan import plan_with_recompute, recompute_stage_count
from syncpass.plan.schedule import single_stage_order
from syncpass.rewrite.source import KnownOps, ModelSource, SyncWriter
from syncpass.transformers.common import CheckpointSite, SyncSite


@dataclass(frozen=True)
class RewriteResult:
    """The rewritten source, and the plan and op graph it came from."""

    original: str
    rewritten: str
    plan: Plan
    graph: OpGraph
    warnings: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        """Whether the rewritten source is other code than the original: a file a formatter
        laid out anew since syncpass wrote it is unchanged (:func:`same_code`)."""
        return not same_code(self.original, self.rewritten)


def check_saved_plan(plan: Plan, graph: OpGraph) -> Plan:
    """``plan`` if it was made for the model of ``graph``: the same ops in the same order,
    every sync point at a cut the source allows; else an error naming the first op that
    differs, at its line."""
    planned = [op for stage in plan.stages for op in stage.ops]
    here = [op.id for op in graph.ops]
    for position, (source_id, plan_id) in enumerate(zip(here, planned, strict=False)):
        if source_id != plan_id:
            raise SyncpassError(
                f"the plan does not match the source: op {position} is {source_id!r} "
                f"here but {plan_id!r} in the plan; plan the model again (syncpass plan) after "
                "changing it",
                str(graph.ops[position].location),
            )
    if len(here) != len(planned):
        extra = here[len(planned)] if len(here) > len(planned) else planned[len(here)]
        raise SyncpassError(
            f"the plan does not match the source: {len(here)} ops here, "
            f"{len(planned)} in the plan (first unmatched: {extra!r}); plan the model again "
            "(syncpass plan)",
            str(graph.forward),
        )
    allowed = {cut.after for cut in graph.cuts}
    for point in plan.sync_points:
        if point.after not in allowed:
            raise SyncpassError(
                f"the plan puts a sync point after {point.after!r}, where the source "
                "allows none (a region, or a # syncpass: no-sync line); plan the model again",
                str(graph.op(point.after).location),
            )
    return plan


def sync_sites(graph: OpGraph, plan: Plan) -> list[SyncSite]:
    """Where each of the plan's sync points goes in the forward, with its comment."""
    last_iteration: dict[int, int] = {}
    for op in graph.ops:
        if op.loop is not None:
            last_iteration[op.statement] = op.loop.path[0]
    sizes = dict(graph.containers)
    sites = []
    live = {cut.after: cut.live for cut in graph.cuts}
    count = len(plan.sync_points)
    for number, point in enumerate(plan.sync_points, start=1):
        op = graph.op(point.after)
        comment = (
            f"{number}/{count}: {num_bytes(point.live_bytes)}, "
            f"{seconds(point.comm_s)}/step predicted"
        )
        place, along = _place(op.loop, sizes) if op.loop is not None else ((), ())
        inside_loop = op.loop is not None and place != (last_iteration[op.statement],)
        sites.append(
            SyncSite(
                statement=op.statement,
                split_after=place[0] if inside_loop else None,
                split_inside=place[1:] if inside_loop else (),
                sizes=along if inside_loop and len(place) > 1 else (),
                comment=comment,
                values=live.get(point.after, ()),
                stage=number,
                written=point.after in graph.written,  # the user's own pipe_split() is there
                kinds=point.kinds,
                recomputed=point.recomputed,
            )
        )
    return sites


def checkpoint_sites(graph: OpGraph, plan: Plan) -> list[CheckpointSite]:
    """Where each op the plan recomputes is in the forward (:attr:`Plan.checkpointed`)."""
    sites = []
    for checkpointed in plan.checkpointed:
        op = graph.op(checkpointed.op)
        nested = op.loop is not None and bool(op.loop.outer)
        if nested:
            raise SyncpassError(
                f"the plan recomputes {op.id}, a child of a nested nn.Sequential, which the "
                "stages cannot checkpoint on its own yet; profile at --depth 1",
                str(op.location),
            )
        sites.append(
            CheckpointSite(
                statement=op.statement,
                iteration=None if op.loop is None else op.loop.index,
                op=op.id,
                stage=checkpointed.stage,
                frees_bytes=checkpointed.frees_bytes,
                cost_s=checkpointed.cost_s,
            )
        )
    return sites


def _place(loop: LoopIteration, sizes: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Where the sync after ``loop``'s item goes below its statement's container, and the
    length of each container along the way: after the last child of a nested group is
    after the group (``blocks.1.1`` of a ``blocks.1`` of 2 is after ``blocks.1``)."""
    place = loop.path
    containers = [loop.top]
    for index in place[:-1]:
        containers.append(f"{containers[-1]}.{index}")
    while len(place) > 1 and place[-1] == sizes.get(containers[len(place) - 1], 0) - 1:
        place = place[:-1]
    return place, tuple(sizes.get(container, 0) for container in containers[: len(place)])


def ensure_parses(rewritten: str, path: str) -> None:
    """Refuse output Python's own parser rejects (a backend's last check before writing)."""
    try:
        ast.parse(rewritten)
    except SyntaxError as error:
        raise SyncpassError(
            f"internal check failed: the rewritten source does not parse ({error.msg}); "
            "nothing was written (please report this with the file)",
            f"{path}:{error.lineno}",
        ) from None


def apply_plan(source: ModelSource, plan: Plan, backend: SyncWriter, path: str) -> RewriteResult:
    """Write ``plan``'s sync points into ``source`` with ``backend``'s hooks, and check the output.

    Refused, with nothing to write: a planned sync point the backend could not
    place, output that does not parse, and output from which removing the
    inserted sync statements does not give back the input.
    """
    sites = sync_sites(source.graph, plan)
    if plan.checkpointed:
        if backend.insert_checkpointed is None:
            raise SyncpassError(
                "this backend cannot write activation checkpointing into the model (the plan "
                "recomputes "
                + ", ".join(c.op for c in plan.checkpointed[:3])
                + (", ..." if len(plan.checkpointed) > 3 else "")
                + "); write eager stages (--backend torch_stages), or drop --recompute",
                path,
            )
        checkpoints = checkpoint_sites(source.graph, plan)
        module, warnings = backend.insert_checkpointed(source, sites, checkpoints, path)
    else:
        module, warnings = backend.insert(source, sites, path)
    warnings = tuple(warnings)
    if warnings and (plan.sync_points or plan.checkpointed):
        planned = (("sync points", plan.sync_points), ("recomputation", plan.checkpointed))
        what = " and ".join(name for name, some in planned if some)
        raise SyncpassError(f"could not place the planned {what}: " + "; ".join(warnings), path)
    rewritten: str = module.code
    if rewritten != source.text:  # output equal to the input was verified when it was read
        ensure_parses(rewritten, path)
        if rewritten != source.base and backend.remove(module, source, path) != source.base:
            raise SyncpassError(
                "internal check failed: removing the inserted sync points does not give back "
                "the input; nothing was written (please report this with the file)",
                path,
            )
    return RewriteResult(
        original=source.text, rewritten=rewritten, plan=plan, graph=source.graph, warnings=warnings
    )


def rewrite_text(
    text: str,
    path: str,
    backend: SyncWriter,
    request: PlanRequest | None,
    costs: Costs | None = None,
    *,
    class_name: str | None = None,
    max_stages: int | None = None,
    plan: Plan | None = None,
    recompute: str | None = None,
) -> RewriteResult:
    """Plan the model in ``text`` from ``costs`` (or apply the saved ``plan``) and write its
    sync points with ``backend``. Raises :class:`SyncpassError` for bad input; writes nothing.

    A byte-order mark and CR-only line endings are taken off before the pass and put
    back on its output (:class:`SourceForm`).

    With ``recompute`` (``auto``, ``all``, ``none``) the plan also chooses which blocks
    recompute their activations under the device's memory
    (:func:`~syncpass.plan.recompute_plan.plan_with_recompute`), and the backend writes
    those as activation checkpointing.
    """
    form, plain = SourceForm.of(text)
    result = _rewrite_plain(
        plain, path, backend, request, costs, class_name, max_stages, plan, recompute
    )
    if plain == text:
        return result
    return dataclasses.replace(result, original=text, rewritten=form.restore(result.rewritten))


def _rewrite_plain(
    text: str,
    path: str,
    backend: SyncWriter,
    request: PlanRequest | None,
    costs: Costs | None,
    class_name: str | None,
    max_stages: int | None,
    plan: Plan | None,
    recompute: str | None = None,
) -> RewriteResult:
    if plan is not None:
        ids = tuple(op for stage in plan.stages for op in stage.ops)
        known = KnownOps(plan.model, ids, settings=plan.model_settings)
        source = backend.analyse(text, path, known, class_name)
        return apply_plan(source, check_saved_plan(plan, source.graph), backend, path)
    if costs is None or request is None:
        raise ValueError("rewrite_text needs costs and a request to plan from, or a saved plan")
    # Whether a value may reach past the next stage is the backend's to say.
    request = dataclasses.replace(
        request, carries_values=backend.carries_values, refused_kinds=backend.refused_kinds
    )
    source = backend.analyse(text, path, KnownOps.of_costs(costs), class_name)
    matched = steer_by_source(source.graph, match_costs(source.graph, costs))
    if recompute is not None:
        if backend.insert_checkpointed is None and recompute != "none":
            raise SyncpassError(
                f"--recompute {recompute}: --backend {backend.name} cannot write activation "
                "checkpointing (it splits the forward as written); write eager stages "
                "(--backend torch_stages), or drop --recompute",
                path,
            )
        if request.stages is None and max_stages is not None:
            _, plan, _ = recompute_stage_count(matched, request, recompute, max_stages, path)
        else:
            plan, _ = plan_with_recompute(matched, request, recompute, path)
        return apply_plan(source, plan, backend, path)
    cache = PlanCache(matched, backend.schedule_order or single_stage_order)
    plan = plan_for(matched, request, path, max_stages, cache)
    if plan.expanded or matched.groups:
        # Nested nn.Sequential children the plan keeps whole are one op of its: the source
        # is planned at the plan's level, as a saved plan is.
        ids = tuple(op for stage in plan.stages for op in stage.ops)
        known = KnownOps(plan.model, ids, costs.containers, costs.model_settings)
        source = backend.analyse(text, path, known, class_name)
        plan = check_saved_plan(plan, source.graph)
    return apply_plan(source, plan, backend, path)

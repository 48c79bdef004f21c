"""Rewrite a model's source with the sync points of a plan (torch pipeline backend).

The pass, step by step:

1. parse the source; remove the sync points an earlier syncpass run wrote, so
   a rewritten file plans exactly like the original (idempotence);
2. build the op graph of the model's forward and check it against the cost
   file (same ops, same order: the cost file must describe this source);
3. plan (any strategy of :mod:`syncpass.plan.planner`);
4. insert one ``pipe_split()`` per sync point, each with a one-line comment;
5. verify before anything is written: the output parses, and removing the
   inserted calls gives back the input tree.

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass

from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import INPUT, OUTPUT, OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.core.units import num_bytes, seconds
from syncpass.frontend import (
    ContainerSizes,
    analyse_model,
    loop_containers,
    model_class_names,
    parse_source,
    sequential_calls,
)
from syncpass.plan.planner import Plan, PlanRequest, best_stage_count, make_plan
from syncpass.transformers.torch_pipeline import (
    SYNC_COMMENT_PREFIX,
    Module,
    SyncSite,
    insert_pipe_splits,
    remove_pipe_splits,
    strips_back_to,
)


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
        return self.original != self.rewritten


def strip_sync_points(text: str, path: str, class_name: str | None = None) -> str:
    """``text`` without the sync points syncpass wrote (unchanged if there are none)."""
    if SYNC_COMMENT_PREFIX not in text:
        return text
    stripped: str = remove_pipe_splits(parse_source(text, path), class_name, path, text).code
    return stripped


def container_sizes(costs: Costs, containers: tuple[str, ...]) -> ContainerSizes:
    """Length of each container, read off the cost file's op ids (``blocks.11`` -> 12)."""
    sizes = {}
    for container in containers:
        pattern = re.compile(rf"^{re.escape(container)}\.(\d+)(@L\d+(:\d+)?)?$")
        indices = [int(found.group(1)) for op in costs.ops if (found := pattern.match(op.id))]
        if indices:
            sizes[container] = max(indices) + 1
    return sizes


def model_class(class_names: list[str], costs: Costs, requested: str | None) -> str | None:
    """The class to rewrite: ``--model``, else the cost file's model if it names one here."""
    if requested is not None:
        return requested
    if costs.model in class_names:
        return costs.model
    return None


_POSITION = re.compile(r"@L\d+(:\d+)?$")


def match_costs(graph: OpGraph, costs: Costs) -> Costs:
    """The cost file with its op ids as this source names them.

    The cost file must describe this source: the same ops in the same order.
    Ids that carry a line (``torch.cat@L58``) may have moved with edits
    elsewhere in the file; when the ops agree but for those lines, the cost
    file is matched by order and its ids are renamed.
    """
    source_ids = [op.id for op in graph.ops]
    cost_ids = [op.id for op in costs.ops]
    if source_ids == cost_ids:
        return costs
    if len(source_ids) == len(cost_ids) and all(
        _POSITION.sub("", here) == _POSITION.sub("", there)
        for here, there in zip(source_ids, cost_ids, strict=True)
    ):
        rename = dict(zip(cost_ids, source_ids, strict=True))
        rename.update({INPUT: INPUT, OUTPUT: OUTPUT})
        return dataclasses.replace(
            costs,
            ops=tuple(dataclasses.replace(op, id=rename[op.id]) for op in costs.ops),
            cuts=tuple(dataclasses.replace(cut, after=rename[cut.after]) for cut in costs.cuts),
            edges=tuple((rename[a], rename[b]) for a, b in costs.edges),
        )
    for position, (source_id, cost_id) in enumerate(zip(source_ids, cost_ids, strict=False)):
        if source_id != cost_id:
            where = str(graph.ops[position].location)
            raise SyncpassError(
                f"the cost file does not match the source: op {position} is {source_id!r} here "
                f"but {cost_id!r} in the cost file; profile the model again "
                "(syncpass profile) after changing it",
                where,
            )
    raise SyncpassError(
        f"the cost file does not match the source: {len(source_ids)} ops here, "
        f"{len(cost_ids)} in the cost file; profile the model again (syncpass profile)",
        str(graph.forward),
    )


def steer_by_source(graph: OpGraph, costs: Costs) -> Costs:
    """The source's own steering wins over the cost file's: ``# syncpass: no-sync`` drops a
    cut, ``# syncpass: sync`` and hand-written ``pipe_split()`` calls pin one, and the
    data flow comes from the source."""
    in_source = {cut.after: cut for cut in graph.cuts}
    cuts = tuple(
        dataclasses.replace(cut, pinned=in_source[cut.after].pinned)
        for cut in costs.cuts
        if cut.after in in_source
    )
    measured = {cut.after for cut in cuts}
    for cut in graph.cuts:
        if cut.pinned and cut.after not in measured:
            raise SyncpassError(
                f"a sync point is pinned after {cut.after}, but the cost file has no cut there "
                "to measure it by; profile the model again (syncpass profile)",
                str(graph.op(cut.after).location),
            )
    return dataclasses.replace(costs, cuts=cuts, edges=graph.edges)


def sync_sites(graph: OpGraph, plan: Plan) -> list[SyncSite]:
    """Where each of the plan's sync points goes in the forward, with its comment."""
    last_iteration: dict[int, int] = {}
    for op in graph.ops:
        if op.loop is not None:
            last_iteration[op.statement] = op.loop.index
    sites = []
    live = {cut.after: cut.live for cut in graph.cuts}
    count = len(plan.sync_points)
    for number, point in enumerate(plan.sync_points, start=1):
        if point.after in graph.written:
            continue  # the user's own pipe_split() is already there
        op = graph.op(point.after)
        comment = (
            f"{number}/{count}: {num_bytes(point.live_bytes)}, "
            f"{seconds(point.comm_s)}/step predicted"
        )
        inside_loop = op.loop is not None and op.loop.index != last_iteration[op.statement]
        sites.append(
            SyncSite(
                statement=op.statement,
                split_after=op.loop.index if inside_loop and op.loop is not None else None,
                comment=comment,
                values=live.get(point.after, ()),
                stage=number,
            )
        )
    return sites


def rewrite_source(
    text: str,
    path: str,
    costs: Costs,
    request: PlanRequest,
    class_name: str | None = None,
    max_stages: int | None = None,
) -> RewriteResult:
    """Plan ``costs`` for the model in ``text`` and write the plan's sync points into it.

    ``max_stages`` with ``request.stages`` of ``None`` picks the stage count
    with the least predicted step time. Raises :class:`SyncpassError` for bad
    input; never writes files.
    """
    module = parse_source(text, path)
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_pipe_splits(module, None, path, text)
        base = module.code
    name = model_class(model_class_names(module), costs, class_name)
    sizes = container_sizes(costs, loop_containers(module, name, path))
    # Sequential calls were expanded (--depth 2) when the cost file lists their children.
    expand = container_sizes(costs, sequential_calls(module, name, path))
    graph = analyse_model(module, path, name, sizes, base, expand)
    costs = steer_by_source(graph, match_costs(graph, costs))
    if request.stages is None and max_stages is not None and request.config.strategy != "manual":
        plan = best_stage_count(costs, request, max_stages, path)
    else:
        plan = make_plan(costs, request, path)
    rewritten_module, warnings = insert_pipe_splits(
        module, graph.model_class, sync_sites(graph, plan), path
    )
    if warnings and plan.sync_points:
        raise SyncpassError("could not place the planned sync points: " + "; ".join(warnings), path)
    rewritten = rewritten_module.code
    if rewritten != text:  # output equal to the input was verified when the input was read
        _verify(rewritten_module, rewritten, base, path, graph.model_class)
    return RewriteResult(
        original=text, rewritten=rewritten, plan=plan, graph=graph, warnings=warnings
    )


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


def _verify(
    rewritten_module: Module, rewritten: str, base: str, path: str, class_name: str
) -> None:
    """Refuse output that does not parse, or whose inserted sync calls, removed, do not
    give back the input."""
    ensure_parses(rewritten, path)
    if rewritten != base and not strips_back_to(
        rewritten_module, rewritten, base, class_name, path
    ):
        raise SyncpassError(
            "internal check failed: removing the inserted sync points does not give back the "
            "input; nothing was written (please report this with the file)",
            path,
        )

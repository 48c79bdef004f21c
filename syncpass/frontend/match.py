"""Matching a cost file to the op graph of the source it describes.

A cost file is measured (or estimated) from one version of a model's source
and planned against the source as it is now: the ops must agree, ids that
carry a line may have moved, and the source's own steering (``# syncpass:
no-sync``, ``# syncpass: sync``, hand-written sync calls) wins over the file's.
Every backend and the rewrite driver use these; nothing here imports
libcst.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from syncpass.contracts.costs import Costs
from syncpass.contracts.graph import INPUT, OUTPUT, OpGraph
from syncpass.core.errors import SyncpassError

_POSITION = re.compile(r"@L\d+(:\d+)?$")


def sizes_from_ids(ids: Iterable[str], containers: tuple[str, ...]) -> dict[str, int]:
    """Length of each container, read off op ids (``blocks.11`` -> 12)."""
    ids = tuple(ids)
    sizes = {}
    for container in containers:
        pattern = re.compile(rf"^{re.escape(container)}\.(\d+)(@L\d+(:\d+)?)?$")
        indices = [int(found.group(1)) for op_id in ids if (found := pattern.match(op_id))]
        if indices:
            sizes[container] = max(indices) + 1
    return sizes


def sequential_sizes_from_ids(ids: Iterable[str], containers: tuple[str, ...]) -> dict[str, int]:
    """Length of each sequential container called whole, read off op ids, and of each child
    planned per child in turn (a nested ``nn.Sequential``): ``blocks.0``, ``blocks.1.0``,
    ``blocks.1.1``, ``blocks.2`` -> ``{"blocks": 3, "blocks.1": 2}``."""
    ids = tuple(ids)
    sizes: dict[str, int] = {}
    pending = list(containers)
    while pending:
        container = pending.pop()
        pattern = re.compile(rf"^{re.escape(container)}\.(\d+)(\.\d+)*(@L\d+(:\d+)?)?$")
        found = [
            (int(hit.group(1)), hit.group(2)) for op_id in ids if (hit := pattern.match(op_id))
        ]
        if not found:
            continue
        sizes[container] = max(index for index, _ in found) + 1
        pending.extend(
            dict.fromkeys(f"{container}.{index}" for index, deeper in found if deeper is not None)
        )
    return sizes


def container_sizes(costs: Costs, containers: tuple[str, ...]) -> dict[str, int]:
    """Length of each container, read off the cost file's op ids (``blocks.11`` -> 12)."""
    return sizes_from_ids((op.id for op in costs.ops), containers)


def pick_model(names: list[str], described: str | None, requested: str | None) -> str | None:
    """The model to rewrite: ``--model``, else the one the cost file or plan names if the
    source has it (``None``: the analysis picks the file's one model)."""
    if requested is not None:
        return requested
    if described in names:
        return described
    return None


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
        return costs.renamed(rename)
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

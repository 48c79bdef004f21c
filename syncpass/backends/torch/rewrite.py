"""The torch backend's rewrite hooks: ``pipe_split()`` calls in an ``nn.Module``'s forward.

:func:`analyse` reads the model (after taking out the sync points an earlier
run wrote, so that a rewritten file plans exactly like the original),
:func:`insert` writes one ``pipe_split()`` per sync site with its one-line
comment, :func:`remove` and :func:`strip` take syncpass's calls out again.
The driver (:mod:`syncpass.rewrite.driver`) plans and checks in between.

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

from collections.abc import Sequence

from syncpass.frontend import (
    analyse_model,
    loop_containers,
    model_class_names,
    parse_source,
    sequential_calls,
)
from syncpass.frontend.match import pick_model, sizes_from_ids
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.torch_pipeline import (
    SYNC_COMMENT_PREFIX,
    Module,
    SyncSite,
    insert_pipe_splits,
    remove_pipe_splits,
)


def strip_sync_points(text: str, path: str, class_name: str | None = None) -> str:
    """``text`` without the sync points syncpass wrote (unchanged if there are none)."""
    if SYNC_COMMENT_PREFIX not in text:
        return text
    stripped: str = remove_pipe_splits(parse_source(text, path), class_name, path, text).code
    return stripped


def analyse(text: str, path: str, known: KnownOps, class_name: str | None) -> ModelSource:
    """The model of ``text`` and its op graph, loops sized by the op ids ``known`` lists.

    Calls of ``nn.Sequential`` submodules count as one op each unless ``known``
    lists their children (a profile made with ``--depth 2``).
    """
    module = parse_source(text, path)
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_pipe_splits(module, None, path, text)
        base = module.code
    name = pick_model(model_class_names(module), known.model, class_name)
    sizes = sizes_from_ids(known.ids, loop_containers(module, name, path))
    expand = sizes_from_ids(known.ids, sequential_calls(module, name, path))
    graph = analyse_model(module, path, name, sizes, base, expand)
    return ModelSource(text=text, base=base, module=module, graph=graph)


def insert(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[Module, tuple[str, ...]]:
    """``source``'s module with one ``pipe_split()`` per site, and warnings for sites missed."""
    return insert_pipe_splits(source.module, source.graph.model_class, sites, path)


def remove(module: Module, source: ModelSource, path: str) -> str:
    """The code of ``module`` without the ``pipe_split()`` calls syncpass wrote."""
    stripped: str = remove_pipe_splits(module, source.graph.model_class, path, module.code).code
    return stripped

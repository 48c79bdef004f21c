"""The torch backend's rewrite hooks: ``pipe_split()`` calls in an ``nn.Module``'s forward.

:func:`insert` writes one ``pipe_split()`` per sync site with its one-line
comment, :func:`remove` and :func:`strip_sync_points` take syncpass's calls out
again. The analysis hook is :func:`syncpass.backends.torch.analysis.analyse`;
the driver (:mod:`syncpass.rewrite.driver`) plans and checks in between.

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

from collections.abc import Sequence

from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import ModelSource
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


def insert(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[Module, tuple[str, ...]]:
    """``source``'s module with one ``pipe_split()`` per site, and warnings for sites missed."""
    return insert_pipe_splits(source.module, source.graph.model_class, sites, path)


def remove(module: Module, source: ModelSource, path: str) -> str:
    """The code of ``module`` without the ``pipe_split()`` calls syncpass wrote."""
    stripped: str = remove_pipe_splits(module, source.graph.model_class, path, module.code).code
    return stripped

"""The JAX backend's rewrite hooks: ``jax.device_put`` transfers in a JAX function or Flax module.

The same steps as the torch backend's (:mod:`syncpass.backends.torch.rewrite`),
with the JAX analysis (:mod:`syncpass.backends.jax.analysis`) and the JAX
transformer (:mod:`syncpass.transformers.jax_transfer`): take out the transfers
an earlier run wrote, build the op graph, insert one ``jax.device_put`` per
sync site. The driver (:mod:`syncpass.rewrite.driver`) plans and checks.

Nothing here imports jax or runs the user's code.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from syncpass.backends.jax.analysis import (
    analyse_jax_model,
    jax_loop_containers,
    jax_model_names,
    resolve_jax_model,
)
from syncpass.frontend.match import pick_model, sizes_from_ids
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.common import SYNC_COMMENT_PREFIX, SyncSite
from syncpass.transformers.jax_transfer import insert_device_puts, remove_device_puts


def strip_jax_sync_points(text: str, path: str, name: str | None = None) -> str:
    """``text`` without the transfers syncpass wrote (unchanged if there are none)."""
    if SYNC_COMMENT_PREFIX not in text:
        return text
    module = parse_source(text, path)
    model, is_function = resolve_jax_model(module, name, path)
    stripped: str = remove_device_puts(module, model, is_function, path).code
    return stripped


def analyse(text: str, path: str, known: KnownOps, name: str | None) -> ModelSource:
    """The JAX model of ``text`` (a function, or a Flax module's ``__call__``) and its op graph.

    ``name`` is the function or Flax module class (default: the one ``known``
    names when the file has it, else :func:`resolve_jax_model`'s choice).
    """
    module = parse_source(text, path)
    model, is_function = resolve_jax_model(
        module, pick_model(jax_model_names(module), known.model, name), path
    )
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_device_puts(module, model, is_function, path)
        base = module.code
    sizes = sizes_from_ids(known.ids, jax_loop_containers(module, model, path))
    graph = analyse_jax_model(module, path, model, sizes, base)
    return ModelSource(
        text=text, base=base, module=module, graph=graph, handle=(model, is_function)
    )


def insert(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[cst.Module, tuple[str, ...]]:
    """``source``'s module with one ``jax.device_put`` per site, and warnings for sites missed."""
    model, is_function = source.handle
    return insert_device_puts(source.module, model, is_function, list(sites), path)


def remove(module: cst.Module, source: ModelSource, path: str) -> str:
    """The code of ``module`` without the transfers syncpass wrote."""
    model, is_function = source.handle
    stripped: str = remove_device_puts(module, model, is_function, path).code
    return stripped

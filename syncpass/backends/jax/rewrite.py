"""The JAX backend's rewrite hooks: ``jax.device_put`` transfers in a JAX function or Flax module.

The same steps as the torch backend's (:mod:`syncpass.backends.torch.rewrite`),
with the JAX analysis (:mod:`syncpass.backends.jax.analysis`) and the JAX
transformers (:mod:`syncpass.transformers.jax_transfer`,
:mod:`syncpass.transformers.jax_checkpoints`): insert one ``jax.device_put`` per sync
site and rematerialise the blocks a plan recomputes (``--recompute``), and take both
out again. The
analysis hook is :func:`syncpass.backends.jax.analysis.analyse`; the driver
(:mod:`syncpass.rewrite.driver`) plans and checks in between.

Nothing here imports jax or runs the user's code.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from syncpass.backends.jax.analysis import JaxModel, resolve_jax_model
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import ModelSource
from syncpass.settings.formatting import formatter_line_length
from syncpass.transformers.checkpoints import RECOMPUTE_COMMENT_PREFIX, CheckpointRefused
from syncpass.transformers.common import SYNC_COMMENT_PREFIX, CheckpointSite, SyncSite
from syncpass.transformers.jax_checkpoints import insert_remat, remove_remat
from syncpass.transformers.jax_transfer import insert_device_puts, remove_device_puts


def strip_jax_sync_points(text: str, path: str, name: str | None = None) -> str:
    """``text`` without the transfers and the rematerialisation syncpass wrote (unchanged if
    there are none), in every function and method of the file (``name``, if given, must be
    a model there)."""
    if SYNC_COMMENT_PREFIX not in text and RECOMPUTE_COMMENT_PREFIX not in text:
        return text
    module = parse_source(text, path)
    if name is not None:
        resolve_jax_model(module, name, path)
    stripped: str = remove_device_puts(remove_remat(module), path).code
    return stripped


def insert(
    source: ModelSource, sites: Sequence[SyncSite], path: str
) -> tuple[cst.Module, tuple[str, ...]]:
    """``source``'s module with one ``jax.device_put`` per site, and warnings for sites missed.

    A site inside a submodule's call that the analysis inlined goes in that submodule's
    ``__call__`` (:meth:`~syncpass.backends.jax.analysis.JaxModel.homes`).
    """
    model: JaxModel = source.handle
    module = source.module
    warnings: list[str] = []
    width = formatter_line_length(path)
    for frame, placed in model.homes(sites):
        module, missed = insert_device_puts(
            module, frame.class_name, model.is_function, placed, path, frame.method, width
        )
        warnings.extend(missed)
    return module, tuple(warnings)


def insert_checkpointed(
    source: ModelSource,
    sites: Sequence[SyncSite],
    checkpoints: Sequence[CheckpointSite],
    path: str,
) -> tuple[cst.Module, tuple[str, ...]]:
    """:func:`insert`, and the ops of ``checkpoints`` recomputing in the backward: each
    one's call wrapped in Flax's ``remat`` (a submodule's) or ``jax.checkpoint`` (a plain
    function's), in the function of the file that makes it
    (:mod:`syncpass.transformers.jax_checkpoints`)."""
    module, warnings = insert(source, sites, path)
    if warnings:
        return module, warnings
    model: JaxModel = source.handle
    try:
        for frame, placed, sizes in model.checkpoint_homes(checkpoints):
            module = insert_remat(
                module,
                source.module,
                frame.class_name,
                model.is_function,
                frame.method,
                placed,
                sizes,
            )
    except CheckpointRefused as refused:
        return source.module, (str(refused),)
    return module, ()


def remove(module: cst.Module, source: ModelSource, path: str) -> str:
    """The code of ``module`` without the transfers and the rematerialisation syncpass
    wrote."""
    stripped: str = remove_device_puts(remove_remat(module), path).code
    return stripped

"""syncpass: place the sync points of a model-parallel program, and write them into its source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from syncpass.backends.torch.parallelize import ParallelStage


def parallelize(*args: Any, **kwargs: Any) -> ParallelStage:
    """Plan a model from a live profile and return this rank's pipeline stage.

    See :func:`syncpass.backends.torch.parallelize.parallelize`; importing syncpass
    does not import torch, calling this does.
    """
    from syncpass.backends.torch.parallelize import parallelize as build

    return build(*args, **kwargs)

"""Backend-neutral reading of model source with libcst: parsing, finding a model's class and
method, building the op graph of its statements, matching a cost file to it.

Each backend's ``analysis.py`` says which method is the model's and what its
own calls mean (:mod:`syncpass.backends.torch.analysis`,
:mod:`syncpass.backends.jax.analysis`).
"""

from __future__ import annotations

from syncpass.frontend.analysis import (
    ContainerSizes,
    ForwardModel,
    find_forward,
    model_class_names,
)
from syncpass.frontend.source import parse_source, read_source

__all__ = [
    "ContainerSizes",
    "ForwardModel",
    "find_forward",
    "model_class_names",
    "parse_source",
    "read_source",
]

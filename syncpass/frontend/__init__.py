"""Reading model source with libcst: parsing, finding the model, building its op graph.

Only this package, ``syncpass.transformers`` and the library API
(:mod:`syncpass.api`, which takes and returns parsed modules) import libcst.
"""

from __future__ import annotations

from syncpass.frontend.analysis import (
    ContainerSizes,
    ForwardModel,
    analyse_model,
    find_forward,
    loop_containers,
    model_class_names,
    sequential_calls,
)
from syncpass.frontend.source import parse_source, read_source

__all__ = [
    "ContainerSizes",
    "ForwardModel",
    "analyse_model",
    "find_forward",
    "loop_containers",
    "model_class_names",
    "parse_source",
    "read_source",
    "sequential_calls",
]

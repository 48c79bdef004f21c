"""Estimate a model's cost file from its source alone, without running anything."""

from __future__ import annotations

from syncpass.backends.torch.estimate.interpreter import (
    DEFAULT_FLOPS_PER_S,
    StaticEstimate,
    UnsizedOp,
    estimate_costs,
    parse_input_shapes,
)

__all__ = [
    "DEFAULT_FLOPS_PER_S",
    "StaticEstimate",
    "UnsizedOp",
    "estimate_costs",
    "parse_input_shapes",
]

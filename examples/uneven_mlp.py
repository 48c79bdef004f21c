"""An MLP whose cost sits in its first layers: wide layers first, then narrow ones.

Most of the compute (and of the parameters) is in the first half of the layers,
so a rule that gives each device the same number of layers loads the first
device with nearly everything. syncpass balances the time instead.

    syncpass rewrite examples/uneven_mlp.py --example examples/uneven_mlp.py:example \\
        --stages 2 -o uneven_mlp_sync.py
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from torch import nn

BATCH = 32
INPUTS = 256
WIDTHS = (1024, 1024, 1024, 1024, 1024, 128, 128, 128, 128, 128, 128)
CLASSES = 10


class UnevenMLP(nn.Module):
    """Maps ``(batch, 256)`` features to class logits through layers of uneven width."""

    def __init__(self, widths: tuple[int, ...] = WIDTHS) -> None:
        super().__init__()
        sizes = (INPUTS, *widths)
        self.layers = nn.ModuleList(
            nn.Linear(inputs, outputs) for inputs, outputs in itertools.pairwise(sizes)
        )
        self.head = nn.Linear(sizes[-1], CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        logits: torch.Tensor = self.head(x)
        return logits


def example() -> tuple[
    UnevenMLP,
    tuple[torch.Tensor],
    torch.Tensor,
    Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
]:
    """The model, one batch of features, their labels and the cross-entropy loss."""
    # Seeded here as well, so the example is the same when called outside syncpass.
    torch.manual_seed(0)
    model = UnevenMLP()
    features = torch.randn(BATCH, INPUTS)
    labels = torch.randint(0, CLASSES, (BATCH,))
    return model, (features,), labels, nn.functional.cross_entropy

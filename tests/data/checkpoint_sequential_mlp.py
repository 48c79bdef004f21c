"""An MLP stack that checkpoints its blocks in segments with checkpoint_sequential."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

WIDTH, LAYERS, BATCH = 16, 8, 8


class SegmentedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.Sequential(
            *(
                nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
                for _ in range(LAYERS)
            )
        )
        self.out = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        x = checkpoint_sequential(self.blocks, 4, x, use_reentrant=False)
        return self.out(x)


def example():
    torch.manual_seed(0)
    return (
        SegmentedMLP(),
        (torch.randn(BATCH, WIDTH),),
        torch.randint(0, 4, (BATCH,)),
        F.cross_entropy,
    )

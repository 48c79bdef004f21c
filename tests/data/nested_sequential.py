"""A trunk of ``nn.Sequential`` groups of blocks, one group much heavier than the rest, and
a group nested in it (timm's EfficientNet keeps its blocks so: ``blocks.1`` holds 13 of its
27 ms): at 4 stages the heavy group is more than a stage's share, so the plan looks into
it, and into its own nested group, while the light groups stay one op each."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """A residual MLP block; ``hidden`` sets how heavy it is."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class NestedTrunk(nn.Module):
    def __init__(self, width: int = 32, light: int = 32, heavy: int = 2048) -> None:
        super().__init__()
        self.stem = nn.Linear(16, width)
        self.blocks = nn.Sequential(
            nn.Sequential(Block(width, light), Block(width, light)),
            nn.Sequential(
                Block(width, heavy),
                Block(width, heavy),
                nn.Sequential(Block(width, heavy), Block(width, heavy)),
            ),
            nn.Sequential(Block(width, light), Block(width, light)),
            Block(width, light),
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.blocks(x)  # the trunk: groups of blocks
        return self.head(x)


def example():
    torch.manual_seed(0)
    return (
        NestedTrunk(),
        (torch.randn(128, 16),),
        torch.randint(0, 4, (128,)),
        nn.functional.cross_entropy,
    )

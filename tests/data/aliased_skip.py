"""A ViT-like forward whose skip connection is an alias: ``skip = x`` before the block
loop, ``x = x + skip`` after it. torch's traced pipelining sees one value (the
embedding's) used by the first stage and by the stage of the add."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


class SkipViT(nn.Module):
    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        skip = x
        for block in self.blocks:
            x = block(x)
        x = x + skip
        return self.head(x.mean(dim=1))


def example():
    torch.manual_seed(0)
    inputs = (torch.randn(8, 4, 16),)
    return SkipViT(), inputs, torch.randint(0, 10, (8,)), nn.functional.cross_entropy

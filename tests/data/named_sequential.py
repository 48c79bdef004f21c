"""A trunk built as an ``nn.Sequential`` of named children (torchvision's RegNet builds its
``trunk_output`` from an ``OrderedDict``: ``block1``, ``block2``, ...), called once in the
forward: planned per child, and a stage keeps its children by their place."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


class Trunked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        blocks = ((f"block{i}", nn.Sequential(nn.Linear(32, 32), nn.ReLU())) for i in range(4))
        self.trunk_output = nn.Sequential(OrderedDict(blocks))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.trunk_output(x)
        return self.head(x)


def example():
    torch.manual_seed(0)
    return (
        Trunked(),
        (torch.randn(16, 16),),
        torch.randint(0, 4, (16,)),
        nn.functional.cross_entropy,
    )

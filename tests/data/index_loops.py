"""Layer stacks run by index, as older and hand-written models do: ``for i in
range(len(self.layers))`` with ``self.layers[i](x)``, ``for i in range(self.depth)``
reading two containers by the same index (run zipped), and a ``while`` stepping an index
over a third. Planned per layer, each stage holding only its layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class IndexedNet(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.depth = depth
        self.embed = nn.Linear(8, width)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.gates = nn.ModuleList([nn.Linear(width, width) for _ in range(depth + 1)])
        self.mixers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        layer = self.embed(x)  # a local the loops must not clobber
        h = layer
        for i in range(len(self.layers)):
            h = torch.tanh(self.layers[i](h)) + h * (i + 1) / 10
        for i in range(self.depth):
            block = self.blocks[i]
            h = block(h) + torch.sigmoid(self.gates[i](h)) * h
        k = 1
        while k < len(self.mixers):
            h = torch.tanh(self.mixers[k](h)) * k + h
            k += 1
        return self.head(h + layer)


def example():
    torch.manual_seed(0)
    return IndexedNet(), (torch.randn(8, 8),), torch.randint(0, 3, (8,)), F.cross_entropy

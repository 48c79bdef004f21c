"""A stack whose forward calls a method of its own that reads a module of its own, as
DeBERTa's encoder does (``rel_embeddings = self.get_rel_embedding()``, reading
``self.rel_embeddings.weight``): every stage that runs layers calls it, so every such stage
holds what the method reads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Encoder(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])
        self.rel_embeddings = nn.Embedding(4, width)
        self.scale = 0.5

    def get_rel_embedding(self) -> torch.Tensor:
        return self.rel_embeddings.weight.mean(0) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x) + self.get_rel_embedding())
        return x


class Classifier(nn.Module):
    def __init__(self, width: int = 16, depth: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.encoder = Encoder(width, depth)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = self.encoder(h)
        return self.head(h)


def example():
    torch.manual_seed(0)
    return Classifier(), (torch.randn(8, 8),), torch.randint(0, 3, (8,)), F.cross_entropy

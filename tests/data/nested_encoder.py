"""An encoder whose forward runs its layers inside one expression, as torchvision's
ViT writes it (``return self.ln(self.layers(self.dropout(input)))``): the layers are an
``nn.Sequential`` of named blocks."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input + self.mlp(self.ln(input))


class Encoder(nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.zeros(1, 5, width))
        self.dropout = nn.Dropout(0.0)
        blocks: OrderedDict[str, nn.Module] = OrderedDict()
        for i in range(layers):
            blocks[f"encoder_layer_{i}"] = Block(width)
        self.layers = nn.Sequential(blocks)
        self.ln = nn.LayerNorm(width)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class Net(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.encoder = Encoder(6, width)
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        x = self.encoder(x)
        x = x[:, 0]
        return self.head(x)


def example():
    torch.manual_seed(0)
    x = torch.randn(8, 5, 8)
    target = torch.randint(0, 3, (8,))
    return Net(), (x,), target, F.cross_entropy

"""A model whose file already has a class named ``<Model>Stage`` (a stage of the network,
as timm names ``ConvNeXtStage``), and whose forward reads a method of a parameter
(``self.token.expand``, as torchvision's ViT reads ``self.class_token.expand``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class NetStage(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.mlp(self.norm(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.token = nn.Parameter(torch.randn(1, 16) / 4)
        self.stages = nn.ModuleList([NetStage(16) for _ in range(4)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.token.expand(x.shape[0], -1)
        for stage in self.stages:
            x = stage(x)
        return self.head(x)


def example():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 8),), torch.randint(0, 4, (8,)), F.cross_entropy

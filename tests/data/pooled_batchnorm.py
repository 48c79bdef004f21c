"""A small convolutional net whose last batch norm sees a 1x1 map (as a ResNet's last
block does on small images): over micro-batches of one sample it would normalise each
channel over a single value, which torch refuses in training."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PooledNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)  # (N, 8, 8, 8): 64 values per channel per sample
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.mix = nn.Conv2d(8, 8, 1)
        self.bn_pooled = nn.BatchNorm2d(8)  # (N, 8, 1, 1): one value per channel per sample
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = self.pool(x)
        x = self.bn_pooled(self.mix(x))
        return self.head(torch.flatten(x, 1))


def example():
    torch.manual_seed(0)
    images = torch.randn(8, 3, 8, 8)
    return PooledNet(), (images,), torch.randint(0, 4, (8,)), F.cross_entropy

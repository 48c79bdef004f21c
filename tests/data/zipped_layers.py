"""Layers zipped with their norms and with a local list of per-layer scales: ``for layer,
norm, scale in zip(self.layers, self.norms, scales)`` (the layers and norms are two
ModuleLists of one length; the scales a list the forward builds)."""

import torch
from torch import nn


class ZippedMLP(nn.Module):
    def __init__(self, width: int = 32, depth: int = 6, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        # Uneven widths: the later layers cost more.
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.Linear(width, width * (1 + i)), nn.GELU(), nn.Linear(width * (1 + i), width)
            )
            for i in range(depth)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = self.embed(x)
        scales = [1.0 / (1 + i) for i in range(len(self.layers))]
        for layer, norm, scale in zip(self.layers, self.norms, scales, strict=True):
            h = h + scale * layer(norm(h))
        return self.head(h)


def example():
    torch.manual_seed(0)
    return (
        ZippedMLP(),
        (torch.randn(8, 16),),
        torch.randint(0, 10, (8,)),
        nn.functional.cross_entropy,
    )

"""vit-pytorch-style layers of (attention, feed-forward) pairs, the last one held out of the loop."""

import torch
from torch import nn


class PairNet(nn.Module):
    """vit-pytorch style: layers of (attention, feed-forward) pairs; the last layer held out."""

    def __init__(self, width: int = 32, depth: int = 7) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.layers = nn.ModuleList(
            [
                nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])
                for _ in range(depth)
            ]
        )
        self.skewed = nn.Linear(width, width)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for attn, ff in self.layers[:-1]:
            x = x + attn(x).tanh()
            x = x + ff(x).relu()
        attn, ff = self.layers[-1]
        x = self.skewed(attn(x) + ff(x))
        return self.head(x)


def example():
    torch.manual_seed(0)
    return PairNet(), (torch.randn(16, 8),)

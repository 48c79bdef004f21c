"""A typed forward whose stages each send one value: some lines the user annotated
(``g: torch.Tensor = ...``), others not, so that a typed stage declares what it sends and
the runner still finds each stage's last line in the forward (4 stages cut after every
layer)."""

from __future__ import annotations

import torch
from torch import nn


class Net(nn.Module):
    """Four linears, each statement's value sent alone at a cut after it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)
        self.d = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        g: torch.Tensor = self.b(h)
        y = self.c(g)
        out: torch.Tensor = self.d(y)
        return out


def example() -> tuple[Net, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 8),)

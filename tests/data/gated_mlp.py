"""A stack of pre-norm gated MLP blocks (SwiGLU, as Llama's MLP) on a residual stream:
two column-split linears read one normalised value, the down projection is row-split."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

WIDTH = 64
HIDDEN = 256
LAYERS = 3
BATCH = 512


class GatedMLP(nn.Module):
    """``down(silu(gate(h)) * up(h))``, with ``h`` the block's normalised input, returned
    as it is made (``return self.down(m)``, as Llama's and litgpt's MLPs end): the stack
    adds it to the residual stream."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        g = F.silu(self.gate(h))
        u = self.up(h)
        m = g * u
        return self.down(m)


class GatedStack(nn.Module):
    """Maps ``(batch, WIDTH)`` features through ``LAYERS`` gated MLP blocks to a score."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GatedMLP(WIDTH, HIDDEN) for _ in range(LAYERS))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        score: torch.Tensor = self.out(x)
        return score


def example() -> tuple[
    GatedStack,
    tuple[torch.Tensor],
    torch.Tensor,
    Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
]:
    torch.manual_seed(0)
    model = GatedStack()
    x = torch.randn(BATCH, WIDTH)
    return model, (x,), torch.randn(BATCH, 1), F.mse_loss

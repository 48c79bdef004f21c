"""An encoder-decoder whose second input (``tgt``, as in ``nn.Transformer``) is first read
after the block loop, with an optional mask the example passes as ``None``."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class EncoderDecoder(nn.Module):
    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.enc = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.dec = nn.Linear(16, width)
        self.head = nn.Linear(width, 10)

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.enc(src)
        for block in self.blocks:
            x = block(x)
        y = self.dec(tgt) + x
        if mask is not None:
            y = y * mask
        return self.head(y.mean(dim=1))


def example():
    torch.manual_seed(0)
    inputs = (torch.randn(8, 4, 16), torch.randn(8, 4, 16), None)
    return EncoderDecoder(), inputs, torch.randint(0, 10, (8,)), nn.functional.cross_entropy

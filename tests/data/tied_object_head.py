"""A language model whose head reuses the embedding's weight through a plain object, as
torchtune's ``TiedLinear`` does: the head is not an ``nn.Module`` but holds the embedding
module and calls ``F.linear`` with its weight. The stage that runs the head uses that
weight, so it must hold the embedding too (its gradient is the head's share)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TiedLinear:
    """``x @ tied_module.weight.T``: a head that owns no parameter of its own."""

    def __init__(self, tied_module: nn.Module) -> None:
        self.tied_module = tied_module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.tied_module.weight)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class TiedHeadLM(nn.Module):
    def __init__(self, vocab: int = 32, width: int = 16, depth: int = 6) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.output = TiedLinear(self.tok_embeddings)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return self.output(h)


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def example():
    torch.manual_seed(0)
    tokens = torch.randint(0, 32, (8, 6))
    return TiedHeadLM(), (tokens,), torch.randint(0, 32, (8, 6)), lm_loss

"""A decoder whose layer loop skips layers at random in training (LayerDrop, as Hugging
Face's OPT writes it: a ``continue`` inside the loop, and a local assigned only when the
skip is enabled, which the analysis finds live across every layer and which holds
nothing when profiled with the skip off)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Decoder(nn.Module):
    def __init__(self, layerdrop: float = 0.0) -> None:
        super().__init__()
        self.layerdrop = layerdrop
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()) for _ in range(4)]
        )
        self.head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids)
        for layer in self.layers:
            if self.training and self.layerdrop > 0.0:
                dropout_probability = torch.rand([])
                if dropout_probability < self.layerdrop:
                    continue
            hidden = hidden + layer(hidden)
        return self.head(hidden)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (8, 9))
    return Decoder(), (ids[:, :-1],), ids[:, 1:], loss_fn

"""Rotary tables handed to the layers in a dict of (cos, sin) pairs by layer type, as
Hugging Face's Gemma 3 writes them (``position_embeddings[decoder_layer.attention_type]``):
each layer type has its own base frequency, and every layer rotates with its type's pair."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LAYER_TYPES = ("sliding_attention", "sliding_attention", "full_attention", "sliding_attention")
BASES = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        cos, sin = table
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(
            rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True
        )
        return x + self.out(y)


class RotaryLM(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.width = width
        self.embed = nn.Embedding(32, width)
        self.layers = nn.ModuleList([Layer(width) for _ in LAYER_TYPES])
        self.head = nn.Linear(width, 32)

    def table(self, positions: torch.Tensor, base: float) -> tuple[torch.Tensor, torch.Tensor]:
        half = self.width // 2
        frequencies = base ** (-torch.arange(half, device=positions.device) / half)
        angles = positions[:, None].float() * frequencies[None, :]
        return angles.cos(), angles.sin()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        position_embeddings = {kind: self.table(positions, base) for kind, base in BASES.items()}
        hidden = self.embed(ids)
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, position_embeddings[LAYER_TYPES[i]])
        return self.head(hidden)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (8, 9))
    return RotaryLM(), (ids[:, :-1],), ids[:, 1:], loss_fn

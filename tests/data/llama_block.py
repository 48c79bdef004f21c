"""A small Llama-shaped decoder: pre-norm blocks of attention with separate q, k, v and
output projections, then a gated MLP (gate, up, down), on a residual stream; the form
torchtitan's tensor-parallel plans are written for (each projection a module of its own).
Its keys' heads are a ``-1`` in their view (as Hugging Face writes them), and q and k are
multiplied by a position table broadcast over the heads."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 64
WIDTH = 64
HEADS = 4
HIDDEN = 128
LAYERS = 2
BATCH = 8
SEQUENCE = 16


class Attention(nn.Module):
    """Causal self-attention, ``HEADS`` heads, each projection its own ``nn.Linear``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, width, bias=False)
        self.v = nn.Linear(width, width, bias=False)
        self.o = nn.Linear(width, width, bias=False)
        # A position table every head multiplies by (a rotary table's role), broadcast
        # over the batch and the heads.
        position = torch.arange(SEQUENCE, dtype=torch.float32)[:, None]
        frequency = torch.arange(width // heads, dtype=torch.float32)[None, :]
        self.register_buffer("table", torch.cos(position * frequency / width), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q = self.q(x)
        k = self.k(x)
        v = self.v(x)
        q = q.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
        k = k.view(batch, seq, -1, width // self.heads).transpose(1, 2)
        v = v.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
        q = q * self.table
        k = k * self.table
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, seq, -1)
        out: torch.Tensor = self.o(y)
        return out


class Block(nn.Module):
    """``x + attention(norm(x))``, then ``x + down(silu(gate(h)) * up(h))``."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(WIDTH)
        self.attention = Attention(WIDTH, HEADS)
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.gate = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.up = nn.Linear(WIDTH, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention_norm(x)
        a = self.attention(h)
        x = x + a
        h = self.mlp_norm(x)
        g = F.silu(self.gate(h))
        u = self.up(h)
        m = g * u
        y = self.down(m)
        return x + y


class Decoder(nn.Module):
    """Token ids ``(batch, sequence)`` to next-token logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        logits: torch.Tensor = self.head(x)
        return logits


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def example() -> tuple[
    Decoder,
    tuple[torch.Tensor],
    torch.Tensor,
    Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
]:
    torch.manual_seed(0)
    model = Decoder()
    ids = torch.randint(0, VOCAB, (BATCH, SEQUENCE))
    target = torch.randint(0, VOCAB, (BATCH, SEQUENCE))
    return model, (ids,), target, _loss

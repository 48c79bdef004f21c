"""A GPT-style LM as real model code is written, for the eager stage tests.

The forward builds a causal mask and a rotary-style table once and hands both
to every block (values that every stage needs), takes a flag with a constant
default and ``**kwargs``, computes a local from the flag alone, calls a method
of its own, and its blocks branch on their data (which torch's tracer cannot
take). The head is tied to the embedding, as in GPT-2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 16, 2, 6, 8, 8


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        q = (q * rope).view(batch, seq, self.heads, -1).transpose(1, 2)
        k = (k * rope).view(batch, seq, self.heads, -1).transpose(1, 2)
        v = v.view(batch, seq, self.heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, width))
        if x.abs().sum() > 1e9:  # data-dependent control flow: torch.export cannot trace it
            x = x / 2
        return x + self.mlp(self.ln_2(x))


class MaskedGPT(nn.Module):
    def __init__(self, tied: bool = True) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(WIDTH, HEADS) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        self.register_buffer("freqs", torch.linspace(0.5, 1.5, WIDTH))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx)

    def forward(
        self, idx: torch.Tensor, output_hidden_states: bool = False, **kwargs
    ) -> torch.Tensor:
        seq = idx.shape[1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=idx.device).tril()
        rope = torch.cos(torch.arange(seq, device=idx.device)[:, None] * self.freqs)
        hidden = () if output_hidden_states else None
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, mask, rope)
        x = self.ln_f(x)
        if hidden is not None:
            hidden = (*hidden, x)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    return MaskedGPT(), (tokens[:, :-1],), tokens[:, 1:], lm_loss

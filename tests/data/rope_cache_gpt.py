"""A GPT whose forward slices a rotary table and an additive causal mask out of buffers
built once for the longest sequence, as litgpt's ``GPT.forward`` does, and hands them
to every block. Both need no gradient and are far larger than the hidden state, so a
later stage does better to slice them again from its own buffers than to receive
them; the sequence length they are sliced with is a Python int read off the input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, MAX_SEQ, SEQ, BATCH = 64, 16, 2, 4, 512, 256, 4


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm(x)).split(width, dim=2)
        q = (q * cos).view(batch, seq, self.heads, -1).transpose(1, 2)
        k = (k * cos).view(batch, seq, self.heads, -1).transpose(1, 2)
        v = v.view(batch, seq, self.heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, seq, width))
        return x + self.mlp(x)


class RopeCacheGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(WIDTH, HEADS) for _ in range(LAYERS)])
        self.head = nn.Linear(WIDTH, VOCAB)
        positions = torch.arange(MAX_SEQ, dtype=torch.float32)[:, None]
        self.register_buffer("cos", torch.cos(positions / torch.linspace(1, 64, WIDTH)), False)
        causal = torch.ones(MAX_SEQ, MAX_SEQ, dtype=torch.bool).tril()
        self.register_buffer(
            "bias", torch.zeros(MAX_SEQ, MAX_SEQ).masked_fill(~causal, -1e4), False
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        cos = self.cos[:T]
        mask = self.bias[:T, :T]
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, cos, mask)
        return self.head(x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    return RopeCacheGPT(), (tokens[:, :-1],), tokens[:, 1:], lm_loss

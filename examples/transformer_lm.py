"""A small decoder-only transformer language model (nanoGPT-like), for ``syncpass run``.

Token and position embeddings, a stack of pre-LayerNorm blocks (causal
self-attention, then an MLP, each on a residual connection), a final LayerNorm
and a language-model head. ``example()`` returns the model, one batch of token
ids, the next-token targets and a cross-entropy loss.

The embedding and the head are deliberately *not* tied: the pipeline tracer
copies a weight that two stages use, so each copy would get only its own
stage's share of the gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
WIDTH = 64
HEADS = 4
LAYERS = 6
SEQ = 32
BATCH = 8


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and earlier ones."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q = q.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
        k = k.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
        v = v.view(batch, seq, self.heads, width // self.heads).transpose(1, 2)
        y: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, seq, width)
        y = self.proj(y)
        return y


class MLP(nn.Module):
    """Position-wise feed-forward network, four times as wide as the residual stream."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        x = self.act(x)
        x = self.proj(x)
        return x


class Block(nn.Module):
    """One pre-LayerNorm transformer block."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TransformerLM(nn.Module):
    """Maps token ids ``(batch, seq)`` to next-token logits ``(batch, seq, vocab)``."""

    def __init__(
        self,
        vocab: int = VOCAB,
        width: int = WIDTH,
        heads: int = HEADS,
        layers: int = LAYERS,
        seq: int = SEQ,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x: torch.Tensor = self.wte(idx) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        x = self.lm_head(x)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next-token predictions."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example() -> tuple[
    TransformerLM,
    tuple[torch.Tensor],
    torch.Tensor,
    Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
]:
    """The model, one batch of token ids, their next-token targets and the loss."""
    # Seeded here as well, so the example is the same when called outside syncpass.
    torch.manual_seed(0)
    model = TransformerLM()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    return model, (tokens[:, :-1],), tokens[:, 1:], lm_loss

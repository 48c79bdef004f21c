"""Attention masks handed to the layers in a dict by layer type, as Hugging Face's Qwen2
writes them (``causal_mask_mapping[self.config.layer_types[i]]``): the full-attention
entry is None (attention is causal by itself), the sliding-window one a tensor."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LAYER_TYPES = ("full_attention", "sliding_attention", "full_attention", "sliding_attention")


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return x + self.out(y)


class MaskedLM(nn.Module):
    def __init__(self, window: int = 3) -> None:
        super().__init__()
        self.window = window
        self.embed = nn.Embedding(32, 16)
        self.layers = nn.ModuleList([Layer(16) for _ in LAYER_TYPES])
        self.head = nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        positions = torch.arange(seq, device=ids.device)
        distance = positions[:, None] - positions[None, :]
        causal_mask_mapping = {
            "full_attention": None,
            "sliding_attention": (distance >= 0) & (distance < self.window),
        }
        hidden = self.embed(ids)
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, causal_mask_mapping[LAYER_TYPES[i]])
        return self.head(hidden)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (8, 9))
    return MaskedLM(), (ids[:, :-1],), ids[:, 1:], loss_fn

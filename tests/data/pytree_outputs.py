"""Values that are neither tensors nor numbers cross every sync point, as real forwards hand
them on: a list of ``None`` per layer (Hugging Face's ``head_mask``), a tuple that grows by
one hidden state per layer, a dict of representations keyed by layer number (esm2's
``repr_layers``), an input that is ``None`` until the forward computes it (``inputs_embeds``),
and a nested output of all of them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        y = self.mlp(self.norm(x))
        return x + (y if scale is None else y * scale)


class RecordingEncoder(nn.Module):
    def __init__(self, width: int = 16, depth: int = 6, vocab: int = 32) -> None:
        super().__init__()
        self.depth = depth
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        if inputs_embeds is None:
            inputs_embeds = self.embed(ids)
        scales = [None] * self.depth
        hidden = inputs_embeds
        states: tuple[torch.Tensor, ...] = ()
        kept = {}
        for i, block in enumerate(self.blocks):
            states = states + (hidden,)  # noqa: RUF005 (as Hugging Face writes it)
            hidden = block(hidden, scales[i])
            if i % 2 == 1:
                kept[i] = hidden
        logits = self.head(hidden)
        return logits, {"states": states, "kept": kept, "first": inputs_embeds}


def loss_fn(output, targets: torch.Tensor) -> torch.Tensor:
    logits, extra = output
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss + sum(state.pow(2).mean() for state in extra["kept"].values()) * 0.01


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (8, 9))
    return RecordingEncoder(), (ids[:, :-1],), ids[:, 1:], loss_fn

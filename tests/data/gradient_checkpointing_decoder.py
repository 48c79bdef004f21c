"""A decoder written as Hugging Face writes its layers' loop with gradient checkpointing."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

VOCAB, WIDTH, LAYERS, SEQ, BATCH = 64, 16, 6, 8, 8


class DecoderLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.down(F.gelu(self.up(self.norm(hidden_states))))
        return hidden_states + h * attention_mask


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([DecoderLayer(WIDTH) for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self) -> None:
        self._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
        self.gradient_checkpointing = True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        attention_mask = torch.ones_like(hidden_states[..., :1])
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(
                    decoder_layer.__call__, hidden_states, attention_mask
                )
            else:
                hidden_states = decoder_layer(hidden_states, attention_mask)
        return self.lm_head(self.norm(hidden_states))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    model = Decoder()
    model.gradient_checkpointing_enable()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    return model, (tokens[:, :-1],), tokens[:, 1:], lm_loss

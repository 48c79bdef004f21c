"""An encoder-decoder as T5 and BART write it: one stack class built twice, the encoder's
output read by every decoder layer (cross-attention), and the decoder called with keyword
arguments that reuse the stack's own parameter names for other values (``mask=dec_mask,
memory_mask=mask``), so that inlining must bind them all before the body runs. Both
stacks rebind ``return_dict`` and the model's forward tests it once they return."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class StackOutput:
    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


class Layer(nn.Module):
    def __init__(self, width: int, cross: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(width, width)
        self.cross = nn.Linear(width, width) if cross else None

    def forward(self, x, mask, memory=None, memory_mask=None):
        y = self.mix(self.norm(x)) * mask[..., None]
        if self.cross is not None:
            pooled = (memory * memory_mask[..., None]).mean(dim=1, keepdim=True)
            y = y + self.cross(pooled)
        return x + y


class Stack(nn.Module):
    def __init__(self, width: int, depth: int, cross: bool, return_dict: bool = True) -> None:
        super().__init__()
        self.return_dict = return_dict
        self.embed = nn.Embedding(32, width)
        self.layers = nn.ModuleList([Layer(width, cross) for _ in range(depth)])

    def forward(self, ids, mask, memory=None, memory_mask=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.return_dict
        x = self.embed(ids)
        states = ()
        for layer in self.layers:
            states = states + (x,)  # noqa: RUF005 (as Hugging Face writes it)
            x = layer(x, mask, memory, memory_mask)
        if not return_dict:
            return (x, states)
        return StackOutput(last_hidden_state=x, hidden_states=states)


class EncoderDecoder(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.return_dict = True
        self.encoder = Stack(width, depth, cross=False)
        self.decoder = Stack(width, depth, cross=True)
        self.head = nn.Linear(width, 32)

    def forward(self, ids, mask, dec_ids, dec_mask=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.return_dict
        if dec_mask is None:
            dec_mask = torch.ones_like(dec_ids, dtype=torch.float)
        memory = self.encoder(ids, mask, return_dict=return_dict)
        out = self.decoder(
            dec_ids,
            mask=dec_mask,
            memory=memory.last_hidden_state,
            memory_mask=mask,
            return_dict=return_dict,
        )
        logits = self.head(out.last_hidden_state)
        if not return_dict:
            return (logits, memory)
        return logits, memory


def loss_fn(output, targets: torch.Tensor) -> torch.Tensor:
    logits, memory = output
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss + memory.last_hidden_state.pow(2).mean() * 0.01


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (8, 7))
    mask = (torch.rand(8, 7) > 0.2).float()
    dec = torch.randint(0, 32, (8, 6))
    return EncoderDecoder(), (ids, mask, dec[:, :-1]), dec[:, 1:], loss_fn

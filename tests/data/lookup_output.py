"""A model that returns a plain lookup into a submodule's output, as HF's BertModel returns
``encoder_outputs.last_hidden_state``: the lookup computes nothing, so torch's tracer reads
the encoder's own output at the model's output, and a sync point right after the encoder
would send that output to two stages."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 2 * width)
        self.proj = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.tanh(self.fc(x)))


class Encoder(nn.Module):
    """The heavy part: returns a dict, as a ``ModelOutput`` is one."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 8 * width)
        self.proj = nn.Linear(8 * width, width)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"last_hidden_state": x + self.proj(torch.relu(self.fc(x)))}


class Head(nn.Module):
    """Heavier than the blocks and the encoder together, so that the best 2-stage split cuts
    right after the encoder (the sync point the tracer refuses) under any profile's noise."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 28 * width)
        self.out = nn.Linear(28 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x))).mean(dim=1)


class LookupOutput(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.encoder = Encoder(width)
        self.head = Head(width)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        encoder_outputs = self.encoder(h)
        sequence_output = encoder_outputs["last_hidden_state"]
        logits = self.head(sequence_output)
        return logits, sequence_output


def example():
    torch.manual_seed(0)

    def loss(output, labels):
        logits, sequence_output = output
        return nn.functional.cross_entropy(logits, labels) + sequence_output.pow(2).mean()

    return LookupOutput(), (torch.randn(32, 16, 16),), torch.randint(0, 10, (32,)), loss

"""A language model written as Hugging Face writes its older models (Bloom, Falcon): the
head's forward takes ``return_dict`` from the configuration when it is not passed, hands it
to the base model, and the base model returns early with a tuple when it is false. Which
branch runs is the configuration's to say: the layer stack is planned once the profile has
read ``config.return_dict`` off the built model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class Config:
    def __init__(self, width: int = 16, layers: int = 6, vocab: int = 32) -> None:
        self.width = width
        self.layers = layers
        self.vocab = vocab
        self.return_dict = True
        self.output_hidden_states = False


@dataclass
class BaseOutput:
    """Indexed as Hugging Face's ``ModelOutput`` is: its fields that are not ``None``."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None

    def __getitem__(self, index: int | slice) -> object:
        fields = (self.last_hidden_state, self.hidden_states)
        return tuple(value for value in fields if value is not None)[index]


@dataclass
class LMOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class Block(nn.Module):
    def __init__(self, width: int, wide: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.up = nn.Linear(width, wide)
        self.down = nn.Linear(wide, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.ln(x))))


class BaseModel(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.width)
        # The layers grow wider: the equal-layer split is not the best one.
        self.h = nn.ModuleList(
            Block(config.width, config.width * (1 + i)) for i in range(config.layers)
        )
        self.ln_f = nn.LayerNorm(config.width)

    def forward(
        self,
        input_ids: torch.Tensor,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> tuple[torch.Tensor, ...] | BaseOutput:
        output_hidden_states = (
            output_hidden_states
            if output_hidden_states is not None
            else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        hidden_states = self.embed(input_ids)
        all_hidden_states = () if output_hidden_states else None
        for block in self.h:
            if output_hidden_states:
                all_hidden_states = (*all_hidden_states, hidden_states)
            hidden_states = block(hidden_states)
        hidden_states = self.ln_f(hidden_states)

        if not return_dict:
            return tuple(v for v in [hidden_states, all_hidden_states] if v is not None)
        return BaseOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states)


class ConfigLM(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.transformer = BaseModel(config)
        self.lm_head = nn.Linear(config.width, config.vocab, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> tuple[torch.Tensor, ...] | LMOutput:
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        transformer_outputs = self.transformer(
            input_ids,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )
        hidden_states = transformer_outputs[0]
        logits = self.lm_head(hidden_states)

        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())

        if not return_dict:
            output = (logits, *transformer_outputs[1:])
            return (loss, *output) if loss is not None else output
        return LMOutput(logits=logits, loss=loss)


def example():
    torch.manual_seed(0)
    config = Config()
    tokens = torch.randint(0, config.vocab, (8, 12))
    targets = torch.randint(0, config.vocab, (8, 12))

    def loss(output: LMOutput, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())

    return ConfigLM(config), (tokens,), targets, loss

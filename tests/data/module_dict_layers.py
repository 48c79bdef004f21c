"""A torchtitan-style decoder: layers in a ModuleDict keyed "0".."n-1", a table every layer reads."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, h, freqs):
        return h + self.down(F.gelu(self.up(self.norm(h) * freqs)))


class Titan(nn.Module):
    def __init__(self, vocab=64, dim=32, hidden=(64, 64, 512, 512, 64, 64)):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.register_buffer("freqs_cis", torch.linspace(0.5, 1.5, dim), persistent=False)
        self.layers = nn.ModuleDict()
        for layer_id, width in enumerate(hidden):
            self.layers[str(layer_id)] = Block(dim, width)
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h) if self.norm else h
        output = self.output(h) if self.output else h
        return output


def loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def example():
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (8, 17))
    return Titan(), (tokens[:, :-1],), tokens[:, 1:], loss

"""A layer stack handed to the model's ``__init__`` and called through a local function
(x-transformers' ``TransformerWrapper(attn_layers=Decoder(...))`` and its
``_attn_layers_forward``): the stack's class inherits its forward from a base that
returns early unless asked for its hiddens; the first stage tests whether the model
has a head, which the last stage runs."""

import torch
from torch import nn


def exists(val):
    return val is not None


class Layers(nn.Module):
    def __init__(self, width: int = 16, depth: int = 4, always_hiddens: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.always_hiddens = always_hiddens

    def forward(self, x, mask=None, return_hiddens=False, scale=1.0):
        return_hiddens |= self.always_hiddens
        hiddens = []
        for layer in self.layers:
            x = x + torch.tanh(layer(x)) * scale
            hiddens.append(x)
        if not return_hiddens:
            return x
        return x, hiddens


class Decoder(Layers):
    pass


class Wrapper(nn.Module):
    def __init__(self, layers: Layers, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = layers
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens, mask=None, **kwargs):
        # The first stage tests the head, the last one runs it (x-transformers'
        # `return_embeddings = ... | (not exists(self.to_logits)) | ...`).
        embeddings_only = not exists(self.head)
        x = self.embed(tokens)
        kwargs = dict(**kwargs, scale=0.5)

        def run_layers(inp, **kwargs):
            return self.layers(inp, mask=mask, return_hiddens=True, **kwargs)

        out, hiddens = run_layers(x, **kwargs)
        if embeddings_only:
            return out
        return self.head(out + 0.1 * hiddens[0])


def example():
    torch.manual_seed(0)
    return Wrapper(Decoder()), (torch.randint(0, 32, (8, 6)),)

"""A Flax LM laid out as Hugging Face's Flax models are: the layer stack two submodules deep.

``LanguageModel.__call__`` calls ``self.body``, whose ``__call__`` makes a causal mask once
and calls ``self.stack``, whose ``__call__`` loops over the blocks (of uneven width: the last
two are four times wider). ``Body`` returns early when ``return_dict`` is false, as Flax
GPT-2's module does; with the default, that branch never runs.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

WIDTHS = (64, 64, 64, 64, 256, 256)


class Block(nn.Module):
    width: int
    hidden: int

    def setup(self) -> None:
        self.norm = nn.LayerNorm()
        self.attn = nn.MultiHeadDotProductAttention(num_heads=4)
        self.up = nn.Dense(self.hidden)
        self.down = nn.Dense(self.width)

    def __call__(self, x, mask):
        h = self.norm(x)
        x = x + self.attn(h, h, mask=mask)
        return x + self.down(nn.gelu(self.up(h)))


class Stack(nn.Module):
    width: int

    def setup(self) -> None:
        self.blocks = [Block(self.width, hidden, name=str(i)) for i, hidden in enumerate(WIDTHS)]

    def __call__(self, hidden, mask, keep_all: bool = False):
        every = () if keep_all else None
        for block in self.blocks:
            hidden = block(hidden, mask)
        return hidden, every


class Body(nn.Module):
    vocab: int
    width: int

    def setup(self) -> None:
        self.embed = nn.Embed(self.vocab, self.width)
        self.stack = Stack(self.width)
        self.norm = nn.LayerNorm()

    def __call__(self, tokens, keep_all: bool = False, return_dict: bool = True):
        mask = nn.make_causal_mask(tokens)  # every block reads it
        hidden = self.embed(tokens)
        hidden, every = self.stack(hidden, mask, keep_all=keep_all)
        hidden = self.norm(hidden)
        if not return_dict:
            return (hidden, every)
        return {"hidden": hidden, "every": every}


class LanguageModel(nn.Module):
    vocab: int = 64
    width: int = 32

    def setup(self) -> None:
        self.body = Body(self.vocab, self.width)
        self.head = nn.Dense(self.vocab)

    def __call__(self, tokens, keep_all: bool = False):
        outputs = self.body(tokens, keep_all=keep_all)
        return self.head(outputs["hidden"])


def cross_entropy(logits, targets):
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def example():
    model = LanguageModel()
    tokens = jax.random.randint(jax.random.key(0), (8, 17), 0, 64)
    variables = model.init(jax.random.key(1), tokens[:, :-1])
    return model, variables, (tokens[:, :-1],), tokens[:, 1:], cross_entropy

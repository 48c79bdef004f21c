"""A small decoder-only transformer LM in Flax (``flax.linen``), for the JAX backend.

Token and position embeddings, a stack of pre-LayerNorm blocks (causal
self-attention, then an MLP, each on a residual connection), a final LayerNorm
and a language-model head: the Flax twin of ``transformer_lm.py``. The model
is built in ``setup`` and ``__call__`` loops over ``self.blocks``, so a sync
point between two blocks splits that loop over slices of the list.

``example()`` returns ``(model, variables, (tokens,), targets, loss_fn)``: the
convention of ``syncpass profile/rewrite/run --backend jax`` (see docs/jax.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

VOCAB = 256
WIDTH = 64
HEADS = 4
LAYERS = 4
SEQ = 32
BATCH = 8


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and MLP, each on a residual connection."""

    width: int
    heads: int

    def setup(self) -> None:
        self.ln_1 = nn.LayerNorm()
        self.attn = nn.MultiHeadDotProductAttention(num_heads=self.heads)
        self.ln_2 = nn.LayerNorm()
        self.fc = nn.Dense(4 * self.width)
        self.proj = nn.Dense(self.width)

    def __call__(self, x: jax.Array) -> jax.Array:
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], dtype=jnp.int32))  # (batch, 1, seq, seq)
        h = self.ln_1(x)
        x = x + self.attn(h, h, mask=mask)
        x = x + self.proj(nn.gelu(self.fc(self.ln_2(x))))
        return x


class TransformerLM(nn.Module):
    """Embeddings, ``layers`` blocks, a final LayerNorm and an untied head."""

    vocab: int = VOCAB
    width: int = WIDTH
    heads: int = HEADS
    layers: int = LAYERS
    seq: int = SEQ

    def setup(self) -> None:
        self.wte = nn.Embed(self.vocab, self.width)
        self.wpe = nn.Embed(self.seq, self.width)
        self.blocks = [Block(self.width, self.heads) for _ in range(self.layers)]
        self.ln_f = nn.LayerNorm()
        self.head = nn.Dense(self.vocab, use_bias=False)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        positions = jnp.arange(tokens.shape[1])  # (seq,)
        x = self.wte(tokens) + self.wpe(positions)  # (batch, seq, width)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        logits = self.head(x)  # (batch, seq, vocab)
        return logits


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy."""
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def example() -> tuple[
    TransformerLM, Any, tuple[jax.Array], jax.Array, Callable[[jax.Array, jax.Array], jax.Array]
]:
    """The model, its variables, one batch of token ids, next-token targets and the loss."""
    key_init, key_data = jax.random.split(jax.random.key(0))
    data = jax.random.randint(key_data, (BATCH, SEQ + 1), 0, VOCAB)
    tokens, targets = data[:, :-1], data[:, 1:]
    model = TransformerLM()
    variables = model.init(key_init, tokens)
    return model, variables, (tokens,), targets, cross_entropy


if __name__ == "__main__":
    lm, params, inputs, y, loss = example()
    output: Any = lm.apply(params, *inputs)
    print(loss(output, y))

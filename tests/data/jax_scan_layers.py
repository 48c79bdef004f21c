"""A plain JAX model whose layers are one ``jax.lax.scan`` over weights stacked along their
first dimension (six pre-norm MLP blocks), with a causal mask every step reads."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

WIDTH = 32
LAYERS = 6
SEQ = 8


def block(x, layer, mask):
    h = x - x.mean(axis=-1, keepdims=True)
    mixed = jnp.einsum("st,btd->bsd", mask, h) / SEQ  # each position sees those before it
    h = jax.nn.gelu(mixed @ layer["up"])
    return x + h @ layer["down"], None


def forward(params, tokens):
    mask = jnp.tril(jnp.ones((SEQ, SEQ)))
    x = params["embed"][tokens]
    x, _ = jax.lax.scan(functools.partial(block, mask=mask), x, params["layers"])
    return x @ params["head"]


def loss_fn(logits, targets):
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def example():
    keys = jax.random.split(jax.random.key(0), 5)
    params = {
        "embed": jax.random.normal(keys[0], (64, WIDTH)) / 4,
        "layers": {
            "up": jax.random.normal(keys[1], (LAYERS, WIDTH, 4 * WIDTH)) / 8,
            "down": jax.random.normal(keys[2], (LAYERS, 4 * WIDTH, WIDTH)) / 16,
        },
        "head": jax.random.normal(keys[3], (WIDTH, 64)) / 4,
    }
    tokens = jax.random.randint(keys[4], (8, SEQ + 1), 0, 64)
    return forward, params, (tokens[:, :-1],), tokens[:, 1:], loss_fn

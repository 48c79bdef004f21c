"""A plain JAX language model whose layers are a list of weight dicts, as much JAX code
keeps them: ``params["layers"]`` is a list, and ``forward`` loops over it. The layers'
MLP widths differ (a wide middle), and a causal mask built once is read by every layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp

VOCAB, WIDTH, SEQ, BATCH = 64, 32, 16, 8
MLP_WIDTHS = (64, 64, 512, 512, 64, 64)


def init_params(key):
    keys = iter(jax.random.split(key, 4 + 3 * len(MLP_WIDTHS)))
    layers = []
    for hidden in MLP_WIDTHS:
        layers.append(
            {
                "qkv": jax.random.normal(next(keys), (WIDTH, 3 * WIDTH)) / jnp.sqrt(WIDTH),
                "up": jax.random.normal(next(keys), (WIDTH, hidden)) / jnp.sqrt(WIDTH),
                "down": jax.random.normal(next(keys), (hidden, WIDTH)) / jnp.sqrt(hidden),
            }
        )
    return {
        "embed": jax.random.normal(next(keys), (VOCAB, WIDTH)) * 0.1,
        "layers": layers,
        "head": jax.random.normal(next(keys), (WIDTH, VOCAB)) / jnp.sqrt(WIDTH),
    }


def layer_norm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def block(layer, x, mask):
    q, k, v = jnp.split(layer_norm(x) @ layer["qkv"], 3, axis=-1)
    scores = jnp.where(mask, q @ k.swapaxes(-1, -2) / jnp.sqrt(WIDTH), -1e9)
    x = x + jax.nn.softmax(scores, axis=-1) @ v
    return x + jax.nn.gelu(layer_norm(x) @ layer["up"]) @ layer["down"]


def forward(params, tokens):
    mask = jnp.tril(jnp.ones((tokens.shape[1], tokens.shape[1]), dtype=bool))
    x = params["embed"][tokens]
    for layer in params["layers"]:
        x = block(layer, x, mask)
    return layer_norm(x) @ params["head"]


def cross_entropy(logits, targets):
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], axis=-1))


def example():
    params = init_params(jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (BATCH, SEQ + 1), 0, VOCAB)
    return forward, params, (tokens[:, :-1],), tokens[:, 1:], cross_entropy

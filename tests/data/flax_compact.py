"""A small ``@nn.compact`` Flax model: inline submodules, one statement per layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

BATCH = 8


class CompactMLP(nn.Module):
    """Three inline Dense layers and a LayerNorm, declared where they are used."""

    width: int = 32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.gelu(nn.Dense(2 * self.width)(x))  # (batch, 64)
        h = nn.LayerNorm()(h)
        h = jnp.tanh(nn.Dense(self.width)(h))  # (batch, 32)
        return nn.Dense(4)(h)  # (batch, 4)


def example() -> tuple[CompactMLP, Any, tuple[jax.Array], jax.Array, Callable[..., jax.Array]]:
    """The model, its variables, one batch and a regression target with a squared loss."""
    key_init, key_x, key_y = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(key_x, (BATCH, 16))
    target = jax.random.normal(key_y, (BATCH, 4))
    model = CompactMLP()
    return model, model.init(key_init, x), (x,), target, lambda y, t: jnp.mean((y - t) ** 2)

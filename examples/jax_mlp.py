"""A plain JAX MLP with uneven layer widths, for the JAX backend of syncpass.

The model is a function of its parameters and its input, as JAX code is
usually written: ``init_params(key)`` builds a dict of weights,
``forward(params, x)`` applies one layer per statement. The widths are uneven
on purpose (a wide middle, a narrow end), so the cost of the layers, and of the
activations that would cross a sync point after each of them, differ.

``example()`` returns ``(forward, params, (x,), target, loss_fn)``: the
convention of ``syncpass profile/rewrite/run --backend jax`` (see docs/jax.md).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

WIDTHS = (32, 256, 512, 128, 64, 10)
BATCH = 16

Params = dict[str, jax.Array]


def init_params(key: jax.Array) -> Params:
    """Weights ``w1..w5`` (fan-in scaled normal) and zero biases ``b1..b5``."""
    params: Params = {}
    keys = jax.random.split(key, len(WIDTHS) - 1)
    for layer, (key_layer, fan_in, fan_out) in enumerate(
        zip(keys, WIDTHS[:-1], WIDTHS[1:], strict=True), start=1
    ):
        params[f"w{layer}"] = jax.random.normal(key_layer, (fan_in, fan_out)) / jnp.sqrt(fan_in)
        params[f"b{layer}"] = jnp.zeros((fan_out,))
    return params


def forward(params: Params, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ params["w1"] + params["b1"])  # (batch, 256)
    h = jax.nn.gelu(h @ params["w2"] + params["b2"])  # (batch, 512): the widest layer
    h = jax.nn.gelu(h @ params["w3"] + params["b3"])  # (batch, 128)
    h = jnp.tanh(h @ params["w4"] + params["b4"])  # (batch, 64)
    logits = h @ params["w5"] + params["b5"]  # (batch, 10)
    return logits


def cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Mean cross-entropy of integer class targets."""
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, target[:, None], axis=1))


def example() -> tuple[
    Callable[[Params, jax.Array], jax.Array],
    Params,
    tuple[jax.Array],
    jax.Array,
    Callable[[jax.Array, jax.Array], jax.Array],
]:
    """The model function, its parameters, one batch, class targets and the loss."""
    key_params, key_x, key_y = jax.random.split(jax.random.key(0), 3)
    params = init_params(key_params)
    x = jax.random.normal(key_x, (BATCH, WIDTHS[0]))
    target = jax.random.randint(key_y, (BATCH,), 0, WIDTHS[-1])
    return forward, params, (x,), target, cross_entropy


if __name__ == "__main__":
    fn, p, args, y, loss = example()
    print(loss(fn(p, *args), y))

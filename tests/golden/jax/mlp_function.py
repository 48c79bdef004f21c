# args: --stages 3
import jax
import jax.numpy as jnp


def forward(params, x):
    """Four layers; the weights are a dict."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])

    # the widest layer
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    skip = h
    h = jnp.tanh(h @ params["w3"])
    return h @ params["w4"] + skip.sum()
# output:
# args: --stages 3
import jax
import jax.numpy as jnp


def forward(params, x):
    """Four layers; the weights are a dict."""
    h = jax.nn.relu(x @ params["w1"] + params["b1"])

    # the widest layer
    h = jax.nn.relu(h @ params["w2"] + params["b2"])
    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/2: 64 KiB, 346 us/step predicted
    skip = h
    h = jnp.tanh(h @ params["w3"])
    h, skip = jax.device_put(
        (h, skip),
        jax.devices()[2],
    )  # syncpass sync 2/2: 128 KiB, 372 us/step predicted
    return h @ params["w4"] + skip.sum()

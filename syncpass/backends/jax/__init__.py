"""The JAX backend: jax.device_put sync points in JAX functions and Flax modules, runs over JAX devices."""

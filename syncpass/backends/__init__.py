"""The backends, one folder each (torch, jax) with the same kinds of file, and the registry of their specs."""

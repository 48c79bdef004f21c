"""Build small cost files for tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cost_dict(
    compute: Sequence[float],
    live: Sequence[float | None] | None = None,
    *,
    backward: Sequence[float] | None = None,
    params: Sequence[float] | None = None,
    out: Sequence[float] | None = None,
    alpha: float = 0.0,
    beta: float = 1.0,
    memory: float | None = None,
    training: bool = False,
    multiplier: float = 1.0,
    config: dict[str, Any] | None = None,
    pinned: Sequence[int] = (),
) -> dict[str, Any]:
    """A version-1 cost file: op ``t`` is ``op{t}``; ``live[t]`` is the cut after it (None: no cut)."""
    n = len(compute)
    live = [0.0] * (n - 1) if live is None else live
    ops = [
        {
            "id": f"op{t}",
            "compute_s": compute[t],
            "backward_s": 0.0 if backward is None else backward[t],
            "param_bytes": 0 if params is None else params[t],
            "out_bytes": 0 if out is None else out[t],
        }
        for t in range(n)
    ]
    cuts = [
        {"after": f"op{t}", "live_bytes": live[t], **({"pinned": True} if t in pinned else {})}
        for t in range(n - 1)
        if live[t] is not None
    ]
    hardware: dict[str, Any] = {"alpha_s": alpha, "beta_bytes_per_s": beta}
    if memory is not None:
        hardware["device_memory_bytes"] = memory
    return {
        "version": 1,
        "batch_size": 8,
        "training": training,
        "memory_multiplier": multiplier,
        "hardware": hardware,
        "config": config
        or {"strategy": "adaptive", "min_sync_interval": 1, "communication_cost_threshold": 0.1},
        "ops": ops,
        "cuts": cuts,
    }

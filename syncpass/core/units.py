"""Human-readable figures for reports and messages."""

from __future__ import annotations

import math


def seconds(value: float) -> str:
    """``0.00123`` -> ``"1.23 ms"``."""
    if math.isinf(value):
        return "inf"
    magnitude = abs(value)
    if magnitude == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if magnitude >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def num_bytes(value: float) -> str:
    """``3 * 2**20`` -> ``"3 MiB"``."""
    if math.isinf(value):
        return "unlimited"
    magnitude = abs(value)
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if magnitude >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def percent(value: float) -> str:
    """``0.123`` -> ``"12.3%"``; ``inf`` stays ``"inf"``."""
    if math.isinf(value):
        return "inf"
    return f"{100 * value:.3g}%"

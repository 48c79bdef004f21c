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


def percent(value: float, digits: int = 3) -> str:
    """``0.123`` -> ``"12.3%"``; ``inf`` stays ``"inf"``."""
    if math.isinf(value):
        return "inf"
    return f"{100 * value:.{digits}g}%"


def percents_apart(first: float, second: float) -> tuple[str, str]:
    """``first`` and ``second`` as percentages with the digits that tell them apart (three
    at least, nine at most): ``11.9%`` and ``11.9%`` become ``11.92%`` and ``11.94%``."""
    for digits in range(3, 10):
        texts = percent(first, digits), percent(second, digits)
        if texts[0] != texts[1]:
            return texts
    return percent(first, 9), percent(second, 9)

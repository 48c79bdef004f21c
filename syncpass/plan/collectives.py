"""What a collective over a group of ``N`` devices costs on an alpha-beta link (a ring).

With ``B`` the bytes of the whole tensor, each of the ``N - 1`` steps of a ring pays the
latency ``alpha`` and moves ``B / N`` bytes:

* all-gather and reduce-scatter: ``(N - 1) alpha + (N - 1) / N * B / beta``;
* all-reduce (a reduce-scatter, then an all-gather): ``2 (N - 1) alpha + 2 (N - 1) / N * B / beta``.

Each collective of the forward has a conjugate in the backward: an all-reduce of a
partial sum comes back as nothing (the gradient is whole), a split of a whole value
comes back as an all-gather, a reduce-scatter as an all-gather and an all-gather as a
reduce-scatter when the gradient comes back as partial sums.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

ALL_REDUCE = "all-reduce"
ALL_GATHER = "all-gather"
REDUCE_SCATTER = "reduce-scatter"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)


def collective_s(kind: str, num_bytes: float, devices: int, alpha_s: float, beta: float) -> float:
    """Time of one ``kind`` collective of a ``num_bytes`` tensor (whole) over ``devices``."""
    if devices <= 1:
        return 0.0
    steps = devices - 1
    one_pass = steps * alpha_s + steps / devices * num_bytes / beta
    if kind == ALL_REDUCE:
        return 2 * one_pass
    if kind in (ALL_GATHER, REDUCE_SCATTER):
        return one_pass
    raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")

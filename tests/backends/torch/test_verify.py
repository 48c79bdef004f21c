"""``--verify``'s note on randomness: when the unsplit model draws random numbers."""

from __future__ import annotations

import torch
from torch import nn

from syncpass.backends.torch.verify import randomness


class StochasticDepth(nn.Module):
    """Skips its layer with probability ``p`` per sample, as torchvision's does."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.layer = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.empty(x.shape[0], 1).bernoulli_(1 - self.p) if self.p else 1
        return x + self.layer(x) * keep


def test_a_forward_that_draws_random_numbers_is_noted_even_when_its_output_did_not_change() -> None:
    # At p = 1e-9 the draw keeps the layer for every seed: the outputs of two seeds agree,
    # but the generator moved.
    model = StochasticDepth(1e-9)
    x = torch.randn(1, 4)
    state = torch.random.get_rng_state()
    note = randomness(model, (x,))
    assert note is not None and "draws random numbers" in note
    assert torch.equal(state, torch.random.get_rng_state())  # left as it was


def test_a_forward_without_random_numbers_gets_no_note() -> None:
    assert randomness(StochasticDepth(0.0), (torch.randn(2, 4),)) is None


def test_dropout_that_changes_the_output_is_named() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    note = randomness(model, (torch.randn(16, 4),))
    assert note is not None and "dropout in 1" in note and "differs between two runs" in note

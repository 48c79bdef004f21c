"""The tensor-parallel benchmark's plans: on each shipped GPU profile the exact plan is no
slower than Megatron-LM's hand placement or than replicating, scored on the same costs."""

from __future__ import annotations

import pytest
from conftest import bench_script

BENCH = bench_script("bench_tensor")


@pytest.mark.parametrize("hardware", BENCH.HARDWARE)
@pytest.mark.parametrize("tp", [2, 4])
def test_the_plan_is_no_slower_than_megatrons_or_replicated(hardware: str, tp: int) -> None:
    row = BENCH.planned(BENCH.SIZES[0], hardware, tp)  # GPT-3 125M: a second or so
    assert isinstance(row, BENCH.Row), row
    assert row.syncpass.fits
    assert row.syncpass.step_s <= row.megatron.step_s * (1 + 1e-9)
    assert row.syncpass.step_s <= row.replicated.step_s * (1 + 1e-9)
    # Megatron's placement: two all-reduces a block forward, and the embedding's and the
    # head's; replicated: none.
    layers = BENCH.SIZES[0].shape.layers
    assert row.megatron.forward_collectives >= 2 * layers
    assert row.replicated.forward_collectives == row.replicated.backward_collectives == 0


def test_a_size_no_layout_fits_is_reported_not_planned() -> None:
    largest = BENCH.SIZES[-1]
    found = BENCH.planned(largest, "pcie4-gpus", 2)
    assert isinstance(found, str)
    assert "no layout on 2 devices fits the device memory" in found

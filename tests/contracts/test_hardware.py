"""Hardware profiles and planning for hardware other than the one measured on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.contracts.costs import parse_costs
from syncpass.contracts.hardware import load_profile, profile_names, retarget_hardware
from syncpass.core.errors import SyncpassError


def test_every_shipped_profile_loads_and_says_where_its_figures_come_from() -> None:
    names = profile_names()
    assert {"cpu-gloo-loopback", "nvlink-8xh100", "pcie4-gpus", "ib-200g-h100"} <= set(names)
    for name in names:
        profile = load_profile(name)
        assert profile.source and profile.hardware.name
        assert profile.hardware.beta_bytes_per_s > 0


def test_retargeting_swaps_the_link_and_scales_compute_by_flops() -> None:
    data = cost_dict([1.0, 2.0], [1000], backward=[2.0, 4.0], alpha=1.0, beta=1.0)
    data["hardware"]["flops_per_s"] = 1e12
    data["hardware"]["name"] = "laptop"
    costs = parse_costs(data)
    profile = load_profile("nvlink-8xh100")
    target = retarget_hardware(costs, profile)
    assert target.hardware == profile.hardware
    assert [op.compute_s for op in target.ops] == pytest.approx([1.0 / 400, 2.0 / 400])
    assert target.notes[-1].startswith("re-targeted from laptop to 8x H100 SXM")
    # The measuring machine's speed probe says nothing of another machine's times.
    probed = dataclasses.replace(costs, speed_probe_s=0.001)
    assert retarget_hardware(probed, profile).speed_probe_s is None
    # Without a measured FLOP/s, compute stays as measured, and the note says so.
    del data["hardware"]["flops_per_s"]
    kept = retarget_hardware(parse_costs(data), profile)
    assert [op.compute_s for op in kept.ops] == [1.0, 2.0]
    assert "compute kept as measured" in kept.notes[-1]


def test_profiles_from_files_and_their_errors(tmp_path: Path) -> None:
    good = tmp_path / "mine.toml"
    good.write_text('name = "mine"\nalpha_s = 1e-6\nbeta_bytes_per_s = 1e10\n')
    assert load_profile(str(good)).hardware.alpha_s == 1e-6
    bad = tmp_path / "bad.toml"
    bad.write_text("alpha_s = 1e-6\nbandwidth = 3\n")
    with pytest.raises(SyncpassError, match="unknown field 'bandwidth'"):
        load_profile(str(bad))
    with pytest.raises(SyncpassError, match="shipped profiles: cpu-gloo-loopback"):
        load_profile("warp-drive")


def test_retargeting_keeps_each_ops_fixed_time_per_call() -> None:
    data = cost_dict([1.0, 2.0], [1000], backward=[2.0, 4.0], alpha=1.0, beta=1.0)
    data["hardware"]["flops_per_s"] = 1e12
    data["ops"][0].update(fixed_s=0.2, backward_fixed_s=0.4)
    target = retarget_hardware(parse_costs(data), load_profile("nvlink-8xh100"))
    first = target.ops[0]
    # Host-side time per call does not shrink on a faster device; the rest does.
    assert first.compute_s == pytest.approx(0.2 + 0.8 / 400)
    assert first.backward_s == pytest.approx(0.4 + 1.6 / 400)
    assert (first.fixed_s, first.backward_fixed_s) == (0.2, 0.4)
    assert "fixed time per call" in target.notes[-1]


@pytest.mark.parametrize("name", profile_names())
def test_retargeting_keeps_the_input_gradients_share_of_the_backward(name: str) -> None:
    # A measured cost file splits each backward into the inputs' gradients and the
    # weights'; on faster hardware both shrink, or the split would exceed the backward.
    data = cost_dict([1e-3, 2e-3], [1000], backward=[2e-3, 4e-3], alpha=1e-4, beta=3e9)
    data["hardware"]["flops_per_s"] = 4e10
    data["ops"][0].update(fixed_s=1e-4, backward_fixed_s=2e-4, backward_input_s=1.5e-3)
    data["ops"][1].update(backward_input_s=4e-3)  # all of it: a layer without weights
    costs = parse_costs(data)
    target = retarget_hardware(costs, load_profile(name))
    for before, after in zip(costs.ops, target.ops, strict=True):
        assert before.backward_input_s is not None and after.backward_input_s is not None
        assert 0 <= after.backward_input_s <= after.backward_s
        assert after.backward_input_s / after.backward_s == pytest.approx(
            before.backward_input_s / before.backward_s
        )

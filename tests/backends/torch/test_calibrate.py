"""`syncpass calibrate`: the link fit, the profile it writes, and real gloo processes.

The fit and the profile are checked on synthetic measurements (exact alpha/beta
data must come back exactly); the slow tests start real gloo process groups on
the CPU and read the written profile back with `load_profile`, as `syncpass plan
--hardware` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLE_COSTS

from syncpass.backends.torch.calibrate import (
    DEFAULT_SIZES,
    MEET_OFFSETS_S,
    CalibrateRequest,
    LinkFit,
    MatmulRate,
    Measurements,
    SizeTimes,
    fit_link,
    measure,
    meeting_figures,
    parse_sizes,
    profile_toml,
    relative_error,
    render_calibration,
)
from syncpass.cli import main as cli_main
from syncpass.commands.calibrate import calibrate_command, register
from syncpass.contracts.hardware import load_profile
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import write_atomically
from syncpass.plan.collectives import ALL_REDUCE, collective_s
from syncpass.plan.tensor_planner import link_for

WHEN = datetime(2026, 3, 4, 5, 6, tzinfo=timezone.utc)
SIZES = [float(size) for size in DEFAULT_SIZES]


def parse(*argv: str) -> argparse.Namespace:
    """``argv`` parsed by a parser that has only ``calibrate``, as cli.py would wire it."""
    parser = argparse.ArgumentParser(prog="syncpass")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["calibrate", *argv])


def synthetic(
    alpha: float, beta: float, host: str = "node-1", memory: int | None = None
) -> Measurements:
    """Measurements whose send/recv times lie exactly on ``alpha + bytes / beta``."""
    return Measurements(
        request=CalibrateRequest(procs=2, repeats=7, warmup=1),
        device="cpu",
        host=host,
        torch_version="2.13.0",
        times=tuple(
            SizeTimes(size, alpha + size / beta, 2 * (alpha + size / beta))
            for size in DEFAULT_SIZES
        ),
        matmul=(MatmulRate(0, 1536, 1, 4e10), MatmulRate(1, 1536, 1, 5e10)),
        device_memory_bytes=memory,
    )


# --- the fit ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "beta"), [(25e-6, 3e9), (1e-5, 3.4e11), (2e-3, 1e8), (5e-5, 2e9)]
)
def test_the_fit_recovers_exact_alpha_and_beta(alpha: float, beta: float) -> None:
    fit = fit_link(SIZES, [alpha + size / beta for size in SIZES])
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-9)
    assert not fit.alpha_clamped
    for size in SIZES:
        assert fit.predict_s(size) == pytest.approx(alpha + size / beta, rel=1e-9)


def test_no_latency_at_all_is_recovered_without_a_clamp() -> None:
    fit = fit_link(SIZES, [size / 2e9 for size in SIZES])
    assert fit.alpha_s == pytest.approx(0.0, abs=1e-15)
    assert fit.beta_bytes_per_s == pytest.approx(2e9, rel=1e-9)
    assert not fit.alpha_clamped


def test_relative_weighting_keeps_the_small_messages_in_the_fit() -> None:
    # +-8% noise on every size: the relative fit stays close to both figures, while
    # plain least squares on the times takes alpha from the noise of the largest messages.
    alpha, beta = 50e-6, 2.5e9
    noise = [1.08 if index % 2 else 0.92 for index in range(len(SIZES))]
    times = [(alpha + size / beta) * factor for size, factor in zip(SIZES, noise, strict=True)]
    fit = fit_link(SIZES, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=0.05)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=0.05)
    for size, measured in zip(SIZES, times, strict=True):
        assert abs(relative_error(fit.predict_s(size), measured)) < 0.12
    _, plain_alpha = np.polyfit(SIZES, times, 1)
    assert abs(plain_alpha / alpha - 1) > 1.0


def test_a_negative_intercept_is_clamped_to_zero() -> None:
    sizes = [1e6, 4e6, 16e6]
    fit = fit_link(sizes, [size / 1e9 - 1e-4 for size in sizes])
    assert fit.alpha_s == 0.0 and fit.alpha_clamped
    assert fit.beta_bytes_per_s == pytest.approx(1.05e9, rel=0.01)


def test_what_cannot_be_fitted() -> None:
    with pytest.raises(SyncpassError, match="at least two different message sizes"):
        fit_link([4.0, 4.0], [1e-5, 1e-5])
    with pytest.raises(SyncpassError, match="do not grow with the message size"):
        fit_link([4.0, 64.0, 1024.0], [3e-5, 2e-5, 1e-5])
    with pytest.raises(SyncpassError, match="cannot fit a time of 0"):
        fit_link([4.0, 64.0], [0.0, 1e-5])


# --- arguments ----------------------------------------------------------------------------------


def test_register_adds_calibrate_with_its_defaults() -> None:
    args = parse("-o", "out.toml")
    assert args.handler is calibrate_command
    assert (args.backend, args.procs, args.sizes, args.repeats) == ("gloo", 2, None, 20)
    assert parse("--backend", "nccl", "--procs", "4", "-o", "x.toml").procs == 4
    with pytest.raises(SystemExit):
        parse("--backend", "mpi", "-o", "x.toml")


def test_sizes_are_parsed_sorted_and_checked() -> None:
    assert parse_sizes("64, 4,16,16") == (4, 16, 64)
    for text, message in (
        ("4,6", "6 is not a positive multiple of 4"),
        ("4,abc", "whole numbers of bytes"),
        ("0,4", "0 is not a positive multiple"),
        ("16", "at least two different sizes"),
    ):
        with pytest.raises(SyncpassError, match=message):
            parse_sizes(text)


def test_bad_requests_fail_before_any_process_starts(tmp_path: Path) -> None:
    out = str(tmp_path / "p.toml")
    with pytest.raises(SyncpassError, match="--procs must be at least 2"):
        calibrate_command(parse("--procs", "1", "-o", out))
    with pytest.raises(SyncpassError, match="no such folder"):
        calibrate_command(parse("-o", str(tmp_path / "missing" / "p.toml")))
    with pytest.raises(SyncpassError, match="is a folder"):
        calibrate_command(parse("-o", str(tmp_path)))
    with pytest.raises(SyncpassError, match="not a positive multiple of 4"):
        calibrate_command(parse("--sizes", "4,10", "-o", out))
    assert not (tmp_path / "p.toml").exists()


def test_main_turns_bad_input_into_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["calibrate", "--procs", "1", "-o", str(tmp_path / "p.toml")]) == 2
    assert capsys.readouterr().err.startswith("syncpass: error: --procs must be at least 2")


def test_nccl_without_a_gpu_per_process_is_refused(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a GPU per process")
    with pytest.raises(SyncpassError, match="--backend nccl needs a GPU per process"):
        calibrate_command(parse("--backend", "nccl", "-o", str(tmp_path / "p.toml")))


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, syncpass.backends.torch.calibrate; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- the report and the profile -----------------------------------------------------------------


def test_the_profile_reads_back_with_load_profile(tmp_path: Path) -> None:
    measurements = synthetic(3e-5, 2e9, host='node "7" \\ rack\t2')
    measurements = dataclasses.replace(measurements, devices=2)  # 2 cores, 1 thread a stage
    fit = fit_link(SIZES, [entry.send_recv_s for entry in measurements.times])
    path = tmp_path / "cpu.toml"
    write_atomically(path, profile_toml(measurements, fit, WHEN))
    profile = load_profile(str(path))
    hardware = profile.hardware
    assert hardware.alpha_s == pytest.approx(3e-5, rel=1e-3)
    assert hardware.beta_bytes_per_s == pytest.approx(2e9, rel=1e-3)
    assert hardware.flops_per_s == pytest.approx(4.5e10, rel=1e-3)
    assert hardware.device_memory_bytes is None  # no limit on the CPU
    assert hardware.devices == 2
    assert hardware.name == '2 local processes over gloo on node "7" \\ rack\t2 (calibrated)'
    for words in ("2026-03-04 05:06 UTC", "2 local processes", "backend gloo", "send/recv"):
        assert words in profile.source
    assert "median of 7 after 1 warm-up" in profile.source
    # The measured table rides along as comments.
    assert f"# {DEFAULT_SIZES[-1]}  " in path.read_text()
    # The collectives' ring model gives back the measured all-reduce times of 2 processes.
    assert hardware.collective_alpha_s is not None and hardware.collective_beta_bytes_per_s
    for entry in measurements.times:
        ring = collective_s(
            ALL_REDUCE,
            entry.size_bytes,
            2,
            hardware.collective_alpha_s,
            hardware.collective_beta_bytes_per_s,
        )
        assert ring == pytest.approx(entry.all_reduce_s, rel=1e-3)
    assert link_for(hardware).alpha_s == hardware.collective_alpha_s  # what TP plans with
    assert "fitted the same way to the all-reduce times" in profile.source


def test_gpu_memory_goes_into_the_profile(tmp_path: Path) -> None:
    measurements = synthetic(1e-5, 3e11, memory=80 * 2**30)
    fit = fit_link(SIZES, [entry.send_recv_s for entry in measurements.times])
    path = tmp_path / "gpu.toml"
    path.write_text(profile_toml(measurements, fit, WHEN))
    assert load_profile(str(path)).hardware.device_memory_bytes == 80 * 2**30


def test_the_table_shows_measured_and_fitted_times_and_errors() -> None:
    measurements = synthetic(5e-5, 2e9)
    text = render_calibration(measurements, LinkFit(5e-5, 1e9))
    lines = text.splitlines()
    header = next(line for line in lines if "send/recv one-way" in line)
    assert header.split()[:5] == ["size", "send/recv", "one-way", "fitted", "error"]
    assert header.endswith("all-reduce (2 procs)")
    rows = [line.split() for line in lines[lines.index(header) + 1 :][: len(DEFAULT_SIZES)]]
    assert [" ".join(row[:2]) for row in rows][::6] == ["4 B", "16 KiB", "64 MiB"]
    # The fit's beta is half the measured one: the error grows to +100% with the size.
    assert rows[0][-3] == "+0.0%"
    expected = relative_error(5e-5 + 2**26 / 1e9, 5e-5 + 2**26 / 2e9)
    assert rows[-1][-3] == f"{100 * expected:+.1f}%" and rows[-1][-3].startswith("+99.")
    assert "alpha 50 us, beta 1 GB/s" in text
    assert "45 GFLOP/s (median of the processes: 40 GFLOP/s, 50 GFLOP/s)" in text


def test_the_meeting_stall_is_the_curves_height_and_its_area_over_the_height() -> None:
    # Extra time of an exchange per offset of the second rank's post, 1 ms the baseline.
    scan = {0.0: 2.1e-3, 5e-5: 1.1e-3, 1e-4: 0.1e-3, 2e-4: 0.08e-3, 1e-3: 0.1e-3}
    stall, window = meeting_figures(scan)
    assert stall == pytest.approx(2.0e-3)
    # Over both signs of the offset: 2 x (trapezoids 0..50 us and 50..100 us) = 0.15 ms^2,
    # the dip under the baseline at 200 us counting as 0.
    area = 2 * (5e-5 * (2.0e-3 + 1.0e-3) / 2 + 5e-5 * 1.0e-3 / 2)
    assert window == pytest.approx(area / 2.0e-3)
    # A noisy late figure does not widen the curve: it falls or stays level with offset.
    noisy = {0.0: 0.5e-3, 1e-4: 0.2e-3, 4e-4: 0.9e-3, 1e-3: 0.0}
    area = 2 * (1e-4 * (0.5e-3 + 0.2e-3) / 2 + 3e-4 * 0.2e-3)
    assert meeting_figures(noisy) == pytest.approx((0.5e-3, area / 0.5e-3))
    # No rise at 0 above the noise: no stall at all.
    assert meeting_figures({0.0: 1.3e-4, 1e-4: 1.0e-4, 1e-3: 1.0e-4}) == (0.0, 0.0)


def test_the_meeting_stall_goes_into_the_profile_and_the_table(tmp_path: Path) -> None:
    measurements = dataclasses.replace(
        synthetic(3e-5, 2e9), meet_stall_s=2.04e-3, meet_window_s=1.2e-4
    )
    fit = fit_link(SIZES, [entry.send_recv_s for entry in measurements.times])
    path = tmp_path / "cpu.toml"
    write_atomically(path, profile_toml(measurements, fit, WHEN))
    profile = load_profile(str(path))
    assert (profile.hardware.meet_stall_s, profile.hardware.meet_window_s) == (2.04e-3, 1.2e-4)
    assert "meet_stall_s and meet_window_s: ranks 0 and 1 compute 2 ms" in profile.source
    assert "stall 2.04 ms at the same moment, window 120 us" in render_calibration(
        measurements, fit
    )
    # Without a stall the profile leaves both out, and planning pays none.
    still = dataclasses.replace(measurements, meet_stall_s=0.0, meet_window_s=0.0)
    path.write_text(profile_toml(still, fit, WHEN))
    assert "meet_" not in "".join(
        line for line in path.read_text().splitlines() if not line.startswith("source")
    )
    assert load_profile(str(path)).hardware.meet_stall_s == 0.0


# --- real processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_two_gloo_processes_calibrate_a_profile_that_plan_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "local.toml"
    # Up to 16 MiB: with other tests (or other work) on the cores, a process waits for its
    # peer to be scheduled, milliseconds a transfer, and the few-MiB messages alone may not
    # grow past that (the fit then finds no bandwidth).
    sizes = [4, 1024, 65536, 1048576, 4194304, 16777216]
    argv = ("--sizes", ",".join(map(str, sizes)), "--repeats", "11", "--warmup", "1")
    args = parse(*argv, "-o", str(path))
    assert args.handler(args) == 0
    out = capsys.readouterr().out
    profile = load_profile(str(path))
    hardware = profile.hardware
    assert hardware.alpha_s >= 0 and hardware.beta_bytes_per_s > 0
    assert hardware.flops_per_s is not None and hardware.flops_per_s > 1e8
    # A real pipeline's runtime costs something per action, and far less than a second.
    assert 0 < hardware.stage_overhead_s < 0.05
    assert "pipeline runtime overhead per micro-batch" in out
    # Two gloo processes' exchange: measured, whatever it is on this machine; a stall has
    # a window, and the table says what was found.
    assert "posts of two ranks that meet (an exchange after 2 ms of compute)" in out
    assert hardware.meet_stall_s >= 0 and hardware.meet_window_s >= 0
    assert (hardware.meet_stall_s > 0) == (hardware.meet_window_s > 0)
    assert hardware.meet_window_s <= 2 * MEET_OFFSETS_S[-1]  # the scan's offsets on each side
    assert "2 local processes" in profile.source and "backend gloo" in profile.source
    for label in ("4 B", "1 KiB", "64 KiB", "1 MiB", "4 MiB", "16 MiB"):
        assert any(line.split()[:2] == label.split() for line in out.splitlines()), label
    # The measured table rides in the profile's comments: size, one-way, fitted, all-reduce.
    rows = [
        tuple(float(cell) for cell in line[2:].split())
        for line in path.read_text().splitlines()
        if line[:2] == "# " and line[2:3].isdigit()
    ]
    assert [int(row[0]) for row in rows] == sizes
    errors = []
    for size, one_way, fitted, all_reduce in rows:
        assert one_way > 0 and all_reduce > 0
        assert fitted == pytest.approx(hardware.transfer_s(size), rel=2e-3)
        errors.append(abs(relative_error(fitted, one_way)))
    # Other load on a small machine stalls a sample now and then (milliseconds on a
    # 100 us message), and the suite's other worker is such load: half the sizes must sit
    # within a factor of two of the fit (one that misses the latency or the bandwidth
    # misses by ten times and more at one end), and a third within half of it.
    assert sorted(errors)[len(errors) // 2] < 1.0, errors
    assert sum(error < 0.5 for error in errors) >= len(errors) // 3, errors
    assert "--hardware " + str(path) in out
    # `syncpass plan --hardware PROFILE.toml` plans with it.
    assert (
        cli_main(["plan", "--costs", str(EXAMPLE_COSTS), "--stages", "2", "--hardware", str(path)])
        == 0
    )
    assert "calibrated" in capsys.readouterr().out


@pytest.mark.slow
def test_three_processes_all_reduce_and_each_measures_its_matmul() -> None:
    request = CalibrateRequest(procs=3, sizes=(4, 65536, 1048576), repeats=3, warmup=1)
    measurements = measure(request)
    assert [entry.size_bytes for entry in measurements.times] == [4, 65536, 1048576]
    assert all(entry.send_recv_s > 0 and entry.all_reduce_s > 0 for entry in measurements.times)
    assert [rate.rank for rate in measurements.matmul] == [0, 1, 2]
    assert all(rate.flops_per_s > 0 and rate.n >= 64 for rate in measurements.matmul)
    assert measurements.device == "cpu" and measurements.device_memory_bytes is None


@pytest.mark.slow
def test_a_failing_process_is_reported_by_rank() -> None:
    # Past the handler's own check: the processes refuse NCCL without GPUs themselves.
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a GPU per process")
    request = CalibrateRequest(backend="nccl", procs=2, sizes=(4, 64), repeats=1, timeout_s=60)
    with pytest.raises(SyncpassError, match=r"rank 0: --backend nccl needs a GPU per process"):
        measure(request)

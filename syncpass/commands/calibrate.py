"""``syncpass calibrate``: the command shell over :mod:`syncpass.backends.torch.calibrate`.

:func:`register` adds the ``calibrate`` subcommand to an argparse subparsers
object; its handler, :func:`calibrate_command`, returns the exit status (0).
Importing this module does not import torch; the handler does.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from syncpass.backends.torch.calibrate import (
    BACKENDS,
    DEFAULT_REPEATS,
    DEFAULT_SIZES,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WARMUP,
    CalibrateRequest,
    check_gpus,
    fit_link,
    measure,
    parse_sizes,
    profile_toml,
    render_calibration,
)
from syncpass.commands.cliargs import EXIT_OK, count, positive_float, positive_int
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import write_atomically


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``calibrate`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); its parser.

    The parser's ``handler`` default is :func:`calibrate_command`.
    """
    parser = subparsers.add_parser(
        "calibrate",
        help="measure the link and the device of local processes and write a hardware profile",
        description="Start local processes, time send/recv between rank 0 and rank 1 and an "
        "all-reduce over all of them at each message size, fit latency (alpha) and bandwidth "
        "(beta) to the send/recv times, measure matmul FLOP/s, and write a hardware profile "
        "for `syncpass plan --hardware PROFILE.toml`. The table goes to stdout, progress to "
        "stderr.",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="gloo",
        help="gloo: processes on the CPU; nccl: one GPU per process (default gloo)",
    )
    parser.add_argument(
        "--procs",
        type=positive_int,
        default=2,
        metavar="N",
        help="processes to start, at least 2 (default 2)",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="PROFILE.toml",
        help="the hardware profile to write",
    )
    parser.add_argument(
        "--sizes",
        metavar="B[,B...]",
        help="message sizes in bytes, multiples of 4 (default: 4 B to 64 MiB in powers of 4)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=DEFAULT_REPEATS,
        metavar="N",
        help=f"timed repetitions per size; the median counts (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        type=count,
        default=DEFAULT_WARMUP,
        metavar="K",
        help=f"untimed repetitions per size first (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="T",
        help="CPU threads per process, for the matmul (default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"stop every process and fail after S seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.set_defaults(handler=calibrate_command)
    return parser  # type: ignore[no-any-return]


def calibrate_command(args: argparse.Namespace) -> int:
    """The handler of ``syncpass calibrate``: measure, fit, print the table, write the profile."""
    request = request_from_args(args)
    output: Path = args.output
    _check_output(output)
    if request.backend == "nccl":
        check_gpus(request.procs)
    print(
        f"syncpass calibrate: starting {request.procs} processes ({request.backend}), "
        f"{len(request.sizes)} sizes x {request.repeats} repeats",
        file=sys.stderr,
    )
    measurements = measure(request)
    fit = fit_link(
        [entry.size_bytes for entry in measurements.times],
        [entry.send_recv_s for entry in measurements.times],
    )
    when = datetime.now(timezone.utc)
    text = profile_toml(measurements, fit, when)
    sys.stdout.write(render_calibration(measurements, fit))
    write_atomically(output, text)
    print(
        f"wrote {output}; plan with it: syncpass plan --costs C --stages S --hardware "
        f"{_hardware_argument(output)}"
    )
    return EXIT_OK


def request_from_args(args: argparse.Namespace) -> CalibrateRequest:
    """The CalibrateRequest of parsed ``syncpass calibrate`` arguments."""
    if args.procs < 2:
        raise SyncpassError(
            f"--procs must be at least 2 (send/recv is timed between rank 0 and rank 1), "
            f"got {args.procs}"
        )
    sizes = DEFAULT_SIZES if args.sizes is None else parse_sizes(args.sizes)
    return CalibrateRequest(
        backend=args.backend,
        procs=args.procs,
        sizes=sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        threads=args.threads,
        timeout_s=args.timeout,
    )


def _check_output(output: Path) -> None:
    """Fail before measuring, not after, when the profile could not be written."""
    if output.is_dir():
        raise SyncpassError("is a folder; give a file name for the profile (-o)", str(output))
    if not output.parent.is_dir():
        raise SyncpassError(f"no such folder {output.parent}; create it first", str(output))


def _hardware_argument(output: Path) -> str:
    """``output`` as ``--hardware`` reads it: a path needs a ``/`` or the ``.toml`` suffix."""
    text = str(output)
    return text if text.endswith(".toml") or "/" in text else f"./{text}"


# --- launching ------------------------------------------------------------------------------

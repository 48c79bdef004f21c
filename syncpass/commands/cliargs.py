"""What every ``syncpass`` subcommand shares: exit statuses and argument types."""

from __future__ import annotations

import argparse
import math

#: Exit statuses, as black and ruff use them.
EXIT_OK = 0
EXIT_FOUND = 1  # --check found work to do; --verify found a mismatch
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


def add_example_timeout(parser: argparse.ArgumentParser) -> None:
    """``--timeout S``: how long the user's example may run (:mod:`syncpass.runtime.guard`)."""
    from syncpass.runtime.guard import DEFAULT_TIMEOUT_S

    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="with --example: stop the example's process and fail after S seconds (default "
        f"{DEFAULT_TIMEOUT_S:g}); it runs in a process of its own",
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _whole(text, minimum=1)


def count(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return _whole(text, minimum=0)


def _whole(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _number(text)
    if value <= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def threshold(text: str) -> float:
    """An argparse type: a number >= 0, ``inf`` for no limit."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (inf for no limit)")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number, not nan")
    return value

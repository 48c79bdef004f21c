"""The ``syncpass`` command line: a thin shell over the library.

Exit status: 0 done, 1 ``--check`` found work to do, 2 error (bad input, an
impossible request). Errors go to stderr as ``syncpass: error: WHERE: WHAT``.
``syncpass plan`` imports neither torch nor jax, so it starts fast and is safe
in hooks.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from syncpass import __version__
from syncpass.config import SCHEDULES, STRATEGIES, SyncConfig, load_config_file
from syncpass.costs import load_costs
from syncpass.errors import SyncpassError
from syncpass.fileio import write_atomically
from syncpass.plan import Plan, PlanRequest, best_stage_count, compare_baselines, make_plan
from syncpass.planfile import dumps_plan
from syncpass.report import render_plan

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_ERROR = 2


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError("must be >= 0 (inf for no limit)")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _stages(text: str) -> int | str:
    return "auto" if text == "auto" else _positive_int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncpass",
        description="Place the sync points of a model-parallel program and write them into its source.",
    )
    parser.add_argument("--version", action="version", version=f"syncpass {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = commands.add_parser(
        "plan",
        help="choose pipeline sync points from a cost file",
        description="Choose pipeline sync points from a cost file and explain the choice. "
        "The report goes to stdout; with --json the plan file goes to stdout instead.",
    )
    plan.add_argument(
        "--costs", required=True, type=Path, metavar="FILE", help="cost file (JSON, version 1)"
    )
    plan.add_argument(
        "--stages",
        type=_stages,
        metavar="S",
        help="number of pipeline stages, or 'auto' for the count with the least predicted step time "
        "(required unless --strategy manual)",
    )
    plan.add_argument(
        "--max-stages",
        type=_positive_int,
        default=8,
        metavar="N",
        help="upper bound for --stages auto (default 8)",
    )
    plan.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML settings ([tool.syncpass] or top level)"
    )
    plan.add_argument(
        "--strategy", choices=STRATEGIES, help="default: the cost file's, else adaptive"
    )
    plan.add_argument(
        "--min-sync-interval", type=_positive_int, metavar="K", help="fewest ops per stage"
    )
    plan.add_argument(
        "--threshold",
        type=_threshold,
        metavar="TAU",
        help="communication_cost_threshold: largest comm/compute ratio at a sync point (inf: no limit)",
    )
    plan.add_argument(
        "--microbatches",
        type=_positive_int,
        metavar="M",
        help="micro-batches per step (default 4 per stage)",
    )
    plan.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="1f1b",
        help="pipeline schedule to predict (default 1f1b)",
    )
    plan.add_argument(
        "--cuts",
        metavar="OP[,OP...]",
        help="pin sync points after these op ids (the cuts of --strategy manual)",
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the plan file (JSON) on stdout instead of the report",
    )
    plan.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="also write the plan file here"
    )
    plan.add_argument(
        "--no-baselines", action="store_true", help="skip the uniform/parameters/time comparison"
    )
    plan.set_defaults(handler=_run_plan)
    return parser


def _run_plan(args: argparse.Namespace) -> int:
    costs = load_costs(args.costs)
    config: SyncConfig = costs.config
    if args.config is not None:
        config = load_config_file(args.config, config)
    try:
        config = config.replace(
            strategy=args.strategy,
            min_sync_interval=args.min_sync_interval,
            communication_cost_threshold=args.threshold,
        )
    except ValueError as error:
        raise SyncpassError(str(error)) from None
    pinned = (
        tuple(part.strip() for part in args.cuts.split(",") if part.strip()) if args.cuts else ()
    )
    auto = args.stages == "auto"
    request = PlanRequest(
        stages=None if auto else args.stages,
        config=config,
        microbatches=args.microbatches,
        schedule=args.schedule,
        pinned=pinned,
    )
    origin = str(args.costs)
    plan: Plan
    if auto:
        plan = best_stage_count(costs, request, args.max_stages, origin)
    else:
        plan = make_plan(costs, request, origin)
    baselines: tuple[Plan, ...] = ()
    if not args.no_baselines and len(plan.stages) > 1:
        baselines = compare_baselines(
            costs,
            PlanRequest(
                stages=len(plan.stages),
                config=config,
                microbatches=plan.microbatches,
                schedule=args.schedule,
                pinned=pinned,
            ),
        )
    document = dumps_plan(plan, baselines)
    if args.output is not None:
        write_atomically(args.output, document)
    if args.json:
        sys.stdout.write(document)
    else:
        if auto:
            sys.stdout.write(
                f"--stages auto: {len(plan.stages)} stage(s) give the least predicted step time (tried 1..{args.max_stages})\n"
            )
        sys.stdout.write(render_plan(plan, baselines))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except SyncpassError as error:
        print(f"syncpass: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # e.g. `syncpass plan ... | head`
        return EXIT_OK
    return status


if __name__ == "__main__":
    sys.exit(main())

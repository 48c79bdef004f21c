"""The ``syncpass`` command line: a thin shell over the library.

Exit status: 0 done, 1 ``--check`` found work to do, 2 error (bad input, an
impossible request). Errors go to stderr as ``syncpass: error: WHERE: WHAT``.
``syncpass plan`` imports neither torch nor jax, so it starts fast and is safe
in hooks.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from syncpass import __version__
from syncpass.backends.registry import load_backend
from syncpass.backends.spec import (
    Backend,
    EstimateRequest,
    MeasureRequest,
)
from syncpass.commands.cliargs import (
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_example_timeout,
    positive_int,
    threshold,
)
from syncpass.commands.tensor import (
    TENSOR_STRATEGY,
    add_tensor_options,
    add_tensor_placement_option,
    add_tensor_style_option,
    run_tensor_plan,
    run_tensor_rewrite,
    tensor_rewritten,
)
from syncpass.contracts.config import SCHEDULES, strategy_names
from syncpass.contracts.costs import Costs, load_costs
from syncpass.contracts.hardware import profile_names
from syncpass.core.errors import SyncpassError, unexpected_error
from syncpass.core.fileio import refuse_clobbering, write_atomically
from syncpass.core.plugins import backend_names
from syncpass.core.units import seconds
from syncpass.plan.optimizer import Infeasible
from syncpass.plan.picture import draw_plan_picture
from syncpass.plan.planfile import dumps_plan, load_plan, plan_to_json
from syncpass.plan.planner import (
    Plan,
    PlanCache,
    PlanRequest,
    auto_stage_limit,
    compare_baselines,
    plan_for,
    timed_step,
)
from syncpass.plan.recompute_plan import (
    RECOMPUTE_MODES,
    plan_recompute,
    plan_with_recompute,
    recompute_problem,
    recompute_stage_count,
    render_recompute,
)
from syncpass.plan.report import render_plan, render_sweep
from syncpass.plan.retarget import retarget_tensor_parallel, sweep_batch, sweep_to_json
from syncpass.plan.schedule import OrderSource, single_stage_order
from syncpass.runtime.example import example_location
from syncpass.runtime.guard import call_guarded
from syncpass.settings.resolve import Overrides, Settings, resolve_settings


def _stages(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def _add_plan_options(parser: argparse.ArgumentParser) -> None:
    """The planning flags ``plan`` and ``rewrite`` share."""
    parser.add_argument(
        "--stages",
        type=_stages,
        metavar="S",
        help="number of pipeline stages (ranks), or 'auto' for the count with the least "
        "predicted step time (required unless --strategy manual)",
    )
    parser.add_argument(
        "--stages-per-device",
        type=_stages,
        metavar="V",
        help="stages each rank holds under a multi-stage --schedule (the plan then has S*V "
        "stages), or 'auto' to try 1, 2 and 4 and keep the least predicted step; default 1 "
        "(2 for zbv and dualpipev)",
    )
    parser.add_argument(
        "--max-stages",
        type=positive_int,
        default=8,
        metavar="N",
        help="upper bound for --stages auto (default 8)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings ([tool.syncpass] or top level); default: the nearest pyproject.toml "
        "with [tool.syncpass] above the input",
    )
    parser.add_argument(
        "--strategy",
        choices=(*strategy_names(), TENSOR_STRATEGY),
        help="default: the cost file's, else adaptive; tensor: tensor parallelism over --tp "
        "devices (plan only)",
    )
    parser.add_argument(
        "--min-sync-interval", type=positive_int, metavar="K", help="fewest ops per stage"
    )
    parser.add_argument(
        "--threshold",
        type=threshold,
        metavar="TAU",
        help="communication_cost_threshold: largest comm/compute ratio at a sync point "
        "(inf: no limit)",
    )
    parser.add_argument(
        "--microbatches",
        type=positive_int,
        metavar="M",
        help="micro-batches per step (default 4 per stage)",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        help="pipeline schedule to predict, as torch.distributed.pipelining runs it "
        "(default 1f1b, or the config's; interleaved-1f1b, looped-bfs, interleaved-zb, zbv "
        "and dualpipev hold --stages-per-device stages per rank)",
    )
    parser.add_argument(
        "--cuts",
        metavar="OP[,OP...]",
        help="pin sync points after these op ids (the cuts of --strategy manual)",
    )
    parser.add_argument(
        "--hardware",
        metavar="NAME|FILE",
        help="plan for this hardware profile (configs/hardware: "
        + ", ".join(profile_names())
        + ", or a .toml file): its link and memory, compute scaled by FLOP/s when known",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="B",
        help="plan for this batch size: compute and activation bytes scale from the cost "
        "file's batch, latency does not",
    )
    parser.add_argument(
        "--optimizer-shards",
        type=positive_int,
        metavar="N",
        help="plan for N data-parallel replicas of the pipeline that shard the optimizer "
        "state (ZeRO-1, FSDP's SHARD_GRAD_OP): each stage holds 1/N of it",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncpass",
        description="Place the sync points of a model-parallel program and write them into "
        "its source.",
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
    _add_plan_options(plan)
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the plan file (JSON) on stdout instead of the report",
    )
    plan.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="also write the plan file here (- for stdout, as --json)",
    )
    plan.add_argument(
        "--picture",
        type=Path,
        metavar="OUT.png",
        help="also draw the plan's simulated step here (PNG): a row per device, each action "
        "and transfer in time, with a time axis and a legend",
    )
    plan.add_argument(
        "--no-baselines", action="store_true", help="skip the uniform/parameters/time comparison"
    )
    plan.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        help="plan activation checkpointing too: auto chooses which blocks recompute (the "
        "fewest that fit the device's memory, exactly), all recomputes every block, none "
        "none; memory then counts activations as the schedule keeps them in flight "
        "(default: not planned)",
    )
    plan.add_argument(
        "--sweep-batch",
        metavar="B[,B...]",
        help="plan at each of these batch sizes and show the batch range where each plan is "
        "optimal",
    )
    plan.add_argument(
        "--backend",
        choices=backend_names(),
        default=None,
        help="the backend the plan is for (default torch_stages, or the config's): with "
        "torch_stages a value may reach any later stage, with torch's tracer only the next one",
    )
    add_tensor_options(plan)
    plan.set_defaults(handler=_run_plan)

    rewrite = commands.add_parser(
        "rewrite",
        help="write a plan's sync points into a model's source",
        description="Plan the model in FILE and write its sync points (pipe_split() calls) into "
        "the source, changing nothing else. The rewritten code goes to stdout unless -o or "
        "--in-place is given; messages go to stderr.",
    )
    rewrite.add_argument("file", metavar="FILE", help="model source file, or - for stdin")
    source = rewrite.add_mutually_exclusive_group(required=True)
    source.add_argument("--costs", type=Path, metavar="FILE", help="cost file of this model")
    source.add_argument(
        "--example",
        metavar="SPEC",
        help="profile on the fly with this example factory (PATH.py:FUNC, module:FUNC, or a "
        "FUNC in FILE); runs the user's code",
    )
    source.add_argument(
        "--input-shape",
        metavar="SHAPES",
        help="estimate the costs from the source for these forward input shapes (8x128, or "
        "8x3x64x64,8x10); runs nothing (see syncpass profile --static)",
    )
    source.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN",
        help="apply this saved plan (syncpass plan -o PLAN) as it is; refused, naming the op, "
        "when its ops are not this file's",
    )
    rewrite.add_argument(
        "--input-dtype",
        metavar="KINDS",
        help="with --input-shape: float or int per input (default: int for token ids)",
    )
    rewrite.add_argument(
        "--model", metavar="CLASS", help="the model class, when the file has several"
    )
    rewrite.add_argument(
        "--depth",
        type=int,
        choices=(1, 2),
        default=1,
        help="with --example or --input-shape: 2 plans calls of nn.Sequential submodules per child (with "
        "--costs, the cost file decides)",
    )
    _add_plan_options(rewrite)
    rewrite.add_argument(
        "--recompute",
        choices=RECOMPUTE_MODES,
        help="plan activation checkpointing too (as plan --recompute) and write it into the "
        "eager stages: each chosen block's call becomes torch.utils.checkpoint.checkpoint"
        "(..., use_reentrant=False), with a comment saying what it frees and costs",
    )
    where = rewrite.add_mutually_exclusive_group()
    where.add_argument(
        "-o", "--output", metavar="OUT", help="write the rewritten source here (- for stdout)"
    )
    where.add_argument("--in-place", action="store_true", help="rewrite FILE itself")
    rewrite.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the file would change, 0 if it is up to date",
    )
    rewrite.add_argument(
        "--diff", action="store_true", help="print a unified diff on stdout instead of the code"
    )
    rewrite.add_argument(
        "--report", type=Path, metavar="FILE", help="write the plan and the analysis (JSON) here"
    )
    rewrite.add_argument(
        "--backend",
        choices=backend_names(),
        default=None,
        help="torch_stages: one eager stage module per stage after the model, run by "
        "torch's PipelineStage (default, or the config's backend; docs/stages.md); torch: "
        "pipe_split() calls in an nn.Module's forward, run by torch's tracer; jax: "
        "jax.device_put transfers in a JAX function or a Flax module's __call__ "
        "(docs/jax.md); others: installed packages' (docs/plugin.md)",
    )
    add_example_timeout(rewrite)
    add_tensor_options(rewrite)
    add_tensor_style_option(rewrite)
    add_tensor_placement_option(rewrite)
    rewrite.set_defaults(handler=_run_rewrite)

    # Imported here, not at the top: `plan` must start without them (they add
    # subcommands only; torch is imported when a command runs).
    from syncpass.commands.calibrate import register as register_calibrate
    from syncpass.commands.check import register as register_check
    from syncpass.commands.profile import register as register_profile
    from syncpass.commands.run import register as register_run

    register_profile(commands)
    register_run(commands)
    register_calibrate(commands)
    register_check(commands)
    return parser


def _overrides(args: argparse.Namespace) -> Overrides:
    """What the flags of ``plan`` and ``rewrite`` say; ``None`` for a flag not given."""
    pinned = (
        tuple(part.strip() for part in args.cuts.split(",") if part.strip()) if args.cuts else ()
    )
    return Overrides(
        stages=args.stages,
        strategy=args.strategy,
        min_sync_interval=args.min_sync_interval,
        communication_cost_threshold=args.threshold,
        microbatches=args.microbatches,
        schedule=args.schedule,
        stages_per_device=args.stages_per_device,
        pinned=pinned,
        hardware=args.hardware,
        batch_size=args.batch_size,
        optimizer_shards=args.optimizer_shards,
        model=getattr(args, "model", None),
        backend=getattr(args, "backend", None),
        config=args.config,
        max_stages=args.max_stages,
    )


def _run_plan(args: argparse.Namespace) -> int:
    if args.picture is not None:
        _check_picture_target(args)
    if args.strategy == TENSOR_STRATEGY or args.tp is not None:
        if args.picture is not None:
            raise SyncpassError("--picture draws a pipeline schedule; drop it for a tensor plan")
        return run_tensor_plan(args, dataclasses.replace(_overrides(args), strategy=None))
    refuse_clobbering({"-o": args.output, "--picture": args.picture}, {"the cost file": args.costs})
    settings = resolve_settings(args.costs, _overrides(args))
    costs = settings.retarget(load_costs(args.costs))
    backend = load_backend(settings.backend)
    request = dataclasses.replace(
        settings.request(costs),
        carries_values=backend.carries_values,
        refused_kinds=backend.refused_kinds,
    )
    if args.recompute is not None:
        if args.picture is not None:
            raise SyncpassError("--picture draws the plan without --recompute; drop one of them")
        return _run_recompute_plan(args, costs, request, settings.auto_limit)
    auto = settings.auto
    orders = backend.schedule_order or single_stage_order
    if args.sweep_batch is not None:
        return _run_sweep(args, costs, request, orders)
    # The baselines reuse what planning computed; the schedule's order is the engine's.
    cache = PlanCache(costs, orders)
    plan = plan_for(costs, request, str(args.costs), settings.auto_limit, cache)
    baselines: tuple[Plan, ...] = ()
    if not args.no_baselines and len(plan.stages) > 1:
        baselines = compare_baselines(
            costs,
            dataclasses.replace(
                request,
                stages=plan.devices,
                stages_per_device=plan.stages_per_device,
                microbatches=plan.microbatches,
            ),
            cache,
        )
    document = dumps_plan(plan, baselines)
    if args.picture is not None:  # first: a picture that cannot be written stops the command
        write_atomically(args.picture, draw_plan_picture(plan, timed_step(plan, cache)))
        print(f"syncpass: wrote {args.picture} (the predicted step)", file=sys.stderr)
    if args.output is not None and str(args.output) == "-":
        args.json = True
    elif args.output is not None:
        write_atomically(args.output, document)
    if args.json:
        sys.stdout.write(document)
    else:
        if auto and settings.auto_limit is not None:
            tried = auto_stage_limit(costs, settings.auto_limit, plan.stages_per_device)
            chosen = f"{len(plan.stages)} stage(s)"
            if plan.stages_per_device > 1:
                chosen = f"{plan.devices} rank(s) of {plan.stages_per_device} stages"
            sys.stdout.write(
                f"--stages auto: {chosen} give the least predicted step time (tried 1..{tried})\n"
            )
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        sys.stdout.write(render_plan(plan, baselines, width))
    return EXIT_OK


def _check_picture_target(args: argparse.Namespace) -> None:
    """Refuse, before planning, a ``--picture`` that cannot be written or has nothing to draw."""
    picture: Path = args.picture
    if str(picture) == "-":
        raise SyncpassError("--picture writes a PNG file; give its name, not -")
    if args.sweep_batch is not None:
        raise SyncpassError("--sweep-batch prints its table; drop --picture")
    if args.output is not None and str(args.output) != "-" and picture == args.output:
        raise SyncpassError("--picture and -o name the same file; give each its own", str(picture))
    if picture.is_dir():
        raise SyncpassError("is a folder; give --picture a file name (OUT.png)", str(picture))
    if not picture.parent.is_dir():
        raise SyncpassError(f"no such folder {picture.parent}; create it first", str(picture))


def _run_recompute_plan(
    args: argparse.Namespace, costs: Costs, request: PlanRequest, auto_limit: int | None
) -> int:
    """``plan --recompute MODE``: the plan with activation checkpointing chosen, and the
    plans recomputing nothing and every block beside it; with ``--stages auto``, at the
    stage count whose plan predicts the least step."""
    plan: Plan | None = None  # made on the way when --stages auto chose the count
    if request.stages is None and auto_limit is not None:
        request, plan, found = recompute_stage_count(
            costs, request, args.recompute, auto_limit, str(args.costs)
        )
    else:
        found = plan_recompute(costs, request, args.recompute)
    problem = recompute_problem(costs, request, found.microbatches)
    chose_count = plan.notes[-1] + "\n" if plan is not None else ""
    report = chose_count + render_recompute(found, costs, problem)
    if isinstance(found.chosen, Infeasible):
        sys.stdout.write(report)
        sys.stderr.write(f"syncpass: error: --recompute {args.recompute}: no plan fits\n")
        return EXIT_ERROR
    if args.output is not None or args.json:
        # The plan file `rewrite --plan` writes from: its cuts, and the ops it checkpoints.
        if plan is None:
            plan, _ = plan_with_recompute(costs, request, args.recompute, str(args.costs), found)
        document = dumps_plan(plan)
        if args.output is not None and str(args.output) != "-":
            write_atomically(args.output, document)
        else:
            args.json = True
        if args.json:
            sys.stdout.write(document)
            return EXIT_OK
    sys.stdout.write(report)
    return EXIT_OK


def _run_sweep(
    args: argparse.Namespace, costs: Costs, request: PlanRequest, orders: OrderSource
) -> int:
    if args.output is not None:
        raise SyncpassError("--sweep-batch prints its table; drop -o (use --json for JSON)")
    try:
        sizes = [positive_int(part) for part in args.sweep_batch.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise SyncpassError(
            f"--sweep-batch takes batch sizes >= 1, got {args.sweep_batch!r}"
        ) from None
    if request.stages is None and request.config.strategy != "manual":
        raise SyncpassError("--sweep-batch needs a fixed --stages S")
    points, ranges = sweep_batch(costs, request, sizes, str(args.costs), orders)
    if args.json:
        sys.stdout.write(json.dumps(sweep_to_json(points, ranges), indent=2) + "\n")
    else:
        sys.stdout.write(render_sweep(points, ranges))
    return EXIT_OK


def _rewrite_costs(
    args: argparse.Namespace, text: str, settings: Settings, backend: Backend
) -> Costs:
    """The costs ``rewrite`` plans with: the cost file, a profile of the example, or an
    estimate from the source."""
    if args.input_shape is not None:
        estimate = backend.need("estimate", "give --costs or --example")
        # Estimated for --hardware directly: there is nothing to re-target from.
        estimated = estimate(
            EstimateRequest(
                file=str(args.file),
                text=text,
                input_shape=args.input_shape,
                model=settings.model,
                input_dtype=args.input_dtype,
                hardware=settings.hardware,
                depth=args.depth,
            )
        )
        return settings.retarget(estimated, estimated_for_hardware=True)
    if args.input_dtype is not None:
        raise SyncpassError("--input-dtype goes with --input-shape")
    if args.example is None:
        return settings.retarget(load_costs(args.costs))
    if args.file == "-":
        raise SyncpassError("--example needs the model file itself, not stdin")
    measure = backend.need("measure", "give its cost file with --costs")
    measured = call_guarded(
        measure,
        MeasureRequest(
            file=Path(args.file),
            text=text,
            example=args.example,
            model=settings.model,
            depth=args.depth,
        ),
        what="the example",
        timeout_s=args.timeout,
        preload=backend.preload,
        location=example_location(args.file, args.example),
    )
    return settings.retarget(measured)


def _saved_plan(args: argparse.Namespace) -> Plan:
    """The plan file of ``--plan``; the planning flags cannot change a saved plan."""
    given = [
        flag
        for flag, value in (
            ("--stages", args.stages),
            ("--stages-per-device", args.stages_per_device),
            ("--schedule", args.schedule),
            ("--strategy", args.strategy),
            ("--min-sync-interval", args.min_sync_interval),
            ("--threshold", args.threshold),
            ("--microbatches", args.microbatches),
            ("--cuts", args.cuts),
            ("--hardware", args.hardware),
            ("--batch-size", args.batch_size),
            ("--optimizer-shards", args.optimizer_shards),
            ("--depth", args.depth if args.depth != 1 else None),
            ("--recompute", args.recompute),
        )
        if value is not None
    ]
    if given:
        raise SyncpassError(
            f"--plan applies a saved plan as it is; drop {', '.join(given)} (or plan again with "
            "syncpass plan)"
        )
    return load_plan(args.plan)


def _run_rewrite_both(args: argparse.Namespace) -> int:
    """``rewrite FILE --example SPEC --strategy tensor --tp T --stages S``: the tensor-parallel
    plan written in, then that source split into S eager stages as any model is (profiled
    on its example, outside a process group, where its collectives do nothing), in one
    file. The tensor-parallel source is kept beside FILE while the stages are planned
    (``.NAME.syncpass-tp.py``) and removed after; the stages are planned with each op's
    time as one rank computes it under the tensor-parallel plan
    (:func:`retarget_tensor_parallel`)."""
    if args.example is None or args.output in (None, "-") or args.in_place:
        raise SyncpassError(
            "rewrite --strategy tensor --stages S needs --example SPEC and -o OUT (the "
            "stages are planned on a profile of the tensor-parallel source)"
        )
    if args.costs is not None or args.plan is not None:
        raise SyncpassError(
            "rewrite --strategy tensor --stages S profiles the tensor-parallel source itself: "
            "drop --costs/--plan (or rewrite in two steps, docs/tensor.md)"
        )
    source = Path(args.file)
    module, _, function = args.example.rpartition(":")
    if not module or Path(module).resolve() != source.resolve():
        raise SyncpassError(
            "rewrite --strategy tensor --stages S needs the example in the model file "
            f"(--example {source}:FUNC), so that it builds the tensor-parallel model",
            args.example,
        )
    refuse_clobbering({"-o": args.output}, {"the input file": args.file})
    _, rewritten, summary, tensor_plan = tensor_rewritten(args)
    print(f"syncpass: {summary}", file=sys.stderr)
    staged = source.with_name(f".{source.stem}.syncpass-tp.py")
    if staged.exists():
        raise SyncpassError(
            "is in the way of the tensor-parallel source rewrite keeps while it plans the "
            "stages (another rewrite running, or one stopped): remove it",
            str(staged),
        )
    write_atomically(staged, rewritten)
    try:
        return _run_rewrite(
            argparse.Namespace(
                **{
                    **vars(args),
                    "file": str(staged),
                    "example": f"{staged}:{function}",
                    "strategy": None,
                    "tp": None,
                    "tp_style": None,
                    "tp_placement": None,
                }
            ),
            # The stages' times as one rank of each stage computes them.
            adjust=lambda costs: retarget_tensor_parallel(costs, tensor_plan),
        )
    finally:
        staged.unlink(missing_ok=True)


def _run_rewrite(args: argparse.Namespace, adjust: Callable[[Costs], Costs] | None = None) -> int:
    from syncpass.commands.confirm import confirmed_rewrite
    from syncpass.frontend.source import read_model_text
    from syncpass.rewrite.driver import rewrite_text
    from syncpass.rewrite.report import analysis_to_json

    tensor_flags = (
        getattr(args, "tp", None),
        getattr(args, "tp_style", None),
        getattr(args, "tp_placement", None),
    )
    tensor = args.strategy == TENSOR_STRATEGY or tensor_flags != (None, None, None)
    if tensor and args.stages is None:
        return run_tensor_rewrite(args)
    if tensor:
        return _run_rewrite_both(args)
    if args.diff and (args.in_place or args.output not in (None, "-")):
        raise SyncpassError("--diff prints the change instead of writing it; drop -o/--in-place")
    path = "<stdin>" if args.file == "-" else args.file
    if args.in_place and args.file == "-":
        raise SyncpassError("--in-place needs a file, not stdin")
    refuse_clobbering(
        {"-o": args.output, "--report": args.report},
        {"the input file": args.file, "the cost file": args.costs, "the plan file": args.plan},
    )
    settings = resolve_settings(
        Path.cwd() if args.file == "-" else Path(args.file), _overrides(args)
    )
    text = read_model_text(args.file)
    backend = load_backend(settings.backend)
    if args.plan is not None:
        plan = _saved_plan(args)
        result = rewrite_text(text, path, backend, None, class_name=settings.model, plan=plan)
    else:
        costs = _rewrite_costs(args, text, settings, backend)
        if adjust is not None:
            costs = adjust(costs)
        result = rewrite_text(
            text,
            path,
            backend,
            settings.request(costs),
            costs,
            class_name=settings.model,
            max_stages=settings.auto_limit,
            recompute=args.recompute,
        )
    refusals: tuple[str, ...] = ()
    if backend.confirm is not None and args.plan is None and args.example is not None:
        result, refusals = confirmed_rewrite(
            backend, backend.confirm, result, costs, settings, path, args.example, args.timeout
        )
    points = len(result.plan.sync_points)
    summary = (
        f"{points} sync point(s), {len(result.plan.stages)} stage(s): bottleneck "
        f"{seconds(result.plan.bottleneck_s)}, predicted step {seconds(result.plan.predicted_step_s)}"
    )
    for region in result.graph.regions:
        print(f"syncpass: note: no sync point inside {region}", file=sys.stderr)
    if result.graph.inlined:
        calls = ", ".join(result.graph.inlined)
        print(
            f"syncpass: note: planned inside {calls} (their statements run in the stages)",
            file=sys.stderr,
        )
    for branch in result.graph.branches:
        print(f"syncpass: note: the stages run {branch}", file=sys.stderr)
    for note in [*refusals, *result.plan.notes]:  # why the plan is what it is
        print(f"syncpass: note: {note}", file=sys.stderr)
    for violation in result.plan.violations:  # a manual or saved plan, written as asked
        print(f"syncpass: warning: the plan breaks a constraint: {violation}", file=sys.stderr)
    if args.report is not None:
        document = {
            "plan": plan_to_json(result.plan),
            "analysis": analysis_to_json(result.graph),
        }
        write_atomically(args.report, json.dumps(document, indent=2) + "\n")
    if args.diff and result.changed:  # a file only laid out anew has no diff to show
        sys.stdout.writelines(
            difflib.unified_diff(
                result.original.splitlines(keepends=True),
                result.rewritten.splitlines(keepends=True),
                fromfile=path,
                tofile=path if args.output in (None, "-") else args.output,
            )
        )
    if args.check:
        if result.changed:
            print(f"would rewrite {path}: {summary}", file=sys.stderr)
            return EXIT_FOUND
        print(f"{path} is up to date: {summary}", file=sys.stderr)
        return EXIT_OK
    if args.diff:
        return EXIT_OK
    target = args.file if args.in_place else args.output
    if target is None or target == "-":
        sys.stdout.write(result.rewritten)
        print(f"syncpass: {summary}", file=sys.stderr)
    elif args.in_place and not result.changed:
        print(f"syncpass: {target} is up to date: {summary}", file=sys.stderr)
    else:
        write_atomically(target, result.rewritten)
        print(f"syncpass: wrote {target}: {summary}", file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
        sys.stdout.flush()  # a full device fails here, not after the exit status is set
    except SyncpassError as error:
        print(f"syncpass: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:  # e.g. `syncpass plan ... | head`
        return EXIT_OK
    except KeyboardInterrupt:
        print("syncpass: interrupted; nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as error:  # the file system (a full device under stdout), not a bug
        if error.filename:
            said = f"{error.filename}: {error.strerror or error}"
        else:  # what is left unnamed is the stream the command writes to
            said = f"standard output: cannot write: {error.strerror or error}"
        print(f"syncpass: error: {said}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as error:  # a crash is an error (2), never a finding (1)
        where = str(getattr(args, "file", None) or "")
        print(f"syncpass: error: {unexpected_error(error, where)}", file=sys.stderr)
        return EXIT_ERROR
    return status


if __name__ == "__main__":
    sys.exit(main())

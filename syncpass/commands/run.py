"""``syncpass run``: the command-line entry of the pipeline runtime.

:func:`register` adds the ``run`` subcommand to an argparse subparsers object;
its handler returns the exit status: 0 done (and, with ``--verify``, every
loss and gradient matched), 1 ``--verify`` found a mismatch. Bad input and
failed stages raise :class:`~syncpass.core.errors.SyncpassError`, which the caller
prints and turns into status 2 (as :func:`main` does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from syncpass.backends.registry import load_backend
from syncpass.commands.cliargs import EXIT_FOUND, EXIT_OK, positive_float, positive_int
from syncpass.contracts.config import MULTI_STAGE_SCHEDULES, default_stages_per_device
from syncpass.contracts.hardware import cpu_devices
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import refuse_clobbering, write_atomically
from syncpass.core.plugins import DEFAULT_BACKEND, backend_names
from syncpass.runtime.contracts import DEVICES, SCHEDULES, RunRequest
from syncpass.runtime.example import example_for_file
from syncpass.runtime.render import render_run, report_document
from syncpass.settings.resolve import Overrides, resolve_settings

DEFAULT_TIMEOUT_S = 300.0


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser.

    The parser's ``handler`` default is :func:`run_command`.
    """
    run = subparsers.add_parser(
        "run",
        help="run a model with pipe_split() sync points as a real pipeline, and check it",
        description="Start one local process per pipeline stage, build the stages with "
        "torch.distributed.pipelining from FILE's pipe_split() calls, run a few training steps "
        "and report each stage's step time and communication wait. With --verify, compare the "
        "loss and every gradient with the unsplit model (exit 1 on a mismatch).",
    )
    run.add_argument("file", type=Path, metavar="FILE", help="model source with pipe_split() calls")
    run.add_argument(
        "--example",
        metavar="SPEC",
        default="example",
        help="the example factory: PATH.py:FUNC, package.module:FUNC, or a FUNC in FILE "
        "(default: example)",
    )
    run.add_argument(
        "--stages",
        type=positive_int,
        metavar="N",
        help="pipeline ranks: one process (and device) each; FILE holds N x V stages",
    )
    run.add_argument(
        "--stages-per-device",
        type=positive_int,
        metavar="V",
        help="stages each rank holds (default 1, 2 for zbv and dualpipev, or the project "
        "configuration's): FILE holds N x V stages, placed round-robin "
        "(interleaved-1f1b, looped-bfs, interleaved-zb) or in a V (zbv, dualpipev: V is 2); "
        "gpipe and 1f1b hold one",
    )
    run.add_argument(
        "--microbatches",
        type=positive_int,
        metavar="M",
        help="micro-batches per step; must divide the batch "
        "(default: the largest divisor of the batch up to four per stage; under torch, "
        "one that leaves micro-batches every batch norm in training takes)",
    )
    run.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="pipeline schedule, as torch.distributed.pipelining names it (default 1f1b; "
        "--backend jax runs gpipe, its default, and refuses the others)",
    )
    run.add_argument(
        "--steps",
        type=positive_int,
        default=3,
        metavar="K",
        help="timed training steps after one warm-up step (default 3)",
    )
    run.add_argument(
        "--verify",
        action="store_true",
        help="compare the loss and every gradient with the unsplit model; exit 1 on a mismatch",
    )
    run.add_argument("--rtol", type=_tolerance, help="relative tolerance of --verify")
    run.add_argument("--atol", type=_tolerance, help="absolute tolerance of --verify")
    run.add_argument(
        "--json-report", type=Path, metavar="OUT", help="also write the figures as JSON here"
    )
    run.add_argument(
        "--timeline",
        type=Path,
        metavar="OUT",
        help="profile the timed steps: OUT.json (each rank's compute, sync time and wait "
        "ratio, with spans) and OUT.png (a timeline of stages and transfers); torch only, "
        "--backend jax refuses it",
    )
    run.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="T",
        help="CPU threads per process (default 1); --backend jax refuses any other count, as "
        "XLA sizes its own pool",
    )
    run.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="auto: one GPU per stage with NCCL when there are enough, else the CPU with gloo; "
        "--backend jax runs on CPU devices (auto, cpu) and refuses cuda",
    )
    run.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"stop every process and fail after S seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    run.add_argument(
        "--costs",
        type=Path,
        metavar="FILE",
        help="the model's cost file: print the cost model's prediction for the sync points "
        "FILE carries beside the measured run (torch; --backend jax refuses it)",
    )
    run.add_argument(
        "--alongside",
        type=Path,
        nargs="+",
        default=[],
        metavar="OTHER",
        help="other files splitting the same model otherwise (each with the example factory "
        "of the same name): their stages are built in the same processes and every timed step "
        "of each runs in turn with FILE's, in a rotated order, so that the machine's load falls "
        "on all alike; each gets its own report (torch)",
    )
    run.add_argument(
        "--backend",
        choices=backend_names(),
        default=DEFAULT_BACKEND,
        help="torch_stages (default) and torch: the file's eager stage classes, or its "
        "pipe_split() calls traced, under PipelineStage over gloo/NCCL processes; jax: the "
        "jax.device_put stages of a JAX function or Flax module, one jax.jit per stage over N "
        "JAX devices (docs/jax.md)",
    )
    run.add_argument(
        "--tp",
        type=positive_int,
        metavar="N",
        help="run a file rewritten with --strategy tensor on N gloo ranks; --verify "
        "compares the loss and every gradient with the unsplit model and the collectives "
        "each rank ran with the plan's. With --stages S: each pipeline stage of the file's "
        "eager stages on N ranks, S x N in all (a tensor-parallel file split into stages)",
    )
    run.set_defaults(handler=run_command)
    return run  # type: ignore[no-any-return]


def checked_paths(args: argparse.Namespace) -> tuple[Path, Path | None]:
    """The model file and the ``--json-report`` path, checked before anything starts."""
    file: Path = args.file
    if not file.is_file():
        raise SyncpassError(
            "no such file (FILE is the model source with its sync points)", str(file)
        )
    report: Path | None = args.json_report
    refuse_clobbering(
        {"--json-report": report},
        {"the model file": file, "the cost file": getattr(args, "costs", None)},
    )
    for other in getattr(args, "alongside", []):
        if not other.is_file():
            raise SyncpassError("no such file (--alongside names other model sources)", str(other))
    if report is not None and not report.parent.is_dir():
        raise SyncpassError("the folder for --json-report does not exist", str(report))
    timeline: Path | None = getattr(args, "timeline", None)
    if timeline is not None and not timeline.parent.is_dir():
        raise SyncpassError("the folder for --timeline does not exist", str(timeline))
    return file, report


def request_from_args(
    args: argparse.Namespace,
    schedule_default: str = "1f1b",
    schedules: tuple[str, ...] = SCHEDULES,
) -> RunRequest:
    """The RunRequest of parsed ``syncpass run`` arguments; checks what needs no process.

    ``schedule_default`` is the schedule of the backend's run when neither ``--schedule``
    nor the project's configuration names one; ``schedules`` are those the backend runs
    (it refuses the others itself, with its reasons). The stages per rank come from
    ``--stages-per-device``, else the configuration (with its schedule, as ``rewrite``
    reads it), else the schedule's default.
    """
    file, _ = checked_paths(args)
    runs_several = any(name in schedules for name in MULTI_STAGE_SCHEDULES)
    given = Overrides(schedule=args.schedule, stages_per_device=args.stages_per_device)
    schedule, per_device = resolve_settings(file, given).schedule_and_stages_per_device(
        schedule_default, check=runs_several
    )
    if per_device is None:  # "auto" in the configuration: the file says how many it holds
        from syncpass.transformers.torch_stages import written_stage_count  # imports libcst

        written = written_stage_count(file.read_text()) if file.suffix == ".py" else None
        fits = written is not None and written % args.stages == 0
        per_device = written // args.stages if fits else default_stages_per_device(schedule)
    if schedule == "1f1b" and args.microbatches is not None and args.microbatches < args.stages:
        raise SyncpassError(
            f"--schedule 1f1b needs --microbatches >= --stages ({args.microbatches} < {args.stages})"
        )
    return RunRequest(
        file=str(file),
        example=example_for_file(file, args.example),
        stages=args.stages,
        microbatches=args.microbatches,
        schedule=schedule,
        steps=args.steps,
        verify=args.verify,
        threads=args.threads,
        device=args.device,
        rtol=args.rtol,
        atol=args.atol,
        timeout_s=args.timeout,
        timeline=None if args.timeline is None else str(args.timeline.resolve()),
        stages_per_device=per_device,
        alongside=tuple(str(other) for other in getattr(args, "alongside", [])),
        tp=getattr(args, "tp", None) or 1,
    )


def _crowded(ranks: int, threads: int, device: str) -> str | None:
    """Why the ranks cannot all run at once on this machine's CPU, or ``None``."""
    if device == "cuda":
        return None
    threads = max(1, threads)
    if ranks <= cpu_devices(threads):
        return None
    return (
        f"{ranks} ranks with {threads} thread(s) each, on {cpu_devices()} CPU core(s) if "
        "they run on the CPU: they share the cores, so the measured steps show the sharing "
        "more than the plan"
    )


def run_command(args: argparse.Namespace) -> int:
    """Handler of ``syncpass run``: run the backend's pipeline, print the report, write the JSON.

    The backend's run hook honours every flag of the request or refuses it
    (a SyncpassError, exit 2) before anything starts.
    """
    backend = load_backend(getattr(args, "backend", DEFAULT_BACKEND))
    if getattr(args, "tp", None) is not None and args.stages is None:
        return _run_tensor(args, backend)
    if args.stages is None:
        raise SyncpassError(
            "run needs --stages N (pipeline ranks) or --tp N (tensor-parallel ranks)"
        )
    run = backend.need("run", "choose a backend that runs pipelines with --backend")
    request = request_from_args(
        args, backend.schedules[0] if backend.schedules else "1f1b", backend.schedules
    )
    costs = predict = None
    if args.costs is not None:  # checked and read before the run: a bad cost file fails fast
        from syncpass.contracts.costs import load_costs

        predict = backend.need("predict", "drop --costs (syncpass plan shows a plan's figures)")
        costs = load_costs(args.costs)
    crowded = _crowded(request.ranks, request.threads, request.device)
    if crowded is not None:
        print(f"syncpass run: warning: {crowded}", file=sys.stderr)
    result = run(request)
    if request.timeline is not None:
        print(
            f"syncpass: wrote {request.timeline}.json and {request.timeline}.png (the timed steps, "
            "rank by rank)",
            file=sys.stderr,
        )
    documents, texts = [], []
    for one in (result, *result.alongside):
        document = report_document(one)
        text = render_run(one)
        if predict is not None and costs is not None:
            from syncpass.runtime.prediction import prediction_to_json, render_prediction

            source = Path(one.request.file).read_text(encoding="utf-8")
            prediction = predict(source, one.request.file, costs, one)
            document["prediction"] = prediction_to_json(prediction)
            text += render_prediction(prediction)
        documents.append(document)
        texts.append(text)
    document, text = documents[0], texts[0]
    if result.alongside:
        document["alongside"] = documents[1:]
        text = "\n".join(
            f"== {one.request.file}{' (steps taken in turn with the others)' if i == 0 else ''}\n"
            f"{part}"
            for i, (one, part) in enumerate(zip((result, *result.alongside), texts, strict=True))
        )
    if args.json_report is not None:
        write_atomically(args.json_report, json.dumps(document, indent=2) + "\n")
    sys.stdout.write(text)
    if request.verify and not all(one.verified for one in (result, *result.alongside)):
        return EXIT_FOUND
    return EXIT_OK


def _run_tensor(args: argparse.Namespace, backend: Any) -> int:
    """``syncpass run FILE --tp N [--verify]``: the backend's tensor-parallel runtime."""
    from syncpass.runtime.contracts import TensorRunRequest

    file, _ = checked_paths(args)
    run = backend.need("tensor_run", "choose --backend torch")
    costs = predict = None
    if args.costs is not None:  # read before the run: a bad cost file fails fast
        from syncpass.contracts.costs import load_costs

        predict = backend.need("tensor_predict", "drop --costs")
        costs = load_costs(args.costs)
    result = run(
        TensorRunRequest(
            file=str(file),
            example=example_for_file(file, args.example),
            tp=args.tp,
            verify=args.verify,
            rtol=args.rtol,
            atol=args.atol,
            timeout_s=args.timeout,
            threads=args.threads,
            steps=args.steps,
            alongside=tuple(str(other) for other in args.alongside),
        )
    )
    from syncpass.runtime.tensor_report import render_tensor_run

    everyone = (result, *result.alongside)
    predictions = [] if predict is None else [predict(one, costs) for one in everyone]
    sys.stdout.write(render_tensor_run(result, predictions))
    if args.json_report is not None:
        import dataclasses

        from syncpass.runtime.prediction import tensor_prediction_to_json

        document = dataclasses.asdict(result)
        for one, prediction in zip((document, *document["alongside"]), predictions, strict=False):
            one["prediction"] = tensor_prediction_to_json(prediction)
        write_atomically(args.json_report, json.dumps(document, indent=2) + "\n")
    ok = result.verified if args.verify else all(one.collectives_match for one in everyone)
    return EXIT_OK if ok else EXIT_FOUND

"""``syncpass plan --strategy tensor --tp N``: a tensor-parallel plan from a cost file.

The cost file's tensor graph (``$.tensor``, :mod:`syncpass.contracts.tensor`) is planned
for ``N`` devices of the cost file's hardware, or of ``--hardware``; ``--batch-size``
re-targets it as it re-targets a pipeline plan. The report goes to stdout (``--json``:
the plan as JSON instead; ``-o FILE``: also to a file). Pipeline-only flags are refused.
"""

from __future__ import annotations

import argparse
import json
import sys

from syncpass.commands.cliargs import EXIT_OK
from syncpass.contracts.costs import load_costs
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import refuse_clobbering, write_atomically
from syncpass.core.samecode import same_code
from syncpass.plan.tensor_baselines import PLACEMENTS
from syncpass.plan.tensor_plan import TensorPlan, tensor_plan_to_json
from syncpass.plan.tensor_planner import (
    TensorRequest,
    check_tensor_request,
    choose_tp,
    link_for,
    plan_tensor,
    render_degrees,
    tensor_graph_of,
)
from syncpass.plan.tensor_report import render_tensor_plan
from syncpass.settings.resolve import Overrides, resolve_settings

#: The ``--strategy`` that plans tensor parallelism instead of pipeline stages.
TENSOR_STRATEGY = "tensor"

#: Flags of a pipeline plan that mean nothing to a tensor-parallel one (yet).
_PIPELINE_ONLY = (
    ("stages", "--stages"),
    ("stages_per_device", "--stages-per-device"),
    ("min_sync_interval", "--min-sync-interval"),
    ("threshold", "--threshold"),
    ("microbatches", "--microbatches"),
    ("schedule", "--schedule"),
    ("cuts", "--cuts"),
    ("sweep_batch", "--sweep-batch"),
    ("optimizer_shards", "--optimizer-shards"),
)


#: ``--tp auto``: the planner chooses the degree (``syncpass plan`` only).
AUTO = "auto"


def tp_count(text: str) -> int | str:
    """An argparse type for ``--tp``: any whole number (the planner says what it must be),
    or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number or auto: {text!r}") from None


def add_tensor_options(parser: argparse.ArgumentParser) -> None:
    """``--tp`` and ``--no-sequence-parallel`` on ``syncpass plan``."""
    parser.add_argument(
        "--tp",
        type=tp_count,
        metavar="N",
        help="with --strategy tensor: the tensor-parallel devices (it must divide every "
        "attention's heads); plan: auto chooses the degree that trains the most sequences "
        "a second on the hardware's devices, data-parallel over the groups",
    )
    parser.add_argument(
        "--no-sequence-parallel",
        action="store_true",
        help="with --strategy tensor: keep what runs between the split layers (norms, "
        "residual sums, dropout) whole instead of letting the plan split it (Megatron-LM "
        "without sequence parallelism)",
    )


def add_tensor_style_option(parser: argparse.ArgumentParser) -> None:
    """``--tp-style`` on ``syncpass rewrite``: the form the plan is written in."""
    parser.add_argument(
        "--tp-style",
        choices=("eager", "dtensor"),
        default=None,
        help="with --strategy tensor: eager (default) writes each collective into the "
        "forwards as a conjugate function, weights sliced by shard_module; dtensor writes "
        "TENSOR_PARALLEL_PLAN, torch's parallel styles for parallelize_module "
        "(docs/tensor.md)",
    )


def add_tensor_placement_option(parser: argparse.ArgumentParser) -> None:
    """``--tp-placement`` on ``syncpass rewrite``: whose layouts are written."""
    parser.add_argument(
        "--tp-placement",
        choices=PLACEMENTS,
        default=None,
        help="with --strategy tensor: syncpass (default) writes the optimiser's layouts; "
        "megatron writes Megatron-LM's hand placement (first linear of each pair by "
        "columns, second by rows, the rest whole) within what the rewrite can write, to "
        "measure against it",
    )


def check_tensor_flags(args: argparse.Namespace, with_stages: bool = False) -> None:
    """``--tp`` and ``--tp-style`` belong to ``--strategy tensor``, and pipeline flags do
    not, unless ``with_stages`` (a rewrite that also splits the result into ``--stages``,
    which the pipeline flags are for) and ``--stages`` is given."""
    tensor = getattr(args, "strategy", None) == TENSOR_STRATEGY
    if not tensor and getattr(args, "tp", None) is not None:
        raise SyncpassError("--tp plans tensor parallelism: add --strategy tensor")
    if not tensor and getattr(args, "tp_style", None) is not None:
        raise SyncpassError("--tp-style writes a tensor-parallel plan: add --strategy tensor")
    if not tensor and getattr(args, "tp_placement", None) is not None:
        raise SyncpassError("--tp-placement writes a tensor-parallel plan: add --strategy tensor")
    if not tensor:
        return
    if getattr(args, "tp", None) is None:
        raise SyncpassError("--strategy tensor needs --tp N, the number of devices")
    if with_stages and getattr(args, "stages", None) is not None:
        return
    for name, flag in _PIPELINE_ONLY:
        if getattr(args, name, None) not in (None, ()):
            raise SyncpassError(
                f"{flag} is a pipeline setting; --strategy tensor plans one layer's split "
                "over --tp devices (syncpass rewrite --strategy tensor --tp T --stages S "
                "also splits the result into stages)"
            )


def run_tensor_plan(args: argparse.Namespace, overrides: Overrides) -> int:
    """``syncpass plan --strategy tensor``: plan, then print the report or the JSON."""
    check_tensor_flags(args, with_stages=True)
    if args.stages is not None:
        return _run_tensor_stages_plan(args, overrides)
    refuse_clobbering({"-o": args.output}, {"the cost file": args.costs})
    settings = resolve_settings(args.costs, overrides)
    measured = load_costs(args.costs)
    costs = settings.retarget(measured)
    graph = tensor_graph_of(costs, measured)
    request = TensorRequest(
        tp=1 if args.tp == AUTO else args.tp,
        sequence_parallel=not args.no_sequence_parallel,
        baselines=not args.no_baselines,
    )
    settings_of_plan = {
        "training": costs.training,
        "memory_multiplier": costs.memory_multiplier,
        "hardware": costs.hardware.name,
        "model": costs.model,
        "notes": costs.notes,
    }
    if args.tp == AUTO:
        devices = costs.hardware.devices
        if devices is None:
            raise SyncpassError(
                "--tp auto chooses among the hardware's devices, and this hardware does not "
                "say how many it has: give --tp N, or --hardware with devices",
                args.costs,
            )
        plan, options = choose_tp(
            graph, link_for(costs.hardware), devices, request, **settings_of_plan
        )
        print(render_degrees(options, plan.tp), file=sys.stderr)
    else:
        check_tensor_request(graph, args.tp, costs.hardware.devices)
        plan = plan_tensor(graph, link_for(costs.hardware), request, **settings_of_plan)  # type: ignore[arg-type]
    document = json.dumps(tensor_plan_to_json(plan), indent=2) + "\n"
    sys.stdout.write(document if _write_document(args, document) else render_tensor_plan(plan))
    return EXIT_OK


def _write_document(args: argparse.Namespace, document: str) -> bool:
    """Write the plan's JSON ``document`` to ``-o FILE``, and say whether stdout gets it
    (``--json``, ``-o -``) instead of the report."""
    if args.output is not None and str(args.output) == "-":
        return True
    if args.output is not None:
        write_atomically(args.output, document)
    return bool(args.json)


def run_tensor_rewrite(args: argparse.Namespace) -> int:
    """``syncpass rewrite FILE --example SPEC --strategy tensor --tp N``: write the plan's
    collectives into the model's forwards (the backend's ``tensor_rewrite`` hook)."""
    from syncpass.commands.cliargs import EXIT_FOUND

    text, rewritten, summary, _ = tensor_rewritten(args)
    changed = not same_code(text, rewritten)  # a file its formatter laid out anew is current
    if args.diff:
        import difflib

        sys.stdout.writelines(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                rewritten.splitlines(keepends=True),
                fromfile=args.file,
                tofile=args.output or args.file,
            )
        )
        return EXIT_OK
    if args.check:
        print(
            f"{'would rewrite' if changed else 'up to date:'} {args.file}: {summary}",
            file=sys.stderr,
        )
        return EXIT_FOUND if changed else EXIT_OK
    if args.output is None or args.output == "-":
        sys.stdout.write(rewritten)
        print(f"syncpass: {summary}", file=sys.stderr)
    else:
        write_atomically(args.output, rewritten)
        print(f"syncpass: wrote {args.output}: {summary}", file=sys.stderr)
    return EXIT_OK


def tensor_rewritten(args: argparse.Namespace) -> tuple[str, str, str, TensorPlan]:
    """The model's text, the text with the tensor-parallel plan written in, the summary
    line and the plan; the notes of what stays replicated and why go to stderr."""
    from pathlib import Path

    from syncpass.backends.registry import load_backend
    from syncpass.backends.spec import TensorRewriteRequest
    from syncpass.core.units import seconds
    from syncpass.frontend.source import read_model_text

    check_tensor_flags(args, with_stages=True)
    if args.tp == AUTO:
        raise SyncpassError(
            "--tp auto is a plan's choice: run syncpass plan --costs FILE --strategy tensor "
            "--tp auto, then rewrite with the degree it chose"
        )
    if args.example is None or args.file == "-":
        raise SyncpassError(
            "rewrite --strategy tensor records the model's tensor graph from its example: "
            "give the model file and --example SPEC"
        )
    if args.in_place:
        raise SyncpassError("rewrite --strategy tensor writes a new file: use -o OUT")
    refuse_clobbering({"-o": args.output}, {"the input file": args.file})
    backend = load_backend(args.backend or "torch_stages")
    rewrite = backend.need("tensor_rewrite", "choose --backend torch")
    text = read_model_text(args.file)
    result = rewrite(
        TensorRewriteRequest(
            file=str(Path(args.file)),
            text=text,
            example=args.example,
            tp=args.tp,
            hardware=args.hardware,
            timeout_s=args.timeout,
            style=args.tp_style or "eager",
            placement=args.tp_placement or "syncpass",
        )
    )
    plan = result.plan
    split = sum(item.layout != "replicated" for item in plan.layouts)
    counts = f"{plan.cost.forward_collectives} forward, {plan.cost.backward_collectives} backward"
    written = (
        "in TENSOR_PARALLEL_PLAN's parallel styles"
        if args.tp_style == "dtensor"
        else f"{result.lines} collective line(s)"
    )
    placement = " Megatron-LM's placement:" if args.tp_placement == "megatron" else ""
    summary = (
        f"tp {plan.tp}:{placement} {split} of {len(plan.layouts)} op(s) split, {written} ({counts} "
        f"collectives a step), predicted step {seconds(plan.cost.step_s)}"
    )
    for note in result.notes:
        print(f"syncpass: note: stays replicated: {note}", file=sys.stderr)
    for note in plan.notes:
        print(f"syncpass: note: {note}", file=sys.stderr)
    return text, result.rewritten, summary, plan


def _run_tensor_stages_plan(args: argparse.Namespace, overrides: Overrides) -> int:
    """``plan --strategy tensor --tp N|auto --stages S``: the tensor-parallel plan inside each
    of S pipeline stages and the pipeline planned on one rank's share of each op
    (:mod:`syncpass.plan.tensor_stages`); ``auto`` weighs every degree."""
    from syncpass.plan.planfile import dumps_plan
    from syncpass.plan.report import render_plan
    from syncpass.plan.tensor_stages import plan_tensor_stages

    if args.stages == AUTO or not str(args.stages).isdigit():
        raise SyncpassError(
            "--strategy tensor --stages S needs a number of stages (--stages auto is a "
            "pipeline plan's choice)"
        )
    refuse_clobbering({"-o": args.output}, {"the cost file": args.costs})
    settings = resolve_settings(args.costs, overrides)
    measured = load_costs(args.costs)
    costs = settings.retarget(measured)
    graph = tensor_graph_of(costs, measured)
    stages = int(args.stages)
    devices = costs.hardware.devices
    if args.tp == AUTO and devices is None:
        raise SyncpassError(
            "--tp auto chooses among the hardware's devices, and this hardware does not say "
            "how many it has: give --tp N, or --hardware with devices",
            args.costs,
        )
    if args.tp == AUTO:
        assert devices is not None
        degrees = [n for n in range(1, devices // stages + 1) if (devices // stages) % n == 0]
    else:
        degrees = [args.tp]
    staged = plan_tensor_stages(
        costs,
        graph,
        link_for(costs.hardware),
        degrees,
        devices or stages * int(degrees[0]),
        TensorRequest(tp=1, sequence_parallel=False, baselines=not args.no_baselines),
        settings.request(costs),
        training=costs.training,
        memory_multiplier=costs.memory_multiplier,
        hardware=costs.hardware.name,
        model=costs.model,
        notes=costs.notes,
    )
    if args.tp == AUTO:
        print(render_degrees(staged.options, staged.tensor.tp, devices, stages), file=sys.stderr)
    document = (
        json.dumps(
            {
                "tensor": tensor_plan_to_json(staged.tensor),
                "pipeline": json.loads(dumps_plan(staged.pipeline)),
            },
            indent=2,
        )
        + "\n"
    )
    if _write_document(args, document):
        sys.stdout.write(document)
        return EXIT_OK
    sys.stdout.write(render_tensor_plan(staged.tensor))
    sys.stdout.write(
        f"\n{stages} pipeline stage(s) of {staged.tensor.tp} tensor-parallel rank(s) each, each "
        "op's time as one rank of its stage computes it:\n"
    )
    sys.stdout.write(render_plan(staged.pipeline, ()).rstrip("\n") + "\n")
    return EXIT_OK

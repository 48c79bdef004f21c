"""``syncpass profile``: measure a model's op costs and write its cost file.

:func:`register` adds the ``profile`` subcommand to an argparse subparsers
object; its handler, :func:`profile_command`, returns the exit status (0).
Bad input raises :class:`~syncpass.core.errors.SyncpassError`, which the caller
prints and turns into status 2.

Importing this module imports neither torch nor libcst (``syncpass plan``
imports it to build its parser); the handler imports them when it runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncpass.commands.cliargs import EXIT_OK, add_example_timeout, count, positive_int
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import refuse_clobbering, write_atomically
from syncpass.core.plugins import DEFAULT_BACKEND, backend_names
from syncpass.runtime.example import example_location
from syncpass.runtime.guard import call_guarded

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile`` to ``subparsers`` (from ``ArgumentParser.add_subparsers``); its parser.

    The parser's ``handler`` default is :func:`profile_command`.
    """
    profile = subparsers.add_parser(
        "profile",
        help="measure the cost of each op of a model and write its cost file",
        description="Run the example model's forward and backward with a probe at every op "
        "boundary of FILE's model class, and write a cost file (version 1) whose op ids are "
        "the ones `syncpass rewrite FILE --costs OUT` expects. Progress goes to stderr.",
    )
    profile.add_argument("file", type=Path, metavar="FILE", help="model source file")
    profile.add_argument(
        "--example",
        metavar="SPEC",
        default="example",
        help="the example factory: PATH.py:FUNC, package.module:FUNC, or a FUNC in FILE "
        "(default: example); it returns (model, args) or (model, args, target, loss_fn)",
    )
    profile.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="the cost file to write (- for stdout)",
    )
    profile.add_argument(
        "--model",
        metavar="CLASS",
        help="the model class (default: the class of the example's model)",
    )
    profile.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        metavar="N",
        help="timed steps; each op keeps the median (default 5)",
    )
    profile.add_argument(
        "--warmup",
        type=count,
        default=2,
        metavar="N",
        help="untimed steps before the timed ones (default 2)",
    )
    profile.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        metavar="N",
        help="CPU threads torch uses (default 1)",
    )
    profile.add_argument(
        "--depth",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: plan calls of nn.Sequential submodules per child, so a sync point can fall "
        "inside one (default 1)",
    )
    profile.add_argument(
        "--backend",
        choices=backend_names(),
        default=DEFAULT_BACKEND,
        help="torch_stages (default): an nn.Module's forward with its own methods and the "
        "submodule holding the layers planned inside, as the eager stages run it; torch: its "
        "forward as written, for pipe_split() (torch's tracer is asked whether it takes the "
        "model); jax: a JAX function or a Flax module, timed per op with jax.jit and counted "
        "with XLA's cost analysis (docs/jax.md)",
    )
    static = profile.add_argument_group(
        "estimates without running code",
        "--static estimates each op from the source alone (FLOP counts of standard layers, "
        "parameter and activation sizes) for the given input shapes; it imports neither torch "
        "nor the model's code. Ops it cannot size are named with file:line and get the median "
        "op's cost.",
    )
    static.add_argument(
        "--static", action="store_true", help="estimate from the source; run nothing"
    )
    static.add_argument(
        "--meta",
        action="store_true",
        help="build the example's model as fake tensors (torch's FakeTensorMode: shapes, no "
        "data) and count each op's FLOPs and bytes (torch's FlopCounterMode): nothing "
        "allocated, nothing timed; needs --hardware, "
        "whose FLOP/s turn FLOPs into time (docs/profile.md)",
    )
    static.add_argument(
        "--input-shape",
        metavar="SHAPES",
        help="with --static: the forward's input shapes, e.g. 8x128 or 8x3x64x64,8x10",
    )
    static.add_argument(
        "--input-dtype",
        metavar="KINDS",
        help="with --static: float or int per input (default: int for token ids that go "
        "into an nn.Embedding, else float)",
    )
    static.add_argument(
        "--hardware",
        metavar="NAME|FILE",
        help="with --static: the hardware profile whose FLOP/s turns FLOPs into time "
        "(default cpu-gloo-loopback)",
    )
    add_example_timeout(profile)
    profile.set_defaults(handler=profile_command)
    return profile  # type: ignore[no-any-return]


def _summary(costs: Costs, target: str, repeats: int) -> str:
    from syncpass.core.units import seconds

    forward = sum(op.compute_s for op in costs.ops)
    return (
        f"syncpass: wrote {target}: {len(costs.ops)} op(s), {len(costs.cuts)} admissible sync "
        f"point(s); forward {seconds(forward)}, {_backward_text(costs)} per step at batch "
        f"{costs.batch_size} (median of {repeats})"
    )


def _backward_text(costs: Costs) -> str:
    """The step's backward, with the part of it that computes the inputs' gradients (the
    zero-bubble schedules' ``I``) where the profile says."""
    from syncpass.core.units import seconds

    text = f"backward {seconds(sum(op.backward_s for op in costs.ops))}"
    if all(op.backward_input_s is None for op in costs.ops):
        return text
    inputs = sum(op.input_gradient_s() for op in costs.ops)
    return f"{text} ({seconds(inputs)} of it the inputs' gradients)"


def profile_command(args: argparse.Namespace) -> int:
    """Handler of ``syncpass profile``: load the example, measure, write the cost file."""
    from syncpass.backends.registry import load_backend
    from syncpass.backends.spec import EstimateRequest, MeasureRequest
    from syncpass.contracts.costs import costs_to_json
    from syncpass.frontend.source import read_model_text

    file: Path = args.file
    refuse_clobbering({"-o": args.output}, {"the model file": file})
    text = read_model_text(file)
    if args.meta and args.static:
        raise SyncpassError("--meta and --static are two ways of not running the model; choose one")
    if args.meta and not args.hardware:
        raise SyncpassError(
            "--meta needs --hardware NAME|FILE: its FLOP/s turn the counted FLOPs into time"
        )
    if not (args.static or args.meta) and (args.input_shape or args.input_dtype or args.hardware):
        raise SyncpassError("--input-shape, --input-dtype and --hardware go with --static")
    backend = load_backend(args.backend)
    if args.static:
        if args.input_shape is None:
            raise SyncpassError("--static needs the forward's input shapes: --input-shape 8x128")
        estimate = backend.need("estimate", "drop --static and profile on an example")
        costs = estimate(
            EstimateRequest(
                file=str(file),
                text=text,
                input_shape=args.input_shape,
                model=args.model,
                input_dtype=args.input_dtype,
                hardware=args.hardware,
                depth=args.depth,
            )
        )
    else:
        measure = backend.need("measure", "give its cost file to plan and rewrite instead")
        costs = call_guarded(
            measure,
            MeasureRequest(
                file=file,
                text=text,
                example=args.example,
                model=args.model,
                repeats=args.repeats,
                warmup=args.warmup,
                threads=args.threads,
                depth=args.depth,
                meta=args.hardware if args.meta else None,
            ),
            what="the example",
            timeout_s=args.timeout,
            preload=backend.preload,
            location=example_location(file, args.example),
        )
    document = json.dumps(costs_to_json(costs), indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(document)
        target = "stdout"
    else:
        write_atomically(args.output, document)
        target = args.output
    if not costs.cuts:
        print(
            "syncpass: note: the forward has no admissible sync point; it can only be planned "
            "as one stage",
            file=sys.stderr,
        )
    if args.static or args.meta:
        how = "counted on fake tensors" if args.meta else "estimated from the source"
        print(_static_summary(costs, target, how), file=sys.stderr)
    else:
        print(_summary(costs, target, args.repeats), file=sys.stderr)
    refused = _refused(costs, backend.refused_kinds)
    if refused:
        print(f"syncpass: note: {refused}", file=sys.stderr)
    return EXIT_OK


def _refused(costs: Costs, kinds: tuple[str, ...]) -> str:
    """What the backend's stages cannot send, and across how many of the cuts (the plan
    puts no sync point there), or ``""``."""
    refused = costs.unsendable(kinds)
    if not refused:
        return ""
    names = collections.Counter(name for crossing in refused.values() for name in crossing)
    shown = ", ".join(f"{name} at {count}" for name, count in names.items())
    return (
        f"{len(refused)} of the {len(costs.cuts)} admissible sync point(s) are refused by this "
        f"backend: a value its stages cannot send crosses them ({shown}); they send "
        "tensors, numbers, shapes, and tuples, lists or dicts of tensors and constants"
    )


def _static_summary(costs: Costs, target: str, how: str) -> str:
    from syncpass.core.units import seconds

    forward = sum(op.compute_s for op in costs.ops)
    return (
        f"syncpass: wrote {target}: {len(costs.ops)} op(s), {len(costs.cuts)} admissible sync "
        f"point(s); forward {seconds(forward)}, {_backward_text(costs)} per step at batch "
        f"{costs.batch_size}, {how} (nothing timed)"
    )

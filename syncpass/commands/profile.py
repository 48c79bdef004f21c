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
import inspect
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from syncpass.commands.cliargs import EXIT_OK, count, positive_int
from syncpass.core.errors import SyncpassError
from syncpass.core.fileio import write_atomically

if TYPE_CHECKING:
    import torch

    from syncpass.contracts.costs import Costs

#: Progress lines appear only once profiling has taken this long.
PROGRESS_AFTER_S = 2.0


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
        choices=("torch", "jax"),
        default="torch",
        help="torch: an nn.Module's forward (default); jax: a JAX function or a Flax module, "
        "timed per op with jax.jit and counted with XLA's cost analysis (docs/jax.md)",
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
    profile.set_defaults(handler=profile_command)
    return profile  # type: ignore[no-any-return]


class ProgressReporter:
    """Writes progress lines to ``stream``, but only once ``after_s`` seconds have passed.

    A quick profile stays silent; a slow one says what it is doing.
    """

    def __init__(self, stream: TextIO, after_s: float = PROGRESS_AFTER_S) -> None:
        self.stream = stream
        self.after_s = after_s
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed >= self.after_s:
            print(f"syncpass profile: {message} ({elapsed:.1f} s)", file=self.stream, flush=True)


def check_model_file(model: torch.nn.Module, file: Path, class_name: str | None) -> None:
    """The example's model must run the forward written in FILE, not a copy elsewhere."""
    for cls in type(model).__mro__:
        if "forward" in vars(cls):
            break
    else:  # pragma: no cover - nn.Module defines forward
        return
    if class_name is not None and cls.__name__ != class_name:
        return  # the analysis reports the class mismatch, naming both classes
    code = getattr(inspect.unwrap(vars(cls)["forward"]), "__code__", None)
    if code is None:
        return
    defined_in = Path(code.co_filename)
    if defined_in.resolve() != file.resolve():
        raise SyncpassError(
            f"the example's model runs {cls.__name__}.forward from {defined_in}, not from this "
            "file; profile that file, or make the example build its model from this one",
            str(file),
        )


def _summary(costs: Costs, target: str, repeats: int) -> str:
    from syncpass.core.units import seconds

    forward = sum(op.compute_s for op in costs.ops)
    backward = sum(op.backward_s for op in costs.ops)
    return (
        f"syncpass: wrote {target}: {len(costs.ops)} op(s), {len(costs.cuts)} admissible sync "
        f"point(s); forward {seconds(forward)}, backward {seconds(backward)} per step at batch "
        f"{costs.batch_size} (median of {repeats})"
    )


def measure_file(
    file: Path,
    text: str,
    example: str,
    class_name: str | None,
    repeats: int = 5,
    warmup: int = 2,
    threads: int = 1,
    depth: int = 1,
) -> Costs:
    """Load the example named by ``example`` and profile the model of ``file`` with it.

    The one place where user code runs, for ``profile`` and ``rewrite --example``.
    """
    from syncpass.frontend.source import parse_source
    from syncpass.runtime.example import example_for_file, load_example

    parse_source(text, str(file))  # a syntax error is reported before any user code runs
    spec = example_for_file(file, example)
    progress = ProgressReporter(sys.stderr)
    progress("loading the example")
    loaded = load_example(spec)
    check_model_file(loaded.model, file, class_name)

    from syncpass.backends.torch.measure import profile_costs

    def loss(output: Any) -> torch.Tensor:
        return loaded.loss_fn(output, loaded.target)

    costs = profile_costs(
        text,
        str(file),
        loaded.model,
        loaded.args,
        loss,
        class_name=class_name,
        repeats=repeats,
        warmup=warmup,
        threads=threads,
        progress=progress,
        depth=depth,
        small_batch=smaller_batch(loaded.args, loaded.target, loaded.loss_fn),
    )
    for note in costs.notes:
        print(f"syncpass: warning: {note}", file=sys.stderr)
    return costs


def smaller_batch(
    args: tuple[Any, ...], target: Any, loss_fn: Callable[[Any, Any], torch.Tensor]
) -> tuple[tuple[Any, ...], Callable[[Any], torch.Tensor]] | None:
    """The first quarter of the example's batch, with its loss, or ``None`` when it
    cannot be cut (a batch under 4, or inputs or target without the batch dimension).
    A ``None`` target (the default loss, which ignores it) stays ``None``."""
    import torch

    from syncpass.backends.torch.measure import SMALL_BATCH_DIVISOR

    tensors = [value for value in args if isinstance(value, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0:
        return None
    size = int(tensors[0].shape[0])
    small = size // SMALL_BATCH_DIVISOR
    if small < 1:
        return None

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == size:
            return value[:small]
        return value

    if target is not None and not (
        isinstance(target, torch.Tensor) and target.dim() > 0 and target.shape[0] == size
    ):
        return None
    small_args = tuple(cut(value) for value in args)
    small_target = None if target is None else target[:small]

    def small_loss(output: Any) -> torch.Tensor:
        return loss_fn(output, small_target)

    return small_args, small_loss


def profile_command(args: argparse.Namespace) -> int:
    """Handler of ``syncpass profile``: load the example, measure, write the cost file."""
    from syncpass.contracts.costs import costs_to_json
    from syncpass.frontend.source import read_model_text

    file: Path = args.file
    text = read_model_text(file)
    if not args.static and (args.input_shape or args.input_dtype or args.hardware):
        raise SyncpassError("--input-shape, --input-dtype and --hardware go with --static")
    if args.static:
        if args.input_shape is None:
            raise SyncpassError("--static needs the forward's input shapes: --input-shape 8x128")
        if args.backend != "torch":
            raise SyncpassError("--static estimates torch models only")
        from syncpass.backends.torch.static import estimate_file

        costs = estimate_file(
            str(file),
            text,
            args.model,
            args.input_shape,
            args.input_dtype,
            args.hardware,
            args.depth,
        )
    elif getattr(args, "backend", "torch") == "jax":
        from syncpass.backends.jax.profile import measure_jax_file

        costs = measure_jax_file(file, text, args.example, args.model, args.repeats, args.warmup)
    else:
        costs = measure_file(
            file,
            text,
            args.example,
            args.model,
            args.repeats,
            args.warmup,
            args.threads,
            args.depth,
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
    if args.static:
        print(_static_summary(costs, target), file=sys.stderr)
    else:
        print(_summary(costs, target, args.repeats), file=sys.stderr)
    return EXIT_OK


def _static_summary(costs: Costs, target: str) -> str:
    from syncpass.core.units import seconds

    forward = sum(op.compute_s for op in costs.ops)
    backward = sum(op.backward_s for op in costs.ops)
    return (
        f"syncpass: wrote {target}: {len(costs.ops)} op(s), {len(costs.cuts)} admissible sync "
        f"point(s); forward {seconds(forward)}, backward {seconds(backward)} per step at batch "
        f"{costs.batch_size}, estimated from the source (nothing ran)"
    )

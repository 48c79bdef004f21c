"""``syncpass run --backend jax``: run a rewritten JAX model over N devices and check it.

The parent (:func:`run_jax`) starts one child process (``python -m
syncpass.backends.jax.run``) with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
set before JAX starts, so that a CPU-only machine has N devices. The child
loads the example, splits its batch into micro-batches, builds the pipeline of
the file's ``jax.device_put`` sync points (:func:`syncpass.backends.jax.pipeline.pipeline`:
one ``jax.jit`` per stage, each on its own device with its weights placed there
once) and runs GPipe loss-and-gradient steps (:class:`syncpass.backends.jax.pipeline.GPipe`):
some timed whole (the step), as many run call by call (each stage's compute).
With ``--verify`` it also runs the unsplit original (the file with syncpass's
sync lines stripped, jitted whole on one device) on the same micro-batches and
compares each micro-batch's loss and every gradient leaf: ``|pipeline -
reference| <= atol + rtol * |reference|``, with the float32 defaults of the
torch check (rtol 1e-5, atol 1e-6).

The child prints one JSON document on stdout; the parent renders it. A
failure is a document too, ``{"error": ..., "location": ...}``: the type and
message of what was raised and the user's ``file:line`` it came from, which
the parent raises as a :class:`SyncpassError`. Before it traces anything, the
child counts the transfers the file's model states and refuses a file written
for more stages than ``--stages``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.core.errors import SyncpassError
from syncpass.core.units import percent, seconds
from syncpass.runtime.contracts import default_microbatches
from syncpass.runtime.render import REPORT_VERSION, _table

RTOL, ATOL = 1e-5, 1e-6
LOSS_MISMATCH = "loss of micro-batch"


@dataclass(frozen=True)
class JaxRunResult:
    """What the child measured and checked (plain values, from its JSON).

    ``step_times_s`` are wall times of whole loss-and-gradient steps as they
    run (stages overlapping); ``stage_compute_times_s[s]`` the time stage
    ``s``'s own calls took in each of as many steps run again with a wait
    after every call (forward, backward, and for the last stage the loss).
    """

    stages: int
    devices: tuple[str, ...]
    stage_weights: tuple[int, ...]  # weight leaves each stage holds
    stage_parameters: tuple[int, ...]  # and their elements
    batch: int
    microbatches: int
    step_times_s: tuple[float, ...]
    stage_compute_times_s: tuple[tuple[float, ...], ...]
    verified: bool | None  # None without --verify
    losses: tuple[float, ...]  # one per micro-batch
    reference_losses: tuple[float, ...] | None
    checks: int
    mismatches: tuple[str, ...]
    max_abs: float
    rtol: float
    atol: float

    @property
    def step_s(self) -> float:
        return statistics.median(self.step_times_s)

    def compute_s(self, stage: int) -> float:
        return statistics.median(self.stage_compute_times_s[stage])

    def comm_wait_s(self, stage: int) -> float:
        """The part of the step stage ``stage`` does not spend in its own calls."""
        return max(0.0, self.step_s - self.compute_s(stage))

    @property
    def gradient_mismatches(self) -> int:
        return sum(not name.startswith(LOSS_MISMATCH) for name in self.mismatches)

    @property
    def loss(self) -> float:
        return sum(self.losses) / len(self.losses)


def _flags(stages: int) -> str:
    flags = os.environ.get("XLA_FLAGS", "")
    kept = " ".join(
        part for part in flags.split() if not part.startswith("--xla_force_host_platform_device")
    )
    return f"{kept} --xla_force_host_platform_device_count={stages}".strip()


def run_jax(
    file: str,
    example: str,
    stages: int,
    steps: int = 3,
    verify: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    timeout_s: float = 300.0,
    microbatches: int | None = None,
) -> JaxRunResult:
    """Run ``file``'s rewritten model over ``stages`` JAX devices in a child process.

    ``microbatches`` splits the batch (default: as for torch, the largest
    divisor of the batch up to four per stage).
    """
    command = [
        sys.executable,
        "-m",
        "syncpass.backends.jax.run",
        file,
        example,
        str(stages),
        str(steps),
        "1" if verify else "0",
        repr(RTOL if rtol is None else rtol),
        repr(ATOL if atol is None else atol),
        str(microbatches or 0),
    ]
    env = dict(os.environ, XLA_FLAGS=_flags(stages))
    env.setdefault("JAX_PLATFORMS", "cpu")
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SyncpassError(
            f"the JAX run took longer than {timeout_s:g} s; stopped it", file
        ) from None
    data = _document(done.stdout)
    if data is not None and "error" in data:
        raise SyncpassError(data["error"], data["location"])
    if done.returncode != 0 or data is None:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise SyncpassError(lines[-1] if lines else f"the JAX run failed ({done.returncode})")
    references = data["reference_losses"]
    return JaxRunResult(
        stages=data["stages"],
        devices=tuple(data["devices"]),
        stage_weights=tuple(data["stage_weights"]),
        stage_parameters=tuple(data["stage_parameters"]),
        batch=data["batch"],
        microbatches=data["microbatches"],
        step_times_s=tuple(data["step_times_s"]),
        stage_compute_times_s=tuple(tuple(times) for times in data["stage_compute_times_s"]),
        verified=data["verified"],
        losses=tuple(data["losses"]),
        reference_losses=None if references is None else tuple(references),
        checks=data["checks"],
        mismatches=tuple(data["mismatches"]),
        max_abs=data["max_abs"],
        rtol=data["rtol"],
        atol=data["atol"],
    )


def _document(stdout: str) -> dict[str, Any] | None:
    """The child's JSON document: its last line of output, if that is one."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def render_jax_run(result: JaxRunResult, file: str = "", example: str = "") -> str:
    """The report ``syncpass run --backend jax`` prints: a stage table as the torch run's."""
    where = f"{file}, example {example}, " if file else ""
    lines = [
        f"syncpass run (jax): {where}{result.stages} stage(s) on {', '.join(result.devices)}, "
        f"gpipe, {result.microbatches} micro-batch(es) of {result.batch // result.microbatches}, "
        f"{len(result.step_times_s)} step(s) after 1 warm-up",
        "",
    ]
    rows = [["stage", "device", "params", "step", "compute", "comm wait", "wait/step"]]
    for stage in range(result.stages):
        wait = result.comm_wait_s(stage)
        rows.append(
            [
                str(stage),
                result.devices[stage],
                f"{result.stage_parameters[stage]:,}",
                seconds(result.step_s),
                seconds(result.compute_s(stage)),
                seconds(wait),
                percent(wait / result.step_s) if result.step_s > 0 else "-",
            ]
        )
    lines += _table(rows, frozenset({2, 3, 4, 5, 6}))
    lines += [
        "step: median wall time of a loss-and-gradient step, stages overlapping; compute: the",
        "stage's own forward, backward and loss calls, timed in as many steps run call by call;",
        "comm wait: the rest of the step (transfers, waiting for neighbours, bubbles)",
    ]
    if result.verified is not None and result.reference_losses is not None:
        status = "ok" if result.verified else "MISMATCH"
        matching = sum(
            abs(got - want) <= result.atol + result.rtol * abs(want)
            for got, want in zip(result.losses, result.reference_losses, strict=True)
        )
        lines += [
            "",
            f"verify: {status}: {result.checks} gradient leaves compared with the unsplit model "
            f"({result.checks - result.gradient_mismatches} match), {matching} of "
            f"{len(result.losses)} micro-batch loss(es) match; rtol {result.rtol:g}, atol "
            f"{result.atol:g}",
            f"  max abs diff {result.max_abs:.3g}; loss {result.loss:.6g} vs "
            f"{sum(result.reference_losses) / len(result.reference_losses):.6g}",
        ]
        lines.extend(f"  mismatch: {name}" for name in result.mismatches)
    return "\n".join(lines) + "\n"


def jax_report_document(result: JaxRunResult, file: str, example: str) -> dict[str, Any]:
    """The ``--json-report`` document, shaped as the torch run's (times in seconds)."""
    document: dict[str, Any] = {
        "version": REPORT_VERSION,
        "file": file,
        "example": example,
        "stages": result.stages,
        "schedule": "gpipe",
        "batch": result.batch,
        "microbatches": result.microbatches,
        "steps": len(result.step_times_s),
        "backend": "jax",
        "device": ", ".join(result.devices),
        "stage_reports": [
            {
                "stage": stage,
                "device": result.devices[stage],
                "parameters": result.stage_parameters[stage],
                "parameter_tensors": result.stage_weights[stage],
                "step_s": result.step_s,
                "compute_s": result.compute_s(stage),
                "comm_wait_s": result.comm_wait_s(stage),
                "step_times_s": list(result.step_times_s),
                "compute_times_s": list(result.stage_compute_times_s[stage]),
            }
            for stage in range(result.stages)
        ],
        "verify": None,
    }
    if result.verified is not None and result.reference_losses is not None:
        document["verify"] = {
            "ok": result.verified,
            "gradient_leaves_compared": result.checks,
            "mismatches": list(result.mismatches),
            "max_abs_diff": result.max_abs,
            "rtol": result.rtol,
            "atol": result.atol,
            "losses": [
                {"microbatch": index, "pipeline": got, "reference": want}
                for index, (got, want) in enumerate(
                    zip(result.losses, result.reference_losses, strict=True)
                )
            ],
        }
    return document


def _split(tree: Any, parts: int, what: str) -> list[Any]:
    """``tree`` cut into ``parts`` equal pieces along the first (batch) dimension."""
    import jax
    import jax.numpy as jnp

    leaves, structure = jax.tree_util.tree_flatten(tree)
    for leaf in leaves:
        if not getattr(leaf, "shape", ()) or leaf.shape[0] % parts:
            raise SyncpassError(
                f"{what} has a leaf of shape {tuple(getattr(leaf, 'shape', ()))}, which does not "
                f"split into {parts} equal micro-batches along its first dimension; choose "
                "--microbatches among the divisors of the batch"
            )
    pieces = [jnp.split(leaf, parts) for leaf in leaves]
    return [
        jax.tree_util.tree_unflatten(structure, [piece[part] for piece in pieces])
        for part in range(parts)
    ]


def _child(
    file: str,
    spec: str,
    stages: int,
    steps: int,
    verify: bool,
    rtol: float,
    atol: float,
    microbatches: int = 0,
) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from syncpass.backends.jax.example import (
        apply_of,
        line_map,
        load_jax_example,
        model_failure,
        model_from_source,
    )
    from syncpass.backends.jax.measure import batch_size
    from syncpass.backends.jax.pipeline import GPipe, pipeline
    from syncpass.backends.jax.rewrite import strip_jax_sync_points

    example = load_jax_example(spec)
    text = Path(file).read_text(encoding="utf-8")
    stated = _stated_transfers(text, file, example.name)
    if stated > stages - 1:  # tracing would index a device JAX does not have
        raise SyncpassError(_stage_count_message(stated, stages), file)
    if len(jax.devices()) < stages:
        raise SyncpassError(
            f"{stages} stage(s) need {stages} devices; JAX sees {len(jax.devices())}"
        )
    batch = batch_size(example)
    count = microbatches or default_microbatches(batch, stages)
    args = _split(example.args, count, "an input")
    targets = (
        [None] * count if example.target is None else _split(example.target, count, "the target")
    )
    batches = list(zip(args, targets, strict=True))
    rewritten = model_from_source(example, text, file, "rewritten")
    # Traced at the shape of one micro-batch; weights placed on their stages here, once.
    staged = pipeline(apply_of(rewritten, example.is_function), example.params, *args[0])
    if len(staged.stages) != stages:
        raise SyncpassError(_stage_count_message(len(staged.stages) - 1, stages), file)
    step = GPipe(staged, example.loss_fn)
    _ready(step(batches).grads)  # warm-up: compiles every stage
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        result = step(batches)
        _ready((result.grads, result.losses))
        times.append(time.perf_counter() - started)
    compute: list[list[float]] = [[] for _ in staged.stages]
    for _ in range(steps):
        for stage, spent in enumerate(step(batches, timed=True).stage_compute_s):
            compute[stage].append(spent)
    losses, grads = result.losses, result.grads
    report: dict[str, Any] = {
        "stages": stages,
        "devices": [str(stage.device) for stage in staged.stages],
        "stage_weights": [len(stage.weights) for stage in staged.stages],
        "stage_parameters": [
            sum(int(weight.size) for weight in stage.placed_weights) for stage in staged.stages
        ],
        "batch": batch,
        "microbatches": count,
        "step_times_s": times,
        "stage_compute_times_s": compute,
        "verified": None,
        "losses": [float(loss) for loss in losses],
        "reference_losses": None,
        "checks": 0,
        "mismatches": [],
        "max_abs": 0.0,
        "rtol": rtol,
        "atol": atol,
    }
    if not verify:
        return report
    stripped = strip_jax_sync_points(text, file, example.name)
    original = model_from_source(example, stripped, file, "original")
    apply = apply_of(original, example.is_function)
    whole = jax.jit(
        jax.value_and_grad(
            lambda params, args, target: example.loss_fn(apply(params, *args), target)
        )
    )
    # The unsplit model on the same micro-batches, gradients summed in the same order.
    reference_losses, reference = [], None
    for micro_args, target in batches:
        try:  # the stripped copy runs under the file's name, with its own line numbers
            loss, gradient = whole(example.params, micro_args, target)
        except Exception as error:
            raise model_failure(
                error, file, "the unsplit reference failed", line_map(stripped, text)
            ) from None
        reference_losses.append(float(loss))
        reference = (
            gradient if reference is None else jax.tree_util.tree_map(jnp.add, reference, gradient)
        )
    reference = jax.tree_util.tree_map(lambda gradient: gradient * (1 / count), reference)
    paths = jax.tree_util.tree_flatten_with_path(reference)[0]
    mismatches, max_abs = [], 0.0
    for (path, want), got in zip(paths, jax.tree_util.tree_leaves(grads), strict=True):
        got = jax.device_put(got, jax.devices()[0])
        diff = jnp.abs(got - want)
        max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
        if not bool(jnp.all(diff <= atol + rtol * jnp.abs(want))):
            mismatches.append(jax.tree_util.keystr(path))
    for index, (got, want) in enumerate(zip(report["losses"], reference_losses, strict=True)):
        if abs(got - want) > atol + rtol * abs(want):
            mismatches.append(f"{LOSS_MISMATCH} {index}")
    report.update(
        verified=not mismatches,
        reference_losses=reference_losses,
        checks=len(paths),
        mismatches=mismatches,
        max_abs=max_abs,
    )
    return report


def _stated_transfers(text: str, file: str, name: str) -> int:
    """How many transfers the model's top-level statements state: a lower bound of the
    pipeline's sync points (a helper the model calls may hold more); 0 if the file cannot
    be analysed."""
    from syncpass.backends.jax.analysis import analyse_jax_model
    from syncpass.frontend.source import parse_source

    try:
        graph = analyse_jax_model(parse_source(text, file), file, name, text=text)
    except SyncpassError:
        return 0
    return len(graph.written)


def _stage_count_message(sync_points: int, stages: int) -> str:
    return (
        f"the file has {sync_points} sync point(s), so {sync_points + 1} stage(s), not "
        f"{stages}; rewrite it with --stages {stages}, or run it with --stages {sync_points + 1}"
    )


def _ready(tree: Any) -> None:
    """Wait until every array of ``tree`` is computed (JAX dispatches asynchronously)."""
    import jax

    for leaf in jax.tree_util.tree_leaves(tree):
        leaf.block_until_ready()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncpass.backends.jax.run")
    for name in ("file", "example", "stages", "steps", "verify", "rtol", "atol", "microbatches"):
        parser.add_argument(name)
    args = parser.parse_args(argv)
    from syncpass.backends.jax.example import model_failure

    try:
        result = _child(
            args.file,
            args.example,
            int(args.stages),
            int(args.steps),
            args.verify == "1",
            float(args.rtol),
            float(args.atol),
            int(args.microbatches),
        )
    except SyncpassError as error:
        return _failed(error)
    except Exception as error:  # the model's, or JAX's: reported at the user's line
        return _failed(model_failure(error, args.file, "the JAX run failed"))
    print(json.dumps(result))
    return 0


def _failed(error: SyncpassError) -> int:
    """Report ``error`` to the parent (a JSON document) and to a person reading stderr."""
    print(str(error), file=sys.stderr)
    print(json.dumps({"error": error.message, "location": error.location}))
    return 2


if __name__ == "__main__":
    sys.exit(main())

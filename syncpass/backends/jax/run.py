"""``syncpass run --backend jax``: run a rewritten JAX model over N devices and check it.

The parent (:func:`run_jax`, the backend's ``run`` hook) refuses what the JAX
run cannot honour (:func:`refusals`), then starts one child process (``python -m
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

The child prints one JSON document on stdout, of the fields of
:class:`~syncpass.runtime.contracts.RunResult`; the parent turns it into one,
which :mod:`syncpass.runtime.render` renders as it renders the torch run's. A
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
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from syncpass.core.errors import SyncpassError
from syncpass.runtime.contracts import (
    LossCheck,
    ParamCheck,
    RunRequest,
    RunResult,
    StageFigures,
    default_microbatches,
)

RTOL, ATOL = 1e-5, 1e-6
SCHEDULE = "gpipe"


def refusals(request: RunRequest) -> list[str]:
    """Why the JAX run cannot honour ``request`` as asked; empty when it can."""
    found = []
    if request.schedule != SCHEDULE:
        found.append(
            f"--schedule {request.schedule}: the JAX run has the gpipe schedule only; drop "
            f"--schedule {request.schedule}"
        )
    if request.stages_per_device != 1:
        found.append(
            f"--stages-per-device {request.stages_per_device}: the JAX run puts one stage on "
            "each device; drop --stages-per-device"
        )
    if request.device == "cuda":
        found.append(
            "--device cuda: the JAX run puts its stages on N host (CPU) devices made with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N; it has no GPU run"
        )
    if request.threads != 1:
        found.append(
            f"--threads {request.threads}: the JAX run's one process holds every stage and XLA "
            "sizes its CPU thread pool itself; syncpass sets no count for it; drop --threads"
        )
    if request.timeline is not None:
        found.append("--timeline: the timeline profiles torch pipelines only")
    if request.alongside:
        found.append("--alongside: the JAX run steps one file's stages; run each file alone")
    return found


def run_jax(request: RunRequest) -> RunResult:
    """Run ``request.file``'s rewritten model over ``request.stages`` JAX devices in a child.

    ``request.microbatches`` splits the batch (default: as for torch, the
    largest divisor of the batch up to four per stage). Raises SyncpassError
    for a flag the JAX run cannot honour (every reason at once), and for a
    failed or timed-out run.
    """
    reasons = refusals(request)
    if reasons:
        raise SyncpassError("--backend jax cannot honour " + "; nor ".join(reasons))
    command = [
        sys.executable,
        "-m",
        "syncpass.backends.jax.run",
        request.file,
        request.example,
        str(request.stages),
        str(request.steps),
        "1" if request.verify else "0",
        repr(RTOL if request.rtol is None else request.rtol),
        repr(ATOL if request.atol is None else request.atol),
        str(request.microbatches or 0),
    ]
    data = run_child(command, request.stages, request.file, request.timeout_s)
    return result_of(request, data)


def result_of(request: RunRequest, data: dict[str, Any]) -> RunResult:
    """The RunResult of the child's document ``data`` for ``request``."""

    def check(entry: dict[str, Any]) -> ParamCheck:
        return ParamCheck(**entry)

    stages = tuple(
        StageFigures(
            stage=row["stage"],
            rank=0,  # every stage runs in the one child process
            parameters=row["parameters"],
            parameter_tensors=row["parameter_tensors"],
            step_times_s=tuple(row["step_times_s"]),
            compute_times_s=tuple(row["compute_times_s"]),
            checks=tuple(map(check, row["checks"])),
            loss_checks=tuple(LossCheck(**entry) for entry in row["loss_checks"]),
            device=row["device"],
        )
        for row in data["stage_reports"]
    )
    return RunResult(
        request=replace(request, schedule=SCHEDULE),
        batch=data["batch"],
        microbatches=data["microbatches"],
        backend="jax",
        device=data["platform"],
        stages=stages,
        model_parameters=data["model_parameters"],
        unplaced=tuple(map(check, data["unplaced"])),
        own_threads=False,
    )


def run_child(module_command: list[str], devices: int, file: str, timeout_s: float) -> Any:
    """The JSON document a JAX child (``python -m ...``) prints last, run on ``devices``
    CPU devices; its error, or its last line of stderr, as a :class:`SyncpassError`."""
    env = dict(os.environ, XLA_FLAGS=device_count_flags(devices))
    env.setdefault("JAX_PLATFORMS", "cpu")
    try:
        done = subprocess.run(
            module_command, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SyncpassError(
            f"the JAX run took longer than {timeout_s:g} s; stopped it", file
        ) from None
    data = child_document(done.stdout)
    if data is not None and "error" in data:
        raise SyncpassError(data["error"], data["location"])
    if done.returncode != 0 or data is None:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise SyncpassError(lines[-1] if lines else f"the JAX run failed ({done.returncode})")
    return data


def device_count_flags(devices: int) -> str:
    """``XLA_FLAGS`` with the host platform's device count set to ``devices``."""
    flags = os.environ.get("XLA_FLAGS", "")
    kept = " ".join(
        part for part in flags.split() if not part.startswith("--xla_force_host_platform_device")
    )
    return f"{kept} --xla_force_host_platform_device_count={devices}".strip()


def child_document(stdout: str) -> dict[str, Any] | None:
    """The child's JSON document: its last line of output, if that is one."""
    lines = stdout.strip().splitlines()
    if not lines:
        return None
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


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

    from syncpass.backends.jax.example import apply_of, load_jax_example, model_from_source
    from syncpass.backends.jax.measure import batch_size
    from syncpass.backends.jax.pipeline import GPipe, pipeline

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
        for index, spent in enumerate(step(batches, timed=True).stage_compute_s):
            compute[index].append(spent)
    losses, grads = result.losses, result.grads
    # A weight leaf belongs to the first stage that reads it, where its gradient is summed.
    owner: dict[int, int] = {}
    for index, stage in enumerate(staged.stages):
        for leaf in stage.weights:
            owner.setdefault(leaf, index)
    stage_checks: list[list[dict[str, Any]]] = [[] for _ in staged.stages]
    unplaced: list[dict[str, Any]] = []
    loss_checks: list[dict[str, Any]] = []
    if verify:
        reference, reference_losses = _reference(example, text, file, batches)
        paths = jax.tree_util.tree_flatten_with_path(reference)[0]
        for index, ((path, want), got) in enumerate(
            zip(paths, jax.tree_util.tree_leaves(grads), strict=True)
        ):
            entry = _compare(jax.tree_util.keystr(path), got, want, rtol, atol)
            entry["stage"] = owner.get(index, -1)
            if entry["stage"] < 0:
                entry["note"] = "no stage reads this weight"
                unplaced.append(entry)
            else:
                stage_checks[entry["stage"]].append(entry)
        for index, (loss, want) in enumerate(zip(losses, reference_losses, strict=True)):
            got = float(loss)
            ok = abs(got - want) <= atol + rtol * abs(want)
            loss_checks.append({"microbatch": index, "pipeline": got, "reference": want, "ok": ok})
    last = len(staged.stages) - 1
    return {
        "platform": staged.stages[0].device.platform,
        "batch": batch,
        "microbatches": count,
        "model_parameters": staged.num_weights,
        "stage_reports": [
            {
                "stage": index,
                "device": str(stage.device),
                "parameters": sum(int(weight.size) for weight in stage.placed_weights),
                "parameter_tensors": len(stage.weights),
                "step_times_s": times,
                "compute_times_s": compute[index],
                "checks": stage_checks[index],
                "loss_checks": loss_checks if index == last else [],
            }
            for index, stage in enumerate(staged.stages)
        ],
        "unplaced": unplaced,
    }


def _reference(
    example: Any, text: str, file: str, batches: list[tuple[Any, Any]]
) -> tuple[Any, list[float]]:
    """The unsplit model's mean gradient over ``batches`` and its loss on each micro-batch."""
    import jax
    import numpy as np

    from syncpass.backends.jax.example import apply_of, line_map, model_failure, model_from_source
    from syncpass.backends.jax.rewrite import strip_jax_sync_points

    stripped = strip_jax_sync_points(text, file, example.name)
    original = model_from_source(example, stripped, file, "original")
    apply = apply_of(original, example.is_function)
    whole = jax.jit(
        jax.value_and_grad(
            lambda params, args, target: example.loss_fn(apply(params, *args), target)
        )
    )
    # The unsplit model on the same micro-batches, gradients summed in the same order.
    losses, total = [], None
    for micro_args, target in batches:
        try:  # the stripped copy runs under the file's name, with its own line numbers
            loss, gradient = whole(example.params, micro_args, target)
        except Exception as error:
            raise model_failure(
                error, file, "the unsplit reference failed", line_map(stripped, text)
            ) from None
        losses.append(float(loss))
        # Summed on the host: an eager jnp.add compiles a program per leaf shape (seconds on
        # a model of a hundred weights); float32 adds give the same bits either way.
        host = jax.tree_util.tree_map(np.asarray, gradient)
        total = host if total is None else jax.tree_util.tree_map(np.add, total, host)
    scale = 1 / len(batches)
    return jax.tree_util.tree_map(
        lambda gradient: gradient * gradient.dtype.type(scale), total
    ), losses


def _compare(name: str, got: Any, want: Any, rtol: float, atol: float) -> dict[str, Any]:
    """One gradient leaf against the reference's, as the fields of a ParamCheck (no stage)."""
    import numpy as np

    # On the host, in numpy: eager jnp operations compile a program per leaf shape.
    got, want = np.asarray(got), np.asarray(want)
    diff = np.abs(got - want)
    max_abs = max_rel = 0.0
    if diff.size:  # relative differences where the reference is not zero, as torch's check
        nonzero = want != 0
        relative = np.where(nonzero, diff / np.where(nonzero, np.abs(want), 1), 0)
        max_abs, max_rel = float(diff.max()), float(relative.max())
    return {
        "name": name,
        "numel": int(want.size),
        "max_abs": max_abs,
        "max_rel": max_rel,
        "ok": bool(np.all(diff <= atol + rtol * np.abs(want))),
        "rtol": rtol,
        "atol": atol,
    }


def _stated_transfers(text: str, file: str, name: str) -> int:
    """How many transfers the model's statements state (the submodules' calls it follows
    included): a lower bound of the pipeline's sync points (a helper the model calls may
    hold more); 0 if the file cannot be analysed."""
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
        return report_failure(error)
    except Exception as error:  # the model's, or JAX's: reported at the user's line
        return report_failure(model_failure(error, args.file, "the JAX run failed"))
    print(json.dumps(result))
    return 0


def report_failure(error: SyncpassError) -> int:
    """Report ``error`` to the parent (a JSON document) and to a person reading stderr."""
    print(str(error), file=sys.stderr)
    print(json.dumps({"error": error.message, "location": error.location}))
    return 2


if __name__ == "__main__":
    sys.exit(main())

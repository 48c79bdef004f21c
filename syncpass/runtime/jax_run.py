"""``syncpass run --backend jax``: run a rewritten JAX model over N devices and check it.

The parent (:func:`run_jax`) starts one child process (``python -m
syncpass.runtime.jax_run``) with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
set before JAX starts, so that a CPU-only machine has N devices. The child
loads the example, builds the pipeline of the file's ``jax.device_put`` sync
points (:func:`syncpass.jax_pipeline.pipeline`: one ``jax.jit`` per stage,
each on its own device), runs loss and gradient steps and times them. With
``--verify`` it also runs the unsplit original (the file with syncpass's sync
lines stripped, jitted whole on one device) and compares the loss and every
gradient leaf: ``|pipeline - reference| <= atol + rtol * |reference|``, with the
float32 defaults of the torch check (rtol 1e-5, atol 1e-6).

The child prints one JSON document on stdout; the parent renders it.
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

from syncpass.errors import SyncpassError

RTOL, ATOL = 1e-5, 1e-6


@dataclass(frozen=True)
class JaxRunResult:
    """What the child measured and checked (plain values, from its JSON)."""

    stages: int
    devices: tuple[str, ...]
    stage_weights: tuple[int, ...]  # weight leaves each stage holds
    step_times_s: tuple[float, ...]
    verified: bool | None  # None without --verify
    loss: float
    reference_loss: float | None
    checks: int
    mismatches: tuple[str, ...]
    max_abs: float
    rtol: float
    atol: float


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
) -> JaxRunResult:
    """Run ``file``'s rewritten model over ``stages`` JAX devices in a child process."""
    command = [
        sys.executable,
        "-m",
        "syncpass.runtime.jax_run",
        file,
        example,
        str(stages),
        str(steps),
        "1" if verify else "0",
        repr(RTOL if rtol is None else rtol),
        repr(ATOL if atol is None else atol),
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
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise SyncpassError(lines[-1] if lines else f"the JAX run failed ({done.returncode})")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return JaxRunResult(
        stages=data["stages"],
        devices=tuple(data["devices"]),
        stage_weights=tuple(data["stage_weights"]),
        step_times_s=tuple(data["step_times_s"]),
        verified=data["verified"],
        loss=data["loss"],
        reference_loss=data["reference_loss"],
        checks=data["checks"],
        mismatches=tuple(data["mismatches"]),
        max_abs=data["max_abs"],
        rtol=data["rtol"],
        atol=data["atol"],
    )


def render_jax_run(result: JaxRunResult) -> str:
    """The report ``syncpass run --backend jax`` prints."""
    step = statistics.median(result.step_times_s)
    lines = [
        f"syncpass run (jax): {result.stages} stage(s) on {', '.join(result.devices)}; "
        f"loss and gradient step {step * 1e3:.2f} ms (median of {len(result.step_times_s)})",
        "stage  device  weight leaves",
    ]
    for index, (device, weights) in enumerate(
        zip(result.devices, result.stage_weights, strict=True)
    ):
        lines.append(f"{index:<5}  {device:<6}  {weights}")
    if result.verified is not None:
        status = "ok" if result.verified else "MISMATCH"
        lines.append(
            f"verify: {status}: {result.checks} gradient leaves compared with the unsplit "
            f"model ({result.checks - len(result.mismatches)} match), loss {result.loss:.6g} vs "
            f"{result.reference_loss:.6g}; rtol {result.rtol:g}, atol {result.atol:g}; max abs "
            f"diff {result.max_abs:.3g}"
        )
        lines.extend(f"  mismatch: {name}" for name in result.mismatches)
    return "\n".join(lines) + "\n"


def _child(
    file: str, spec: str, stages: int, steps: int, verify: bool, rtol: float, atol: float
) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    from syncpass.jax_example import apply_of, load_jax_example, model_from_source
    from syncpass.jax_pipeline import pipeline
    from syncpass.rewrite_jax import strip_jax_sync_points

    if len(jax.devices()) < stages:
        raise SyncpassError(
            f"{stages} stage(s) need {stages} devices; JAX sees {len(jax.devices())}"
        )
    example = load_jax_example(spec)
    text = Path(file).read_text(encoding="utf-8")
    rewritten = model_from_source(example, text, file, "rewritten")
    staged = pipeline(apply_of(rewritten, example.is_function), example.params, *example.args)
    if len(staged.stages) != stages:
        raise SyncpassError(
            f"the file has {len(staged.stages) - 1} sync point(s), so {len(staged.stages)} "
            f"stage(s), not {stages}; rewrite it with --stages {stages}",
            file,
        )
    step = jax.value_and_grad(lambda params: example.loss(params, staged))
    times = []
    loss, grads = step(example.params)  # warm-up: compiles every stage
    _ready(grads)
    for _ in range(steps):
        started = time.perf_counter()
        loss, grads = step(example.params)
        _ready(grads)
        times.append(time.perf_counter() - started)
    result: dict[str, Any] = {
        "stages": stages,
        "devices": [str(stage.device) for stage in staged.stages],
        "stage_weights": [len(stage.weights) for stage in staged.stages],
        "step_times_s": times,
        "verified": None,
        "loss": float(loss),
        "reference_loss": None,
        "checks": 0,
        "mismatches": [],
        "max_abs": 0.0,
        "rtol": rtol,
        "atol": atol,
    }
    if not verify:
        return result
    original = model_from_source(
        example, strip_jax_sync_points(text, file, example.name), file, "original"
    )
    apply = apply_of(original, example.is_function)
    reference_loss, reference = jax.jit(
        jax.value_and_grad(lambda params: example.loss(params, apply))
    )(example.params)
    paths = jax.tree_util.tree_flatten_with_path(reference)[0]
    mismatches, max_abs = [], 0.0
    for (path, want), got in zip(paths, jax.tree_util.tree_leaves(grads), strict=True):
        got = jax.device_put(got, jax.devices()[0])
        diff = jnp.abs(got - want)
        max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
        if not bool(jnp.all(diff <= atol + rtol * jnp.abs(want))):
            mismatches.append(jax.tree_util.keystr(path))
    loss_ok = abs(float(loss) - float(reference_loss)) <= atol + rtol * abs(float(reference_loss))
    if not loss_ok:
        mismatches.append("loss")
    result.update(
        verified=not mismatches,
        reference_loss=float(reference_loss),
        checks=len(paths),
        mismatches=mismatches,
        max_abs=max_abs,
    )
    return result


def _ready(tree: Any) -> None:
    """Wait until every array of ``tree`` is computed (JAX dispatches asynchronously)."""
    import jax

    for leaf in jax.tree_util.tree_leaves(tree):
        leaf.block_until_ready()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncpass.runtime.jax_run")
    for name in ("file", "example", "stages", "steps", "verify", "rtol", "atol"):
        parser.add_argument(name)
    args = parser.parse_args(argv)
    try:
        result = _child(
            args.file,
            args.example,
            int(args.stages),
            int(args.steps),
            args.verify == "1",
            float(args.rtol),
            float(args.atol),
        )
    except SyncpassError as error:
        print(str(error), file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``syncpass run --backend jax --tp N``: a tensor-parallel rewritten Flax model on N JAX
devices, in one child process (``python -m syncpass.backends.jax.tensor_run``) with
``XLA_FLAGS=--xla_force_host_platform_device_count=N``.

The child builds the example from the rewritten file, takes the unsplit model's loss and
gradients (outside a ``shard_map`` every collective is the identity), splits the weights
with :func:`~syncpass.backends.jax.tensor_parallel.shard_variables` by the file's
``TENSOR_PARALLEL_LAYOUT``, and runs one training step (``jax.value_and_grad`` of the loss
of the model under :func:`jax.shard_map` over a 1-D mesh of the N devices, jitted). It
counts the collectives of the step's lowered program (StableHLO, before XLA's passes
combine any): those of the forward alone, and the rest as the backward's; compares them
with ``TENSOR_PARALLEL_COLLECTIVES``; with ``--verify`` compares the loss and every
gradient (split weights' gradients come back whole) with the unsplit model's; and times
``--steps`` more steps (their median).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from typing import Any

from syncpass.backends.jax.run import report_failure, run_child
from syncpass.core.errors import SyncpassError
from syncpass.runtime.contracts import ParamCheck, TensorRankDone, TensorRunRequest, TensorRunResult
from syncpass.runtime.tensor_report import DEFAULT_ATOL, DEFAULT_RTOL

#: StableHLO's collectives by the plan's kinds.
_KINDS = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
}
_COLLECTIVE = re.compile(r"stablehlo\.(all_reduce|all_gather|reduce_scatter)\b")


def collective_counts(program: str) -> dict[str, int]:
    """The collectives of a lowered program's text, by the plan's kinds."""
    counts: dict[str, int] = {}
    for match in _COLLECTIVE.finditer(program):
        kind = _KINDS[match.group(1)]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def launch_jax_tensor(request: TensorRunRequest) -> TensorRunResult:
    """Run ``request`` in a child process on ``request.tp`` CPU devices."""
    if request.alongside:
        raise SyncpassError("--backend jax runs one file with --tp; drop --alongside")
    if request.tp < 1:
        raise SyncpassError(f"--tp must be at least 1, got {request.tp}")
    command = [
        sys.executable,
        "-m",
        "syncpass.backends.jax.tensor_run",
        request.file,
        request.example,
        str(request.tp),
        str(request.steps),
        "1" if request.verify else "0",
        repr(DEFAULT_RTOL if request.rtol is None else request.rtol),
        repr(DEFAULT_ATOL if request.atol is None else request.atol),
    ]
    data = run_child(command, request.tp, request.file, request.timeout_s)
    rank = TensorRankDone(
        rank=0,
        loss=data["loss"],
        reference_loss=data["reference_loss"],
        step_s=data["step_s"],
        counts=tuple(sorted((kind, count) for kind, count in data["counts"].items())),
        checks=tuple(ParamCheck(**check) for check in data["checks"]),
        split=data["split"],
        timed_steps=data["timed_steps"],
        file=request.file,
    )
    return TensorRunResult(
        request=request,
        ranks=(rank,),
        expected=tuple(sorted(data["expected"].items())),
        parameters=data["parameters"],
        layouts=tuple(sorted(data["layouts"].items())),
        engine=f"JAX {data['platform']} device(s) under shard_map (one process)",
        one_program=True,
    )


def _written(module: Any, file: str) -> tuple[dict[str, str], dict[str, int]]:
    layouts = getattr(module, "TENSOR_PARALLEL_LAYOUT", None)
    counts = getattr(module, "TENSOR_PARALLEL_COLLECTIVES", None)
    if not isinstance(layouts, dict) or not isinstance(counts, dict):
        raise SyncpassError(
            "no TENSOR_PARALLEL_LAYOUT and TENSOR_PARALLEL_COLLECTIVES in this file: run "
            "syncpass rewrite --backend jax --strategy tensor --tp N on the model first",
            file,
        )
    return layouts, counts


def _checks(got: Any, want: Any, rtol: float, atol: float) -> list[dict[str, Any]]:
    import jax
    import numpy as np

    found = []
    pairs = zip(
        jax.tree_util.tree_flatten_with_path(got)[0],
        jax.tree_util.tree_leaves(want),
        strict=True,
    )
    for (path, value), reference in pairs:
        name = ".".join(str(getattr(key, "key", key)) for key in path[1:])
        value, reference = np.asarray(value), np.asarray(reference)
        diff = np.abs(value - reference)
        ok = bool(np.all(diff <= atol + rtol * np.abs(reference)))
        rel = diff / np.maximum(np.abs(reference), 1e-12)
        found.append(
            {
                "name": name,
                "stage": 0,
                "numel": int(reference.size),
                "max_abs": float(diff.max(initial=0.0)),
                "max_rel": float(rel.max(initial=0.0)),
                "ok": ok,
                "rtol": rtol,
                "atol": atol,
            }
        )
    return found


def _child(
    file: str, spec: str, tp: int, steps: int, verify: bool, rtol: float, atol: float
) -> dict[str, Any]:
    import jax
    from jax import sharding

    from syncpass.backends.jax.example import load_jax_example
    from syncpass.backends.jax.tensor_parallel import (
        layout_of,
        shard_variables,
        tensor_parallel_axis,
        unshard_gradients,
    )

    example = load_jax_example(spec)
    if example.is_function:
        raise SyncpassError("--backend jax --tp runs a Flax module's example", example.origin)
    layouts, expected = _written(sys.modules[type(example.model).__module__], file)
    if len(jax.devices()) < tp:
        raise SyncpassError(f"--tp {tp} needs {tp} devices; JAX sees {len(jax.devices())}")

    def loss(variables: Any, *args: Any) -> Any:
        return example.loss_fn(example.model.apply(variables, *args), example.target)

    reference_loss, reference = jax.value_and_grad(loss)(example.params, *example.args)
    partition: Any = sharding.PartitionSpec
    mesh = sharding.Mesh(jax.devices()[:tp], (tensor_parallel_axis(),))
    arrays, specs = shard_variables(example.params, layouts, tp)
    split = jax.shard_map(
        loss,
        mesh=mesh,
        in_specs=(specs, *(partition() for _ in example.args)),
        out_specs=partition(),
    )
    step = jax.jit(jax.value_and_grad(split))
    forward = collective_counts(jax.jit(split).lower(arrays, *example.args).as_text())
    both = collective_counts(step.lower(arrays, *example.args).as_text())
    counts = {f"forward {kind}": count for kind, count in forward.items() if count}
    for kind, count in both.items():
        if count - forward.get(kind, 0):
            counts[f"backward {kind}"] = count - forward.get(kind, 0)
    value, gradients = step(arrays, *example.args)
    jax.block_until_ready(gradients)  # type: ignore[no-untyped-call]
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(step(arrays, *example.args))  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - start)
    whole = unshard_gradients(gradients, layouts, tp)
    modules = {
        ".".join(str(getattr(key, "key", key)) for key in path[1:-1])
        for path, _ in jax.tree_util.tree_flatten_with_path(example.params)[0]
    }
    return {
        "loss": float(value),
        "reference_loss": float(reference_loss) if verify else None,
        "step_s": statistics.median(times) if times else 0.0,
        "timed_steps": len(times),
        "counts": counts,
        "expected": {str(kind): int(count) for kind, count in expected.items()},
        "checks": _checks(whole, reference, rtol, atol) if verify else [],
        "split": sum(layout_of(module, layouts) is not None for module in modules),
        "parameters": len(jax.tree_util.tree_leaves(example.params)),
        "layouts": {str(name): str(layout) for name, layout in layouts.items()},
        "platform": jax.devices()[0].platform.upper(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncpass.backends.jax.tensor_run")
    for name in ("file", "example", "tp", "steps", "verify", "rtol", "atol"):
        parser.add_argument(name)
    args = parser.parse_args(argv)
    from syncpass.backends.jax.example import model_failure

    try:
        result = _child(
            args.file,
            args.example,
            int(args.tp),
            int(args.steps),
            args.verify == "1",
            float(args.rtol),
            float(args.atol),
        )
    except SyncpassError as error:
        return report_failure(error)
    except Exception as error:  # the model's, or JAX's: reported at the user's line
        return report_failure(model_failure(error, args.file, "the JAX run failed"))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["collective_counts", "launch_jax_tensor"]

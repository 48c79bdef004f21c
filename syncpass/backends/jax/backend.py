"""The JAX backend's spec: every hook the commands call (:class:`~syncpass.backends.spec.Backend`).

It has no static estimator, lint or run prediction (those hooks are ``None``). Importing this module
imports no jax: the measure and run hooks import it when they are called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from syncpass.backends.jax.analysis import analyse
from syncpass.backends.jax.rewrite import insert, insert_checkpointed, remove, strip_jax_sync_points
from syncpass.backends.spec import (
    Backend,
    MeasureRequest,
    TensorRewriteRequest,
    TensorRewriteResult,
)

if TYPE_CHECKING:
    from syncpass.backends.jax.example import JaxExample
    from syncpass.contracts.costs import Costs
    from syncpass.runtime.contracts import RunRequest, RunResult, TensorRunRequest, TensorRunResult


def _measure(request: MeasureRequest) -> Costs:
    from syncpass.backends.jax.profile import measure

    return measure(request)


def _run(request: RunRequest) -> RunResult:
    from syncpass.backends.jax.run import run_jax

    return run_jax(request)


def _tensor_rewrite(request: TensorRewriteRequest) -> TensorRewriteResult:
    from syncpass.backends.jax.tensor_rewrite import rewrite_flax_tensor

    return rewrite_flax_tensor(request)


def _tensor_run(request: TensorRunRequest) -> TensorRunResult:
    from syncpass.backends.jax.tensor_run import launch_jax_tensor

    return launch_jax_tensor(request)


def _load_example(spec: str) -> JaxExample:
    from syncpass.backends.jax.example import load_jax_example

    return load_jax_example(spec)


BACKEND = Backend(
    name="jax",
    description="jax.device_put transfers in a JAX function or a Flax module (docs/jax.md)",
    analyse=analyse,
    insert=insert,
    insert_checkpointed=insert_checkpointed,
    remove=remove,
    strip=strip_jax_sync_points,
    measure=_measure,
    run=_run,
    schedules=("gpipe",),
    carries_values=True,  # each transfer moves every live value, so any value reaches any stage
    load_example=_load_example,
    tensor_rewrite=_tensor_rewrite,
    tensor_run=_tensor_run,
)

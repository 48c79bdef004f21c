"""``syncpass profile --backend jax`` and ``rewrite --backend jax --example``: load a JAX
example and measure its model (:mod:`syncpass.backends.jax.measure`).

Importing this module imports no jax; :func:`measure_jax_file` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from syncpass.backends.spec import MeasureRequest
from syncpass.core.errors import SyncpassError

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs


def measure_jax_file(
    file: Path,
    text: str,
    example: str,
    name: str | None,
    repeats: int = 5,
    warmup: int = 2,
) -> Costs:
    """Load the JAX example named by ``example`` and profile the model of ``file`` with it.

    The one place where user code runs for the JAX backend's ``profile`` and
    ``rewrite --example``.
    """
    from syncpass.backends.jax.example import load_jax_example
    from syncpass.frontend.source import parse_source
    from syncpass.runtime.example import example_for_file

    parse_source(text, str(file))  # a syntax error is reported before any user code runs
    loaded = load_jax_example(example_for_file(file, example))
    if name is not None and name != loaded.name:
        raise SyncpassError(
            f"the example's model is {loaded.name}, not {name}; drop --model or change the example",
            str(file),
        )
    from syncpass.backends.jax.measure import profile_jax_costs

    return profile_jax_costs(text, str(file), loaded, loaded.name, repeats, warmup)


def measure(request: MeasureRequest) -> Costs:
    """The measure hook; the torch profiler's ``threads``, ``depth`` and ``meta`` are refused,
    not ignored."""
    if request.threads != 1:
        raise SyncpassError(
            "--backend jax cannot set the CPU threads of a JAX process after it starts; drop "
            "--threads (XLA_FLAGS sets them)"
        )
    if request.meta is not None:
        raise SyncpassError(
            "--meta builds a torch model on torch's meta device; a JAX model is measured on "
            "its example (XLA's cost analysis counts the FLOPs): drop --meta"
        )
    if request.depth != 1:
        raise SyncpassError(
            "--depth 2 plans the children of nn.Sequential calls, which JAX models do not have; "
            "drop --depth"
        )
    return measure_jax_file(
        request.file, request.text, request.example, request.model, request.repeats, request.warmup
    )

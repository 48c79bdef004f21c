"""Costs without running code: ``syncpass profile --static`` and ``rewrite --input-shape``.

The estimate itself is :func:`syncpass.backends.torch.estimate.estimate_costs` (FLOP
counts of standard layers from the source, at a hardware profile's FLOP/s);
this module turns command-line flags into its inputs and reports the ops it
could not size. It imports neither torch nor the user's code, which is what
lets a pre-commit hook or CI plan a model on a machine without its
dependencies.
"""

from __future__ import annotations

import sys
from typing import TextIO

from syncpass.backends.spec import EstimateRequest
from syncpass.contracts.costs import Costs
from syncpass.contracts.hardware import load_profile
from syncpass.core.errors import SyncpassError

#: The hardware an estimate is made for unless ``--hardware`` names another.
DEFAULT_PROFILE = "cpu-gloo-loopback"
INPUT_DTYPES = ("float", "int")


def parse_input_dtypes(spec: str | None, inputs: int) -> tuple[str, ...] | None:
    """``--input-dtype int,float`` as one kind per input; ``None`` when not given."""
    if spec is None:
        return None
    kinds = tuple(part.strip() for part in spec.split(","))
    wrong = [kind for kind in kinds if kind not in INPUT_DTYPES]
    if wrong:
        raise SyncpassError(
            f"--input-dtype: {', '.join(map(repr, wrong))} is not one of {', '.join(INPUT_DTYPES)}"
        )
    if len(kinds) != inputs:
        raise SyncpassError(
            f"--input-dtype gives {len(kinds)} kind(s) for {inputs} input shape(s); give one "
            "per input, e.g. --input-shape 8x128,8x128 --input-dtype int,float"
        )
    return kinds


def estimate_file(
    path: str,
    text: str,
    class_name: str | None,
    input_shape: str,
    input_dtype: str | None = None,
    hardware: str | None = None,
    depth: int = 1,
    report: TextIO | None = None,
) -> Costs:
    """The estimated cost file of ``path``'s model; unsized ops are named on ``report``."""
    from syncpass.backends.torch.estimate import estimate_costs, parse_input_shapes

    shapes = parse_input_shapes(input_shape)
    dtypes = parse_input_dtypes(input_dtype, len(shapes))
    target = load_profile(hardware if hardware is not None else DEFAULT_PROFILE).hardware
    estimate = estimate_costs(
        text, path, class_name, shapes, target, depth=depth, input_dtypes=dtypes
    )
    out = report if report is not None else sys.stderr
    for unsized in estimate.unsized:
        print(f"syncpass: warning: {unsized} (estimated by the fallback)", file=out)
    return estimate.costs


def estimate(request: EstimateRequest) -> Costs:
    """The estimate hook: :func:`estimate_file` with the request's settings."""
    return estimate_file(
        request.file,
        request.text,
        request.model,
        request.input_shape,
        request.input_dtype,
        request.hardware,
        request.depth,
    )

"""What ``syncpass rewrite --strategy tensor`` wrote after the model, read back by running
the file: the eager form's ``TENSOR_PARALLEL_LAYOUT`` or the DTensor form's
``TENSOR_PARALLEL_PLAN``, and ``TENSOR_PARALLEL_COLLECTIVES``. ``run --tp`` checks its
ranks against them and predicts from them; ``run --stages S --tp T`` slices each stage's
weights by them."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

from syncpass.core.errors import SyncpassError


@dataclass(frozen=True)
class WrittenForm:
    """What ``syncpass rewrite --strategy tensor`` wrote after the model: the eager form's
    ``TENSOR_PARALLEL_LAYOUT`` (``shard_module``'s), or the ``dtensor`` form's
    ``TENSOR_PARALLEL_PLAN`` (``parallelize_module``'s parallel styles); and
    ``TENSOR_PARALLEL_COLLECTIVES``."""

    layouts: dict[str, str] | None
    styles: dict[str, Any] | None
    counts: dict[str, int]


def written_form(file: str) -> WrittenForm:
    """The file's written form (:class:`WrittenForm`)."""
    spec = importlib.util.spec_from_file_location("_syncpass_tensor_file", file)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path
        raise SyncpassError("cannot import this file", file)
    module = importlib.util.module_from_spec(spec)
    # Registered while it runs, as an import would: code that looks its own module up
    # (Hugging Face's docstring decorators, dataclasses) finds it.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    layouts = getattr(module, "TENSOR_PARALLEL_LAYOUT", None)
    styles = getattr(module, "TENSOR_PARALLEL_PLAN", None)
    counts = getattr(module, "TENSOR_PARALLEL_COLLECTIVES", None)
    if not isinstance(layouts, dict | None) or not isinstance(styles, dict | None):
        raise SyncpassError(
            "TENSOR_PARALLEL_LAYOUT and TENSOR_PARALLEL_PLAN must be dicts by module name", file
        )
    if (layouts is None) == (styles is None) or not isinstance(counts, dict):
        raise SyncpassError(
            "no TENSOR_PARALLEL_LAYOUT (or TENSOR_PARALLEL_PLAN) and TENSOR_PARALLEL_COLLECTIVES "
            "in this file: run syncpass rewrite --strategy tensor --tp N on the model first",
            file,
        )
    return WrittenForm(layouts, styles, counts)


#: DTensor's parallel styles as the plan's layouts.
_STYLE_LAYOUTS = {"ColwiseParallel": "column", "RowwiseParallel": "row"}


def written_layouts(file: str) -> dict[str, str]:
    """The eager form's TENSOR_PARALLEL_LAYOUT of ``file`` (the pipeline runner's, for
    ``--stages S --tp T``)."""
    form = written_form(file)
    if form.layouts is None:
        raise SyncpassError(
            "--stages with --tp runs the eager tensor form (TENSOR_PARALLEL_LAYOUT); this "
            "file has the DTensor form's TENSOR_PARALLEL_PLAN: rewrite it without "
            "--tp-style dtensor",
            file,
        )
    return {str(name): str(layout) for name, layout in form.layouts.items()}


def expected_of(file: str) -> tuple[dict[str, int], dict[str, str], str]:
    """The collectives the written plan runs per rank (``TENSOR_PARALLEL_COLLECTIVES``), the
    layout of each module it splits, and its form."""
    form = written_form(file)
    if form.styles is not None:
        layouts = {
            name: _STYLE_LAYOUTS[type(style).__name__]
            for name, style in form.styles.items()
            if type(style).__name__ in _STYLE_LAYOUTS
        }
        return form.counts, layouts, "dtensor"
    assert form.layouts is not None
    return form.counts, {str(k): str(v) for k, v in form.layouts.items()}, "eager"

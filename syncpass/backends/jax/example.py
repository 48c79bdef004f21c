"""Loading a JAX example: a model function or Flax module, its weights and one batch.

``FUNC`` (named ``PATH.py:FUNC`` or ``package.module:FUNC``, as for torch)
takes no arguments and returns ``(model, params, args)`` or ``(model, params,
args, target, loss_fn)``: see :mod:`syncpass.backends.jax.analysis` for the
convention. A JAX example seeds itself (``jax.random.key(0)``): JAX has no
global seed. :func:`model_from_source` builds the same model from another
version of its file (the original, or one with probes), which is how
``run --verify`` gets the unsplit reference and ``profile`` its probed copy.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.core.errors import SyncpassError
from syncpass.runtime.example import (
    describe_error,
    factory_origin,
    find_factory,
    import_user_file,
    import_user_module,
    innermost_user_frame,
    is_path,
    located_failure,
    private_module_name,
    split_spec,
)

EXPECTED = "(model, params, args) or (model, params, args, target, loss_fn)"


def mean_square_loss(output: Any, target: Any = None) -> Any:
    """The mean of the squared outputs, summed over the outputs if there are several."""
    import jax
    import jax.numpy as jnp

    return sum(jnp.mean(jnp.square(leaf)) for leaf in jax.tree_util.tree_leaves(output))


@dataclass(frozen=True)
class JaxExample:
    """A JAX model with its weights, one batch, and its loss.

    ``name`` is the model's name in the source: the function's, or the Flax
    module's class. ``apply(params, *args)`` runs it.
    """

    model: Any
    params: Any
    args: tuple[Any, ...]
    target: Any
    loss_fn: Callable[[Any, Any], Any]
    name: str
    is_function: bool
    origin: str = ""

    @property
    def apply(self) -> Callable[..., Any]:
        return self.model if self.is_function else self.model.apply  # type: ignore[no-any-return]

    def loss(self, params: Any, apply: Callable[..., Any] | None = None) -> Any:
        """The loss of ``apply`` (default: the model) on the example batch."""
        output = (apply or self.apply)(params, *self.args)
        return self.loss_fn(output, self.target)


def load_jax_example(spec: str) -> JaxExample:
    """Import the example's file or module, call ``FUNC()`` and check what it returned."""
    import flax.linen as nn

    source, name = split_spec(spec)
    module = import_user_file(source) if is_path(source) else import_user_module(source)
    where = source if is_path(source) else (getattr(module, "__file__", None) or source)
    function = find_factory(module, name, where)
    origin = factory_origin(function, where)
    try:
        result = function()
    except Exception as error:
        raise located_failure(
            error, origin.rpartition(":")[0], origin, f"{name}() raised"
        ) from None
    if not isinstance(result, tuple) or len(result) not in (3, 5):
        raise SyncpassError(f"{name}() must return {EXPECTED}", origin)
    model, params, args = result[:3]
    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise SyncpassError(
            f"{name}() must return {EXPECTED}; args has type {type(args).__name__}, not a tuple "
            "such as (x,)",
            origin,
        )
    if isinstance(model, nn.Module):
        model_name, is_function = type(model).__name__, False
    elif isinstance(model, types.FunctionType):
        model_name, is_function = model.__name__, True
    else:
        raise SyncpassError(
            f"{name}() must return {EXPECTED}; the model has type {type(model).__name__}, not a "
            "function(params, *args) or a flax.linen Module",
            origin,
        )
    target, loss_fn = (result[3], result[4]) if len(result) == 5 else (None, mean_square_loss)
    if not callable(loss_fn):
        raise SyncpassError(f"{name}() must return {EXPECTED}; loss_fn is not callable", origin)
    return JaxExample(model, params, args, target, loss_fn, model_name, is_function, origin)


def model_from_source(example: JaxExample, text: str, filename: str, tag: str) -> Any:
    """The example's model as defined by ``text`` (another version of its file).

    The text runs as a fresh module; a Flax module is rebuilt from the same
    field values.
    """
    name = f"{private_module_name(Path(filename))}_{tag}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    try:
        exec(compile(text, filename, "exec"), module.__dict__)
    except Exception as error:
        raise located_failure(error, filename, filename, f"running {tag} source failed") from None
    found = getattr(module, example.name, None)
    if found is None:
        raise SyncpassError(f"no {example.name} in the {tag} source", filename)
    if example.is_function:
        return found
    fields = {
        field.name: getattr(example.model, field.name)
        for field in dataclasses.fields(example.model)
        if field.init and field.name not in ("parent", "name")
    }
    return found(**fields)


def apply_of(model: Any, is_function: bool) -> Callable[..., Any]:
    """``model`` itself for a function, ``model.apply`` for a Flax module."""
    return model if is_function else model.apply  # type: ignore[no-any-return]


def line_map(copy: str, original: str) -> dict[int, int]:
    """Each line of ``copy`` (``original`` with lines added or changed: probes, transfers,
    split loops) -> the line of ``original`` it stands for (1-based).

    A line ``original`` has unchanged maps to it; a line repeated elsewhere (a
    loop body written twice for a split loop) to the nearest line with its
    text; any other line to the line it replaced (a sliced loop header), or to
    the line before it (an added probe).
    """
    copy_lines, original_lines = copy.splitlines(), original.splitlines()
    where: dict[str, list[int]] = {}
    for number, text in enumerate(original_lines, start=1):
        where.setdefault(text, []).append(number)
    matcher = difflib.SequenceMatcher(None, original_lines, copy_lines, autojunk=False)
    mapping: dict[int, int] = {}
    for tag, start, _, copy_start, copy_stop in matcher.get_opcodes():
        for offset, index in enumerate(range(copy_start, copy_stop)):
            if tag == "equal":
                mapping[index + 1] = start + offset + 1
                continue
            text = copy_lines[index]
            same = where.get(text, []) if text.strip() else []
            if same:
                mapping[index + 1] = min(same, key=lambda number: abs(number - start - 1))
            else:
                mapping[index + 1] = start + 1 if tag == "replace" else max(start, 1)
    return mapping


def model_failure(
    error: BaseException,
    path: str,
    what: str,
    lines: Mapping[int, int] | None = None,
    fallback: str | None = None,
) -> SyncpassError:
    """A SyncpassError naming ``error`` (type and message) and the user's line it came from
    (``fallback``, else ``path``, when no frame of the user's code raised it).

    ``lines`` maps the lines of a copy of ``path`` that ran under its name (a
    probed copy) back to the file's own.
    """
    frame = innermost_user_frame(error.__traceback__, path)
    if frame is None or frame.lineno is None:
        return SyncpassError(f"{what}: {describe_error(error)}", fallback or path)
    line = frame.lineno
    if lines is not None and Path(frame.filename).resolve() == Path(path).resolve():
        line = lines.get(line, line)
    return SyncpassError(f"{what}: {describe_error(error)}", f"{frame.filename}:{line}")

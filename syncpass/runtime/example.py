"""Loading a user's example: a model and one batch of inputs, built by a function of theirs.

An example is named ``PATH.py:FUNC`` or ``package.module:FUNC``. ``FUNC`` takes
no arguments and returns either ``(model, args)`` or ``(model, args, target,
loss_fn)``: an ``nn.Module``, a tuple with the model's positional inputs for
one full batch, a target tensor whose first dimension is the batch, and
``loss_fn(output, target) -> scalar tensor``. Without a loss the default is
:func:`default_loss`, ``output.float().pow(2).mean()`` (summed over the outputs
when the forward returns several), which depends on every output element.

``torch.manual_seed(0)`` runs before ``FUNC``, so every process that loads the
same example builds the same weights and inputs. torch is imported only when
an example is loaded: importing this module stays cheap.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from syncpass.core.errors import SyncpassError

if TYPE_CHECKING:
    import torch

EXPECTED = "(model, args) or (model, args, target, loss_fn)"


@dataclass(frozen=True)
class Example:
    """A model with one batch of inputs, and how to turn its output into a loss.

    ``target`` is ``None`` when the example gives no loss; ``loss_fn`` is then
    :func:`default_loss`, which ignores the target. ``origin`` is the factory's
    ``"file:line"``.
    """

    model: torch.nn.Module
    args: tuple[Any, ...]
    target: torch.Tensor | None
    loss_fn: Callable[[Any, Any], torch.Tensor]
    spec: str
    origin: str = ""


def default_loss(output: Any, target: Any = None) -> torch.Tensor:
    """``output.float().pow(2).mean()``, summed over the outputs if there are several.

    ``target`` is ignored; it is accepted so that the function can stand where a
    ``loss_fn(output, target)`` is expected.
    """
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    total: torch.Tensor = outputs[0].float().pow(2).mean()
    for extra in outputs[1:]:
        total = total + extra.float().pow(2).mean()
    return total


def split_spec(spec: str) -> tuple[str, str]:
    """``"a/b.py:make"`` -> ``("a/b.py", "make")``; the function name follows the last colon."""
    source, colon, name = spec.rpartition(":")
    if not colon or not source or not name.isidentifier():
        raise SyncpassError(
            f"example {spec!r} is not PATH.py:FUNC or package.module:FUNC "
            "(FUNC is a function that takes no arguments)"
        )
    return source, name


def is_path(source: str) -> bool:
    """Whether the part before the colon names a file rather than a module."""
    return source.endswith(".py") or "/" in source or "\\" in source


def private_module_name(path: Path) -> str:
    """A module name for a user's file that no real package uses, stable for one path."""
    digest = hashlib.sha1(str(path).encode("utf-8")).hexdigest()[:12]
    return f"_syncpass_example_{path.stem if path.stem.isidentifier() else 'file'}_{digest}"


def _library_folders() -> tuple[Path, ...]:
    """Folders whose code is not the user's: the standard library, installed packages, syncpass."""
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    folders = {Path(sysconfig.get_paths()[name]).resolve() for name in names}
    folders.add(Path(__file__).resolve().parent)
    return tuple(folders)


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` is the user's code (not Python's, an installed package's or syncpass's)."""
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    return not any(path.is_relative_to(folder) for folder in _library_folders())


def innermost_user_frame(
    trace: TracebackType | None, filename: str = ""
) -> traceback.FrameSummary | None:
    """The deepest frame of ``trace`` in the user's code, else the deepest one in ``filename``."""
    frames = traceback.extract_tb(trace)
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return frame
    if filename:
        wanted = Path(filename).resolve()
        for frame in reversed(frames):
            if Path(frame.filename).resolve() == wanted:
                return frame
    return None


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _located_failure(
    error: BaseException, filename: str, fallback: str, what: str
) -> SyncpassError:
    """A SyncpassError at the user's line where ``error`` was raised (or at ``fallback``)."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return SyncpassError(
            f"{what}: {type(error).__name__}: {error.msg}", f"{error.filename}:{error.lineno}"
        )
    frame = innermost_user_frame(error.__traceback__, filename)
    location = f"{frame.filename}:{frame.lineno}" if frame is not None else fallback
    return SyncpassError(f"{what}: {_describe(error)}", location)


def _import_path(source: str) -> ModuleType:
    path = Path(source).resolve()
    if not path.is_file():
        raise SyncpassError("no such file (the example is PATH.py:FUNC)", source)
    # Sibling imports (`from layers import Block`) work as when the file runs as a script.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = private_module_name(path)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SyncpassError("cannot be imported as a Python module", source)
    module = importlib.util.module_from_spec(module_spec)
    # Registered before running, as a normal import does: dataclasses and pickling
    # look classes up in sys.modules by their module name.
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise _located_failure(error, str(path), source, "importing the file failed") from None
    return module


def _import_module(source: str) -> ModuleType:
    try:
        found = importlib.util.find_spec(source)
    except (ImportError, ValueError):
        found = None
    except Exception as error:  # a parent package failed while being imported
        raise _located_failure(error, "", source, f"importing {source} failed") from None
    if found is None:
        raise SyncpassError(
            f"no module named {source!r} on the Python path (for a file, give PATH.py:FUNC)"
        )
    try:
        return importlib.import_module(source)
    except Exception as error:
        filename = found.origin or ""
        raise _located_failure(
            error, filename, filename or source, f"importing {source} failed"
        ) from None


def _factory(module: ModuleType, name: str, where: str) -> Callable[[], Any]:
    function = getattr(module, name, None)
    if function is None:
        candidates = sorted(
            key
            for key, value in vars(module).items()
            if callable(value)
            and not isinstance(value, type)
            and getattr(value, "__module__", None) == module.__name__
            and not key.startswith("_")
        )
        hint = f"; functions defined there: {', '.join(candidates)}" if candidates else ""
        raise SyncpassError(f"no function {name!r}{hint}", where)
    if not callable(function):
        raise SyncpassError(f"{name!r} is not a function (type {type(function).__name__})", where)
    return function  # type: ignore[no-any-return]


def _origin(function: Callable[[], Any], fallback: str) -> str:
    code = getattr(function, "__code__", None)
    if code is None:
        return fallback
    return f"{code.co_filename}:{code.co_firstlineno}"


def _check_result(result: Any, name: str, origin: str, spec: str) -> Example:
    import torch

    def wrong(detail: str) -> SyncpassError:
        return SyncpassError(f"{name}() must return {EXPECTED}; {detail}", origin)

    if not isinstance(result, tuple) or len(result) not in (2, 4):
        size = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise wrong(f"it returned {size}")
    model, args = result[0], result[1]
    if not isinstance(model, torch.nn.Module):
        raise wrong(f"the model has type {type(model).__name__}, not torch.nn.Module")
    if isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise wrong(f"args has type {type(args).__name__}, not a tuple of inputs such as (x,)")
    if len(result) == 2:
        return Example(model, args, None, default_loss, spec, origin)
    target, loss_fn = result[2], result[3]
    if not isinstance(target, torch.Tensor):
        raise wrong(
            f"target has type {type(target).__name__}, not a tensor whose first dimension is the batch"
        )
    if not callable(loss_fn):
        raise wrong(f"loss_fn has type {type(loss_fn).__name__}, not a function(output, target)")
    return Example(model, args, target, loss_fn, spec, origin)


def load_example(spec: str) -> Example:
    """Import ``PATH.py:FUNC`` or ``package.module:FUNC``, seed torch, call ``FUNC()`` and check it.

    A file is imported under a private module name (never one a real package
    could own) with its own folder on ``sys.path``. Every failure is a
    :class:`~syncpass.core.errors.SyncpassError` located at the user's file (and line).
    """
    import torch

    source, name = split_spec(spec)
    module = _import_path(source) if is_path(source) else _import_module(source)
    where = source if is_path(source) else (getattr(module, "__file__", None) or source)
    function = _factory(module, name, where)
    origin = _origin(function, where)
    torch.manual_seed(0)
    try:
        result = function()
    except Exception as error:
        raise _located_failure(
            error, origin.rpartition(":")[0], origin, f"{name}() raised"
        ) from None
    return _check_result(result, name, origin, spec)


def example_for_file(file: str | Path, example: str) -> str:
    """An ``--example`` spec as given with a model FILE: a bare FUNC names a function in FILE."""
    if ":" not in example and not is_path(example):
        return f"{file}:{example}"
    split_spec(example)  # fails early, with the expected forms, on a malformed spec
    return example

"""Finding a user's example factory: ``PATH.py:FUNC`` or ``package.module:FUNC``, imported
under a private name, failures located at the user's line.

What a factory returns, and how it is checked, is each backend's
(:mod:`syncpass.backends.torch.example`, :mod:`syncpass.backends.jax.example`).
Nothing here imports torch or jax.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from syncpass.core.errors import SyncpassError


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
    folders.add(
        Path(__file__).resolve().parents[1]
    )  # syncpass/, this file being runtime/example.py
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


def describe_error(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def located_failure(error: BaseException, filename: str, fallback: str, what: str) -> SyncpassError:
    """A SyncpassError at the user's line where ``error`` was raised (or at ``fallback``)."""
    if isinstance(error, SyntaxError) and error.filename and error.lineno:
        return SyncpassError(
            f"{what}: {type(error).__name__}: {error.msg}", f"{error.filename}:{error.lineno}"
        )
    frame = innermost_user_frame(error.__traceback__, filename)
    location = f"{frame.filename}:{frame.lineno}" if frame is not None else fallback
    return SyncpassError(f"{what}: {describe_error(error)}", location)


def import_user_file(source: str) -> ModuleType:
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
        raise located_failure(error, str(path), source, "importing the file failed") from None
    return module


def import_user_module(source: str) -> ModuleType:
    try:
        found = importlib.util.find_spec(source)
    except (ImportError, ValueError):
        found = None
    except Exception as error:  # a parent package failed while being imported
        raise located_failure(error, "", source, f"importing {source} failed") from None
    if found is None:
        raise SyncpassError(
            f"no module named {source!r} on the Python path (for a file, give PATH.py:FUNC)"
        )
    try:
        return importlib.import_module(source)
    except Exception as error:
        filename = found.origin or ""
        raise located_failure(
            error, filename, filename or source, f"importing {source} failed"
        ) from None


def find_factory(module: ModuleType, name: str, where: str) -> Callable[[], Any]:
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


def factory_origin(function: Callable[[], Any], fallback: str) -> str:
    code = getattr(function, "__code__", None)
    if code is None:
        return fallback
    return f"{code.co_filename}:{code.co_firstlineno}"


def example_for_file(file: str | Path, example: str) -> str:
    """An ``--example`` spec as given with a model FILE: a bare FUNC names a function in FILE."""
    if ":" not in example and not is_path(example):
        return f"{file}:{example}"
    split_spec(example)  # fails early, with the expected forms, on a malformed spec
    return example


def example_location(file: str | Path, example: str) -> str:
    """Where an ``--example`` is, for messages: its file (or module)."""
    if ":" not in example and not is_path(example):
        return str(file)
    return example.rpartition(":")[0] or str(file)

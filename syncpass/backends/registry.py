"""Backends by name: the built-in ones and those of installed packages (entry points).

A package adds a backend by declaring an entry point in its own ``pyproject.toml``
whose object is a :class:`~syncpass.backends.spec.Backend`::

    [project.entry-points."syncpass.backends"]
    mybackend = "mypackage.syncpass_backend:BACKEND"

Once that package is installed, ``--backend mybackend`` (and ``backend`` in
``[tool.syncpass]``) use it. The entry point's name is the name users give; a
name already taken by a built-in is refused, so a package cannot change what
``torch`` or ``jax`` mean. A backend is held to what syncpass promises of its
own: the driver checks that its output parses and strips back to the input,
and an exception of its own from any hook becomes a :class:`SyncpassError`
naming it. Strategies from installed packages are found by
:mod:`syncpass.plan.strategies`.

This module imports neither torch, jax nor libcst; a backend's module loads
when its name is looked up.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

from syncpass.backends.spec import Backend
from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import (
    BACKEND_GROUP,
    BUILTIN_BACKENDS,
    backend_names,
    declared,
    load_entry_point,
)

_HOOKS = tuple(
    field.name
    for field in dataclasses.fields(Backend)
    if field.name not in ("name", "description", "schedules", "carries_values", "refused_kinds")
)
#: The module and attribute that hold each built-in backend's spec.
_BUILTIN_SPECS = {
    "torch": ("syncpass.backends.torch.backend", "BACKEND"),
    "torch_stages": ("syncpass.backends.torch.backend", "STAGES_BACKEND"),
    "jax": ("syncpass.backends.jax.backend", "BACKEND"),
}


@functools.cache
def load_backend(name: str) -> Backend:
    """The spec of the backend called ``name``; an unknown name lists the known ones."""
    if name in _BUILTIN_SPECS:
        module, attribute = _BUILTIN_SPECS[name]
        spec: Backend = getattr(importlib.import_module(module), attribute)
        return spec
    point = declared(BACKEND_GROUP, BUILTIN_BACKENDS).get(name)
    if point is None:
        raise SyncpassError(f"no backend named {name!r}; known: {', '.join(backend_names())}")
    found = load_entry_point(point, BACKEND_GROUP)
    if not isinstance(found, Backend):
        raise SyncpassError(
            f"backend {name!r} ({point.value}) is not a syncpass.backends.spec.Backend but a "
            f"{type(found).__name__}; see docs/plugin.md"
        )
    return _checked(dataclasses.replace(found, name=name))


def _checked(backend: Backend) -> Backend:
    """``backend`` with every hook's own exceptions turned into errors that name it."""
    hooks: dict[str, Any] = {}
    for hook in _HOOKS:
        function = getattr(backend, hook)
        if function is not None:
            hooks[hook] = _guarded(backend.name, hook, function)
    return dataclasses.replace(backend, **hooks)


def _guarded(name: str, hook: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except SyncpassError:
            raise
        except Exception as error:
            where = next((arg for arg in args[1:2] if isinstance(arg, str)), "")
            raise SyncpassError(
                f"backend {name!r} failed in {hook}: {type(error).__name__}: {error}", where
            ) from None

    return guarded

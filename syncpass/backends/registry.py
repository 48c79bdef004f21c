"""Backends and strategies, built in and from other packages (entry points).

A package adds a **backend** (how sync points are written into source) or a
**strategy** (how the sync points are chosen) by declaring an entry point in
its own ``pyproject.toml``::

    [project.entry-points."syncpass.backends"]
    mybackend = "mypackage.syncpass_backend:BACKEND"

    [project.entry-points."syncpass.strategies"]
    mystrategy = "mypackage.syncpass_strategy:choose_cuts"

Once that package is installed, ``syncpass rewrite --backend mybackend`` and
``--strategy mystrategy`` (and ``backend``/``strategy`` in ``[tool.syncpass]``)
use them. The entry point's name is the name users give; a name already taken
by a built-in is refused, so a package cannot change what ``torch`` or
``adaptive`` mean.

The protocols:

* A backend is an object with a ``rewrite(text, path, costs, request,
  class_name=None, max_stages=None)`` method returning a
  :class:`syncpass.rewrite.driver.RewriteResult` (:class:`Backend`): parse ``text``,
  build the op graph whose op ids match ``costs``, plan with
  :func:`syncpass.plan.planner.make_plan` (or
  :func:`syncpass.plan.planner.best_stage_count` when ``request.stages`` is ``None``
  and ``max_stages`` is given), write the sync points, and raise
  :class:`syncpass.core.errors.SyncpassError` with ``file:line`` for bad input.
  It must keep the guarantees of the built-in backends: everything but the
  sync lines byte-for-byte, one stage leaves the file identical, and
  rewriting its own output gives the same output. It may set a
  ``description`` string, shown in ``--help``.
* A strategy is a function ``choose_cuts(problem, stages, costs)`` that
  returns the positions of its ``stages - 1`` cuts, ascending
  (:data:`StrategyFunction`). ``problem`` is the optimiser's
  :class:`syncpass.plan.optimizer.Problem` (per-op compute and memory, per-cut
  communication, admissible and pinned cuts, ``min_ops``), position ``p``
  being the cut after op ``p - 1``; ``costs`` the cost file. The plan is then
  scored, simulated and reported like any other, with the constraints it
  breaks listed as for the built-in rules.

This module imports neither torch, jax nor libcst; entry points load when a
name is looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from syncpass.core.errors import SyncpassError

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs
    from syncpass.plan.optimizer import Problem
    from syncpass.plan.planner import PlanRequest
    from syncpass.rewrite.driver import RewriteResult

BACKEND_GROUP = "syncpass.backends"
STRATEGY_GROUP = "syncpass.strategies"
BUILTIN_BACKENDS = ("torch", "jax")
#: What :data:`syncpass.contracts.config.STRATEGIES` holds.
BUILTIN_STRATEGIES = ("adaptive", "fixed", "uniform", "parameters", "time", "manual")


class Backend(Protocol):
    """How one backend writes sync points into a model's source."""

    def rewrite(
        self,
        text: str,
        path: str,
        costs: Costs,
        request: PlanRequest,
        class_name: str | None = None,
        max_stages: int | None = None,
    ) -> RewriteResult: ...


#: ``choose_cuts(problem, stages, costs) -> cut positions``, ascending.
StrategyFunction = Callable[["Problem", int, "Costs"], Sequence[int]]


class _LoadedBackend:
    """A backend by name: its ``rewrite`` is found when it first rewrites.

    A backend of an installed package (``checked``) is held to what syncpass
    promises of its own: an exception of its own becomes a :class:`SyncpassError`
    naming it, and output that does not parse is refused before anything is
    written.
    """

    def __init__(
        self,
        name: str,
        find: Callable[[], Callable[..., RewriteResult]],
        description: str,
        checked: bool = False,
    ) -> None:
        self.name, self.find, self.description, self.checked = name, find, description, checked

    def rewrite(
        self,
        text: str,
        path: str,
        costs: Costs,
        request: PlanRequest,
        class_name: str | None = None,
        max_stages: int | None = None,
    ) -> RewriteResult:
        rewrite = self.find()
        if not self.checked:
            return rewrite(text, path, costs, request, class_name, max_stages)
        from syncpass.rewrite.driver import ensure_parses

        try:
            result = rewrite(text, path, costs, request, class_name, max_stages)
        except SyncpassError:
            raise
        except Exception as error:
            raise SyncpassError(
                f"backend {self.name!r} failed: {type(error).__name__}: {error}", path
            ) from None
        ensure_parses(result.rewritten, path)
        return result


def _function(module: str, name: str) -> Callable[[], Callable[..., RewriteResult]]:
    def find() -> Callable[..., RewriteResult]:
        found: Callable[..., RewriteResult] = getattr(importlib.import_module(module), name)
        return found

    return find


_BUILTIN: dict[str, Backend] = {
    "torch": _LoadedBackend(
        "torch",
        _function("syncpass.rewrite.driver", "rewrite_source"),
        "pipe_split() calls in an nn.Module's forward (torch.distributed.pipelining)",
    ),
    "jax": _LoadedBackend(
        "jax",
        _function("syncpass.backends.jax.rewrite", "rewrite_jax_source"),
        "jax.device_put transfers in a JAX function or a Flax module (docs/jax.md)",
    ),
}


@cache
def _declared(group: str) -> dict[str, Any]:
    """The entry points of ``group`` by name, not loaded; built-in names are left out."""
    builtin = BUILTIN_BACKENDS if group == BACKEND_GROUP else BUILTIN_STRATEGIES
    return {point.name: point for point in entry_points(group=group) if point.name not in builtin}


def backend_names() -> tuple[str, ...]:
    """Every backend a user may name: the built-in ones, then the installed ones."""
    return (*BUILTIN_BACKENDS, *sorted(_declared(BACKEND_GROUP)))


def strategy_names() -> tuple[str, ...]:
    """Every strategy a user may name: the built-in ones, then the installed ones."""
    return (*BUILTIN_STRATEGIES, *sorted(_declared(STRATEGY_GROUP)))


def plugin_strategy_names() -> tuple[str, ...]:
    """The strategies installed packages add."""
    return tuple(sorted(_declared(STRATEGY_GROUP)))


def load_backend(name: str) -> Backend:
    """The backend called ``name``; an unknown name lists the known ones."""
    if name in _BUILTIN:
        return _BUILTIN[name]
    point = _declared(BACKEND_GROUP).get(name)
    if point is None:
        raise SyncpassError(f"no backend named {name!r}; known: {', '.join(backend_names())}")
    backend = _load(point, BACKEND_GROUP)
    if not callable(getattr(backend, "rewrite", None)):
        raise SyncpassError(
            f"backend {name!r} ({point.value}) has no rewrite() method; see the protocol in "
            "syncpass.backends.registry"
        )
    description = str(getattr(backend, "description", ""))
    return _LoadedBackend(name, lambda: backend.rewrite, description, checked=True)


def load_strategy(name: str) -> StrategyFunction:
    """The installed strategy called ``name`` (built-in strategies live in syncpass.plan.planner)."""
    point = _declared(STRATEGY_GROUP).get(name)
    if point is None:
        raise SyncpassError(f"no strategy named {name!r}; known: {', '.join(strategy_names())}")
    function = _load(point, STRATEGY_GROUP)
    if not callable(function):
        raise SyncpassError(f"strategy {name!r} ({point.value}) is not a function")
    return function  # type: ignore[no-any-return]


def _load(point: Any, group: str) -> Any:
    try:
        return point.load()
    except Exception as error:  # an installed plugin that is broken must not read as a bug here
        raise SyncpassError(
            f"the {group} entry point {point.name!r} ({point.value}) failed to load: "
            f"{type(error).__name__}: {error}"
        ) from None

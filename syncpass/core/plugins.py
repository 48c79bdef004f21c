"""Entry points: the names installed packages add to syncpass, found without loading them.

Two groups exist: ``syncpass.backends`` (a :class:`syncpass.backends.spec.Backend`
spec) and ``syncpass.strategies`` (a ``choose_cuts`` function, see
:mod:`syncpass.plan.strategies`). A name already taken by a built-in is left
out, so a package cannot change what ``torch`` or ``adaptive`` mean. Nothing is
imported until a name is looked up (:func:`load_entry_point`).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from syncpass.core.errors import SyncpassError

BACKEND_GROUP = "syncpass.backends"
STRATEGY_GROUP = "syncpass.strategies"
#: The backends syncpass ships (:mod:`syncpass.backends.registry` holds their specs).
BUILTIN_BACKENDS = ("torch", "torch_stages", "jax")
#: The backend used when none is named: torch's eager stages (``PipelineStage``), which run
#: any forward torch runs eagerly; ``torch`` (``pipe_split()`` and torch's tracer) stays an option.
DEFAULT_BACKEND = "torch_stages"


@cache
def declared(group: str, builtin: tuple[str, ...]) -> dict[str, EntryPoint]:
    """The entry points of ``group`` by name, not loaded; names in ``builtin`` are left out."""
    return {point.name: point for point in entry_points(group=group) if point.name not in builtin}


def backend_names() -> tuple[str, ...]:
    """Every backend a user may name: the built-in ones, then the installed ones."""
    return (*BUILTIN_BACKENDS, *sorted(declared(BACKEND_GROUP, BUILTIN_BACKENDS)))


def load_entry_point(point: EntryPoint, group: str) -> Any:
    """The object ``point`` names; a plugin that fails to load is the user's error, not ours."""
    try:
        return point.load()
    except Exception as error:  # an installed plugin that is broken must not read as a bug here
        raise SyncpassError(
            f"the {group} entry point {point.name!r} ({point.value}) failed to load: "
            f"{type(error).__name__}: {error}"
        ) from None

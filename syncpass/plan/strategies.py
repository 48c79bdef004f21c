"""Strategies that installed packages add (entry point group ``syncpass.strategies``).

A package declares one in its own ``pyproject.toml``::

    [project.entry-points."syncpass.strategies"]
    mystrategy = "mypackage.syncpass_strategy:choose_cuts"

A strategy is a function ``choose_cuts(problem, stages, costs)`` that returns
the positions of its ``stages - 1`` cuts, ascending (:data:`StrategyFunction`).
``problem`` is the optimiser's :class:`syncpass.plan.optimizer.Problem`
(per-op compute and memory, per-cut communication, admissible and pinned
cuts, ``min_ops``), position ``p`` being the cut after op ``p - 1``; ``costs``
the cost file. The plan is then scored, simulated and reported like any
other, with the constraints it breaks listed as for the built-in rules. The
built-in strategies' names are :data:`syncpass.contracts.config.STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from syncpass.contracts.config import STRATEGIES, strategy_names
from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import STRATEGY_GROUP, declared, load_entry_point

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs
    from syncpass.plan.optimizer import Problem

#: ``choose_cuts(problem, stages, costs) -> cut positions``, ascending.
StrategyFunction = Callable[["Problem", int, "Costs"], Sequence[int]]


def load_strategy(name: str) -> StrategyFunction:
    """The installed strategy called ``name`` (built-in strategies live in the planner)."""
    point = declared(STRATEGY_GROUP, STRATEGIES).get(name)
    if point is None:
        raise SyncpassError(f"no strategy named {name!r}; known: {', '.join(strategy_names())}")
    function = load_entry_point(point, STRATEGY_GROUP)
    if not callable(function):
        raise SyncpassError(f"strategy {name!r} ({point.value}) is not a function")
    return function  # type: ignore[no-any-return]

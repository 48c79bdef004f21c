"""The strategies besides the optimiser: the rules of thumb, and those installed packages add.

The rules (``uniform``, ``parameters``, ``time``) are balanced partitions of one
weight per op (:func:`baseline_cuts`). An installed strategy comes from the entry
point group ``syncpass.strategies``; its cuts are checked before anything trusts
them (:func:`plugin_cuts`).

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

import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from syncpass.contracts.config import STRATEGIES, strategy_names
from syncpass.core.errors import SyncpassError
from syncpass.core.plugins import STRATEGY_GROUP, declared, load_entry_point
from syncpass.plan.optimizer import Infeasible, Problem, solve

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs

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


#: What each rule of thumb balances, for the plan's notes (``uniform``'s says what it
#: counted: :func:`uniform_rule`).
BASELINE_RULES = {
    "uniform": "equal numbers of layers per stage",
    "parameters": "equal parameter bytes per stage (DeepSpeed's default)",
    "time": "equal compute per stage, communication ignored (torchgpipe's balance_by_time)",
}


def op_layers(costs: Costs) -> tuple[str | None, ...]:
    """The layer each op belongs to, as a person splitting a model by hand counts layers:
    the item of a layer container (``blocks.3`` for ``blocks.3.attn``; the outermost, for
    containers in containers), or ``None`` for an op outside every container (an
    embedding, a head, a statement such as ``torch.triu@L29``).

    The containers are the cost file's ``containers`` (``syncpass profile`` records each
    ``nn.ModuleList`` or ``nn.Sequential`` it planned per item), else every name whose
    numbered items (``blocks.0``, ``blocks.1``) the op ids show."""
    containers = {name for name, _ in costs.containers}
    if not containers:
        items: dict[str, set[str]] = {}
        for op in costs.ops:
            parts = op.id.split(".")
            for end in range(1, len(parts)):
                if parts[end].isdigit():
                    items.setdefault(".".join(parts[:end]), set()).add(parts[end])
        containers = {name for name, indices in items.items() if len(indices) > 1}
    layers: list[str | None] = []
    for op in costs.ops:
        parts = op.id.split(".")
        layer = None
        for end in range(1, len(parts)):
            if parts[end].isdigit() and ".".join(parts[:end]) in containers:
                layer = ".".join(parts[: end + 1])
                break
        layers.append(layer)
    return tuple(layers)


def uniform_rule(costs: Costs) -> str:
    """What ``uniform`` balances on ``costs``, for the report: the layers it counted."""
    layers = list(dict.fromkeys(layer for layer in op_layers(costs) if layer is not None))
    if len(layers) < 2:
        return (
            f"equal numbers of ops per stage ({len(costs.ops)} ops counted: the cost file "
            "shows no stack of layers)"
        )
    outside = sum(layer is None for layer in op_layers(costs))
    beside = f"; the {outside} op(s) outside them go with the layers beside them" if outside else ""
    return (
        f"equal numbers of layers per stage ({len(layers)} layers counted: "
        f"{layers[0]} .. {layers[-1]}{beside})"
    )


def _layer_weights(costs: Costs) -> np.ndarray:
    """One per layer, shared by its ops; 0 for an op outside every layer. One per op when
    the cost file shows no stack of layers."""
    layers = op_layers(costs)
    if len({layer for layer in layers if layer is not None}) < 2:
        return np.ones(len(layers))
    sizes: dict[str, int] = {}
    for layer in layers:
        if layer is not None:
            sizes[layer] = sizes.get(layer, 0) + 1
    return np.array([0.0 if layer is None else 1 / sizes[layer] for layer in layers])


def plugin_cuts(
    problem: Problem, stages: int, strategy: str, costs: Costs, origin: str
) -> tuple[int, ...]:
    """The cuts an installed strategy chose, checked before anything trusts them: a
    plan that drops a pinned cut or sends a value past a stage cannot be written."""
    try:
        chosen = load_strategy(strategy)(problem, stages, costs)
    except SyncpassError:
        raise
    except Exception as error:
        raise SyncpassError(
            f"strategy {strategy!r} failed: {type(error).__name__}: {error}", origin
        ) from None
    try:
        cuts = tuple(int(position) for position in chosen)
    except (TypeError, ValueError):
        raise SyncpassError(
            f"strategy {strategy!r} returned {chosen!r}, not a sequence of cut positions", origin
        ) from None
    wrong = None
    if len(cuts) != stages - 1:
        wrong = f"{len(cuts)} cut(s) for {stages} stages"
    elif list(cuts) != sorted(set(cuts)):
        wrong = f"cuts {list(cuts)} are not ascending"
    elif any(not 0 < cut < problem.num_ops or not problem.admissible[cut] for cut in cuts):
        wrong = f"cuts {list(cuts)} include one that is not an admissible sync point"
    if wrong is None:
        dropped = [int(p) for p in np.flatnonzero(problem.pinned) if int(p) not in cuts]
        if dropped:
            wrong = f"cuts {list(cuts)} without the pinned cut(s) {dropped}"
    if wrong is None and problem.last_use is not None:
        # The optimiser's rule: a stage (i, j] needs last_use[i] <= j.
        for start, end in itertools.pairwise((0, *cuts, problem.num_ops)):
            if int(problem.last_use[start]) > end:
                wrong = f"cuts {list(cuts)} that send a value past the stage after it"
                break
    if wrong is not None:
        raise SyncpassError(f"strategy {strategy!r} returned {wrong}", origin)
    return cuts


def baseline_cuts(
    problem: Problem, stages: int, strategy: str, costs: Costs
) -> tuple[int, ...] | Infeasible:
    """Balanced partition of one weight per op, honouring what makes a plan legal: admissible
    and pinned cuts, min interval, values reaching only the next stage. ``uniform`` weighs
    layers (:func:`op_layers`), ``parameters`` parameter bytes, ``time`` compute.

    Ties between equally balanced partitions go to the cuts closest to the
    ideal boundaries (multiples of total weight / stages).
    """
    if strategy == "uniform":
        weights = _layer_weights(costs)
    elif strategy == "parameters":
        weights = np.array([op.param_bytes for op in costs.ops], dtype=np.float64)
    else:
        weights = problem.op_compute.copy()
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    share = prefix[-1] / stages
    nearest = np.round(prefix / share) * share if share > 0 else prefix
    balanced = Problem(
        op_compute=weights,
        op_memory=np.zeros(problem.num_ops),
        cut_comm=np.zeros(problem.num_ops + 1),
        admissible=problem.admissible,
        pinned=problem.pinned,
        min_ops=problem.min_ops,
        last_use=problem.last_use,
    )
    result = solve(balanced, stages, math.inf, adaptive=False, tie_cost=np.abs(prefix - nearest))
    return result if isinstance(result, Infeasible) else result.cuts

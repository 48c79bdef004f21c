"""The torch backend's tensor predict hook: what the cost model says a ``run --tp`` of a
file would take (``syncpass run FILE --tp N --costs COSTS``).

The file's written layouts (``TENSOR_PARALLEL_LAYOUT``, or the DTensor form's parallel
styles) fix each linear of the cost file's tensor graph to what the file splits it as,
every other linear whole; the plan is then made as the rewrite makes it (the layouts the
rewrite writes, no sequence parallelism), so it chooses only how values cross, and its
step is set beside the run's measured one: the slowest rank's median step. The compute is
taken at the machine's speed during the run, as for a pipeline run
(:func:`syncpass.plan.retarget.retarget_speed`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from syncpass.backends.torch.tensor_rewrite import WRITABLE, dtensor_collectives, site_medians
from syncpass.contracts.costs import Costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.retarget import speed_factor
from syncpass.plan.tensor_plan import TensorPlan
from syncpass.plan.tensor_planner import (
    TensorRequest,
    link_for,
    plan_tensor,
    retarget_tensor_graph,
    tensor_graph_of,
)
from syncpass.runtime.contracts import TensorRunResult
from syncpass.runtime.prediction import TensorRunPrediction


def _pattern(name: str) -> re.Pattern[str]:
    """A written module name (``blocks.*.mlp.fc``: ``*`` for any layer's index) as a regex."""
    return re.compile(r"\d+".join(re.escape(part) for part in name.split("*")))


def predict_tensor_run(result: TensorRunResult, costs: Costs) -> TensorRunPrediction:
    """Plan the layouts ``result``'s file carries on ``costs``, beside the run."""
    factor = speed_factor(costs, [probe for rank in result.ranks for probe in rank.speed_probes_s])
    plan = written_layouts_plan(costs, result.layouts, result.request.tp, result.style, factor)
    return TensorRunPrediction(plan, max(rank.step_s for rank in result.ranks), factor)


def written_layouts_plan(
    costs: Costs,
    layouts: Sequence[tuple[str, str]],
    tp: int,
    style: str = "eager",
    speed_factor: float = 1.0,
) -> TensorPlan:
    """The tensor-parallel plan of ``layouts`` (module pattern -> ``column``/``row`` as a
    file writes them) on ``costs``' tensor graph, its compute scaled by ``speed_factor``
    (the run's speed over the profile's)."""
    if costs.tensor is None:
        raise SyncpassError(
            "the cost file has no tensor graph ($.tensor) to predict a --tp run with: "
            "profile the model again with this syncpass"
        )
    graph = site_medians(retarget_tensor_graph(tensor_graph_of(costs), compute_scale=speed_factor))
    written = [(_pattern(name), layout) for name, layout in layouts]
    allowed: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:
        if op.kind != "linear":
            allowed[op.id] = WRITABLE.get(op.kind, ("replicated",))
            continue
        found = next(
            (layout for pattern, layout in written if op.module and pattern.fullmatch(op.module)),
            None,
        )
        base = None if found is None else re.match(r"column|row", found)
        allowed[op.id] = ("replicated",) if base is None else (base[0],)
    request = TensorRequest(
        tp, sequence_parallel=False, baselines=False, explain=False, allowed=tuple(allowed.items())
    )
    plan = plan_tensor(
        graph,
        link_for(costs.hardware),
        request,
        training=costs.training,
        memory_multiplier=costs.memory_multiplier,
        hardware=costs.hardware.name,
        model=costs.model,
    )
    return dtensor_collectives(graph, plan) if style == "dtensor" else plan


def literal_layouts(text: str) -> tuple[tuple[str, str], ...]:
    """The ``TENSOR_PARALLEL_LAYOUT = {...}`` a rewritten source assigns, read as the literal
    it is (the file is not run); none when it has none."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and [
            getattr(target, "id", None) for target in node.targets
        ] == ["TENSOR_PARALLEL_LAYOUT"]:
            value = ast.literal_eval(node.value)
            if isinstance(value, dict):
                return tuple((str(name), str(layout)) for name, layout in value.items())
    return ()

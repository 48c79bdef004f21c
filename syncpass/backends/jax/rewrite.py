"""Rewrite a JAX model's source with the sync points of a plan (``--backend jax``).

The same pass as :mod:`syncpass.rewrite.driver`, with the JAX analysis
(:mod:`syncpass.backends.jax.analysis`) and the JAX transformer
(:mod:`syncpass.transformers.jax_transfer`): strip the transfers an earlier run
wrote, build the op graph, match the cost file, plan, insert one
``jax.device_put`` per sync point, and check before anything is written that
the output parses and that stripping it gives back the input.

Nothing here imports jax or runs the user's code.
"""

from __future__ import annotations

from syncpass.backends.jax.analysis import (
    analyse_jax_model,
    jax_loop_containers,
    jax_model_names,
    resolve_jax_model,
)
from syncpass.contracts.costs import Costs
from syncpass.core.errors import SyncpassError
from syncpass.frontend.source import parse_source
from syncpass.plan.planner import PlanRequest, best_stage_count, make_plan
from syncpass.rewrite.driver import (
    RewriteResult,
    container_sizes,
    ensure_parses,
    match_costs,
    model_class,
    steer_by_source,
    sync_sites,
)
from syncpass.transformers.jax_transfer import insert_device_puts, remove_device_puts
from syncpass.transformers.torch_pipeline import SYNC_COMMENT_PREFIX


def strip_jax_sync_points(text: str, path: str, name: str | None = None) -> str:
    """``text`` without the transfers syncpass wrote (unchanged if there are none)."""
    if SYNC_COMMENT_PREFIX not in text:
        return text
    module = parse_source(text, path)
    model, is_function = resolve_jax_model(module, name, path)
    stripped: str = remove_device_puts(module, model, is_function, path).code
    return stripped


def rewrite_jax_source(
    text: str,
    path: str,
    costs: Costs,
    request: PlanRequest,
    class_name: str | None = None,
    max_stages: int | None = None,
) -> RewriteResult:
    """Plan ``costs`` for the JAX model in ``text`` and write the plan's transfers into it.

    ``class_name`` is the JAX function or Flax module class (default: the cost file's
    model when the file has it, else :func:`resolve_jax_model`'s choice).
    Raises :class:`SyncpassError` for bad input; never writes files.
    """
    module = parse_source(text, path)
    name = model_class(jax_model_names(module), costs, class_name)
    model, is_function = resolve_jax_model(module, name, path)
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_device_puts(module, model, is_function, path)
        base = module.code
    sizes = container_sizes(costs, jax_loop_containers(module, model, path))
    graph = analyse_jax_model(module, path, model, sizes, base)
    costs = steer_by_source(graph, match_costs(graph, costs))
    if request.stages is None and max_stages is not None and request.config.strategy != "manual":
        plan = best_stage_count(costs, request, max_stages, path)
    else:
        plan = make_plan(costs, request, path)
    rewritten_module, warnings = insert_device_puts(
        module, model, is_function, sync_sites(graph, plan), path
    )
    if warnings and plan.sync_points:
        raise SyncpassError("could not place the planned sync points: " + "; ".join(warnings), path)
    rewritten = rewritten_module.code
    if rewritten != text:
        ensure_parses(rewritten, path)
        stripped = remove_device_puts(rewritten_module, model, is_function, path).code
        if rewritten != base and stripped != base:
            raise SyncpassError(
                "internal check failed: removing the inserted transfers does not give back the "
                "input; nothing was written (please report this with the file)",
                path,
            )
    return RewriteResult(
        original=text, rewritten=rewritten, plan=plan, graph=graph, warnings=warnings
    )

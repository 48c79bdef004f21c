"""Measure a JAX model's per-op costs (``syncpass profile --backend jax``).

The op graph comes from the source (:func:`~syncpass.backends.jax.analysis.analyse_jax`).
A copy of the file gets a probe after every op: a transfer of the values live
there to the first device (``x = jax.device_put(x, jax.devices()[0])``, written
by the same transformer as the real sync points), but where the user wrote a
transfer: that one ends the piece, pointed at the first device in the copy so
that the copy traces on one device. The copy's model is traced and split at
these transfers by :func:`syncpass.backends.jax.pipeline.pipeline`, so each piece is
exactly one op (or the ops up to the next transfer, where there is no cut),
with the op ids of the analysis. An error the model raises while traced or
measured is a :class:`SyncpassError` at the line of the user's file (the
copy's lines mapped back). Per piece:

* ``compute_s``: wall time of the jitted piece, median of ``repeats`` after ``warmup``;
* ``backward_s``: wall time of its jitted ``jax.vjp`` pull-back (which recomputes
  the forward) minus ``compute_s``;
* ``flops``: the forward FLOPs of XLA's cost analysis of the compiled piece;
* ``param_bytes``: bytes of the weight leaves the piece reads first;
* ``out_bytes``: bytes of the values it defines that later pieces use.

The last op also carries the loss, which a pipeline's last stage computes: the
forward time and FLOPs of the jitted ``loss_fn(output, target)`` are added to
its ``compute_s`` and ``flops``, and the time the loss's gradient (jitted
``jax.value_and_grad``) adds to its ``backward_s``, as the torch profiler does.

A cut's ``live_bytes`` are the bytes of the values computed before it that a later piece
reads: what its probe (or the user's transfer) moves, and what the pipeline moves
besides. The user's file is never modified. This module imports jax.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.extend import core as jcore

from syncpass.backends.jax.analysis import analyse_jax, jax_loop_containers
from syncpass.backends.jax.example import (
    JaxExample,
    apply_of,
    line_map,
    model_failure,
    model_from_source,
)
from syncpass.backends.jax.pipeline import Pipeline, nbytes, pipeline, read_value
from syncpass.backends.jax.rewrite import insert, strip_jax_sync_points
from syncpass.contracts.costs import Costs, CutCost, OpCost
from syncpass.contracts.graph import OpGraph
from syncpass.contracts.hardware import cpu_devices, load_profile
from syncpass.core.errors import SyncpassError
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import ModelSource
from syncpass.transformers.common import SyncSite
from syncpass.transformers.jax_transfer import retarget_device_puts

TRAINING_MEMORY_MULTIPLIER = 4


def _probe_sites(graph: OpGraph) -> tuple[list[SyncSite], list[int]]:
    """A probe at every admissible cut but those the user's own transfer already marks
    (``graph.written``); the op each piece of the probed trace ends with.

    The trace splits at the probes and at the user's transfers alike, so both
    end a piece. Every cut of a JAX graph has an array live across it, which
    its probe moves (the analysis leaves out cuts with nothing to move).
    """
    last_iteration: dict[int, int] = {}
    for op in graph.ops:
        if op.loop is not None:
            last_iteration[op.statement] = op.loop.index
    position_of = {op.id: position for position, op in enumerate(graph.ops)}
    sites, after = [], []
    for cut in graph.cuts:
        position = position_of[cut.after]
        if cut.after in graph.written:
            after.append(position)  # the user's jax.device_put splits the trace here
            continue
        if not cut.live:
            continue
        op = graph.ops[position]
        inside = op.loop is not None and op.loop.index != last_iteration[op.statement]
        sites.append(
            SyncSite(
                statement=op.statement,
                split_after=op.loop.index if inside and op.loop is not None else None,
                comment=f"probe after {op.id}",
                values=cut.live,
                stage=0,
            )
        )
        after.append(position)
    return sites, after


def _median_time(function: Callable[[], Any], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(function())  # type: ignore[no-untyped-call]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(function())  # type: ignore[no-untyped-call]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _time_piece(
    function: Callable[..., Any], values: list[Any], outputs: list[Any], repeats: int, warmup: int
) -> tuple[float, float]:
    """Forward time of a jitted piece, and the time its pull-back adds (``jax.vjp``)."""
    forward_s = _median_time(functools.partial(function, *values), repeats, warmup)
    if not outputs:
        return forward_s, 0.0
    cotangents = [jax.numpy.ones_like(out) for out in outputs]

    def pull_back(inputs: list[Any], ct: list[Any]) -> Any:
        return jax.vjp(function, *inputs)[1](ct)

    with_backward = functools.partial(jax.jit(pull_back), values, cotangents)
    return forward_s, max(0.0, _median_time(with_backward, repeats, warmup) - forward_s)


def _kept_for_backward(
    function: Callable[..., Any], variables: Sequence[Any], values: list[Any], weights: set[Any]
) -> tuple[int, int]:
    """What a piece keeps for its backward, weights left out (the residuals of its
    ``jax.vjp``: the leaves of the pull-back it returns), and the bytes of the values it
    reads that are not weights (what a rematerialised piece keeps instead)."""
    held = [value for var, value in zip(variables, values, strict=True) if var in weights]
    data = [value for var, value in zip(variables, values, strict=True) if var not in weights]
    pull_back = jax.vjp(function, *values)[1]
    saved = sum(
        int(leaf.nbytes)
        for leaf in jax.tree_util.tree_leaves(pull_back)
        if hasattr(leaf, "nbytes") and not any(leaf is weight for weight in held)
    )
    return saved, sum(int(getattr(value, "nbytes", 0)) for value in data)


def _flops(function: Callable[..., Any], values: list[Any]) -> float | None:
    analysis: Any = jax.jit(function).lower(*values).compile().cost_analysis()
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    flops = analysis.get("flops") if isinstance(analysis, dict) else None
    return float(flops) if flops is not None and flops >= 0 else None


def profile_jax_costs(
    text: str,
    path: str,
    example: JaxExample,
    name: str | None = None,
    repeats: int = 5,
    warmup: int = 2,
) -> Costs:
    """The cost file of the JAX model in ``text``, measured on ``example``."""
    base = strip_jax_sync_points(text, path, name or example.name)
    module = parse_source(base, path)
    model_name = name or example.name
    sizes = _container_sizes(example, jax_loop_containers(module, model_name, path))
    analysed = analyse_jax(module, path, model_name, sizes, base)
    graph = analysed.graph
    sites, after = _probe_sites(graph)
    source = ModelSource(text=base, base=base, module=module, graph=graph, handle=analysed)
    probed, warnings = insert(source, sites, path)
    if warnings:
        raise SyncpassError("could not probe the model: " + "; ".join(warnings), path)
    # The user's own transfers go to the probes' device: the copy is traced on one device.
    probed_text = retarget_device_puts(probed, 0, path).code
    lines = line_map(probed_text, text)
    model = model_from_source(example, probed_text, path, "probed")
    try:
        staged = pipeline(apply_of(model, example.is_function), example.params, *example.args)
    except Exception as error:
        raise model_failure(error, path, "tracing the model failed", lines) from None
    if len(staged.stages) != len(after) + 1:
        raise SyncpassError(
            f"the probed model split into {len(staged.stages)} pieces, expected "
            f"{len(after) + 1}; a jax.device_put to a device in a function the analysis "
            "does not follow confuses the probes",
            path,
        )
    # Values of every traced variable, piece by piece, to time each piece on real inputs.
    leaves = jax.tree_util.tree_leaves((example.params, *example.args))
    env: dict[Any, Any] = dict(staged.consts)
    env.update(zip(staged.invars, leaves, strict=True))
    weight_vars = set(staged.weight_index)  # the leaves, and the rows of one a piece runs
    counted: set[Any] = set()
    first_op = 0
    ops: list[OpCost] = []
    for piece, stage in enumerate(staged.stages):
        last_op = after[piece] if piece < len(after) else len(graph.ops) - 1
        values = [staged.value_of(var, env) for var in stage.inputs]
        try:
            outputs = stage.function(*values)
            forward_s, backward_s = _time_piece(stage.function, values, outputs, repeats, warmup)
            flops = _flops(stage.function, values)
        except Exception as error:
            where = graph.ops[last_op]
            raise model_failure(
                error, path, f"measuring {where.id} failed", lines, str(where.location)
            ) from None
        env.update(zip(stage.outputs, outputs, strict=True))
        saved_bytes, input_bytes = _kept_for_backward(
            stage.function, stage.inputs, values, weight_vars
        )
        weights = [var for var in stage.inputs if var in weight_vars and var not in counted]
        counted.update(weights)
        param_bytes = nbytes([var.aval for var in weights])
        out_bytes = nbytes([var.aval for var in stage.outputs])
        # The piece's figures go to its last op; ops merged into it (nothing live to probe) get 0.
        for position in range(first_op, last_op + 1):
            op = graph.ops[position]
            own = position == last_op
            ops.append(
                OpCost(
                    id=op.id,
                    compute_s=forward_s if own else 0.0,
                    backward_s=backward_s if own else 0.0,
                    param_bytes=param_bytes if own else 0,
                    out_bytes=out_bytes if own else 0,
                    flops=flops if own else None,
                    source=str(op.location),
                    saved_bytes=saved_bytes if own else 0,
                    input_bytes=input_bytes if own else 0,
                )
            )
        first_op = last_op + 1
    # The last op also carries the loss, which a pipeline's last stage computes.
    output = jax.tree_util.tree_unflatten(
        staged.out_tree, [read_value(env, var) for var in staged.outvars]
    )
    try:
        ops[-1] = _with_loss(ops[-1], example, output, repeats, warmup)
    except Exception as error:
        raise model_failure(error, path, "the loss failed", fallback=example.origin) from None
    moved = {
        graph.ops[position].id: _crossing_bytes(staged, piece)
        for piece, position in enumerate(after)
    }
    cuts = tuple(
        CutCost(after=cut.after, live_bytes=moved.get(cut.after, 0), pinned=cut.pinned)
        for cut in graph.cuts
    )
    batch = batch_size(example)
    # One process holds every stage, on as many host devices: they share the cores. Its
    # transfers are copies inside the process, not gloo's posts, which stall when they meet.
    hardware = dataclasses.replace(
        load_profile("cpu-gloo-loopback").hardware,
        devices=cpu_devices(),
        meet_stall_s=0.0,
        meet_window_s=0.0,
    )
    return Costs(
        batch_size=batch,
        training=True,
        memory_multiplier=TRAINING_MEMORY_MULTIPLIER,
        hardware=hardware,
        ops=tuple(ops),
        cuts=cuts,
        model=graph.model_class,
        edges=graph.edges,
    )


def _crossing_bytes(staged: Pipeline, piece: int) -> int:
    """Bytes of the values computed up to piece ``piece`` that a later piece reads: what its
    transfer moves, and any other value the pipeline moves to a later stage's device (a
    value of an outer function, live across a transfer inside a submodule's call)."""
    crossing = {var for var in staged.transfers[piece] if not isinstance(var, jcore.Literal)}
    crossing |= {
        var
        for stage in staged.stages[piece + 1 :]
        for var in stage.inputs
        if not isinstance(var, jcore.Literal) and staged.producers.get(var, piece + 1) <= piece
    }
    return nbytes([var.aval for var in crossing])


def _with_loss(last: OpCost, example: JaxExample, output: Any, repeats: int, warmup: int) -> OpCost:
    """``last`` plus the loss: its forward time and FLOPs, and the time its gradient adds."""
    loss = jax.jit(example.loss_fn)
    loss_and_grad = jax.jit(jax.value_and_grad(example.loss_fn))
    forward_s = _median_time(functools.partial(loss, output, example.target), repeats, warmup)
    both_s = _median_time(functools.partial(loss_and_grad, output, example.target), repeats, warmup)
    flops = _flops(example.loss_fn, [output, example.target])
    return dataclasses.replace(
        last,
        compute_s=last.compute_s + forward_s,
        backward_s=last.backward_s + max(0.0, both_s - forward_s),
        flops=None if last.flops is None or flops is None else last.flops + flops,
    )


def batch_size(example: JaxExample) -> int:
    """The first dimension of the example's first input with one (1 if none)."""
    for leaf in jax.tree_util.tree_leaves(example.args):
        shape = getattr(leaf, "shape", ())
        if shape:
            return int(shape[0])
    return 1


def _weights_at(params: Any, path: str) -> Any:
    """``params["a"]["b"]`` for ``"a.b"``; ``None`` where a key is missing."""
    value = params
    for key in path.split("."):
        try:
            value = value[key]
        except (KeyError, TypeError, IndexError):
            return None
    return value


def _container_sizes(example: JaxExample, containers: tuple[str, ...]) -> dict[str, int]:
    """Length of each list a model loops over: of a JAX function's weights, the list itself
    (``params["layers"]``) or, for weights stacked for a scan, the first dimension all their
    leaves share; of a Flax module's submodules, the list the module bound to its
    variables builds in ``setup`` (``blocks``, ``transformer.h.blocks``)."""
    if not containers:
        return {}
    if example.is_function:
        sizes = {}
        for container in containers:
            value = _weights_at(example.params, container)
            if isinstance(value, (list, tuple)):
                sizes[container] = len(value)
            elif value is not None:  # weights stacked for a scan: the leaves' first dimension
                leaves = jax.tree_util.tree_leaves(value)
                if leaves and all(getattr(leaf, "ndim", 0) for leaf in leaves):
                    leading = {int(leaf.shape[0]) for leaf in leaves}
                    if len(leading) == 1:
                        sizes[container] = leading.pop()
        return sizes
    try:
        bound = example.model.bind(example.params)
    except Exception:  # the sizes are the analysis's to do without: the error comes later
        return {}
    sizes = {}
    for container in containers:
        value = bound
        try:
            for part in container.split("."):
                value = getattr(value, part)
        except Exception:
            continue
        if isinstance(value, (list, tuple)):
            sizes[container] = len(value)
    return sizes

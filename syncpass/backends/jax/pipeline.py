"""Run a JAX model rewritten with ``jax.device_put`` sync points as a pipeline of jitted stages.

:func:`pipeline` traces the model once (``jax.make_jaxpr``) and splits the
traced computation at every transfer to a named device, the lines
``syncpass rewrite --backend jax`` writes. Each piece is one **stage**, on the
device the transfer names (stage 0 on the first device), with its own
``jax.jit``-compiled forward and pull-back, and with the weights it reads
placed on that device once, when the pipeline is built. This is how
``torch.distributed.pipelining`` builds its stages from ``pipe_split()``
calls. :class:`GPipe` runs micro-batches through the stages (forward all, then
backward all; JAX's asynchronous dispatch lets the stages overlap) and
accumulates the gradients; it is what ``syncpass run --backend jax`` runs::

    from syncpass.backends.jax.pipeline import GPipe, pipeline

    staged = pipeline(forward, params, x0)       # or pipeline(model.apply, variables, x0)
    result = GPipe(staged, loss_fn)([((x0,), y0), ((x1,), y1)])
    result.losses, result.grads                  # per micro-batch; of the mean loss

The staged function itself, ``staged(params, x)``, gives the model's output
and is differentiable (``jax.grad``, ``jax.vjp``): a transfer's transpose moves
the gradient back. This module imports jax; nothing in ``syncpass`` imports it
but the JAX commands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
from jax.extend import core as jcore


@dataclass(frozen=True)
class Stage:
    """One piece of the traced computation: jitted functions of ``inputs`` on ``device``.

    ``inputs`` and ``outputs`` are the traced variables it reads and defines
    that cross its ends; ``weights`` are the positions of the weight leaves
    among ``inputs`` (indices into the flattened weights) and
    ``weight_positions`` where they are among ``inputs``;
    ``placed_weights`` those leaves, put on ``device`` once when the pipeline
    was built. ``function`` is the jitted forward; ``backward(values,
    cotangents)`` the jitted pull-back (it recomputes the forward, as GPipe
    does) that gives the cotangents of the ``differentiable`` inputs from
    those of the ``differentiable_outputs`` (positions, floating-point values).
    """

    index: int
    device: Any
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    weights: tuple[int, ...]
    weight_positions: tuple[int, ...]
    function: Callable[..., Any]
    jaxpr: Any
    equations: int
    placed_weights: tuple[Any, ...] = ()
    differentiable: tuple[int, ...] = ()
    differentiable_outputs: tuple[int, ...] = ()
    backward: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Pipeline:
    """The stages of a traced model, and how to run them.

    ``source_weights`` are the weight leaves the pipeline was built with;
    each stage holds its own copy of those it reads, already on its device.
    """

    stages: tuple[Stage, ...]
    invars: tuple[Any, ...]
    outvars: tuple[Any, ...]
    consts: dict[Any, Any]
    out_tree: Any
    num_weights: int
    transfers: tuple[tuple[Any, ...], ...]  # the variables each sync point moves
    weights_tree: Any = None
    source_weights: tuple[Any, ...] = ()
    producers: dict[Any, int] = field(default_factory=dict)  # variable -> stage defining it
    weight_index: dict[Any, int] = field(default_factory=dict)  # weight variable -> leaf index
    # A stage input that is rows ``start:stop`` of a weight leaf (the slice of a stacked
    # scan's weights its piece runs): variable -> (the leaf's variable, start, stop).
    weight_slices: dict[Any, tuple[Any, int, int]] = field(default_factory=dict)

    def value_of(self, var: Any, env: dict[Any, Any]) -> Any:
        """``var``'s value in ``env``, a weight slice cut from its leaf."""
        if var in self.weight_slices:
            source, start, stop = self.weight_slices[var]
            return env[source][start:stop]
        return env[var]

    def __call__(self, params: Any, *args: Any) -> Any:
        """The model's output, computed stage by stage (differentiable).

        A weight leaf that is the very array the pipeline was built with is
        taken from the stage's placed copy; any other value (a traced one
        under ``jax.grad``, new weights) is moved to the stage's device.
        """
        leaves = jax.tree_util.tree_leaves((params, *args))
        if len(leaves) != len(self.invars):
            raise ValueError(
                f"the pipeline was traced with {len(self.invars)} array leaves, got {len(leaves)}"
            )
        env: dict[Any, Any] = dict(self.consts)
        env.update(zip(self.invars, leaves, strict=True))
        for stage in self.stages:
            values = [
                None
                if self._is_source_weight(var, leaves)
                else _on(self.value_of(var, env), stage.device)
                for var in stage.inputs
            ]
            for position, placed in zip(stage.weight_positions, stage.placed_weights, strict=True):
                if values[position] is None:
                    values[position] = placed
            env.update(zip(stage.outputs, stage.function(*values), strict=True))
        outputs = [read_value(env, var) for var in self.outvars]
        return jax.tree_util.tree_unflatten(self.out_tree, outputs)

    def _is_source_weight(self, var: Any, leaves: Sequence[Any]) -> bool:
        index = self.weight_index.get(var)
        return index is not None and leaves[index] is self.source_weights[index]

    @property
    def params(self) -> Any:
        """The weights as placed: each leaf on the device of the first stage that reads it
        whole (a leaf the stages hold only in slices is the array the pipeline was built
        with)."""
        leaves = list(self.source_weights)
        for stage in reversed(self.stages):
            for var, index, placed in zip(
                (stage.inputs[i] for i in stage.weight_positions),
                stage.weights,
                stage.placed_weights,
                strict=True,
            ):
                if var not in self.weight_slices:
                    leaves[index] = placed
        return jax.tree_util.tree_unflatten(self.weights_tree, leaves)

    @property
    def owners(self) -> dict[int, Any]:
        """Weight leaf index -> the device of the first stage that reads it (its owner), for
        every leaf some stage reads."""
        found: dict[int, Any] = {}
        for stage in self.stages:
            for index in stage.weights:
                found.setdefault(index, stage.device)
        return found


def _on(value: Any, device: Any) -> Any:
    """``value`` on ``device``: itself when it is a concrete array already there."""
    if (
        isinstance(value, jax.Array)
        and not isinstance(value, jax.core.Tracer)
        and value.devices() == {device}
    ):
        return value
    return jax.device_put(value, device)


def read_value(env: dict[Any, Any], atom: Any) -> Any:
    """The value of a traced variable (or literal) ``atom`` in ``env``."""
    if isinstance(atom, jcore.Literal):
        return atom.val
    return env[atom]


def _is_transfer(equation: Any) -> bool:
    """A ``jax.device_put`` to a named device: a sync point. Without a device
    (``jax.device_put(x)``) it moves nothing between stages, and the analysis
    reads it as an ordinary op too."""
    if equation.primitive.name != "device_put":
        return False
    devices = equation.params.get("devices", ())
    return bool(devices) and all(isinstance(device, jax.Device) for device in devices)


def pipeline(model: Callable[..., Any], params: Any, *args: Any) -> Pipeline:
    """Trace ``model(params, *args)`` and split it into stages at its transfers."""
    closed, shape = jax.make_jaxpr(model, return_shape=True)(params, *args)
    jaxpr = closed.jaxpr
    num_weights = len(jax.tree_util.tree_leaves(params))
    consts = dict(zip(jaxpr.constvars, closed.consts, strict=True))
    # Group the equations; a transfer's outputs are its inputs, moved (aliases).
    groups: list[list[Any]] = [[]]
    devices: list[Any] = [jax.devices()[0]]
    alias: dict[Any, Any] = {}
    transfers: list[tuple[Any, ...]] = []

    def resolve(atom: Any) -> Any:
        while not isinstance(atom, jcore.Literal) and atom in alias:
            atom = alias[atom]
        return atom

    for equation in jaxpr.eqns:
        if _is_transfer(equation):
            for out, source in zip(equation.outvars, equation.invars, strict=True):
                alias[out] = resolve(source)
            transfers.append(tuple(resolve(var) for var in equation.invars))
            groups.append([])
            devices.append(equation.params["devices"][0])
            continue
        groups[-1].append(equation.replace(invars=[resolve(var) for var in equation.invars]))
    outvars = tuple(resolve(var) for var in jaxpr.outvars)
    # What each stage reads from before it, and what later stages (or the output) read from it.
    defined_in: dict[Any, int] = {}
    reads: list[list[Any]] = []
    for position, group in enumerate(groups):
        seen: dict[Any, None] = {}
        for equation in group:
            for var in equation.invars:
                if not isinstance(var, jcore.Literal) and defined_in.get(var, -1) != position:
                    seen[var] = None
            for var in equation.outvars:
                if not isinstance(var, jcore.DropVar):
                    defined_in[var] = position
        reads.append(list(seen))
    needed_later: list[set[Any]] = [set() for _ in groups]
    for wanted in reads:
        for var in wanted:
            if var in defined_in:
                needed_later[defined_in[var]].add(var)
    for var in outvars:
        if not isinstance(var, jcore.Literal) and var in defined_in:
            needed_later[defined_in[var]].add(var)
    weight_index = {var: index for index, var in enumerate(jaxpr.invars[:num_weights])}
    weight_leaves = jax.tree_util.tree_leaves(params)
    weight_slices: dict[Any, tuple[Any, int, int]] = {}
    for position, group in enumerate(groups):
        for var in list(reads[position]):
            found = _row_slice(var, group) if var in weight_index else None
            if found is None or found[0].outvars[0] in needed_later[position]:
                continue
            equation, start, stop = found
            rows = equation.outvars[0]
            # The stage takes the rows it runs as its input: only they are placed on it.
            group.remove(equation)
            reads[position][reads[position].index(var)] = rows
            del defined_in[rows]
            weight_index[rows] = weight_index[var]
            weight_slices[rows] = (var, start, stop)
    stages = []
    for position, group in enumerate(groups):
        defined = [
            var
            for equation in group
            for var in equation.outvars
            if not isinstance(var, jcore.DropVar)
        ]
        outputs = tuple(var for var in defined if var in needed_later[position])
        inputs = tuple(reads[position])
        piece = jcore.Jaxpr(
            constvars=[],
            invars=list(inputs),
            outvars=list(outputs),
            eqns=group,
            effects=jaxpr.effects,
            debug_info=jcore.DebugInfo(
                "syncpass pipeline stage",
                f"stage {position}",
                tuple(f"in{index}" for index in range(len(inputs))),
                tuple(f"out{index}" for index in range(len(outputs))),
            ),
        )
        traced = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(piece, []))
        weight_positions = tuple(i for i, var in enumerate(inputs) if var in weight_index)
        weights = tuple(weight_index[inputs[i]] for i in weight_positions)
        # Gradients flow to the weights and to what earlier stages hand on, if floating-point.
        differentiable = tuple(
            i
            for i, var in enumerate(inputs)
            if (var in weight_index or var in defined_in) and _inexact(var)
        )
        differentiable_outputs = tuple(i for i, var in enumerate(outputs) if _inexact(var))
        device = devices[position]
        stages.append(
            Stage(
                index=position,
                device=device,
                inputs=inputs,
                outputs=outputs,
                weights=weights,
                weight_positions=weight_positions,
                function=jax.jit(traced),
                jaxpr=piece,
                equations=len(group),
                # Placed once, here: no step moves a weight again.
                placed_weights=tuple(
                    jax.device_put(_rows(weight_leaves[index], weight_slices.get(var)), device)
                    for var, index in zip(
                        (inputs[i] for i in weight_positions), weights, strict=True
                    )
                ),
                differentiable=differentiable,
                differentiable_outputs=differentiable_outputs,
                backward=jax.jit(_pull_back(traced, differentiable, differentiable_outputs)),
            )
        )
    return Pipeline(
        stages=tuple(stages),
        invars=tuple(jaxpr.invars),
        outvars=outvars,
        consts=consts,
        out_tree=jax.tree_util.tree_structure(shape),
        num_weights=num_weights,
        transfers=tuple(transfers),
        weights_tree=jax.tree_util.tree_structure(params),
        source_weights=tuple(weight_leaves),
        producers=defined_in,
        weight_index=weight_index,
        weight_slices=weight_slices,
    )


def _row_slice(var: Any, group: Sequence[Any]) -> tuple[Any, int, int] | None:
    """The one equation of ``group`` that reads ``var``, when it is a static slice of rows
    ``start:stop`` of it (all of every other axis, step 1): how a piece runs its slice of
    a stacked scan's weights (``jax.tree.map(lambda w: w[2:4], params["layers"])``)."""
    readers = [equation for equation in group if var in equation.invars]
    if len(readers) != 1 or readers[0].primitive.name != "slice":
        return None
    equation = readers[0]
    starts = equation.params["start_indices"]
    limits = equation.params["limit_indices"]
    strides = equation.params.get("strides")
    shape = var.aval.shape
    if not shape or (strides is not None and any(stride != 1 for stride in strides)):
        return None
    if any(starts[axis] != 0 or limits[axis] != shape[axis] for axis in range(1, len(shape))):
        return None
    return equation, int(starts[0]), int(limits[0])


def _rows(leaf: Any, found: tuple[Any, int, int] | None) -> Any:
    return leaf if found is None else leaf[found[1] : found[2]]


def _inexact(var: Any) -> bool:
    return bool(jax.numpy.issubdtype(var.aval.dtype, jax.numpy.inexact))


def _pull_back(
    function: Callable[..., Any], inputs: tuple[int, ...], outputs: tuple[int, ...]
) -> Callable[[Sequence[Any], Sequence[Any]], list[Any]]:
    """``(values, cotangents) -> cotangents of inputs``: the vjp of ``function`` restricted to
    the ``inputs`` and ``outputs`` positions (the forward is recomputed inside)."""

    def pull_back(values: Sequence[Any], cotangents: Sequence[Any]) -> list[Any]:
        def restricted(*chosen: Any) -> list[Any]:
            full = list(values)
            for position, value in zip(inputs, chosen, strict=True):
                full[position] = value
            results = function(*full)
            return [results[position] for position in outputs]

        _, vjp = jax.vjp(restricted, *[values[position] for position in inputs])
        return list(vjp(list(cotangents)))

    return pull_back


@dataclass(frozen=True)
class StepResult:
    """One GPipe step: each micro-batch's loss, the gradients, and each stage's compute time.

    ``grads`` has the weights' structure, each leaf on the device of the first
    stage that reads it, averaged over the micro-batches (the gradient of the
    mean loss). ``stage_compute_s`` is empty unless the step was timed.
    """

    losses: tuple[Any, ...]
    grads: Any
    stage_compute_s: tuple[float, ...] = ()


class GPipe:
    """Loss and gradients of a :class:`Pipeline` over micro-batches, GPipe-style.

    Every micro-batch goes forward through every stage, then backward through
    every stage in reverse; each call is a stage's jitted piece on its own
    device. Calls are issued micro-batch by micro-batch and JAX dispatches
    them asynchronously, so stage 1 works on micro-batch 0 while stage 0 works
    on micro-batch 1. Only activations and their gradients cross devices;
    the weights stay where :func:`pipeline` placed them. The loss of each
    micro-batch is computed on the last stage's device.
    """

    def __init__(self, staged: Pipeline, loss_fn: Callable[[Any, Any], Any]) -> None:
        self.staged = staged
        self.loss_device = staged.stages[-1].device
        self.loss_and_cotangent = jax.jit(jax.value_and_grad(loss_fn))

    def __call__(
        self, batches: Sequence[tuple[tuple[Any, ...], Any]], timed: bool = False
    ) -> StepResult:
        """Run ``batches`` (``(args, target)`` per micro-batch); ``timed`` waits for each
        stage call to finish and adds its time to its stage (which removes the overlap)."""
        staged = self.staged
        clock = [0.0] * len(staged.stages)

        def call(stage: int, function: Callable[..., Any], *values: Any) -> Any:
            if not timed:
                return function(*values)
            jax.block_until_ready(values)  # type: ignore[no-untyped-call]
            started = time.perf_counter()
            result = jax.block_until_ready(function(*values))  # type: ignore[no-untyped-call]
            clock[stage] += time.perf_counter() - started
            return result

        saved: list[tuple[dict[Any, Any], list[list[Any]]]] = []
        for args, _ in batches:  # forward, micro-batch by micro-batch
            env: dict[Any, Any] = dict(staged.consts)
            leaves = jax.tree_util.tree_leaves(args)
            env.update(zip(staged.invars[staged.num_weights :], leaves, strict=True))
            inputs_of: list[list[Any]] = []
            for stage in staged.stages:
                values = self._inputs(stage, env)
                inputs_of.append(values)
                env.update(
                    zip(stage.outputs, call(stage.index, stage.function, *values), strict=True)
                )
            saved.append((env, inputs_of))
        losses = []
        # Each weight's cotangents, one per reading stage and micro-batch, on its owner:
        # summed at the end in one jitted call per owner (eager adds compile per shape).
        parts: list[list[Any]] = [[] for _ in range(staged.num_weights)]
        owners = staged.owners
        last = len(staged.stages) - 1
        for (env, inputs_of), (_, target) in zip(saved, batches, strict=True):
            outputs = [_on(read_value(env, var), self.loss_device) for var in staged.outvars]
            output = jax.tree_util.tree_unflatten(staged.out_tree, outputs)
            loss, output_cotangent = call(
                last, self.loss_and_cotangent, output, jax.device_put(target, self.loss_device)
            )
            losses.append(loss)
            cotangents: dict[Any, Any] = {}
            for var, cotangent in zip(
                staged.outvars, jax.tree_util.tree_leaves(output_cotangent), strict=True
            ):
                self._add(cotangents, var, cotangent)
            for stage in reversed(staged.stages):  # backward
                wanted = [stage.outputs[i] for i in stage.differentiable_outputs]
                if not stage.differentiable or not any(var in cotangents for var in wanted):
                    continue
                given = [
                    cotangents.pop(var)
                    if var in cotangents
                    else jax.device_put(
                        jax.numpy.zeros(var.aval.shape, var.aval.dtype), stage.device
                    )
                    for var in wanted
                ]
                assert stage.backward is not None
                found = call(stage.index, stage.backward, inputs_of[stage.index], given)
                for position, cotangent in zip(stage.differentiable, found, strict=True):
                    var = stage.inputs[position]
                    index = staged.weight_index.get(var)
                    if index is None:
                        self._add(cotangents, var, cotangent)
                        continue
                    # Summed on the weight's owner, where staged.params has it.
                    cotangent = _on(cotangent, owners[index])
                    if var in staged.weight_slices:  # the rows this stage holds, in the leaf
                        _, start, stop = staged.weight_slices[var]
                        whole = staged.source_weights[index]
                        zeros = jax.numpy.zeros(whole.shape, whole.dtype, device=owners[index])
                        cotangent = zeros.at[start:stop].set(cotangent)
                    parts[index].append(cotangent)
        return StepResult(
            losses=tuple(losses),
            grads=jax.tree_util.tree_unflatten(
                staged.weights_tree, _mean_gradients(parts, staged, len(batches))
            ),
            stage_compute_s=tuple(clock) if timed else (),
        )

    def _inputs(self, stage: Stage, env: dict[Any, Any]) -> list[Any]:
        values: list[Any] = [None] * len(stage.inputs)
        for position, placed in zip(stage.weight_positions, stage.placed_weights, strict=True):
            values[position] = placed
        for position, var in enumerate(stage.inputs):
            if values[position] is None:
                values[position] = _on(env[var], stage.device)  # a sync point's transfer
        return values

    def _add(self, cotangents: dict[Any, Any], var: Any, cotangent: Any) -> None:
        """Add ``cotangent`` to ``var``'s, on the device of the stage that defines ``var``."""
        if isinstance(var, jcore.Literal) or var not in self.staged.producers:
            return  # an input, a constant or a weight handed on unchanged: nothing to send back
        device = self.staged.stages[self.staged.producers[var]].device
        cotangent = _on(cotangent, device)
        cotangents[var] = cotangents[var] + cotangent if var in cotangents else cotangent


@jax.jit
def _scaled_sums(parts: tuple[tuple[Any, ...], ...], scale: float) -> tuple[Any, ...]:
    """Each tuple of ``parts`` summed in its order, times ``scale``."""
    return tuple(sum(part[1:], part[0]) * scale for part in parts)


def _mean_gradients(parts: list[list[Any]], staged: Pipeline, batches: int) -> list[Any]:
    """Every weight's gradient of the mean loss: its cotangents summed over the stages that
    read it and the ``batches`` micro-batches, divided by ``batches``, on its owner (one
    jitted call per owner device); zeros for a weight no stage differentiates."""
    leaves: list[Any] = [None] * len(parts)
    owners = staged.owners
    by_owner: dict[Any, list[int]] = {}
    for index, found in enumerate(parts):
        if found:
            by_owner.setdefault(owners[index], []).append(index)
        else:
            leaves[index] = jax.numpy.zeros_like(staged.source_weights[index])
    for indexes in by_owner.values():
        summed = _scaled_sums(tuple(tuple(parts[index]) for index in indexes), 1 / batches)
        for index, leaf in zip(indexes, summed, strict=True):
            leaves[index] = leaf
    return leaves


def nbytes(avals: Sequence[Any]) -> int:
    """Bytes of arrays of these abstract values (``var.aval``)."""
    total = 0
    for aval in avals:
        size = 1
        for dim in aval.shape:
            size *= int(dim)
        total += size * aval.dtype.itemsize
    return total

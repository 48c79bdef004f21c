"""Run a JAX model rewritten with ``jax.device_put`` sync points as a pipeline of jitted stages.

:func:`pipeline` traces the model once (``jax.make_jaxpr``) and splits the
traced computation at every transfer to a named device, the lines
``syncpass rewrite --backend jax`` writes. Each piece is one **stage**: its
own ``jax.jit``-compiled function, run on the device the transfer names (stage
0 on the first device), with the weights it reads placed on that device and
the values it receives moved there. This is how ``torch.distributed.pipelining``
builds its stages from ``pipe_split()`` calls, and it is what
``syncpass run --backend jax`` runs::

    from syncpass.jax_pipeline import pipeline

    staged = pipeline(forward, params, x)        # or pipeline(model.apply, variables, x)
    logits = staged(params, x)                   # the same result as forward(params, x)
    grads = jax.grad(lambda p: loss(staged(p, x), y))(params)

The staged function is differentiable (``jax.grad``, ``jax.vjp``): a transfer's
transpose moves the gradient back. One batch flows through the stages in turn
(no micro-batching). This module imports jax; nothing in ``syncpass`` imports
it but the JAX commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax.extend import core as jcore


@dataclass(frozen=True)
class Stage:
    """One piece of the traced computation: a jitted function of ``inputs`` on ``device``.

    ``inputs`` and ``outputs`` are the traced variables it reads and defines
    that cross its ends; ``weights`` are the positions of the weight leaves
    among ``inputs`` (indices into the flattened weights).
    """

    index: int
    device: Any
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    weights: tuple[int, ...]
    function: Callable[..., Any]
    jaxpr: Any
    equations: int


@dataclass(frozen=True)
class Pipeline:
    """The stages of a traced model, and how to run them."""

    stages: tuple[Stage, ...]
    invars: tuple[Any, ...]
    outvars: tuple[Any, ...]
    consts: dict[Any, Any]
    out_tree: Any
    num_weights: int
    transfers: tuple[tuple[Any, ...], ...]  # the variables each sync point moves

    def __call__(self, params: Any, *args: Any) -> Any:
        leaves = jax.tree_util.tree_leaves((params, *args))
        if len(leaves) != len(self.invars):
            raise ValueError(
                f"the pipeline was traced with {len(self.invars)} array leaves, got {len(leaves)}"
            )
        env: dict[Any, Any] = dict(self.consts)
        env.update(zip(self.invars, leaves, strict=True))
        for stage in self.stages:
            # Weights and received values go to the stage's device (no copy if already there).
            values = [jax.device_put(env[var], stage.device) for var in stage.inputs]
            env.update(zip(stage.outputs, stage.function(*values), strict=True))
        outputs = [_value(env, var) for var in self.outvars]
        return jax.tree_util.tree_unflatten(self.out_tree, outputs)


def _value(env: dict[Any, Any], atom: Any) -> Any:
    if isinstance(atom, jcore.Literal):
        return atom.val
    return env[atom]


def _is_transfer(equation: Any) -> bool:
    """A ``jax.device_put`` to a named device: a sync point."""
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
        )
        function = jax.jit(jcore.jaxpr_as_fun(jcore.ClosedJaxpr(piece, [])))
        stages.append(
            Stage(
                index=position,
                device=devices[position],
                inputs=inputs,
                outputs=outputs,
                weights=tuple(weight_index[var] for var in inputs if var in weight_index),
                function=function,
                jaxpr=piece,
                equations=len(group),
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
    )


def nbytes(avals: Sequence[Any]) -> int:
    """Bytes of arrays of these abstract values (``var.aval``)."""
    total = 0
    for aval in avals:
        size = 1
        for dim in aval.shape:
            size *= int(dim)
        total += size * aval.dtype.itemsize
    return total

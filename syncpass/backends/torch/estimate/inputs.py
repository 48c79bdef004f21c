"""The forward's inputs: ``--input-shape`` parsed, and shapes and kinds bound to the
forward's parameters."""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from syncpass.backends.torch.estimate.interpreter import Interpreter
from syncpass.backends.torch.estimate.values import (
    ClassRef,
    Container,
    Instance,
    Layer,
    Library,
    Opaque,
    Tensor,
    Unsized,
)
from syncpass.contracts.graph import OpGraph
from syncpass.core.errors import SyncpassError


def parse_input_shapes(spec: str) -> tuple[tuple[int, ...], ...]:
    """The tensor shapes of ``--input-shape``: ``8x128`` (one input) or
    ``8x3x64x64,8x64`` (one shape per forward argument, comma-separated)."""
    example = "write one shape per forward argument, e.g. 8x128 or 8x3x64x64,8x64"
    if not spec.strip():
        raise SyncpassError(f"--input-shape is empty; {example}")
    shapes = []
    for number, part in enumerate(spec.split(","), start=1):
        text = part.strip()
        if not text:
            raise SyncpassError(f"--input-shape {spec!r}: shape {number} is empty; {example}")
        dims = []
        for dim in re.split(r"[xX]", text):
            dim = dim.strip()
            if not dim.isdigit():
                shown = dim or "nothing"
                raise SyncpassError(
                    f"--input-shape {spec!r}: shape {number} ({text!r}) has {shown!r} where a "
                    f"size should be; sizes are whole numbers joined by 'x'; {example}"
                )
            if int(dim) < 1:
                raise SyncpassError(
                    f"--input-shape {spec!r}: shape {number} ({text!r}) has a size 0; every "
                    f"size must be at least 1; {example}"
                )
            dims.append(int(dim))
        shapes.append(tuple(dims))
    return tuple(shapes)


def _input_kinds(
    interp: Interpreter,
    model: Instance,
    forward: cst.FunctionDef,
    names: Sequence[str],
    given: Sequence[str] | None,
) -> list[str]:
    """Each input's kind: as given, else int when its first use is an nn.Embedding."""
    if given is not None:
        kinds = list(given)
        for kind in kinds:
            if kind not in ("float", "int"):
                raise SyncpassError(f"input dtype {kind!r} is not 'float' or 'int'")
        if len(kinds) != len(names):
            raise SyncpassError(
                f"{len(kinds)} input dtype(s) for {len(names)} input shape(s); give one per input"
            )
        return kinds
    first_use: dict[str, cst.Call] = {}

    class _FirstUse(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            for arg in node.args:
                if isinstance(arg.value, cst.Name) and arg.value.value in names:
                    first_use.setdefault(arg.value.value, node)

    forward.body.visit(_FirstUse())
    kinds = []
    for name in names:
        call = first_use.get(name)
        kind = "float"
        if call is not None:
            try:
                callee = interp.eval(call.func, {"self": model})
            except Unsized:
                callee = None
            while isinstance(callee, Container) and callee.kind == "Sequential" and callee.children:
                callee = callee.children[0]
            if (isinstance(callee, Layer) and callee.kind == "Embedding") or (
                isinstance(callee, Library) and callee.name.endswith("functional.embedding")
            ):
                kind = "int"
        kinds.append(kind)
    return kinds


def bind_inputs(
    interp: Interpreter,
    model: Instance,
    forward: cst.FunctionDef,
    graph: OpGraph,
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[str] | None,
) -> dict[str, object]:
    params = [*forward.params.posonly_params, *forward.params.params]
    if params and params[0].name.value == "self":
        params = params[1:]
    names = [param.name.value for param in params]
    required = [param.name.value for param in params if param.default is None]
    where = str(graph.forward)
    star = forward.params.star_arg
    if len(shapes) > len(names) and not isinstance(star, cst.Param):
        raise SyncpassError(
            f"{len(shapes)} input shape(s) for a forward that takes {len(names)} "
            f"({', '.join(names) or 'no inputs'}); give one shape per input",
            where,
        )
    if len(shapes) < len(required):
        raise SyncpassError(
            f"{len(shapes)} input shape(s) for a forward that needs {len(required)} "
            f"({', '.join(required)}); give one shape per input, e.g. 8x3x64x64,8x64",
            where,
        )
    bound = names[: len(shapes)]
    if dtypes is not None and len(dtypes) != len(shapes):
        raise SyncpassError(
            f"{len(dtypes)} input dtype(s) for {len(shapes)} input shape(s); give one per input"
        )
    kinds = _input_kinds(
        interp, model, forward, bound, None if dtypes is None else dtypes[: len(bound)]
    )
    frame: dict[str, object] = {"self": model, "__self__": model}
    frame["__class__"] = ClassRef(model.classdef)
    for name, shape, kind in zip(bound, shapes[: len(bound)], kinds, strict=True):
        frame[name] = Tensor(tuple(shape), kind)
    if isinstance(star, cst.Param):  # forward(self, *inputs): the rest, as floats
        frame[star.name.value] = tuple(Tensor(tuple(shape)) for shape in shapes[len(bound) :])
    for param in params[len(shapes) :]:
        assert param.default is not None
        try:
            frame[param.name.value] = interp.eval(param.default, {})
        except Unsized as error:
            frame[param.name.value] = Opaque(error.reason)
    for param in forward.params.kwonly_params:
        if param.default is None:
            frame[param.name.value] = Opaque(f"the keyword input {param.name.value!r}")
            continue
        try:
            frame[param.name.value] = interp.eval(param.default, {})
        except Unsized as error:
            frame[param.name.value] = Opaque(error.reason)
    return frame

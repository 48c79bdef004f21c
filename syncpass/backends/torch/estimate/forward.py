"""The model's forward, run op by op on the interpreter, each op's figures recorded.

Each op of the op graph (:func:`syncpass.frontend.analyse_model`) runs on a fresh
FLOP counter; the bytes of the tensors it writes and of the names live after it
are counted from the values in the forward's frame. An op the interpreter
cannot follow gets the fallback: every name it writes holds a tensor of the
shape of its first input that has one (else of the last activation before it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import libcst as cst

from syncpass.backends.torch.estimate.flops import Counter
from syncpass.backends.torch.estimate.interpreter import Interpreter
from syncpass.backends.torch.estimate.values import (
    Break,
    Container,
    Continue,
    Instance,
    Opaque,
    Return,
    Tensor,
    Unsized,
    as_int,
    numel,
)
from syncpass.contracts.graph import Op, OpGraph
from syncpass.frontend.analysis import match_container_loop, match_sequential_call

#: Bytes per element of integer tensors (token ids are int64).
INT_BYTES = 8


def resolve_path(root: Instance, dotted: str) -> object | None:
    """``blocks.3`` of the model: an attribute path, indexing containers by position or key."""
    value: object = root
    for part in dotted.split("."):
        if isinstance(value, Instance):
            value = value.attrs.get(part)
        elif isinstance(value, Container):
            if value.keys is not None:
                if part not in value.keys:
                    return None
                value = value.children[value.keys.index(part)]
            elif part.isdigit() and int(part) < len(value.children):
                value = value.children[int(part)]
            else:
                return None
        else:
            return None
    return value


def _value_tensors(value: object, seen: set[int]) -> Iterator[Tensor]:
    """The tensors ``value`` holds (itself, or in tuples, lists and dicts), each once."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _value_tensors(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _value_tensors(item, seen)


@dataclass
class OpFigures:
    """One op's FLOPs, the bytes it writes and those live after it; why it is unsized."""

    forward_flops: float = 0.0
    backward_flops: float = 0.0
    weight_backward_flops: float = 0.0  # the part of backward_flops for weights' gradients
    out_bytes: float = 0.0
    live_bytes: float = 0.0
    unsized: str | None = None


class ForwardRun:
    """The model's forward run op by op, each op's figures recorded."""

    def __init__(
        self,
        interp: Interpreter,
        model: Instance,
        graph: OpGraph,
        forward: cst.FunctionDef,
        frame: dict[str, object],
        dtype_bytes: int,
    ) -> None:
        self.interp = interp
        self.model = model
        self.graph = graph
        self.forward = forward
        self.frame = frame
        self.dtype_bytes = dtype_bytes
        self.last_activation: Tensor | None = None
        self.finished = False

    def bytes_of(self, names: Sequence[str]) -> float:
        seen: set[int] = set()
        total = 0
        for name in names:
            for tensor in _value_tensors(self.frame.get(name), seen):
                size = {"float": self.dtype_bytes, "int": INT_BYTES, "bool": 1}[tensor.kind]
                total += numel(tensor.shape) * size
        return float(total)

    def run(self) -> list[OpFigures]:
        assert isinstance(self.forward.body, cst.IndentedBlock)
        statements = list(self.forward.body.body)
        by_statement: dict[int, list[int]] = {}
        for position, op in enumerate(self.graph.ops):
            by_statement.setdefault(op.statement, []).append(position)
        live = {cut.after: cut.live for cut in self.graph.cuts}
        figures = [OpFigures() for _ in self.graph.ops]
        for index, statement in enumerate(statements):
            positions = by_statement.get(index, [])
            if not positions:
                if not self.finished:
                    with contextlib.suppress(Unsized, Return, Break, Continue):
                        self.interp.run_statement(statement, self.frame, nested=False)
                continue
            for position in positions:
                op = self.graph.ops[position]
                figures[position] = self.run_op(op, statement)
                figures[position].out_bytes = self.bytes_of(op.writes)
                figures[position].live_bytes = self.bytes_of(live.get(op.id, ()))
        return figures

    def run_op(self, op: Op, statement: cst.BaseStatement) -> OpFigures:
        interp = self.interp
        interp.counter = Counter()
        interp.steps = 0  # each op has its own budget
        reason: str | None = None
        if self.finished:
            reason = "runs after the forward has returned"
        else:
            try:
                self._execute(op, statement)
            except Return:
                self.finished = True
            except (Break, Continue):
                reason = "a break or continue outside a loop syncpass follows"
            except Unsized as error:
                reason = error.reason
            except RecursionError:
                reason = "nests deeper than syncpass follows"
        if reason is not None:
            self._fallback(op)
            return OpFigures(unsized=reason)
        for name in op.writes:
            value = self.frame.get(name)
            if isinstance(value, Tensor) and value.kind == "float":
                self.last_activation = value
        counter = interp.counter
        return OpFigures(counter.forward, counter.backward, counter.weight_backward)

    def _execute(self, op: Op, statement: cst.BaseStatement) -> None:
        interp = self.interp
        if op.loop is None:
            interp.run_statement(statement, self.frame, nested=False)
            return
        container = resolve_path(self.model, op.loop.container)
        if not isinstance(container, Container):
            raise Unsized(f"self.{op.loop.container} is not a container syncpass knows")
        child = container.children[op.loop.index]
        sequential = match_sequential_call(statement)
        if isinstance(statement, cst.For):
            loop = match_container_loop(statement)
            assert loop is not None
            if loop.parts:
                if not isinstance(child, Container) or len(child.children) != len(loop.parts):
                    raise Unsized(
                        f"self.{op.loop.container}[{op.loop.index}] does not unpack into "
                        f"{', '.join(loop.parts)}"
                    )
                for part, piece in zip(loop.parts, child.children, strict=True):
                    self.frame[part] = piece
            else:
                self.frame[loop.item] = child
            for name, other in loop.zipped:
                zipped = resolve_path(self.model, other) if other else None
                if not isinstance(zipped, Container):
                    raise Unsized(f"a loop zips self.{op.loop.container} with a local sequence")
                self.frame[name] = zipped.children[op.loop.index]
            if loop.index_name is not None:
                self.frame[loop.index_name] = self._enumerated_index(statement, op.loop.index)
            interp.run_block(statement.body, self.frame, nested=False)
        elif sequential is not None:
            first = op.loop.index == (sequential.start or 0)
            value = self.frame.get(sequential.argument if first else sequential.target)
            callee = f"self.{op.loop.container}[{op.loop.index}]"
            self.frame[sequential.target] = interp.call_module(child, [value], {}, callee)
        else:
            raise Unsized("an op syncpass cannot match to its source")

    def _enumerated_index(self, statement: cst.For, index: int) -> int:
        loop = match_container_loop(statement)
        assert loop is not None and isinstance(statement.iter, cst.Call)
        start = 0
        if len(statement.iter.args) > 1:
            start = as_int(self.interp.eval(statement.iter.args[1].value, {}), "start")
        return start + index - (loop.start or 0)

    def _fallback(self, op: Op) -> None:
        """Every name the op writes takes the shape of its first sized input."""
        shape: Tensor | None = None
        for name in op.reads:
            value = self.frame.get(name)
            if isinstance(value, Tensor):
                shape = value
                break
        shape = shape or self.last_activation
        written: object = Opaque("unsized") if shape is None else Tensor(shape.shape)
        for name in op.writes:
            self.frame[name] = written  # one tensor: several names of it count once
        if shape is not None:
            self.last_activation = shape

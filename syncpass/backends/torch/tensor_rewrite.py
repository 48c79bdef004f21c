"""``syncpass rewrite --strategy tensor --tp N`` for torch: plan what the source can carry,
then write it (the eager style: the model's own forwards, changed where a collective goes).

1. In a guarded child, the example's model runs once under the recorder
   (:func:`~syncpass.backends.torch.tensor_record.record_tensor_shapes`): the tensor graph,
   and for each reshape where a split of ``N`` blocks lands.
2. The plan is made with each op restricted to the layouts the rewrite can write
   (:data:`WRITABLE`), without sequence parallelism; then checked against the source
   (:func:`check_plan`). Every op of one source site (a line run by every layer) must take
   one layout; every collective must be a conjugate function of the runtime placed on a
   line of its own; every reshape of a split value must have a size argument to divide.
   What fails is taken out of the op's allowed layouts, with the reason, and the plan is
   made again, until the plan is one the source can carry (at worst: everything
   replicated). The reasons are the report's notes.
3. The source gets one line per collective (``x = reduce_from_tensor_parallel_region(x)``
   with a one-line comment), ``// tp_size()`` on the size arguments of split reshapes,
   the runtime's import, and after the last statement ``TENSOR_PARALLEL_LAYOUT`` (what
   :func:`~syncpass.backends.torch.tensor_parallel.shard_module` slices) and
   ``TENSOR_PARALLEL_COLLECTIVES`` (what ``syncpass run --tp`` checks each rank ran).

``--tp-style dtensor`` writes the same plan in the form torchtitan runs: no collective in
the source (the sizes are divided all the same), and after the model
``TENSOR_PARALLEL_PLAN``, torch's parallel styles by module for ``parallelize_module``
(``ColwiseParallel()``, ``ColwiseParallel(output_layouts=Replicate())`` where the plan
gathers a column-split layer's output, ``RowwiseParallel()``). Those styles place each
collective at a layer's edge, so the check refuses besides: a fused weight's chunks (one
``ColwiseParallel`` slices the weight in one block), a partial sum not reduced at a
row-split layer's output, a gather of anything but a column-split layer's output. Each
``ColwiseParallel`` layer sums the gradient of its input on its own: a value read by ``k``
column-split layers has ``k`` backward all-reduces where the eager form has one; the
plan's collectives and step say so (:func:`dtensor_collectives`).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from syncpass.backends.spec import TensorRewriteRequest, TensorRewriteResult
from syncpass.backends.torch.tensor_parallel import TRANSPOSED
from syncpass.backends.torch.tensor_record import OpShape
from syncpass.contracts.tensor import TensorGraph, TensorOp
from syncpass.core.errors import SyncpassError
from syncpass.core.units import num_bytes, seconds
from syncpass.plan.tensor_baselines import PLACEMENTS
from syncpass.plan.tensor_plan import TensorPlan
from syncpass.plan.tensor_planner import TensorRequest, link_for
from syncpass.plan.tensor_sites import (
    Refusal,
    collapse,
    per_reader_gradient_reduces,
    plan_the_source_carries,
    refusal_notes,
    site_key,
    site_medians,
    tail,
    writable_choices,
)
from syncpass.transformers.common import import_in_order, imports_laid_out
from syncpass.transformers.torch_tensor import (
    RUNTIME_MODULE,
    CallSite,
    StatementSite,
    TensorEdit,
    gather_tensor_sites,
    insert_tensor_collectives,
)

#: The layouts the rewrite writes, by kind (docs/tensor.md, "The rewrite").
WRITABLE: Mapping[str, tuple[str, ...]] = {
    "linear": ("replicated", "column", "row"),
    "elementwise": ("replicated", "split"),
    "reshape": ("replicated", "split", "partial"),
    "add": ("replicated", "split", "partial"),
    "attention": ("replicated", "heads"),
}
#: Reshapes that need no size argument changed when the split moves through them.
_NO_SIZES = {
    "transpose",
    "permute",
    "contiguous",
    "chunk",
    "flatten",
    "unsqueeze",
    "squeeze",
    # casts and copies: the same shape
    "to",
    "type_as",
    "float",
    "half",
    "bfloat16",
    "clone",
    "detach",
}
#: Reshapes by index, which the recorder keeps split only where each rank's slice indexed
#: as written gives its slice of the whole (``x[..., :half]``).
_INDEXED = {"getitem", "narrow"}
_SIZED = {"view", "reshape", "split"}
_COPY = "copy_to_tensor_parallel_region"
_REDUCE = "reduce_from_tensor_parallel_region"
_GATHER = "gather_from_tensor_parallel_region"
#: How a plan is written: ``eager`` (the conjugate functions in the forwards, weights sliced
#: by ``shard_module``) or ``dtensor`` (torch's parallel styles, for ``parallelize_module``).
STYLES = ("eager", "dtensor")
#: The parallel style each written layout becomes in the ``dtensor`` form.
_DTENSOR_STYLES = {
    "column": "ColwiseParallel()",
    "column-gathered": "ColwiseParallel(output_layouts=Replicate())",
    "row": "RowwiseParallel()",
}
_DTENSOR_MODULE = "torch.distributed.tensor.parallel"
#: The modules whose weight each form slices, by the recorded class name: ``nn.Linear``'s
#: ``(out, in)``; the eager form also Hugging Face's ``Conv1D`` (GPT-2's), ``(in, out)``,
#: written ``column transposed`` (DTensor's styles slice ``nn.Linear`` only).
_WEIGHTS = {"eager": ("Linear", "Conv1D"), "dtensor": ("Linear",)}
_TRANSPOSED = {"Conv1D"}


@dataclass(frozen=True)
class WrittenPlan:
    """A plan the source carries: the edits, the weights' layouts by module, the
    collectives a step runs per rank, and why ops stay replicated."""

    plan: TensorPlan
    edits: tuple[TensorEdit, ...]
    layouts: tuple[tuple[str, str], ...]
    counts: tuple[tuple[str, int], ...]
    refusals: tuple[Refusal, ...]


class _Source:
    """The model file's statements and calls, by line."""

    def __init__(self, text: str, path: Path) -> None:
        self.path = path.resolve()
        visitor = gather_tensor_sites(cst.parse_module(text))
        self.statements = visitor.statements
        self.calls = visitor.calls

    def line(self, op: TensorOp) -> int | None:
        if op.source is None:
            return None
        file, _, line = op.source.rpartition(":")
        if not line.isdigit() or Path(file).resolve() != self.path:
            return None
        return int(line)

    def statement(self, line: int) -> StatementSite | None:
        found = [s for s in self.statements if s.start <= line <= s.end]
        return min(found, key=lambda s: s.end - s.start) if found else None

    def calls_named(self, line: int, name: str) -> list[CallSite]:
        return [c for c in self.calls if c.start <= line <= c.end and c.name == name]


def _callee_of(op: TensorOp, shape: OpShape | None) -> str:
    """The name the op's call has in the source: a submodule's attribute, a function's."""
    if op.module is not None:
        return op.module.rsplit(".", 1)[-1]
    return shape.function if shape is not None else ""


class _Checker:
    """Checks one plan against the source; collects refusals and, when none, the edits."""

    def __init__(
        self,
        graph: TensorGraph,
        shapes: Mapping[str, OpShape],
        source: _Source,
        plan: TensorPlan,
        style: str = "eager",
        tied: frozenset[str] = frozenset(),
    ) -> None:
        self.graph = graph
        self.tied = tied
        self.shapes = shapes
        self.source = source
        self.plan = plan
        self.style = style
        self.layout = {item.op: item for item in plan.layouts}
        self.dims: dict[str, int] = {}
        self.fused: dict[str, tuple[int, ...]] = {}  # a column-split linear's chunk sizes
        self.gathered: set[str] = set()  # column-split layers whose output is gathered
        self.refusals: list[Refusal] = []
        self.edits: dict[tuple[str, int, str, int], TensorEdit] = {}

    def refuse(self, op: str, reason: str) -> None:
        layout = self.layout[op].layout
        if layout != "replicated":
            self.refusals.append(Refusal(op, layout, reason))

    def ndim(self, op: str) -> int | None:
        shape = self.shapes.get(op)
        return shape.out_ndim if shape is not None else None

    def edit(self, edit: TensorEdit) -> None:
        self.edits.setdefault((edit.kind, edit.line, edit.name, edit.position), edit)

    # -- consistency: one layout per source site --------------------------------------

    def sites(self) -> None:
        groups: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
        for op in self.graph.ops:
            groups[site_key(op)].append(op.id)
        members: list[str]
        for members in groups.values():
            layouts = collections.Counter(self.layout[op].layout for op in members)
            if len(layouts) < 2:
                continue
            keep = layouts.most_common(1)[0][0]
            for member in members:
                if self.layout[member].layout != keep:
                    self.refuse(
                        member,
                        f"one line of source runs it for every layer; the others run {keep}",
                    )

    # -- split dimensions ---------------------------------------------------------------

    def splits(self) -> None:
        for op in self.graph.ops:
            item = self.layout[op.id]
            shape = self.shapes.get(op.id)
            if item.layout == "replicated" or shape is None:
                continue
            line = self.source.line(op)
            if op.kind == "linear" and item.layout == "column":
                self.sliced(op, shape)
                self.dims[op.id] = shape.out_ndim - 1
            elif op.kind == "linear" and item.layout == "row":
                self.sliced(op, shape)
                x = op.inputs[0]
                if self.dims.get(x) != (self.ndim(x) or 0) - 1:
                    self.refuse(op.id, "its input is not split on its features")
            elif op.kind in ("elementwise", "add") and item.layout == "split":
                self.elementwise(op, shape)
            elif op.kind == "reshape" and item.layout == "split":
                self.reshape(op, shape, line)
            elif op.kind == "attention" and item.layout == "heads":
                dims = {self.dims.get(name) for name in op.inputs}
                heads = shape.out_ndim - 3
                if dims != {heads}:
                    self.refuse(op.id, "q, k and v do not reach it split on their heads")
                self.dims[op.id] = heads

    def sliced(self, op: TensorOp, shape: OpShape) -> None:
        """A split linear's weight is a submodule's that the form slices: ``nn.Linear``'s,
        and in the eager form a weight stored ``(in, out)`` (Hugging Face's ``Conv1D``)."""
        if op.module is None or shape.function not in _WEIGHTS[self.style]:
            what = " or ".join(_WEIGHTS[self.style])
            self.refuse(op.id, f"only a submodule's weight ({what}) is sliced in this form")
        elif op.module in self.tied:
            self.refuse(
                op.id,
                "its weight is tied to another module's (an embedding's): slicing it would "
                "untie them",
            )

    def elementwise(self, op: TensorOp, shape: OpShape) -> None:
        """A split element-wise op: its split inputs split on one dimension (of its output),
        and every other input broadcast along it (a rotary table over the heads, a mask),
        so that no input needs a slice the source does not have."""
        split = {
            self.dims[name] + shape.out_ndim - (self.ndim(name) or 0)
            for name in op.inputs
            if name in self.dims
        }
        if len(split) != 1:
            self.refuse(op.id, "its inputs are not split on one dimension")
            return
        d = split.pop()
        if shape.joined_dim == d:
            self.refuse(op.id, "it joins its inputs along their split dimension")
            return
        broadcast = dict(shape.broadcast)
        whole = [name for name in op.inputs if name not in self.dims]
        if shape.constants:
            whole.append("")
        if any(d not in broadcast.get(name, ()) for name in whole):
            self.refuse(op.id, "it reads a tensor that is not split as its input is")
            return
        self.dims[op.id] = d

    def reshape(self, op: TensorOp, shape: OpShape, line: int | None) -> None:
        d = self.dims.get(op.inputs[0])
        if d is None:
            self.refuse(op.id, "its input's split is not known")
            return
        if line is None and shape.cut_dim == d:
            self.refuse(op.id, "its source is not in the model file")
            return
        if shape.cut_dim == d and line is not None:  # a fused weight's chunks: each split
            root = self.root_linear(op.inputs[0])
            if root is None:
                self.refuse(op.id, "it cuts a split value that no column-split linear made alone")
                return
            if self.style == "dtensor":
                self.refuse(
                    root,
                    f"its weight holds {shape.outputs} fused chunks, each to be sliced, and "
                    "ColwiseParallel slices a weight in one block (--tp-style eager writes it)",
                )
                return
            sizes = shape.chunk_sizes or (0,) * shape.outputs
            tp = self.plan.tp
            if any(size % tp for size in sizes):
                self.refuse(root, f"its fused chunks {sizes} do not each split over {tp} ranks")
                return
            self.fused[root] = sizes
            self.dims[op.id] = d
            if shape.function == "split":
                self.divide(op, line, 0)
            return
        moves = dict(shape.moves)
        if d not in moves:
            self.refuse(op.id, f"the split of dimension {d} does not survive {shape.function}")
            return
        self.dims[op.id] = moves[d]
        if shape.function in _NO_SIZES | _INDEXED or moves[d] in shape.inferred:
            return  # no size to divide: the call fits each rank's slice as written
        if line is None:
            self.refuse(op.id, "its source is not in the model file")
        elif shape.function in ("view", "reshape"):
            self.divide(op, line, moves[d])
        else:
            self.refuse(op.id, f"{shape.function} of a split value is not rewritten")

    def divide(self, op: TensorOp, line: int, position: int) -> None:
        name = self.shapes[op.id].function
        calls = self.source.calls_named(line, name)
        if len(calls) != 1:
            self.refuse(
                op.id, f"{len(calls)} calls of {name} on line {line}: which one is not clear"
            )
            return
        call = calls[0]
        if call.starred or position >= len(call.args):
            self.refuse(op.id, f"{name}'s sizes are not separate arguments")
            return
        text = call.args[position]
        if text.strip() == "-1":
            return
        if text.strip().startswith("(") and text.strip().endswith(")") and "*" in text:
            self.refuse(op.id, f"{name}'s sizes {text} are not separate items")
            return
        if ".shape" in text or ".size(" in text or "[" in text:
            self.refuse(op.id, f"its size {text} may be read from a split tensor")
            return
        self.edit(TensorEdit("divide", line, name=name, position=position))

    def root_linear(self, value: str) -> str | None:
        """The column-split linear a split value comes from through reshapes alone, when
        nothing else reads what lies between."""
        while True:
            op = self.graph.op(value)
            if op.kind == "linear" and self.layout[value].layout == "column":
                return value
            if op.kind != "reshape" or len(self.graph.consumers[value]) != 1:
                return None
            value = op.inputs[0]

    # -- collectives ----------------------------------------------------------------------

    def collectives(self) -> None:
        planned: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
        for item in self.plan.collectives:
            if item.within is not None:
                self.refuse(item.within, "it runs collectives inside itself")
                continue
            planned[item.value].append((item.direction, item.kind))
        for op in self.graph.ops:
            self.value(op, sorted(planned.get(op.id, [])))

    def value(self, op: TensorOp, planned: list[tuple[str, str]]) -> None:
        made = self.layout[op.id].output
        reads: list[tuple[str, str, bool]] = []  # reader, state, partial gradient
        for reader in self.graph.consumers[op.id]:
            item = self.layout[reader]
            rop = self.graph.op(reader)
            for name, state in zip(rop.inputs, item.reads, strict=True):
                if name == op.id:
                    partial = rop.kind == "linear" and item.layout == "column"
                    reads.append((reader, state, partial))
        if op.id in self.graph.outputs:
            reads.append(("<output>", "R", False))
        if not reads:
            return
        states = {state for _, state, _ in reads}
        partials = {p for _, _, p in reads}
        # One line after the value serves every reader: the eager form's gradient
        # all-reduce must serve all of them or none; the dtensor form's is each
        # ColwiseParallel reader's own.
        if len(states) > 1 or (len(partials) > 1 and self.style == "eager"):
            for reader, state, p in reads:
                if reader != "<output>" and (state != "R" or p):
                    self.refuse(reader, f"{op.id} is read in several states; one line serves one")
            return
        target = states.pop()
        copy = any(partials)
        wanted: list[tuple[str, str]] = []
        call: str | None = None
        if made == "P" and target == "R":
            call, wanted = _REDUCE, [("forward", "all-reduce")]
        elif made == "C" and target == "R":
            call, wanted = _GATHER, [("forward", "all-gather")]
        elif made != target:
            self.refuse(op.id, f"{made} -> {target} is not written yet")
            for reader, _, _ in reads:
                if reader != "<output>":
                    self.refuse(reader, f"it reads {op.id} {target}, made {made}")
            return
        if copy:
            wanted.append(("backward", "all-reduce"))
        if sorted(wanted) != planned:
            # The plan sums the gradient its column-split readers send back otherwise than
            # the runtime's functions do (a reduce-scatter into a split value): those
            # readers are refused, not the value's split, which other readers (a row-split
            # layer) may read as it is.
            partial_readers = [reader for reader, _, p in reads if p]
            for reader in partial_readers:
                self.refuse(
                    reader,
                    f"the plan sums the gradient it sends {op.id} by {planned}; the runtime's "
                    f"functions would run {wanted}",
                )
            if not partial_readers:
                self.refuse(
                    op.id, f"the runtime's functions would run {wanted}, the plan {planned}"
                )
            return
        if not wanted:
            return
        self.place(op, call, copy, [reader for reader, _, _ in reads])

    def place(self, op: TensorOp, call: str | None, copy: bool, readers: list[str]) -> None:
        if self.style == "dtensor":
            self.place_in_style(op, call)
            return
        line = self.source.line(op)
        statement = self.source.statement(line) if line is not None else None
        shape = self.shapes.get(op.id)
        after = (
            statement is not None
            and statement.target is not None
            and statement.value == _callee_of(op, shape)
        )
        if after and statement is not None and line is not None:
            name = statement.target
            if call is not None:
                dim = ""
                if call == _GATHER:
                    dim = f", dim={self.dims[op.id] - (self.ndim(op.id) or 0)}"
                code = f"# {self.comment(op, 'forward')}\n{name} = {call}({name}{dim})"
                self.edit(TensorEdit("after", line, code))
            if copy:
                code = f"# {self.comment(op, 'backward')}\n{name} = {_COPY}({name})"
                self.edit(TensorEdit("after", line, code, name=_COPY))
            return
        if (
            call is not None
            and not copy
            and statement is not None
            and statement.returns
            and line is not None
            and statement.value == _callee_of(op, shape)
        ):  # return self.proj(x): the returned value goes through the collective
            dim = ""
            if call == _GATHER:
                dim = f", dim={self.dims[op.id] - (self.ndim(op.id) or 0)}"
            code = f"# {self.comment(op, 'forward')}\n{call}(__value__{dim})"
            self.edit(TensorEdit("return", line, code, name=call))
            return
        if call is not None:
            self.refuse(op.id, self.no_line_reason(op, line))
            for reader in readers:
                if reader != "<output>":
                    self.refuse(reader, f"{op.id}'s collective has no line of its own")
            return
        # A gradient's all-reduce alone: before the column-split readers' line.
        lines = {self.source.line(self.graph.op(reader)) for reader in readers}
        tails = {_callee_of(self.graph.op(r), self.shapes.get(r)) for r in readers}
        if len(lines) == 1 and None not in lines and len(tails) == 1:
            rline = lines.pop()
            assert rline is not None
            calls = self.source.calls_named(rline, tails.pop())
            if len(calls) == 1 and calls[0].args and calls[0].args[0].isidentifier():
                name = calls[0].args[0]
                code = f"# {self.comment(op, 'backward')}\n{name} = {_COPY}({name})"
                self.edit(TensorEdit("before", rline, code, name=_COPY))
                return
        for reader in readers:
            self.refuse(reader, f"no line of its own to sum the gradient of {op.id} on")

    def no_line_reason(self, op: TensorOp, line: int | None) -> str:
        """Why the collective after ``op`` has no line: its code is in another file (a
        package's layer: the dtensor form splits it without a line), or its value is not
        assigned on a line of its own."""
        if line is None and op.source is not None:
            file = op.source.rpartition(":")[0]
            return (
                f"its code is in {file}, not in the file rewritten (--tp-style dtensor splits "
                "such a layer without changing its code)"
            )
        return "its value is not assigned to a name on a line of its own"

    def place_in_style(self, op: TensorOp, call: str | None) -> None:
        """The ``dtensor`` form: a collective is a parallel style's, at a layer's edge.
        A gradient's all-reduce is each column-split reader's ``ColwiseParallel``."""
        layout = self.layout[op.id].layout
        linear = op.kind == "linear" and op.module is not None
        if call == _REDUCE and not (linear and layout == "row"):
            self.refuse(
                op.id,
                "DTensor's styles all-reduce a partial sum only at a RowwiseParallel layer's "
                "output (--tp-style eager writes it here)",
            )
        elif call == _GATHER:
            if linear and layout == "column":
                self.gathered.add(op.id)
            else:
                self.refuse(
                    op.id,
                    "DTensor's styles gather only a ColwiseParallel layer's output "
                    "(--tp-style eager writes it here)",
                )

    def comment(self, op: TensorOp, direction: str) -> str:
        """What crosses and why, in a few words, with its predicted size and time."""
        item = next(
            (c for c in self.plan.collectives if c.value == op.id and c.direction == direction),
            None,
        )
        if item is None:  # pragma: no cover - placed only for planned collectives
            return "syncpass tensor"
        name = tail(op)
        figures = f"{num_bytes(item.bytes)}, {seconds(item.time_s)} predicted"
        if direction == "backward":
            readers = ", ".join(sorted({tail(self.graph.op(r)) for r in item.readers}))
            return (
                f"syncpass tensor: all-reduce of its gradient in the backward ({readers} "
                f"column-split); {figures}"
            )
        made = self.layout[op.id].layout
        what = "partial sums" if item.kind == "all-reduce" else "slices"
        how = f"{made}-split" if made in ("row", "column") else "split"
        return f"syncpass tensor: {item.kind} of {name}'s {what} ({how}); {figures}"


def check_plan(
    graph: TensorGraph,
    shapes: Mapping[str, OpShape],
    source: _Source,
    plan: TensorPlan,
    style: str = "eager",
    tied: frozenset[str] = frozenset(),
) -> tuple[list[Refusal], _Checker]:
    """What the source cannot carry of ``plan`` in ``style`` (``tied``: the modules whose
    weight another module shares); the checker holds the edits when nothing."""
    checker = _Checker(graph, shapes, source, plan, style, tied)
    checker.sites()
    if not checker.refusals:
        checker.splits()
    if not checker.refusals:
        checker.collectives()
    return checker.refusals, checker


def written_plan(
    graph: TensorGraph,
    shapes: Mapping[str, OpShape],
    text: str,
    path: Path,
    plan_with: TensorRequest,
    plan: dict[str, object],
    style: str = "eager",
    tied: frozenset[str] = frozenset(),
    placement: str = "syncpass",
) -> WrittenPlan:
    """Plan ``graph`` as ``plan_with`` asks, within what the source of ``path`` carries
    written in ``style`` (:data:`STYLES`). ``placement`` ``megatron``: each op may take
    only Megatron-LM's layout for it (:func:`megatron_layouts`) where the rewrite writes
    that layout, else runs replicated; the plan then only chooses how values cross."""
    source = _Source(text, path)
    graph = site_medians(graph)
    allowed = writable_choices(graph, WRITABLE, placement)
    made, refusals, checker = plan_the_source_carries(
        graph,
        plan_with,
        plan,
        allowed,
        lambda made: check_plan(graph, shapes, source, made, style, tied),
    )
    layouts: dict[str, str] = {}
    for item in made.layouts:
        op = graph.op(item.op)
        if op.kind == "linear" and item.layout in ("column", "row") and op.module is not None:
            layouts[op.module] = item.layout + _chunks_code(checker.fused.get(op.id, ()))
            shape = shapes.get(op.id)
            if shape is not None and shape.function in _TRANSPOSED:
                layouts[op.module] += TRANSPOSED
            if op.id in checker.gathered:
                layouts[op.module] = "column-gathered"
    if style == "dtensor":
        made = dtensor_collectives(graph, made)
    counts = collections.Counter(
        f"{item.direction} {item.kind}" for item in made.collectives if item.within is None
    )
    return WrittenPlan(
        made,
        tuple(checker.edits.values()),
        tuple(collapse(layouts).items()),
        tuple(sorted(counts.items())),
        tuple(refusals),
    )


def _chunks_code(sizes: tuple[int, ...]) -> str:
    """A fused weight's chunks in its layout: ``:3`` for three equal ones, ``:32+16+16``
    for chunks of unequal sizes (grouped-query q, k, v), nothing for one."""
    if len(sizes) < 2:
        return ""
    if len(set(sizes)) == 1:
        return f":{len(sizes)}"
    return ":" + "+".join(str(size) for size in sizes)


def dtensor_collectives(graph: TensorGraph, plan: TensorPlan) -> TensorPlan:
    """``plan`` as DTensor's styles run it: each ``ColwiseParallel`` layer all-reduces the
    gradient of its input on its own (:func:`per_reader_gradient_reduces`)."""
    return per_reader_gradient_reduces(graph, plan, "ColwiseParallel layers")


def _footer(model: str, tp: int, written: WrittenPlan, style: str) -> str:
    if style == "dtensor":
        return _dtensor_footer(model, tp, written)
    lines = [
        "",
        "",
        f"# syncpass tensor: {model} planned for {tp} ranks; run it with syncpass run --tp N.",
        "# shard_module(model, TENSOR_PARALLEL_LAYOUT) slices these weights after the model is",
        "# built or a checkpoint loaded (column: 1/tp of the output features, column:K of each",
        "# of K fused chunks, column:A+B+C of chunks of those sizes; row: of the input",
        "# features, the bias on rank 0; transposed: of a weight stored (in, out)).",
        "TENSOR_PARALLEL_LAYOUT = {",
        *(f"    {json.dumps(name)}: {json.dumps(layout)}," for name, layout in written.layouts),
        "}",
        "# The collectives one training step runs on each rank, as planned.",
        "TENSOR_PARALLEL_COLLECTIVES = {",
        *(f"    {json.dumps(kind)}: {count}," for kind, count in written.counts),
        "}",
    ]
    return "\n".join(lines).replace("{\n}", "{}") + "\n"


def _dtensor_footer(model: str, tp: int, written: WrittenPlan) -> str:
    sizes = (
        [
            "# The sizes divided by tp_size() above read the default process group's size; with",
            "# a 2-D mesh, set_tensor_parallel_group(mesh[NAME].get_group()) first.",
        ]
        if any(edit.kind == "divide" for edit in written.edits)
        else []
    )
    lines = [
        "",
        "",
        f"# syncpass tensor: {model} planned for {tp} ranks as DTensor parallel styles; run it",
        "# with syncpass run --tp N. parallelize_module(model, mesh, TENSOR_PARALLEL_PLAN), mesh",
        "# a 1-D DeviceMesh of the tensor-parallel ranks (of a 2-D one: mesh[NAME]), splits",
        "# these layers after the model is built or a checkpoint loaded.",
        *sizes,
        "TENSOR_PARALLEL_PLAN = {",
        *(
            f"    {json.dumps(name)}: {_DTENSOR_STYLES[layout]},"
            for name, layout in written.layouts
        ),
        "}",
        "# The collectives one training step runs on each rank, as planned.",
        "TENSOR_PARALLEL_COLLECTIVES = {",
        *(f"    {json.dumps(kind)}: {count}," for kind, count in written.counts),
        "}",
    ]
    return "\n".join(lines).replace("{\n}", "{}") + "\n"


def _imports(written: WrittenPlan, style: str) -> list[tuple[str, str]]:
    """What the written file imports: the runtime's functions it calls, and in the
    ``dtensor`` form the parallel styles its plan names."""
    names = {
        name
        for edit in written.edits
        for name in (_COPY, _REDUCE, _GATHER, "tp_size")
        if name in edit.code or (edit.kind == "divide" and name == "tp_size")
    }
    found = [(RUNTIME_MODULE, name) for name in sorted(names)]
    if style == "dtensor":
        layouts = {layout for _, layout in written.layouts}
        if layouts & {"column", "column-gathered"}:
            found.append((_DTENSOR_MODULE, "ColwiseParallel"))
        if "row" in layouts:
            found.append((_DTENSOR_MODULE, "RowwiseParallel"))
        if "column-gathered" in layouts:
            found.append(("torch.distributed.tensor", "Replicate"))
    return found


def _tied_modules(model: object) -> frozenset[str]:
    """The modules of ``model`` that share a parameter with another module (a head tied to
    the embedding): slicing one's weight would untie them."""
    from torch import nn

    assert isinstance(model, nn.Module)
    owners: dict[int, set[str]] = collections.defaultdict(set)
    for name, module in model.named_modules():
        for parameter in module.parameters(recurse=False):
            owners[id(parameter)].add(name)
    return frozenset(name for names in owners.values() if len(names) > 1 for name in names)


def _record_example(
    request: tuple[str, int, float | None],
) -> tuple[TensorGraph, dict[str, OpShape], str, frozenset[str]]:
    """In the guarded child: the example's tensor graph and shapes, its model's class and
    its modules that share a weight."""
    from syncpass.backends.torch.example import load_example
    from syncpass.backends.torch.tensor_record import record_tensor_shapes

    spec, tp, flops = request
    example = load_example(spec)
    graph, shapes = record_tensor_shapes(
        example.model,
        example.args,
        tp,
        loss=example.loss_fn,
        targets=example.target,
        flops_per_s=flops,
    )
    return graph, shapes, type(example.model).__name__, _tied_modules(example.model)


def rewrite_tensor(request: TensorRewriteRequest) -> TensorRewriteResult:
    """The torch backend's tensor rewrite hook."""
    from syncpass.backends.torch.run import PRELOAD
    from syncpass.contracts.hardware import load_profile
    from syncpass.runtime.example import example_for_file, example_location
    from syncpass.runtime.guard import call_guarded

    path = Path(request.file)
    hardware = load_profile(request.hardware or "cpu-gloo-loopback").hardware
    if request.style not in STYLES:
        raise SyncpassError(f"--tp-style {request.style}: use one of {', '.join(STYLES)}")
    if request.placement not in PLACEMENTS:
        raise SyncpassError(
            f"--tp-placement {request.placement}: use one of {', '.join(PLACEMENTS)}"
        )
    if request.tp > 1 and request.tp > (hardware.devices or request.tp):
        raise SyncpassError(
            f"--tp {request.tp} needs {request.tp} devices and the hardware has "
            f"{hardware.devices}; name other hardware with --hardware (e.g. nvlink-8xh100)"
        )
    cst.parse_module(request.text)  # a syntax error is reported before any user code runs
    graph, shapes, model, tied = call_guarded(
        _record_example,
        (example_for_file(path, request.example), request.tp, hardware.flops_per_s),
        what="the example",
        timeout_s=request.timeout_s,
        preload=PRELOAD,
        location=example_location(path, request.example),
    )
    written = written_plan(
        graph,
        shapes,
        request.text,
        path,
        TensorRequest(request.tp),
        {"link": link_for(hardware), "hardware": hardware.name, "model": model},
        request.style,
        tied,
        request.placement,
    )
    imports = _imports(written, request.style)
    module = cst.parse_module(request.text)
    # Written even where the plan splits nothing: the file then runs replicated on every
    # rank (syncpass run --tp N measures it beside another placement).
    footer = _footer(model, request.tp, written, request.style)
    result, missed = insert_tensor_collectives(module, written.edits, footer, imports)
    if missed:
        raise SyncpassError(
            f"{len(missed)} planned change(s) found no site (line {missed[0].line}); "
            "nothing was written",
            request.file,
        )
    for name in dict.fromkeys(module for module, _ in imports):
        result = import_in_order(result, name)
    code = imports_laid_out(result.code, [module for module, _ in imports])
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError as error:  # pragma: no cover - built from parsed snippets
        raise SyncpassError(f"the rewritten source does not parse: {error}", request.file) from None
    lines = sum(edit.kind != "divide" for edit in written.edits)
    return TensorRewriteResult(code, written.plan, refusal_notes(written.refusals), lines)


__all__: Sequence[str] = (
    "STYLES",
    "WRITABLE",
    "check_plan",
    "dtensor_collectives",
    "rewrite_tensor",
    "site_medians",
    "written_plan",
)

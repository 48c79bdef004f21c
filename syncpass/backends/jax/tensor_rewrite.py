"""``syncpass rewrite --backend jax --strategy tensor --tp N``: a tensor-parallel plan written
into a Flax model, for :func:`jax.shard_map` over one mesh axis (docs/jax.md, "Tensor
parallelism").

1. In a guarded child, the example's model is traced once
   (:func:`~syncpass.backends.jax.tensor_record.record_jax_tensor_graph`): its tensor
   graph, and the module behind each op.
2. The plan is made with each op restricted to what the rewrite writes (:data:`WRITABLE`:
   ``Dense`` layers column or row, point-wise ops and sums split), without sequence
   parallelism, and checked against the source (:func:`check_flax_plan`): a split ``Dense``
   must be built in its owner's ``setup`` as ``self.NAME = nn.Dense(FEATURES, ...)`` (a
   column split divides ``FEATURES``) and called once on its line as ``self.NAME(x)``;
   every layer's op of one line takes one layout; a partial sum is all-reduced only at a
   row-split layer's output, a split value gathered only at a column-split layer's output,
   and never where a split reader reads it too; a split op reads split values, not
   replicated ones it would have to slice. What fails is taken out of the op's choices and
   the plan made again (:func:`~syncpass.plan.tensor_sites.plan_the_source_carries`).
3. The source gets each collective around the call of its layer, with a one-line comment
   above the statement: ``reduce_from_tensor_parallel_region(self.proj(h))`` after a
   row-split layer, ``gather_from_tensor_parallel_region(self.head(x))`` after a
   column-split one the plan gathers, ``self.fc(copy_to_tensor_parallel_region(h))`` where
   the backward sums the gradient of a column-split layer's input; ``// tp_size()`` on a
   column-split layer's features; the runtime's import; and after the last statement
   ``TENSOR_PARALLEL_LAYOUT`` (what :func:`~syncpass.backends.jax.tensor_parallel.shard_variables`
   splits) and ``TENSOR_PARALLEL_COLLECTIVES`` (what ``syncpass run --backend jax --tp``
   checks the step's program holds).

JAX runs the backward of each function itself (the transpose of ``psum`` and of a value
made varying), so the file needs no backward code. A value read by ``k`` column-split
layers gets ``k`` backward all-reduces, one per ``copy_to`` (the plan counts them).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from syncpass.backends.jax.tensor_parallel import TRANSPOSED
from syncpass.backends.jax.tensor_record import ATTENTION_CLASSES, JaxTensorRecording, ModuleCall
from syncpass.backends.spec import TensorRewriteRequest, TensorRewriteResult
from syncpass.contracts.tensor import TensorGraph, TensorOp
from syncpass.core.errors import SyncpassError
from syncpass.core.units import num_bytes, seconds
from syncpass.plan.tensor_baselines import PLACEMENTS
from syncpass.plan.tensor_plan import PlannedCollective, TensorPlan
from syncpass.plan.tensor_planner import TensorRequest, link_for
from syncpass.plan.tensor_sites import (
    Refusal,
    collapse,
    per_reader_gradient_reduces,
    plan_the_source_carries,
    refusal_notes,
    site_medians,
    tail,
    writable_choices,
)
from syncpass.transformers.common import import_in_order, imports_laid_out
from syncpass.transformers.jax_tensor import (
    RUNTIME_MODULE,
    FlaxCallSite,
    FlaxConstruction,
    FlaxEdit,
    gather_flax_sites,
    insert_flax_collectives,
)

#: The layouts the rewrite writes, by kind.
WRITABLE: Mapping[str, tuple[str, ...]] = {
    "linear": ("replicated", "column", "row"),
    "elementwise": ("replicated", "split"),
    "add": ("replicated", "split"),
    "attention": ("replicated", "heads"),
}
#: How the ops of a Flax attention module split together: by heads, or not at all.
_BY_HEADS = {"query": "column", "key": "column", "value": "column", "out": "row", "": "heads"}
_COPY = "copy_to_tensor_parallel_region"
_REDUCE = "reduce_from_tensor_parallel_region"
_GATHER = "gather_from_tensor_parallel_region"


def tail_of(path: str) -> str:
    """A module path's last name (``blocks_0.attn`` -> ``attn``)."""
    return path.rsplit(".", 1)[-1]


def flax_family(name: str) -> str:
    """Ops of repeated layers share a family (``blocks_3.fc`` -> ``blocks_*.fc``, Flax's
    names of list members and of unnamed submodules)."""
    return re.sub(r"_\d+(?=\.|$|#)", "_*", re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name))


def flax_site_key(op: TensorOp) -> tuple[str, str, str]:
    """Ops of one source site: every layer's op at one place of one line. One line makes
    many primitives (an inlined ``gelu``), numbered in each layer's scope in order
    (``blocks_0.mul#2``), so the place is the op's family with its number."""
    return (op.source or op.id, op.kind, flax_family(op.id))


@dataclass(frozen=True)
class WrittenFlaxPlan:
    """A plan the source carries: the edits, the weights' layouts by module, the
    collectives a step runs on each device, and why ops stay replicated."""

    plan: TensorPlan
    edits: tuple[FlaxEdit, ...]
    layouts: tuple[tuple[str, str], ...]
    counts: tuple[tuple[str, int], ...]
    refusals: tuple[Refusal, ...]


class _FlaxChecker:
    """What of one plan a Flax source carries, and the edits that write it."""

    def __init__(
        self,
        recording: JaxTensorRecording,
        graph: TensorGraph,
        constructions: Sequence[FlaxConstruction],
        calls: Sequence[FlaxCallSite],
        plan: TensorPlan,
    ) -> None:
        self.recording = recording
        self.graph = graph
        self.constructions = constructions
        self.calls = calls
        self.plan = plan
        self.layout = {item.op: item for item in plan.layouts}
        self.refusals: list[Refusal] = []
        self.edits: dict[tuple[str, int, str, str], FlaxEdit] = {}

    def refuse(self, op: str, reason: str) -> None:
        layout = self.layout[op].layout
        if layout != "replicated" and not any(
            r.op == op and r.layout == layout for r in self.refusals
        ):
            self.refusals.append(Refusal(op, layout, reason))

    def edit(self, edit: FlaxEdit) -> None:
        self.edits.setdefault((edit.kind, edit.line, edit.attribute, edit.function), edit)

    def _line(self, op: TensorOp) -> int | None:
        if op.source is None:
            return None
        file, _, line = op.source.rpartition(":")
        return int(line) if file == self.recording.model_file and line.isdigit() else None

    def container(self, op: TensorOp) -> ModuleCall | None:
        """The Flax attention module ``op`` is part of (its projections and its own work)."""
        parts = (op.module or "").split(".")
        for end in range(len(parts), 0, -1):
            call = self.recording.module(".".join(parts[:end]))
            if call is not None and call.cls in ATTENTION_CLASSES:
                return call
        return None

    def call_site(self, op: TensorOp) -> FlaxCallSite | None:
        """The one ``self.NAME(...)`` call of ``op``'s layer on its line (of its attention
        module, for one of its parts), if one."""
        call = self.container(op) or self.recording.module(op.module or "")
        line = self._line(op)
        if call is None or line is None or call.owner_cls is None:
            return None
        attribute = call.path.rsplit(".", 1)[-1]
        found = [
            site
            for site in self.calls
            if site.cls == call.owner_cls
            and site.attribute == attribute
            and site.start <= line <= site.end
        ]
        return found[0] if len(found) == 1 else None

    def construction(self, op: TensorOp) -> FlaxConstruction | None:
        call = self.container(op) or self.recording.module(op.module or "")
        if call is None:
            return None
        attribute = call.path.rsplit(".", 1)[-1]
        found = [
            site
            for site in self.constructions
            if site.cls == call.owner_cls and site.attribute == attribute
        ]
        return found[0] if len(found) == 1 else None

    def sites(self) -> None:
        """Every layer's op of one line takes one layout."""
        groups: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
        for op in self.graph.ops:
            groups[flax_site_key(op)].append(op.id)
        for members in groups.values():
            layouts = {self.layout[member].layout for member in members}
            if len(layouts) > 1:
                for member in members:
                    self.refuse(
                        member,
                        "one line of source runs every layer's op, and the plan split them "
                        f"differently ({', '.join(sorted(layouts))})",
                    )

    def splits(self) -> None:
        """Split layers are ``Dense`` layers built and called where the rewrite can change
        them, and split ops read split values."""
        for op in self.graph.ops:
            item = self.layout[op.id]
            if item.layout == "replicated":
                continue
            container = self.container(op)
            if container is not None:
                self.by_heads(op, container)
            elif op.kind == "linear":
                self.linear(op, item.layout)
            if item.layout in ("row", "split", "heads"):
                for name in op.inputs:
                    if self.layout[name].output != "C":
                        self.refuse(
                            op.id,
                            f"it reads {name}, which is whole on every device; the rewrite "
                            "does not slice a replicated value",
                        )

    def by_heads(self, op: TensorOp, container: ModuleCall) -> None:
        """A part of a Flax attention module splits only as the whole module splits by
        heads (q, k, v by columns, its work by heads, ``out`` by rows): what the module's
        ``num_heads`` and ``qkv_features`` divided by ``tp_size()`` make it compute."""
        prefix = container.path + "."
        parts = {
            (name.module or "")[len(prefix) :] if name.module != container.path else "": name.id
            for name in self.graph.ops
            if name.module == container.path or (name.module or "").startswith(prefix)
        }
        wrong = [
            part for part, layout in _BY_HEADS.items()
            if part not in parts or self.layout[parts[part]].layout != layout
        ]  # fmt: skip
        if wrong:
            self.refuse(
                op.id,
                f"{container.cls} splits only by heads as a whole (query, key, value by "
                "columns, out by rows), which the plan did not choose for "
                + ", ".join(part or "its attention" for part in wrong),
            )
            return
        if self.call_site(op) is None:
            self.refuse(op.id, f"no single call self.{tail_of(container.path)}(...) on its line")
            return
        built = self.construction(op)
        if built is None or built.callee not in ATTENTION_CLASSES:
            self.refuse(
                op.id,
                f"{container.owner_cls}.setup does not build self.{tail_of(container.path)} "
                f"as nn.{container.cls}(...), where the rewrite divides its heads",
            )
            return
        query = self.graph.op(parts["query"])
        self.edit(FlaxEdit("heads", built.line, built.attribute, features=query.in_features or 0))

    def linear(self, op: TensorOp, layout: str) -> None:
        call = self.recording.module(op.module or "")
        if call is None:  # pragma: no cover - a linear is a module's call
            self.refuse(op.id, "it is no module's call")
            return
        if self.call_site(op) is None:
            self.refuse(
                op.id,
                f"no single call self.{tail(op)}(...) on its line "
                f"({op.where()}) to put a collective around",
            )
            return
        if layout == "column":
            built = self.construction(op)
            if built is None or not built.has_features or built.callee != call.cls:
                how = (
                    f"it is built by {built.callee}(...), not {call.cls}(...)"
                    if built is not None and built.callee != call.cls
                    else f"{call.owner_cls}.setup does not build it once as "
                    f"self.{tail(op)} = {call.cls}(FEATURES, ...)"
                )
                self.refuse(
                    op.id, f"{how}, where the rewrite would divide its features by tp_size()"
                )
                return
            self.edit(FlaxEdit("divide", built.line, built.attribute))

    def collectives(self) -> None:
        for item in self.plan.collectives:
            if item.within is not None:
                continue
            op = self.graph.op(item.value)
            made = self.layout[op.id].layout
            if item.direction == "forward" and item.kind == "all-reduce" and made == "row":
                self.around(op, item, _REDUCE)
            elif item.direction == "forward" and item.kind == "all-gather" and made == "column":
                split_readers = [
                    reader
                    for reader in self.graph.consumers[op.id]
                    if self.layout[reader].layout != "replicated"
                ]
                if split_readers:
                    self.refuse(
                        op.id,
                        f"its output is read split ({split_readers[0]}) and whole; one call "
                        "cannot give both",
                    )
                else:
                    self.around(op, item, _GATHER)
            elif (
                item.direction == "backward"
                and item.kind == "all-reduce"
                and made in ("replicated", "split", "column", "row")
            ):
                for reader in item.readers:
                    self.copy(self.graph.op(reader), item)
            else:
                self.refuse(
                    op.id,
                    f"its {item.direction} {item.kind} is not one of the rewrite's calls "
                    "(an all-reduce after a row-split Dense, a gather after a column-split "
                    "one, an all-reduce of a column-split Dense's input gradient)",
                )

    def around(self, op: TensorOp, item: PlannedCollective, function: str) -> None:
        site = self.call_site(op)
        if site is None:  # refused by linear() already
            return
        what = "partial sums" if item.kind == "all-reduce" else "slices"
        layout = self.layout[op.id].layout
        comment = (
            f"syncpass tensor: {item.kind} of {tail(op)}'s {what} ({layout}-split); "
            f"{num_bytes(item.bytes)}, {seconds(item.time_s)}"
        )
        self.edit(FlaxEdit("wrap", site.start, site.attribute, function, comment))

    def copy(self, reader: TensorOp, item: PlannedCollective) -> None:
        if reader.kind != "linear" or self.layout[reader.id].layout != "column":
            self.refuse(
                reader.id,
                "its input's gradient is summed in the backward only at a column-split Dense",
            )
            return
        site = self.call_site(reader)
        if site is None:
            return
        if site.positional < 1:
            self.refuse(reader.id, f"self.{tail(reader)}(...) has no positional input to wrap")
            return
        container = self.container(reader)
        name = tail(reader) if container is None else tail_of(container.path)
        split = tail(reader) if container is None else "query, key, value"
        comment = (
            f"syncpass tensor: backward all-reduce of {name}'s input gradient "
            f"({split} column-split); {num_bytes(item.bytes)}, {seconds(item.time_s)}"
        )
        self.edit(FlaxEdit("wrap-argument", site.start, site.attribute, _COPY, comment))


def check_flax_plan(
    recording: JaxTensorRecording,
    graph: TensorGraph,
    constructions: Sequence[FlaxConstruction],
    calls: Sequence[FlaxCallSite],
    plan: TensorPlan,
) -> tuple[list[Refusal], _FlaxChecker]:
    """What the source cannot carry of ``plan``; the checker holds the edits when nothing."""
    checker = _FlaxChecker(recording, graph, constructions, calls, plan)
    checker.sites()
    if not checker.refusals:
        checker.splits()
    if not checker.refusals:
        checker.collectives()
    return checker.refusals, checker


def written_flax_plan(
    recording: JaxTensorRecording,
    text: str,
    plan_with: TensorRequest,
    plan: Mapping[str, object],
    placement: str = "syncpass",
) -> WrittenFlaxPlan:
    """Plan the recording's graph as ``plan_with`` asks, within what ``text`` carries;
    ``placement`` ``megatron``: each op only Megatron-LM's layout for it, where written."""
    constructions, calls = gather_flax_sites(cst.parse_module(text))
    graph = site_medians(recording.graph, flax_site_key)
    allowed = writable_choices(graph, WRITABLE, placement)
    made, refusals, checker = plan_the_source_carries(
        graph,
        plan_with,
        plan,
        allowed,
        lambda made: check_flax_plan(recording, graph, constructions, calls, made),
    )
    layouts = {
        op.module: item.layout + (TRANSPOSED if op.module in recording.transposed else "")
        for item in made.layouts
        if (op := graph.op(item.op)).kind == "linear"
        and item.layout in ("column", "row")
        and op.module is not None
    }
    # JAX makes a replicated input varying at each column-split projection that reads it
    # (an explicit copy or its own): one backward all-reduce per projection.
    made = per_reader_gradient_reduces(graph, made, "column-split projections", flax_family)
    counts = collections.Counter(
        f"{item.direction} {item.kind}" for item in made.collectives if item.within is None
    )
    return WrittenFlaxPlan(
        made,
        tuple(checker.edits.values()),
        tuple(collapse(layouts, flax_family).items()),
        tuple(sorted(counts.items())),
        refusals,
    )


def _footer(model: str, tp: int, written: WrittenFlaxPlan) -> str:
    lines = [
        "",
        "",
        f"# syncpass tensor: {model} planned for {tp} devices; run it with syncpass run "
        "--backend jax --tp N.",
        "# shard_variables(variables, TENSOR_PARALLEL_LAYOUT, tp) gives each weight's "
        "PartitionSpec",
        "# over the 'tp' mesh axis for jax.shard_map (column: of the output features; row: of",
        "# the input features, the bias on the first device).",
        "TENSOR_PARALLEL_LAYOUT = {",
        *(f"    {json.dumps(name)}: {json.dumps(layout)}," for name, layout in written.layouts),
        "}",
        "# The collectives one training step runs on each device, as planned.",
        "TENSOR_PARALLEL_COLLECTIVES = {",
        *(f"    {json.dumps(kind)}: {count}," for kind, count in written.counts),
        "}",
    ]
    return "\n".join(lines).replace("{\n}", "{}") + "\n"


def _imports(written: WrittenFlaxPlan) -> list[str]:
    names = {edit.function for edit in written.edits if edit.function}
    if any(edit.kind == "divide" for edit in written.edits):
        names.add("tp_size")
    return sorted(names)


def _record(request: tuple[str, str, float | None]) -> JaxTensorRecording:
    """In the guarded child: the example's tensor graph."""
    from syncpass.backends.jax.example import load_jax_example
    from syncpass.backends.jax.tensor_record import record_jax_tensor_graph

    spec, file, flops = request
    return record_jax_tensor_graph(load_jax_example(spec), Path(file), flops)


def rewrite_flax_tensor(request: TensorRewriteRequest) -> TensorRewriteResult:
    """The JAX backend's tensor rewrite hook."""
    from syncpass.contracts.hardware import load_profile
    from syncpass.runtime.example import example_for_file, example_location
    from syncpass.runtime.guard import call_guarded

    path = Path(request.file)
    hardware = load_profile(request.hardware or "cpu-gloo-loopback").hardware
    if request.style != "eager":
        raise SyncpassError(
            f"--tp-style {request.style}: --backend jax writes one form (shard_map with the "
            "collectives in the source); drop --tp-style"
        )
    if request.placement not in PLACEMENTS:
        raise SyncpassError(
            f"--tp-placement {request.placement}: use one of {', '.join(PLACEMENTS)}"
        )
    cst.parse_module(request.text)  # a syntax error is reported before any user code runs
    recording = call_guarded(
        _record,
        (example_for_file(path, request.example), str(path.resolve()), hardware.flops_per_s),
        what="the example",
        timeout_s=request.timeout_s,
        location=example_location(path, request.example),
    )
    model = Path(recording.model_file).stem
    root = next((call.cls for call in recording.modules if call.path == ""), model)
    written = written_flax_plan(
        recording,
        request.text,
        TensorRequest(request.tp),
        {"link": link_for(hardware), "hardware": hardware.name, "model": root},
        request.placement,
    )
    imports = _imports(written)
    module = cst.parse_module(request.text)
    result, missed = insert_flax_collectives(
        module, written.edits, _footer(root, request.tp, written), imports
    )
    if missed:
        raise SyncpassError(
            f"{len(missed)} planned change(s) found no site (line {missed[0].line}); "
            "nothing was written",
            request.file,
        )
    if imports:
        result = import_in_order(result, RUNTIME_MODULE)
    code = imports_laid_out(result.code, [RUNTIME_MODULE])
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError as error:  # pragma: no cover - built from parsed snippets
        raise SyncpassError(f"the rewritten source does not parse: {error}", request.file) from None
    lines = sum(edit.kind != "divide" for edit in written.edits)
    notes = refusal_notes(written.refusals, flax_family)
    return TensorRewriteResult(code, written.plan, notes, lines)


__all__: Sequence[str] = (
    "WRITABLE",
    "check_flax_plan",
    "flax_family",
    "rewrite_flax_tensor",
    "written_flax_plan",
)

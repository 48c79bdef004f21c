"""Measure a model's per-op costs by running an instrumented copy of its forward.

:func:`profile_costs` builds the op graph of the model's forward
(:mod:`syncpass.contracts.graph`), instruments a copy of the forward with a probe at
every op boundary (:mod:`syncpass.transformers.probes`), binds that copy to the
live model and runs forward, loss and backward. The user's file and class are
left untouched: the copy is executed in a copy of the module's namespace and
bound to the one model instance for the duration of the measurement.

What each op gets:

* ``compute_s``: forward wall time between the probe before the op and the
  probe after it (the probes' own time excluded), median over the timed runs.
  The last op also carries what follows it: the ``return`` expression and the
  loss, which a pipeline's last stage computes.
* ``backward_s``: see :class:`_Boundary`. The gradient of the loss and the
  backward of the ``return`` expression go to the last op.
* ``backward_input_s``: the part of ``backward_s`` that computes the inputs'
  gradients (torch's ``I``), timed in a backward asked for nothing else before
  each step's whole backward (:meth:`_Session.step`); 0 for an op whose inputs
  need no gradient, all of ``backward_s`` for one without weights, None (half)
  where it cannot be timed (:meth:`_SplitFacts.measured`).
* ``fixed_s`` and ``backward_fixed_s``: the part of each time that does not
  shrink with the batch (dispatch, kernel launches, Python), from a second
  set of timed runs on a smaller batch (:data:`SMALL_BATCH_DIVISOR`) taken in
  turn with the full-batch runs: with ``t(b) = fixed + b * per_sample``
  through the two medians, clamped to ``0 <= fixed <= min(t(small), t(full))``.
  A pipeline runs micro-batches, and on small ops this part is most of the time.
* ``flops``: forward FLOPs from :class:`torch.utils.flop_counter.FlopCounterMode`
  (a separate run, since counting slows ops down), with a formula for the CPU
  flash-attention kernel, which torch's table lacks.
* ``param_bytes``: bytes of the parameters of the submodules the op calls; a
  parameter several ops share counts once, at its first use.
* ``out_bytes``: bytes of the tensors the op writes, after it ran.
* ``saved_bytes``: bytes of the tensors autograd saves for the op's backward while it runs
  (a ``saved_tensors_hooks`` pack hook; weights and buffers left out, a storage counted at
  the first op that saves it); ``input_bytes``: bytes of the tensors it reads. An op whose
  backward runs module forwards again (activation checkpointing as written:
  ``checkpoint``, ``checkpoint_wrapper``, Hugging Face's ``gradient_checkpointing``) is
  marked ``recomputes``: its backward time includes that, its saved bytes are what the
  checkpoint keeps.

A cut's ``live_bytes`` are the bytes of the tensors held by the names live
across it (:func:`tensor_bytes`). The hardware is a placeholder
(:data:`PLACEHOLDER_HARDWARE`) until calibration exists.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import itertools
import math
import statistics
import sys
import sysconfig
import time
import traceback
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from syncpass.backends.torch.analysis import (
    analyse_model,
    checked_loops,
    loop_containers,
    sequential_calls,
)
from syncpass.backends.torch.norms import batch_norm_floor
from syncpass.backends.torch.rewrite import strip_sync_points
from syncpass.backends.torch.speed import SpeedProbe
from syncpass.contracts.costs import (
    PYTREE,
    SAME,
    TENSOR_LEAF,
    Costs,
    CutCost,
    CutValue,
    Hardware,
    OpCost,
    OpGroup,
    known_kind,
)
from syncpass.contracts.graph import Cut, OpGraph
from syncpass.contracts.hardware import cpu_devices, load_profile
from syncpass.core.errors import SyncpassError
from syncpass.frontend import find_forward, parse_source
from syncpass.frontend.analysis import ContainerLoop
from syncpass.transformers.probes import PROBE, ProbeSite, probed_forward_source
from syncpass.transformers.torch_stages import tensor_pieces

#: Until link calibration exists: a gloo link between local processes, roughly.
PLACEHOLDER_HARDWARE = load_profile("cpu-gloo-loopback").hardware
#: The second, smaller batch timed to split each op's time into its fixed part and
#: its per-sample part: an eighth of the example's batch (at least one sample), the
#: micro-batch a 2-stage plan runs by default (8 micro-batches), so that the line is
#: through the time where most plans run. An op's time is not linear in its batch (a
#: ResNet's last stages took 1.9, 3.7 and 7.4 ms at 1, 2 and 8 samples), and a line
#: through a quarter batch put 1.6x their time on one sample.
SMALL_BATCH_DIVISOR = 8
#: Weights, gradients and two Adam moments per parameter byte.
TRAINING_MEMORY_MULTIPLIER = 4
#: Backward FLOPs per forward FLOP when counted, not timed (input and weight gradients).
BACKWARD_FLOPS_RATIO = 2.0

#: Receives one line per phase of a measurement ("timed run 2/5").
Progress = Callable[[str], None]
#: Maps the model's output to the scalar loss whose backward is measured.
LossFn = Callable[[Any], torch.Tensor]

_Key = tuple[int, int | str | None]


def _sdpa_cpu_flops(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten._scaled_dot_product_flash_attention_for_cpu``: as torch counts SDPA."""
    flops: int = sdpa_flop_count(query_shape, key_shape, value_shape)  # type: ignore[no-untyped-call]
    return flops


#: FlopCounterMode's table lacks the CPU flash-attention kernel that
#: F.scaled_dot_product_attention dispatches to on CPU, so without this entry
#: attention counts as zero FLOPs there.
CPU_FLOP_FORMULAS: dict[Any, Any] = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
}


# --- the op graph of the live model ------------------------------------------------


def _resolve(root: object, dotted: str) -> object | None:
    """``root.a.b`` for ``"a.b"`` (``"blocks.3"`` indexes a ModuleList); None if missing."""
    value = root
    for part in dotted.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            return None
    return value


def _by_place(root: object, dotted: str) -> object | None:
    """:func:`_resolve`, where a number names an ``nn.Sequential``'s child by its place as
    slicing counts it (``"trunk_output.0"`` is torchvision's RegNet ``trunk_output.block1``);
    None if missing."""
    value = root
    for part in dotted.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            if not (isinstance(value, torch.nn.Sequential) and part.isdigit()):
                return None
            if int(part) >= len(value):
                return None
            value = value[int(part)]
    return value


def _forward_class(model: torch.nn.Module) -> type:
    """The class whose ``forward`` the model runs."""
    for cls in type(model).__mro__:
        if "forward" in vars(cls):
            return cls
    raise AssertionError("every nn.Module has a forward")


def _module_globals(cls: type) -> dict[str, Any]:
    """The globals of the module that defines ``cls``."""
    module = sys.modules.get(cls.__module__)
    if module is not None:
        return vars(module)
    for member in vars(cls).values():
        found = getattr(inspect.unwrap(member), "__globals__", None) if callable(member) else None
        if isinstance(found, dict):
            return found
    raise SyncpassError(f"cannot find the module of {cls.__qualname__} ({cls.__module__})")


def _named_class(model: torch.nn.Module, name: str) -> type | None:
    """The class named ``name`` in the model's MRO whose forward the model runs: the class
    that defines it, or one that inherits it from that class (the eager form plans an
    inherited forward as the subclass's: :mod:`syncpass.frontend.bases`)."""
    defining = _forward_class(model)
    for cls in type(model).__mro__:
        if cls.__name__ == name:
            return cls if defining in cls.__mro__ else None
        if cls is defining:
            return None
    return None


def build_graph(
    text: str, path: str, model: torch.nn.Module, class_name: str | None = None, depth: int = 1
) -> OpGraph:
    """The op graph of ``model``'s forward, as written in ``text``.

    ``class_name`` defaults to the model's class name. The length of each
    layer container the forward loops over is read off the live model, so
    each iteration becomes an op; a container that has no length stays a
    region. With ``depth`` 2, a statement calling an ``nn.Sequential``
    submodule (``h = self.layer1(x)``) is planned per child; with more, each child that is
    an ``nn.Sequential`` too is planned per child, ``depth - 2`` levels down. Raises
    :class:`SyncpassError` when the class is not in ``text`` or is not the
    class whose forward the model runs.
    """
    module = parse_source(text, path)
    name = class_name or type(model).__name__
    find_forward(module, name, path)  # the class must be in the file, before anything else
    defining = _forward_class(model)
    if defining.__name__ != name and _named_class(model, name) is None:
        runs = (
            f"{type(model).__name__}"
            if defining is type(model)
            else f"{type(model).__name__} (forward of {defining.__name__})"
        )
        raise SyncpassError(
            f"the example's model is a {runs}, not a {name}; profile the class the example "
            "builds, or change --model",
            path,
        )
    sizes: dict[str, int] = {}
    for container in loop_containers(module, name, path):
        value = _resolve(model, container)
        try:
            sizes[container] = len(value)  # type: ignore[arg-type]
        except TypeError:
            continue  # no length: the analysis keeps the loop as a region
    for loop, line in checked_loops(module, name, path):
        _check_loop(model, loop, line, sizes.get(loop.container), path)
    expand: dict[str, int] = {}
    if depth >= 2:
        for container in sequential_calls(module, name, path):
            value = _resolve(model, container)
            if isinstance(value, torch.nn.Sequential) and _runs_children(value):
                expand[container] = len(value)
                _expand_nested(model, container, depth - 2, expand)
    return analyse_model(module, path, name, sizes, text, expand)


def op_groups(graph: OpGraph) -> tuple[OpGroup, ...]:
    """The nested ``nn.Sequential`` children of ``graph`` planned per child, as the cost
    file records them (:class:`OpGroup`)."""
    return tuple(OpGroup(group, ops) for group, ops in graph.nested_groups() if len(ops) >= 2)


def _expand_nested(
    model: torch.nn.Module, container: str, levels: int, expand: dict[str, int]
) -> None:
    """Size, into ``expand``, the children of ``container`` that are ``nn.Sequential``
    themselves (``blocks.1`` of timm's EfficientNet), ``levels`` deep: each is planned per
    child, and the planner plans it as one op again unless it is too big for a stage
    (:mod:`syncpass.plan.levels`). A child its container names (``nn.Sequential(
    OrderedDict(...))``) is found by its place, as slicing counts it, and so named
    (``trunk.0.1``). A child of fewer than two children, or one that is not run child by
    child or cannot be sliced (:func:`_runs_children`), stays one op."""
    if levels < 1:
        return
    for index in range(expand[container]):
        inner = f"{container}.{index}"
        value = _by_place(model, inner)
        if isinstance(value, torch.nn.Sequential) and len(value) >= 2 and _runs_children(value):
            expand[inner] = len(value)
            _expand_nested(model, inner, levels - 1, expand)


def _runs_children(sequential: torch.nn.Sequential) -> bool:
    """Whether ``sequential`` runs its children one after the other as ``nn.Sequential`` does
    (a subclass may override ``forward``), and can be sliced: torch builds a slice as
    ``type(self)(OrderedDict(...))``, which a subclass with a constructor of its own
    (torchvision's RegNet ``AnyStage``) refuses."""
    if type(sequential).forward is not torch.nn.Sequential.forward:
        return False
    try:
        sequential[:1]
    except Exception:  # the subclass's constructor, whatever it raises
        return False
    return True


def _check_loop(
    model: torch.nn.Module, loop: ContainerLoop, line: int, size: int | None, path: str
) -> None:
    """What the source cannot say of a layer loop, checked on the built model: a bound read
    when the forward runs (``self.config.num_hidden_layers``) must cover the whole container
    (the plan and the stages run every layer of it); a ``ModuleDict``'s keys must be ``"0"``,
    ``"1"``, ... in order (its layers are named by position: ``layers.3``); containers
    zipped with it must be at least as long (``zip`` stops at the shortest, and the plan
    runs every layer)."""
    if loop.view is not None:
        container = _resolve(model, loop.container)
        keys = list(container.keys()) if isinstance(container, torch.nn.ModuleDict) else None
        if keys is not None and keys != [str(index) for index in range(len(keys))]:
            shown = ", ".join(repr(key) for key in keys[:4]) + (", ..." if len(keys) > 4 else "")
            raise SyncpassError(
                f"the loop runs over {loop.expression}, whose keys are {shown}: syncpass names "
                "a ModuleDict's layers by position (layers.0, layers.1, ...) and needs the keys "
                "'0', '1', ... in order (torchtitan's form)",
                f"{path}:{line}",
            )
    for other in loop.zipped_containers:
        try:
            length: int | None = len(_resolve(model, other))  # type: ignore[arg-type]
        except TypeError:
            length = None
        if size is not None and (length is None or length < size):
            raise SyncpassError(
                f"the loop zips self.{loop.container} ({size} layers) with self.{other} "
                f"({'no length' if length is None else length}): syncpass plans a zipped loop "
                "per layer only over containers at least as long as the layers (zip stops at "
                "the shortest)",
                f"{path}:{line}",
            )
    if loop.runtime_stop is None:
        return
    value = _resolve(model, loop.runtime_stop)
    if size is None or (isinstance(value, int) and not isinstance(value, bool) and value >= size):
        return
    raise SyncpassError(
        f"the loop over self.{loop.container} stops at self.{loop.runtime_stop}, which is "
        f"{value!r} for a container of {size}: syncpass plans a loop with a bound read at run "
        "time only when it covers the whole container; slice the container itself "
        f"(self.{loop.container} = self.{loop.container}[:{value!r}]) or write the bound as "
        "a number",
        f"{path}:{line}",
    )


def boundary_names(graph: OpGraph) -> list[tuple[str, ...]]:
    """Names whose tensors cross the boundary after each op, for timing the backward.

    After an admissible cut these are the cut's live names. Elsewhere (after
    an op marked no-sync) the graph lists none, so every name defined so far
    is taken: routing a tensor nothing uses later through the boundary costs
    a copy but changes no timing. None after the last op, whose backward
    starts the backward pass.
    """
    live = {cut.after: cut.live for cut in graph.cuts}
    defined: dict[str, None] = dict.fromkeys(graph.inputs)
    names: list[tuple[str, ...]] = []
    for position, op in enumerate(graph.ops):
        defined.update(dict.fromkeys(op.writes))
        if position == len(graph.ops) - 1:
            names.append(())
        else:
            names.append(live.get(op.id, tuple(defined)))
    return names


def _probe_sites(graph: OpGraph, names: Sequence[tuple[str, ...]]) -> list[ProbeSite]:
    rebind: dict[int, dict[str, None]] = {}
    loops: dict[int, bool] = {}
    paths: dict[int, list[tuple[int, ...]]] = {}
    for op, op_names in zip(graph.ops, names, strict=True):
        rebind.setdefault(op.statement, {}).update(dict.fromkeys(op_names))
        loops[op.statement] = op.loop is not None
        if op.loop is not None:
            paths.setdefault(op.statement, []).append(op.loop.path)
    return [
        ProbeSite(
            statement,
            loops[statement],
            tuple(rebind[statement]),
            # A sequential call with nested children planned per child runs child by child.
            tuple(paths[statement]) if any(len(p) > 1 for p in paths.get(statement, ())) else (),
        )
        for statement in rebind
    ]


def _key(graph: OpGraph, position: int) -> _Key:
    op = graph.ops[position]
    if op.loop is None:
        return (op.statement, None)
    if op.loop.outer:  # a nested child: the probe names it by its place, "1.0"
        return (op.statement, ".".join(str(index) for index in op.loop.path))
    return (op.statement, op.loop.index)


# --- sizes ---------------------------------------------------------------------------


def _tensors(value: object, seen: set[int] | None = None) -> Iterator[torch.Tensor]:
    """Tensors in ``value``, recursing into tuples, lists, dicts and dataclasses."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if not (isinstance(value, (tuple, list, dict)) or _is_dataclass_value(value)):
        return
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    items: Iterable[object]
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (tuple, list)):
        items = value
    else:
        items = [getattr(value, field.name) for field in dataclasses.fields(value)]  # type: ignore[arg-type]
    for item in items:
        yield from _tensors(item, seen)


def value_kind(value: object, class_names: Mapping[type, str] | None = None) -> str:
    """What a live value that is not a tensor is (:data:`syncpass.contracts.costs.VALUE_KINDS`).
    ``class_names`` names the classes of the user's module: a dataclass of one of them
    (Hugging Face's ``ModelOutput``) crosses as a ``pytree:`` kind, rebuilt by that name."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, torch.Size):
        return "size"
    if isinstance(value, torch.device):
        return "device"
    if isinstance(value, tuple) and value:
        if all(isinstance(item, int) and not isinstance(item, bool) for item in value):
            return "ints"
        if all(isinstance(item, torch.Tensor) for item in value):
            return f"tensors:{len(value)}"
    # A plain dict only: a subclass (Hugging Face's ModelOutput, an OrderedDict) is more
    # than its items, which is all the next stage would put together again.
    if type(value) is dict and value and all(type(key) is str for key in value):
        entries = [f"{key}={_entry_kind(item)}" for key, item in value.items()]
        kind = "mapping:" + ",".join(entries)
        if known_kind(kind):
            return kind
    template = _template(value, MAX_TEMPLATE_LEAVES, class_names or {})
    if template is not None and known_kind(PYTREE + template):
        return PYTREE + template
    return "other"


#: The most leaves a value crossing as a ``pytree:`` kind may hold (its template is written
#: into the cost file and the stage code).
MAX_TEMPLATE_LEAVES = 256


def _template(value: object, room: int, class_names: Mapping[type, str]) -> str | None:
    """``value`` as a ``pytree:`` template (:func:`syncpass.contracts.costs.pytree_template`):
    plain tuples, lists and dicts (string or int keys), sets of constants, and dataclasses
    that their own fields build again (rebuilt by the name ``class_names`` gives their
    class), of tensors (``T``), numbers (``I``, ``F``: sent, they may be sizes) and
    constants (``None``, booleans, strings), at most ``room`` leaves; else ``None``
    (another object, a subclass of a container, which are more than their items)."""
    leaves = 0

    def constant(item: object) -> str | None:
        """A set member or dict key, written out: a constant, or a number."""
        if item is None or type(item) in (bool, int, float, str):
            if isinstance(item, float) and not math.isfinite(item):
                return None
            return repr(item)
        return None

    def written(item: object) -> str | None:
        nonlocal leaves
        leaves += 1
        if leaves > room:
            return None
        if isinstance(item, torch.Tensor):
            return TENSOR_LEAF
        if type(item) is int:
            return "I"
        if type(item) is float:
            return "F" if math.isfinite(item) else None
        if item is None or type(item) in (bool, str):
            return repr(item)
        if type(item) in (tuple, list):
            assert isinstance(item, tuple | list)
            parts = [written(part) for part in item]
            if any(part is None for part in parts):
                return None
            inner = ", ".join(parts)  # type: ignore[arg-type]
            if type(item) is list:
                return f"[{inner}]"
            return f"({inner},)" if len(parts) == 1 else f"({inner})"
        if type(item) is dict:
            assert isinstance(item, dict)
            entries = []
            for key, part in item.items():
                inner_part = written(part)
                if type(key) not in (str, int) or inner_part is None:
                    return None
                entries.append(f"{key!r}: {inner_part}")
            return "{" + ", ".join(entries) + "}"
        if type(item) in (set, frozenset):  # of constants: esm2's set(repr_layers)
            assert isinstance(item, set | frozenset)
            members = sorted((constant(part) for part in item), key=str)
            if any(part is None for part in members):
                return None
            inner = ", ".join(members)  # type: ignore[arg-type]
            if type(item) is frozenset:
                return f"frozenset({{{inner}}})" if members else "frozenset()"
            return f"{{{inner}}}" if members else "set()"
        if type(item) in _SEQUENCE_ITERATORS:
            # What it has left to give, read off a copy (which leaves it where it is).
            remaining = written(list(copy.copy(item)))  # type: ignore[call-overload]
            return None if remaining is None else f"iter({remaining})"
        name = class_names.get(type(item))
        if name is not None and dataclasses.is_dataclass(item) and _rebuilt_alike(item):
            arguments = []
            for field in dataclasses.fields(item):
                inner_part = written(getattr(item, field.name))
                if inner_part is None:
                    return None
                arguments.append(f"{field.name}={inner_part}")
            return f"{name}({', '.join(arguments)})"
        return None

    return written(value)


#: Iterators over a list or a tuple: a copy goes on from where the original is.
_SEQUENCE_ITERATORS: tuple[type, ...] = (type(iter([])), type(iter(())))


def _rebuilt_alike(item: object) -> bool:
    """Whether the dataclass ``item``'s class, called with its fields, gives back the same
    fields: no ``InitVar`` it needs, no field ``__init__`` does not take, no
    ``__post_init__`` that changes one (a Hugging Face ``ModelOutput`` is rebuilt so)."""
    fields = dataclasses.fields(item)  # type: ignore[arg-type]
    if not all(field.init for field in fields):
        return False
    try:
        again = type(item)(**{field.name: getattr(item, field.name) for field in fields})
    except Exception:  # an InitVar it needs, a check that fails: not rebuilt so
        return False
    return all(getattr(again, field.name) is getattr(item, field.name) for field in fields)


def same_tensors(
    names: Sequence[str], values: Mapping[str, object], kinds: Mapping[str, str]
) -> dict[str, str]:
    """The ``same:`` kinds of the tensors among ``names`` that are the very tensor another
    of them holds (``kinds``: the others' kinds): a piece of a value that crosses as its
    tensors (T5's ``encoder_hidden_states`` is ``encoder_outputs.last_hidden_state``), or
    a tensor under a name before it. Each such tensor is sent once, as the first."""
    first: dict[int, str] = {}
    for name in names:
        for piece in tensor_pieces(kinds.get(name)) or ():
            item = _piece_of(values.get(name), piece)
            if isinstance(item, torch.Tensor):
                first.setdefault(id(item), name + piece)
    found = {}
    for name in names:
        value = values.get(name)
        if isinstance(value, torch.Tensor):
            reference = first.setdefault(id(value), name)
            if reference != name:
                found[name] = SAME + reference
    return found


def _piece_of(value: object, piece: str) -> object:
    """What ``piece`` (``.logits``, ``[0]``, ``["mask"][1]``, as a kind's pieces are written)
    picks out of ``value``; ``None`` where it picks nothing."""
    node = ast.parse(f"value{piece}", mode="eval").body
    steps: list[ast.Attribute | ast.Subscript] = []
    while isinstance(node, ast.Attribute | ast.Subscript):
        steps.append(node)
        node = node.value
    for step in reversed(steps):
        try:
            if isinstance(step, ast.Attribute):
                value = getattr(value, step.attr)
            else:
                value = value[ast.literal_eval(step.slice)]  # type: ignore[index]
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None
    return value


def _entry_kind(item: object) -> str:
    """What one entry of a crossing dict is: ``none``, ``tensor``, ``tensors:N`` (a tuple of
    tensors), or ``other`` (which no mapping kind admits)."""
    if item is None:
        return "none"
    if isinstance(item, torch.Tensor):
        return "tensor"
    if type(item) is tuple and item and all(isinstance(part, torch.Tensor) for part in item):
        return f"tensors:{len(item)}"
    return "other"


def tensor_bytes(values: Iterable[object]) -> int:
    """Bytes of the tensors in ``values`` (tuples, lists and dicts recursed), aliases once.

    Each storage counts once. Tensors that share one (the same tensor under two
    names, views, the pieces of a ``split``) count the smaller of the bytes of
    the distinct views and the bytes of the union of the ranges they span: a
    tensor under two names counts once, a transpose next to its original
    counts once, and a strided slice counts its own elements, not the gaps
    between them.
    """
    seen: set[int] = set()
    storages: dict[tuple[str, int], _Storage] = {}
    total = 0
    for value in values:
        for tensor in _tensors(value, seen):
            if tensor.numel() == 0:
                continue
            size = tensor.element_size()
            try:
                untyped = tensor.untyped_storage()
                # A fake or meta tensor's storage has no data: its identity tells aliases apart.
                pointer = untyped._cdata if _without_data(tensor) else untyped.data_ptr()
            except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
                pointer = 0
            if pointer == 0:
                total += tensor.numel() * size
                continue
            shape = tuple(int(length) for length in tensor.shape)
            strides = tuple(int(stride) for stride in tensor.stride())
            offset = int(tensor.storage_offset()) * size
            extent = 1 + sum(
                (length - 1) * stride for length, stride in zip(shape, strides, strict=True)
            )
            storage = storages.setdefault((str(tensor.device), pointer), _Storage())
            storage.views[(offset, shape, strides, size)] = tensor.numel() * size
            storage.ranges.append((offset, offset + extent * size))
    return total + sum(storage.bytes() for storage in storages.values())


def _without_data(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` has shape and dtype but no data (meta, or a fake tensor)."""
    from torch._subclasses.fake_tensor import is_fake

    return bool(tensor.is_meta or is_fake(tensor))


@dataclass
class _Storage:
    """The views of one storage that :func:`tensor_bytes` met."""

    views: dict[tuple[int, tuple[int, ...], tuple[int, ...], int], int] = field(
        default_factory=dict
    )
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def bytes(self) -> int:
        spanned = 0
        ranges = sorted(self.ranges)
        current_start, current_end = ranges[0]
        for start, end in ranges[1:]:
            if start > current_end:
                spanned += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        spanned += current_end - current_start
        return min(spanned, sum(self.views.values()))


def parameter_bytes(model: torch.nn.Module, graph: OpGraph) -> list[int]:
    """Bytes of the parameters of the submodules each op calls (``op.calls``).

    A parameter several ops use counts once, at the first op that calls it.
    Parameters a forward uses without calling a submodule (``x @ self.weight``)
    are not attributed: the op graph records calls, not attribute reads.
    """
    seen: set[int] = set()
    result = []
    for op in graph.ops:
        total = 0
        for call in op.calls:
            if not call.startswith("self."):
                continue
            target = _resolve(model, call.removeprefix("self."))
            if not isinstance(target, torch.nn.Module):
                continue
            for parameter in target.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    total += parameter.numel() * parameter.element_size()
        result.append(total)
    return result


def batch_size_of(args: Sequence[object], path: str) -> int:
    """Size of dimension 0 of the first tensor among the forward's arguments."""
    for tensor in _tensors(tuple(args)):
        if tensor.dim() == 0:
            break
        return int(tensor.shape[0])
    raise SyncpassError(
        "cannot tell the batch size: the example's first tensor argument must have a batch "
        "dimension (dimension 0)",
        path,
    )


# --- the probe ---------------------------------------------------------------------------


class _Boundary(torch.autograd.Function):
    """Identity on the live tensors at an op boundary; its backward records the time.

    The backward of this node runs when the gradients of all the tensors that
    crossed the boundary have arrived: after the backward of every later op
    that used them. The autograd engine runs ready nodes latest-created first,
    so between the boundary after op ``j`` and the one before it, it runs
    mostly the backward of op ``j`` (and the gradient accumulation of its
    parameters). That is the approximation: backward nodes whose inputs
    allow it may run early or late, and a boundary no gradient crosses splits
    nothing (see :func:`_backward_spans`).

    Outputs are copies, not views: user code may modify a live tensor in place
    (``x += y``, ``ReLU(inplace=True)``), which autograd forbids on a view a
    custom function returns.

    ``anchor`` (the probe's :attr:`_Probe.anchor`, or None) is a scalar leaf that
    needs a gradient and gets none: every boundary node has an edge to it, so a
    backward asked for the anchor's gradient alone runs every boundary node and
    everything between them on the way to the inputs, and none of the weights'
    gradients (:meth:`_Session.step`).
    """

    @staticmethod
    def forward(
        ctx: Any,
        probe: _Probe,
        position: int,
        anchor: torch.Tensor | None,
        *tensors: torch.Tensor,
    ) -> Any:
        ctx.probe = probe
        ctx.position = position
        ctx.set_materialize_grads(False)
        return tuple(tensor.clone() for tensor in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.probe.passed(ctx.position)
        return (None, None, None, *grads)


def _gradient_tensors(value: object, found: dict[int, torch.Tensor], seen: set[int]) -> None:
    """Add to ``found`` the tensors in ``value`` (:func:`_tensors`) that need a gradient."""
    for tensor in _tensors(value, seen):
        if tensor.requires_grad:
            found.setdefault(id(tensor), tensor)


def _is_dataclass_value(value: object) -> bool:
    """Whether ``value`` is an instance of a dataclass (not the class itself)."""
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


#: Values that hold no tensor an op could take a gradient through (a submodule's
#: parameters are its weights, not its inputs).
_NO_GRADIENT = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    slice,
    range,
    torch.Size,
    torch.dtype,
    torch.device,
    torch.nn.Module,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
)


def _needs_gradient(value: object, seen: set[int] | None = None) -> bool | None:
    """Whether a tensor in ``value`` (tuples, lists and dicts recursed) needs a
    gradient; None when it holds a value of another kind, which may hold tensors."""
    if isinstance(value, torch.Tensor):
        return value.requires_grad
    if isinstance(value, _NO_GRADIENT):
        return False
    if not isinstance(value, (tuple, list, dict)):
        return None
    seen = set() if seen is None else seen
    if id(value) in seen:
        return False
    seen.add(id(value))
    answers = [
        _needs_gradient(item, seen)
        for item in (value.values() if isinstance(value, dict) else value)
    ]
    if any(answers):
        return True
    return None if None in answers else False


def _substitute(value: Any, swap: Mapping[int, torch.Tensor], seen: set[int]) -> Any:
    """``value`` with the tensors in ``swap`` replaced.

    Lists, dicts and dataclasses are updated in place (a frozen one too), so other
    references to them see the same values: a name bound to a dataclass's field
    (``context = memory.states``) stays that field's tensor. Tuples are rebuilt (named
    tuples as their own type).
    """
    if isinstance(value, torch.Tensor):
        return swap.get(id(value), value)
    if not (isinstance(value, (tuple, list, dict)) or _is_dataclass_value(value)):
        return value
    if id(value) in seen:
        return value
    seen.add(id(value))
    if not isinstance(value, (tuple, list, dict)):
        for field in dataclasses.fields(value):
            old = getattr(value, field.name)
            new = _substitute(old, swap, seen)
            if new is not old:
                object.__setattr__(value, field.name, new)
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            new = _substitute(item, swap, seen)
            if new is not item:
                value[index] = new
        return value
    if isinstance(value, dict):
        for key, item in list(value.items()):
            new = _substitute(item, swap, seen)
            if new is not item:
                value[key] = new
        return value
    items = [_substitute(item, swap, seen) for item in value]
    if all(new is old for new, old in zip(items, value, strict=True)):
        return value
    if hasattr(value, "_make"):
        return value._make(items)
    return type(value)(items)


class _Probe:
    """What the instrumented forward calls (:data:`syncpass.transformers.probes.PROBE`).

    ``begin()`` marks the start of the forward; ``boundary(statement, index,
    locals())`` marks the end of one op (found by its statement and loop
    index) and returns the live tensors routed through :class:`_Boundary`.
    """

    def __init__(
        self,
        graph: OpGraph,
        rebind: Sequence[tuple[str, ...]],
        sync: Callable[[], None],
    ) -> None:
        self.graph = graph
        self.positions = {_key(graph, position): position for position in range(len(graph.ops))}
        self.rebind = rebind
        # The names whose bytes each cut's live_bytes are (measured in the measuring step).
        self.cut_live = {self._position(cut.after): cut.crossing for cut in graph.cuts}
        # Where the backend said what it sends: each value measured on its own, with what
        # a value computed again would need received (Cut.replayable).
        self.cut_values = {
            self._position(cut.after): tuple(
                dict.fromkeys(
                    [*cut.crossing, *(need for item in cut.replayable for need in item.needs)]
                )
            )
            for cut in graph.cuts
            if cut.sent is not None
        }
        self.sync = sync
        self.counter: FlopCounterMode | None = None
        self.measure_bytes = False
        self.watch_random = True  # not on fake tensors, whose random draws cannot be seen
        # What the input-gradient pass asks the gradient of (see _Boundary); None: no such pass.
        self.anchor: torch.Tensor | None = None
        self.input_pass = False  # whether the backward running is that pass
        self.inputs: frozenset[int] = frozenset()  # ids of the forward's argument tensors
        self.class_names: Mapping[type, str] = {}  # the user's module's classes, by name
        self.reset()

    def _position(self, op_id: str) -> int:
        return next(index for index, op in enumerate(self.graph.ops) if op.id == op_id)

    def reset(self) -> None:
        self.begun: float | None = None
        self.forward: dict[int, tuple[float, float]] = {}
        self.backward: dict[int, float] = {}
        self.backward_input: dict[int, float] = {}  # the same, in the input-gradient pass
        self.flops: dict[int, int] = {}  # running FLOP total at each boundary
        self.forward_flops = 0  # the total when the forward returned
        self.live_bytes: dict[int, int] = {}
        self.kinds: dict[int, dict[str, str]] = {}  # live values that are not tensors
        # Per value crossing a cut: its bytes and whether it carries a gradient.
        self.values: dict[int, dict[str, tuple[int, bool]]] = {}
        self.random: set[int] = set()  # ops that drew random numbers
        self.rng_state: torch.Tensor | None = None
        self.out_bytes: dict[int, int] = {}
        self.input_bytes: dict[int, int] = {}
        self.saved: dict[int, list[torch.Tensor]] = {}  # what autograd saved, by op
        self.recomputes: set[int] = set()
        self.backward_at = len(self.graph.ops) - 1  # the op whose backward runs
        # Per op, from the measuring step: whether its backward computes the gradient of a
        # weight (a leaf that is no input of the forward), and whether a tensor it reads
        # needs a gradient (where the op's boundaries tell: see weights_below and boundary).
        self.weights: dict[int, bool] = {}
        self.reads_grad: dict[int, bool] = {}
        self.nodes: dict[int, Any] = {}  # the boundaries' autograd nodes, by id
        self.last = -1

    def now(self) -> float:
        """Wall time, after the device has finished what was queued."""
        self.sync()
        return time.perf_counter()

    def begin(self) -> None:
        self.begun = self.now()
        if self.measure_bytes and self.watch_random:
            self.rng_state = torch.random.get_rng_state()

    def boundary(
        self, statement: int, index: int | str | None, values: Mapping[str, object]
    ) -> dict[str, object]:
        entry = self.now()
        position = self.positions.get((statement, index))
        if position is None:
            return {}
        self.last = position
        if self.counter is not None:
            self.flops[position] = self.counter.get_total_flops()
        if self.measure_bytes:
            op = self.graph.ops[position]
            self.out_bytes[position] = tensor_bytes(
                values[name] for name in op.writes if name in values
            )
            if position in self.cut_live:
                self.live_bytes[position] = tensor_bytes(
                    values[name] for name in self.cut_live[position] if name in values
                )
                names = self.cut_values.get(position, self.cut_live[position])
                kinds = {
                    name: value_kind(values[name], self.class_names)
                    if name in values
                    else "unbound"
                    for name in names
                    if not isinstance(values.get(name), torch.Tensor)
                }
                kinds |= same_tensors(names, values, kinds)
                self.kinds[position] = kinds
                if position in self.cut_values:
                    self.values[position] = {
                        name: (
                            # Another value's tensor is sent once, as that value's.
                            0
                            if kinds.get(name, "").startswith(SAME)
                            else tensor_bytes([values[name]]),
                            any(tensor.requires_grad for tensor in _tensors(values[name])),
                        )
                        for name in names
                        if name in values
                    }
            if position + 1 < len(self.graph.ops):
                reads = self.graph.ops[position + 1].reads
                self.input_bytes[position + 1] = tensor_bytes(
                    values[name] for name in reads if name in values
                )
                needs = _needs_gradient([values[name] for name in reads if name in values])
                if needs is not None:
                    self.reads_grad[position + 1] = needs
            if self.watch_random:
                state = torch.random.get_rng_state()
                if self.rng_state is not None and not torch.equal(state, self.rng_state):
                    self.random.add(position)
                self.rng_state = state
        replaced = self._route(position, values) if torch.is_grad_enabled() else {}
        self.forward[position] = (entry, self.now())
        return replaced

    def _route(self, position: int, values: Mapping[str, object]) -> dict[str, object]:
        names = [name for name in self.rebind[position] if name in values]
        found: dict[int, torch.Tensor] = {}
        seen: set[int] = set()
        for name in names:
            _gradient_tensors(values[name], found, seen)
        if not found:
            return {}
        if self.measure_bytes:
            self.see_weights(position, (tensor.grad_fn for tensor in found.values()))
        # One node for all of them: its backward runs once every gradient has arrived.
        outputs = _Boundary.apply(self, position, self.anchor, *found.values())  # type: ignore[no-untyped-call]
        node = outputs[0].grad_fn
        self.nodes[id(node)] = node
        swap = dict(zip(found, outputs, strict=True))
        seen = set()
        return {name: _substitute(values[name], swap, seen) for name in names}

    def see_weights(self, position: int, roots: Iterable[Any]) -> None:
        """Record in :attr:`weights` whether op ``position``'s backward computes weights'
        gradients: whether the autograd graph below ``roots`` (``grad_fn`` nodes), down
        to the boundaries' nodes, reaches a leaf that needs a gradient and is not one
        of the forward's inputs. Parameters read without a submodule call
        (``x @ self.weight``) count too. Nothing is recorded when the graph has none
        but passes through a custom ``autograd.Function``, which may use weights it was
        not given (reentrant activation checkpointing runs the forward again inside)."""
        stack = [root for root in roots if root is not None]
        seen: dict[int, Any] = {}  # the nodes themselves are kept, so no id is reused
        opaque = False
        while stack:
            node = stack.pop()
            if id(node) in seen or id(node) in self.nodes:
                continue
            seen[id(node)] = node
            variable = getattr(node, "variable", None)  # an AccumulateGrad node's leaf
            if isinstance(variable, torch.Tensor):
                if id(variable) not in self.inputs:
                    self.weights[position] = True
                    return
                continue
            opaque = opaque or isinstance(node, torch.autograd.function.BackwardCFunction)
            stack.extend(child for child, _ in node.next_functions if child is not None)
        if not opaque:
            self.weights[position] = False

    def passed(self, position: int) -> None:
        times = self.backward_input if self.input_pass else self.backward
        times[position] = self.now()
        self.backward_at = position

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """A saved-tensor hook: what autograd saves goes to the op running."""
        self.saved.setdefault(self.last + 1, []).append(tensor)
        return tensor

    def recomputing(self, module: torch.nn.Module, args: object) -> None:
        """A module's forward during the backward: the op whose backward runs recomputes."""
        if not torch.is_inference_mode_enabled():
            self.recomputes.add(self.backward_at)

    def saved_bytes(self, weights: Iterable[torch.Tensor]) -> dict[int, int]:
        """Bytes each op's backward keeps, weights and buffers left out, each storage at
        the first op that saved it."""
        seen = {_storage_key(tensor) for tensor in weights}
        found = {}
        for position in sorted(self.saved):
            fresh = []
            for tensor in self.saved[position]:
                key = _storage_key(tensor)
                if key not in seen:
                    fresh.append(tensor)
            seen.update(_storage_key(tensor) for tensor in fresh)
            found[position] = tensor_bytes(fresh)
        return found


def _storage_key(tensor: torch.Tensor) -> int:
    """The storage a tensor views (its identity where it has no data)."""
    try:
        untyped = tensor.untyped_storage()
        return int(untyped._cdata if _without_data(tensor) else untyped.data_ptr()) or id(tensor)
    except (RuntimeError, NotImplementedError):
        return id(tensor)


# --- one step ------------------------------------------------------------------------------


def _forward_spans(
    marks: Sequence[tuple[float, float] | None], begin: float, end: float
) -> list[float]:
    """Per-op amounts between consecutive probe marks ``(at entry, at exit)``.

    An op's amount runs from the exit of the previous mark to the entry of its
    own. The rest, up to ``end``, goes to the first op whose mark never came
    (the forward returned early inside it), else to the last op.
    """
    amounts = [0.0] * len(marks)
    last = begin
    first_missing: int | None = None
    for position, mark in enumerate(marks):
        if mark is None:
            if first_missing is None:
                first_missing = position
            continue
        amounts[position] = max(0.0, mark[0] - last)
        last = mark[1]
    tail = len(marks) - 1 if first_missing is None else first_missing
    amounts[tail] += max(0.0, end - last)
    return amounts


def _backward_spans(
    marks: Sequence[float | None], start: float, end: float, forward: Sequence[float]
) -> list[float]:
    """Per-op backward time from the times gradients passed each boundary.

    ``marks[j]`` is when the gradient passed the boundary after op ``j`` (None
    if it never did; the entry for the last op is ignored), ``start`` and
    ``end`` bound the backward pass. Op ``j`` gets ``marks[j-1] - marks[j]``.
    Where boundaries were not passed, the ops between two passed ones share
    the time: all of it to the last of them when no earlier boundary was
    passed at all (no gradient reached the earlier ops, so they have no
    backward), else in proportion to their forward times.
    """
    count = len(forward)
    # Break points in op order: (boundary index, time); -1 is the end of backward.
    points: list[tuple[int, float]] = [(-1, end)]
    points += [
        (position, mark) for position, mark in enumerate(marks[: count - 1]) if mark is not None
    ]
    points.append((count - 1, start))
    amounts = [0.0] * count
    for (low, low_time), (high, high_time) in itertools.pairwise(points):
        span = max(0.0, low_time - high_time)
        covered = range(low + 1, high + 1)
        if low == -1 or len(covered) == 1:
            amounts[high] += span
            continue
        weights = [forward[position] for position in covered]
        total = sum(weights)
        for position, weight in zip(covered, weights, strict=True):
            amounts[position] += span * (weight / total if total > 0 else 1 / len(covered))
    return amounts


@dataclass(frozen=True)
class _StepTimes:
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    # Per op, from the input-gradient pass when it ran: its time, and whether both
    # boundaries around the op were passed (else the time is a share of several ops').
    backward_input_s: tuple[float, ...] | None = None
    input_own: tuple[bool, ...] | None = None


def _library_folders() -> tuple[Path, ...]:
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    folders = {Path(sysconfig.get_paths()[name]).resolve() for name in names}
    folders.add(Path(torch.__file__).resolve().parent)
    folders.add(Path(__file__).resolve().parents[2])  # syncpass/, this being backends/torch/
    return tuple(folders)


def _user_frame(error: BaseException, prefer: str) -> str | None:
    """``file:line`` of the deepest frame in ``prefer``, else in any code not a library's."""
    frames = traceback.extract_tb(error.__traceback__)
    try:
        wanted: Path | None = Path(prefer).resolve()
    except (OSError, ValueError):
        wanted = None
    for frame in reversed(frames):
        if (
            wanted is not None
            and not frame.filename.startswith("<")
            and Path(frame.filename).resolve() == wanted
        ):
            return f"{frame.filename}:{frame.lineno}"
    folders = _library_folders()
    for frame in reversed(frames):
        if frame.filename.startswith("<"):
            continue
        path = Path(frame.filename).resolve()
        if not any(path.is_relative_to(folder) for folder in folders):
            return f"{frame.filename}:{frame.lineno}"
    return None


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _unpacked(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class _Session:
    """The instrumented model, ready to run measured steps."""

    def __init__(
        self,
        graph: OpGraph,
        model: torch.nn.Module,
        args: tuple[Any, ...],
        loss_fn: LossFn,
        probe: _Probe,
    ) -> None:
        self.graph = graph
        self.model = model
        self.args = args
        self.loss_fn = loss_fn
        self.probe = probe
        self.split_failure: str | None = None

    def step(self, measure: bool, split: bool = False) -> _StepTimes:
        """One forward, loss and backward; with ``measure``, FLOPs and sizes too.

        With ``split`` (and the probe's anchor set), a backward asked only for the
        anchor's gradient (and the inputs' that need one) runs first and keeps the
        graph: what torch's pipelining runs as ``I`` (``stage_backward_input``:
        ``autograd.grad`` on the stage's inputs, the graph kept for the weights), here
        for every op at once. Autograd runs only what leads to the anchor, so that
        pass skips the weights' gradients, in the nodes that compute both too (a
        linear layer's backward computes ``dX`` and not ``dW``). The whole backward
        follows, timed as without it. The pass costs each step the inputs' part of
        its backward once more: about a third more time per step for a model of
        linear layers (forward 1, backward 2, of which inputs 1), and no more memory
        than the whole backward, since it makes no weight gradient. A failure of
        that pass (reentrant activation checkpointing refuses ``autograd.grad``) is
        kept in :attr:`split_failure` and the pass is not tried again.
        """
        probe = self.probe
        probe.reset()
        split = split and probe.anchor is not None and self.split_failure is None
        probe.inputs = frozenset(id(tensor) for tensor in _tensors(self.args))
        # The first op reads only the forward's arguments (and the model's own tensors).
        needs = _needs_gradient(self.args)
        if needs is not None:
            probe.reads_grad[0] = needs
        # Zeroed, not dropped: a pipeline's micro-batches after the first add their weights'
        # gradients to those already there (each computed into a temporary, then added),
        # and every op's backward is timed as they run it. With the gradients dropped the
        # uneven MLP's backward took 6 ms where the adding one took 10.5 ms, and its 2-stage
        # steps, run twice with each cost file in turn, were predicted 0.64-0.74 of the
        # measured with the first and 0.96-0.97 with the second.
        self.model.zero_grad(set_to_none=False)
        start = probe.now()
        probe.measure_bytes = measure
        try:
            if measure:
                counter = FlopCounterMode(display=False, custom_mapping=CPU_FLOP_FORMULAS)
                probe.counter = counter
                saving = torch.autograd.graph.saved_tensors_hooks(probe.pack, _unpacked)
                with counter, saving:
                    output = self.model(*self.args)
                probe.forward_flops = counter.get_total_flops()
            else:
                output = self.model(*self.args)
        except Exception as error:
            raise self._forward_failure(error) from None
        finally:
            probe.counter = None
            probe.measure_bytes = False
        try:
            loss = self.loss_fn(output)
        except Exception as error:
            raise SyncpassError(
                f"the loss function failed: {_describe(error)}",
                _user_frame(error, self.graph.path) or self.graph.path,
            ) from None
        count = len(self.graph.ops)
        if measure and isinstance(loss, torch.Tensor):
            probe.see_weights(count - 1, [loss.grad_fn])
        loss_end = probe.now()
        inputs = self._input_pass(loss) if split else None
        input_end = probe.now()
        probe.backward_at = count - 1
        watch = (
            torch.nn.modules.module.register_module_forward_pre_hook(probe.recomputing)
            if measure
            else None
        )
        try:
            loss.backward()  # type: ignore[no-untyped-call]
        except Exception as error:
            raise SyncpassError(
                f"the backward pass failed: {_describe(error)} (the loss must be a scalar "
                "tensor that depends on the model's parameters)",
                _user_frame(error, self.graph.path) or self.graph.path,
            ) from None
        finally:
            if watch is not None:
                watch.remove()
        backward_end = probe.now()
        forward = _forward_spans(
            [probe.forward.get(position) for position in range(count)],
            start if probe.begun is None else probe.begun,
            loss_end,
        )
        backward = _backward_spans(
            [probe.backward.get(position) for position in range(count)],
            input_end,
            backward_end,
            forward,
        )
        if inputs is None:
            return _StepTimes(tuple(forward), tuple(backward))
        marks = [probe.backward_input.get(position) for position in range(count)]
        own = tuple(
            (position == 0 or marks[position - 1] is not None)
            and (position == count - 1 or marks[position] is not None)
            for position in range(count)
        )
        spans = _backward_spans(marks, loss_end, input_end, forward)
        return _StepTimes(tuple(forward), tuple(backward), tuple(spans), own)

    def _input_pass(self, loss: torch.Tensor) -> bool | None:
        """The backward to the inputs only (see :meth:`step`); None if it failed."""
        probe = self.probe
        assert probe.anchor is not None
        wanted = [probe.anchor, *(t for t in _tensors(self.args) if t.requires_grad)]
        probe.input_pass = True
        try:
            torch.autograd.grad(loss, wanted, retain_graph=True, allow_unused=True)
        except Exception as error:
            self.split_failure = _describe(error)
            return None
        finally:
            probe.input_pass = False
        return True

    def _forward_failure(self, error: Exception) -> SyncpassError:
        ops = self.graph.ops
        failing = self.probe.last + 1
        where = "after its last op" if failing >= len(ops) else f"in op {ops[failing].id}"
        fallback = str(ops[min(failing, len(ops) - 1)].location)
        return SyncpassError(
            f"{self.graph.model_class}.forward failed {where}: {_describe(error)}",
            _user_frame(error, self.graph.path) or fallback,
        )

    def flops(self) -> list[int]:
        """Per-op forward FLOPs of the last measuring step."""
        marks: list[tuple[float, float] | None] = []
        for position in range(len(self.graph.ops)):
            total = self.probe.flops.get(position)
            marks.append(None if total is None else (float(total), float(total)))
        spans = _forward_spans(marks, 0.0, float(self.probe.forward_flops))
        return [round(span) for span in spans]


def _instrument(
    graph: OpGraph, text: str, model: torch.nn.Module, probe: _Probe
) -> Callable[..., Any]:
    """The instrumented forward, compiled in a copy of the model module's namespace."""
    module = parse_source(text, graph.path)
    names = probe.rebind
    source, warnings = probed_forward_source(
        module, graph.model_class, _probe_sites(graph, names), graph.path
    )
    if warnings:
        raise SyncpassError(
            "could not instrument the forward: " + "; ".join(warnings), str(graph.forward)
        )
    user_globals = forward_globals(model, graph.model_class)
    # A dataclass crossing a sync point is rebuilt by the stage after under its name here.
    probe.class_names = {
        value: name for name, value in user_globals.items() if isinstance(value, type)
    }
    return compiled_forward(
        source,
        model,
        graph.model_class,
        {PROBE: probe},
        f"<syncpass probes: {graph.path}>",
        str(graph.forward),
    )


def forward_globals(model: torch.nn.Module, class_name: str) -> dict[str, Any]:
    """The globals the forward of ``model`` (planned as class ``class_name``'s) runs in."""
    defining = _forward_class(model)
    original = inspect.unwrap(vars(defining)["forward"])
    user_globals: dict[str, Any] = getattr(original, "__globals__", {})
    named = _named_class(model, class_name)
    if named is not None and named is not defining:
        # An inherited forward is planned, and its stages run, in the subclass's module.
        user_globals = _module_globals(named)
    return user_globals


def compiled_forward(
    source: str,
    model: torch.nn.Module,
    class_name: str,
    names: Mapping[str, object],
    filename: str,
    where: str,
) -> Callable[..., Any]:
    """The ``forward`` of class ``class_name`` in ``source`` (the model's module, rewritten),
    compiled in a copy of the namespace the model's forward runs in, with ``names`` added
    (what the rewritten forward calls); ``model`` is handed to it as ``self``. A failure to
    define it is an error at ``where``."""
    defining = _forward_class(model)
    named = _named_class(model, class_name)
    if named is not None and named is not defining:
        defining = named
    user_globals = forward_globals(model, class_name)
    namespace = dict(user_globals)
    namespace.update(names)
    # Postponed annotations: names imported only for type checking need not exist.
    code = compile(
        "from __future__ import annotations\n" + source, filename, "exec", dont_inherit=True
    )
    try:
        exec(code, namespace)
    except Exception as error:  # e.g. a decorator of forward that fails outside its module
        raise SyncpassError(
            f"could not define the instrumented forward: {_describe(error)}", where
        ) from None
    function: Callable[..., Any] = vars(namespace[class_name])["forward"]
    # The copy must see the user's globals, not the shell class and the future import.
    for name in (class_name, "annotations"):
        if name in user_globals:
            namespace[name] = user_globals[name]
        else:
            del namespace[name]
    inner = inspect.unwrap(function)
    code_object = getattr(inner, "__code__", None)
    closure = getattr(inner, "__closure__", None)
    if code_object is not None and closure and "__class__" in code_object.co_freevars:
        # Zero-argument super() inside forward must find the user's class.
        closure[code_object.co_freevars.index("__class__")].cell_contents = defining
    return function


def _measured_on(flops_per_s: float | None, threads: int, on_gpu: bool) -> Hardware:
    """The cost file's hardware: the placeholder profile with the compute rate the op
    times reflect and this CPU's devices. On a GPU, whose stages talk over NCCL, gloo's
    stall of posts that meet (``meet_stall_s``) does not apply."""
    hardware = dataclasses.replace(
        PLACEHOLDER_HARDWARE, flops_per_s=flops_per_s, devices=cpu_devices(threads)
    )
    if on_gpu:
        hardware = dataclasses.replace(hardware, meet_stall_s=0.0, meet_window_s=0.0)
    return hardware


def _on_gpu(model: torch.nn.Module, args: tuple[Any, ...]) -> bool:
    tensors = [*model.parameters(), *model.buffers(), *_tensors(args)]
    return any(tensor.is_cuda for tensor in tensors)


def _no_sync() -> None:
    pass


def fixed_part(full_s: float, small_s: float, full_batch: int, small_batch: int) -> float:
    """The time a call costs whatever its batch, from times at two batch sizes.

    The line ``t(b) = fixed + b * per_sample`` through both points, with the
    fixed part kept within ``[0, min(small_s, full_s)]`` (noise can put the
    line's intercept outside it).
    """
    if full_batch <= small_batch:
        raise ValueError("the full batch must be larger than the small one")
    intercept = (small_s * full_batch - full_s * small_batch) / (full_batch - small_batch)
    return min(max(intercept, 0.0), small_s, full_s)


def _median(values: Iterable[float]) -> float:
    """The median, to six significant digits: timings are not more precise than that."""
    return float(f"{statistics.median(values):.6g}")


def profile_costs(
    text: str,
    path: str,
    model: torch.nn.Module,
    args: tuple[Any, ...],
    loss_fn: LossFn,
    class_name: str | None = None,
    repeats: int = 5,
    warmup: int = 2,
    threads: int = 1,
    progress: Progress | None = None,
    depth: int = 1,
    small_batch: tuple[tuple[Any, ...], LossFn] | None = None,
    counted_on: Hardware | None = None,
    refine: Callable[[OpGraph, torch.nn.Module, tuple[Any, ...]], OpGraph] | None = None,
) -> Costs:
    """Measure the cost of every op of ``model``'s forward, as written in ``text``.

    ``refine`` is the backend's last word on the op graph, given the model and ``args``,
    before anything is measured (the eager stages check what their decided branches
    assumed, and say what each cut sends: :attr:`Cut.sent`).

    With ``counted_on`` (a model and inputs as fake tensors: no data) nothing is
    timed: one step counts each op's FLOPs and bytes, and its forward time is
    its FLOPs at ``counted_on.flops_per_s``, its backward twice that (the inputs'
    part as :meth:`_SplitFacts.counted` says); the cost file's hardware is
    ``counted_on``.

    ``depth`` 2 plans calls of ``nn.Sequential`` submodules per child.

    ``args`` are the forward's positional inputs for one batch; ``loss_fn``
    maps the forward's output to the scalar loss whose backward is timed.
    One measuring step (FLOPs and sizes) and ``warmup`` steps run first, then
    ``repeats`` timed steps whose per-op median is kept; torch runs on
    ``threads`` CPU threads. The cost file's op ids are exactly the op
    graph's, so ``syncpass rewrite --costs`` accepts it for this source.

    ``small_batch`` (the forward's inputs and the loss for a smaller batch)
    adds a timed run on it after each full-batch one, from which each op's
    fixed time per call is fitted; without it the fixed parts are 0.

    The model's gradients, its ``forward`` and torch's thread count are as
    before when this returns. Bad input (class not in ``text``, a forward the
    analysis cannot plan, an example that fails) raises :class:`SyncpassError`.
    """
    if repeats < 1 or warmup < 0 or threads < 1:
        raise ValueError("need repeats >= 1, warmup >= 0 and threads >= 1")
    report = progress or (lambda message: None)
    report("analysing the forward")
    # A file syncpass rewrote before is measured as the source it came from: its sync
    # lines do nothing outside a pipeline, and the op ids must be the original's.
    text = strip_sync_points(text, path)
    graph = build_graph(text, path, model, class_name, depth)
    if refine is not None:
        graph = refine(graph, model, args)
    batch_size = batch_size_of(args, path)
    sync: Callable[[], None] = torch.cuda.synchronize if _on_gpu(model, args) else _no_sync
    probe = _Probe(graph, boundary_names(graph), sync)
    probe.watch_random = counted_on is None
    if counted_on is None:
        tensors = itertools.chain(model.parameters(), _tensors(args))
        device = next((tensor.device for tensor in tensors), torch.device("cpu"))
        probe.anchor = torch.zeros((), device=device, requires_grad=True)
    function = _instrument(graph, text, model, probe)

    saved_grads = {parameter: parameter.grad for parameter in model.parameters()}
    had_forward = "forward" in vars(model)
    saved_forward = vars(model).get("forward")
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    model.forward = types.MethodType(function, model)
    try:
        session = _Session(graph, model, args, loss_fn, probe)
        small = None
        if small_batch is not None:
            small = _SmallBatch(_Session(graph, model, small_batch[0], small_batch[1], probe))
        report("measuring FLOPs and sizes")
        session.step(measure=True)
        flops = session.flops()
        live_bytes = dict(probe.live_bytes)
        kinds = dict(probe.kinds)
        values = _Values(dict(probe.values), frozenset(probe.random), counted_on is not None)
        out_bytes = dict(probe.out_bytes)
        input_bytes = dict(probe.input_bytes)
        input_bytes[0] = tensor_bytes(args)
        saved_bytes = probe.saved_bytes(itertools.chain(model.parameters(), model.buffers()))
        probe.saved.clear()
        recomputes = frozenset(probe.recomputes)
        split = _SplitFacts(dict(probe.weights), dict(probe.reads_grad))
        if counted_on is not None:
            warmup, repeats = 0, 0
        for run in range(warmup):
            report(f"warm-up run {run + 1}/{warmup}")
            session.step(measure=False, split=True)
            if small is not None:
                small.step()
        steps: list[_StepTimes] = []
        small_steps: list[_StepTimes] = []
        # The machine's speed before each timed run and after the last (not on a GPU,
        # whose kernels the host's speed does not time).
        speed = SpeedProbe() if repeats and not _on_gpu(model, args) else None
        probes: list[float] = []
        for run in range(repeats):
            report(f"timed run {run + 1}/{repeats}")
            if speed is not None:
                probes.append(speed.time_s())
            steps.append(session.step(measure=False, split=True))
            small_times = small.step() if small is not None else None
            if small_times is not None:
                small_steps.append(small_times)
        if speed is not None:
            probes.append(speed.time_s())
    finally:
        if had_forward:
            vars(model)["forward"] = saved_forward
        else:
            del vars(model)["forward"]
        torch.set_num_threads(saved_threads)
        for parameter, grad in saved_grads.items():
            parameter.grad = grad

    # With the user's forward back (each batch norm is named by its own line), and once
    # the measured steps have shown that it runs.
    floor = batch_norm_floor(model, args, batch_size)
    params = parameter_bytes(model, graph)
    if counted_on is not None:
        counted = _counted_costs(
            graph,
            counted_on,
            flops,
            params,
            live_bytes,
            kinds,
            values,
            out_bytes,
            batch_size,
            split,
        )
        return dataclasses.replace(
            counted, min_microbatch_size=floor.size, min_microbatch_by=floor.by
        )
    small_size = batch_size_of(small_batch[0], path) if small_batch is not None else batch_size
    if small is not None and small.failure is not None:
        small_steps = []
    speed_probe_s = None
    if probes:
        speed_probe_s = _median(probes)
        steps = _at_speed(steps, probes, speed_probe_s)
        small_steps = _at_speed(small_steps, probes, speed_probe_s)
    fixed_note = _fixed_note(small_batch is not None, small.failure if small else None)
    notes = [] if fixed_note is None else [fixed_note]
    if session.split_failure is not None:
        notes.append(
            f"the inputs' part of each backward not measured ({session.split_failure}): "
            "half, for an op with weights whose inputs need a gradient"
        )
    ops = []
    for position, op in enumerate(graph.ops):
        forward_s = _median(step.forward_s[position] for step in steps)
        backward_s = _median(step.backward_s[position] for step in steps)
        fixed_s = backward_fixed_s = 0.0
        if small_steps and small_size < batch_size:
            fixed_s = fixed_part(
                forward_s,
                _median(step.forward_s[position] for step in small_steps),
                batch_size,
                small_size,
            )
            backward_fixed_s = fixed_part(
                backward_s,
                _median(step.backward_s[position] for step in small_steps),
                batch_size,
                small_size,
            )
        ops.append(
            OpCost(
                id=op.id,
                compute_s=forward_s,
                backward_s=backward_s,
                param_bytes=params[position],
                out_bytes=out_bytes.get(position, 0),
                flops=flops[position],
                source=str(op.location),
                fixed_s=fixed_s,
                backward_fixed_s=backward_fixed_s,
                backward_input_s=split.measured(position, backward_s, steps),
                saved_bytes=saved_bytes.get(position, 0),
                input_bytes=input_bytes.get(position, 0),
                recomputes=position in recomputes,
            )
        )
    cuts = _cut_costs(graph, live_bytes, kinds, values)
    # The compute rate the op times reflect, so that --hardware can scale them.
    forward_flops = sum(op.flops or 0 for op in ops)
    total_forward_s = sum(op.compute_s for op in ops)
    achieved = (
        forward_flops / total_forward_s if forward_flops > 0 and total_forward_s > 0 else None
    )
    return Costs(
        batch_size=batch_size,
        training=True,
        memory_multiplier=TRAINING_MEMORY_MULTIPLIER,
        hardware=_measured_on(achieved, threads, on_gpu=_on_gpu(model, args)),
        ops=tuple(ops),
        cuts=cuts,
        model=graph.model_class,
        edges=graph.edges,
        notes=tuple(notes),
        containers=graph.containers,
        groups=op_groups(graph),
        min_microbatch_size=floor.size,
        min_microbatch_by=floor.by,
        speed_probe_s=speed_probe_s,
    )


def _at_speed(steps: list[_StepTimes], probes: list[float], speed_s: float) -> list[_StepTimes]:
    """``steps`` (one per timed run, or none) as they would have run at the speed where
    the probe takes ``speed_s``: run ``i``'s times scaled by ``speed_s`` over the mean of
    the probes before and after it (``probes`` has one more item than there were runs),
    so that a profile the machine's speed changed in the middle of is at one speed."""
    scaled = []
    for index, step in enumerate(steps):
        factor = speed_s / ((probes[index] + probes[index + 1]) / 2)
        scaled.append(
            _StepTimes(
                tuple(value * factor for value in step.forward_s),
                tuple(value * factor for value in step.backward_s),
                None
                if step.backward_input_s is None
                else tuple(value * factor for value in step.backward_input_s),
                step.input_own,
            )
        )
    return scaled


@dataclass(frozen=True)
class _SplitFacts:
    """What the measuring step saw of each op's backward (by op position): whether it
    computes a weight's gradient, and whether a tensor the op reads needs a gradient.
    An op missing from either was not seen alone (no gradient crossed the boundary
    after it, or before it)."""

    weights: Mapping[int, bool]
    reads_grad: Mapping[int, bool]

    def known(self, position: int, backward_s: float) -> float | None:
        """``backward_input_s`` where the structure decides it: 0 when nothing the op
        reads needs a gradient (the first op, reading token ids), all of ``backward_s``
        when the op has no weight whose gradient it computes."""
        if self.reads_grad.get(position) is False:
            return 0.0
        if self.weights.get(position) is False:
            return backward_s
        return None

    def measured(
        self, position: int, backward_s: float, steps: Sequence[_StepTimes]
    ) -> float | None:
        """``backward_input_s`` of a measured profile: :meth:`known`, else the median
        of the input-gradient pass's times, at most ``backward_s``. None (half, when
        read) where that pass did not run or did not time the op alone: no gradient
        crossed a boundary next to it (an op whose outputs are not tensors that need
        one), so its time is a share of several ops'."""
        known = self.known(position, backward_s)
        if known is not None:
            return known
        timed = [
            step.backward_input_s[position]
            for step in steps
            if step.backward_input_s is not None and step.input_own is not None
            if step.input_own[position]
        ]
        if not steps or len(timed) < len(steps) or position not in self.weights:
            return None
        return min(max(_median(timed), 0.0), backward_s)

    def counted(self, position: int, backward_s: float) -> float | None:
        """``backward_input_s`` of a counted profile: :meth:`known`, else half, the
        gradient of the input of each of the op's matrix products and not of its weight
        (a linear layer's backward is two products of its forward's size). None where the
        op's weights were not seen alone."""
        known = self.known(position, backward_s)
        if known is not None or position not in self.weights:
            return known
        return backward_s / 2


@dataclass(frozen=True)
class _Values:
    """What the measuring step saw of the values crossing each cut, one by one (by op
    position: each value's bytes and whether it carries a gradient), which ops drew
    random numbers, and whether the step ran on fake tensors (where drawing random
    numbers cannot be seen)."""

    at: Mapping[int, Mapping[str, tuple[int, bool]]]
    random: frozenset[int]
    fake: bool


def _cut_costs(
    graph: OpGraph,
    live_bytes: Mapping[int, int],
    kinds: Mapping[int, Mapping[str, str]],
    values: _Values | None = None,
) -> tuple[CutCost, ...]:
    """The graph's cuts with what the measuring step saw live at each (by op position)."""
    positions = {op.id: position for position, op in enumerate(graph.ops)}
    return tuple(
        CutCost(
            after=cut.after,
            live_bytes=live_bytes.get(positions[cut.after], 0),
            pinned=cut.pinned,
            kinds=tuple(sorted(kinds.get(positions[cut.after], {}).items())),
            values=_cut_values(cut, positions, kinds.get(positions[cut.after], {}), values),
        )
        for cut in graph.cuts
    )


def _cut_values(
    cut: Cut,
    positions: Mapping[str, int],
    kinds: Mapping[str, str],
    values: _Values | None,
) -> tuple[CutValue, ...]:
    """What crosses ``cut`` value by value, where the backend said what it sends
    (:attr:`Cut.sent`): the values the stage after could compute again
    (:attr:`Cut.replayable`) keep their ops, unless one of them drew random numbers (it
    would draw others), a value they need could not be sent (neither a tensor nor a
    number), or the step ran on fake tensors."""
    if values is None or cut.sent is None:
        return ()
    seen = values.at.get(positions[cut.after])
    if seen is None:
        return ()
    replayable = {item.name: item for item in cut.replayable}
    found: list[CutValue] = []
    for name in dict.fromkeys([*cut.crossing, *(n for r in cut.replayable for n in r.needs)]):
        size, grad = seen.get(name, (0, False))
        item = replayable.get(name)
        if item is not None and (
            values.fake
            or any(positions[op] in values.random for op in item.ops)
            or any(kinds.get(need) == "other" or need not in seen for need in item.needs)
        ):
            item = None
        found.append(
            CutValue(
                name=name,
                bytes=size,
                grad=grad,
                recompute=() if item is None else item.ops,
                needs=() if item is None else item.needs,
                sent=name in cut.crossing,
            )
        )
    return tuple(found)


def _counted_costs(
    graph: OpGraph,
    hardware: Hardware,
    flops: Sequence[int],
    params: Sequence[int],
    live_bytes: Mapping[int, int],
    kinds: Mapping[int, Mapping[str, str]],
    values: _Values,
    out_bytes: Mapping[int, int],
    batch_size: int,
    split: _SplitFacts,
) -> Costs:
    """The cost file of a step counted on fake tensors (:func:`profile_costs`); each op's
    ``backward_input_s`` as :meth:`_SplitFacts.counted` says."""
    rate = hardware.flops_per_s
    assert rate is not None and rate > 0
    ops = tuple(
        OpCost(
            id=op.id,
            compute_s=flops[position] / rate,
            backward_s=BACKWARD_FLOPS_RATIO * flops[position] / rate,
            param_bytes=params[position],
            out_bytes=out_bytes.get(position, 0),
            flops=flops[position],
            source=str(op.location),
            backward_input_s=split.counted(position, BACKWARD_FLOPS_RATIO * flops[position] / rate),
        )
        for position, op in enumerate(graph.ops)
    )
    cuts = _cut_costs(graph, live_bytes, kinds, values)
    note = (
        f"counted on fake tensors (no data), not measured: FLOPs (torch's FlopCounterMode) at "
        f"{rate:.3g} FLOP/s ({hardware.name or 'the hardware profile'}), backward "
        f"{BACKWARD_FLOPS_RATIO:g}x forward"
    )
    return Costs(
        batch_size=batch_size,
        training=True,
        memory_multiplier=TRAINING_MEMORY_MULTIPLIER,
        hardware=hardware,
        ops=ops,
        cuts=cuts,
        model=graph.model_class,
        edges=graph.edges,
        notes=(note,),
        containers=graph.containers,
        groups=op_groups(graph),
    )


class _SmallBatch:
    """The smaller batch's session; a failure there (a batch norm on one sample, a
    model that hard-codes its batch) only costs the fixed parts, not the profile."""

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.failure: SyncpassError | None = None

    def step(self) -> _StepTimes | None:
        if self.failure is not None:
            return None
        try:
            return self.session.step(measure=False)
        except SyncpassError as error:
            self.failure = error
            return None


def _fixed_note(asked: bool, failure: SyncpassError | None) -> str | None:
    """What the cost file says when the per-call fixed times could not be measured."""
    if asked and failure is None:
        return None
    why = (
        f"the run on an eighth of the batch failed ({failure})"
        if failure is not None
        else "the example's batch could not be cut into a smaller one"
    )
    return (
        f"per-call fixed times not measured: {why}; each micro-batch is costed as its "
        "share of the batch, which understates small ops"
    )

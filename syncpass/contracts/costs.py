"""The cost file (version 1): measured or estimated costs of a model's ops.

A cost file is the contract between profiling and planning. It holds, for one
batch size, each op's compute time and sizes, the admissible sync points
("cuts") with the bytes that cross them, the hardware they were measured on
and the default pass settings. It is plain JSON so it can be committed and
re-planned from without running any code; the format is documented in
``docs/formats.md``.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from syncpass.contracts.config import (
    CONFIG_KEYS,
    SyncConfig,
    default_sync_config,
    sync_config_from_mapping,
)
from syncpass.contracts.graph import INPUT, OUTPUT
from syncpass.contracts.tensor import TensorGraph, parse_tensor_graph, tensor_graph_to_json
from syncpass.core.errors import SyncpassError
from syncpass.core.jsonio import read_json

COST_FILE_VERSION = 1

#: A setting of the built model (``config.return_dict``) as the analysis may read it.
SettingValue = bool | int | float | str | None


@dataclass(frozen=True)
class Hardware:
    """The link and device a plan is made for.

    Communication of ``b`` bytes takes ``alpha_s + b / beta_bytes_per_s``.
    ``device_memory_bytes`` of ``None`` means no memory limit.
    ``collective_alpha_s`` and ``collective_beta_bytes_per_s``, when given, are the ring
    model's latency and bandwidth for collectives (tensor parallelism's all-reduces), fitted
    to measured all-reduces where they cost more than the point-to-point link says (gloo:
    about 300 us against 45 us for a small message on a 2-core machine); absent, the
    collectives take ``alpha_s`` and ``beta_bytes_per_s``.
    ``stage_overhead_s`` is the pipeline runtime's own time for each micro-batch
    forward or backward a stage runs (scheduling, autograd bookkeeping, setting
    up the transfers), on top of the ops' compute. ``devices`` is how many stages
    can run at once (GPUs per node times nodes; on a CPU, its cores divided by the
    threads each stage uses); ``None`` when not known (no limit).
    ``meet_stall_s`` and ``meet_window_s`` (0: none) are what two ranks' posts of their
    transfers to each other cost when they meet: the stall of posts made at the same
    moment, and how far apart two posts may be and still stall, the half-width of a
    triangle (gloo on a CPU blocks such posts for milliseconds; ``syncpass calibrate``
    measures both from two ranks' exchange at offsets; see
    :func:`~syncpass.plan.schedule.meeting_stall_s`).
    """

    alpha_s: float
    beta_bytes_per_s: float
    device_memory_bytes: float | None = None
    name: str | None = None
    flops_per_s: float | None = None  # the compute rate the op times reflect, when known
    stage_overhead_s: float = 0.0
    devices: int | None = None
    collective_alpha_s: float | None = None
    collective_beta_bytes_per_s: float | None = None
    meet_stall_s: float = 0.0
    meet_window_s: float = 0.0

    def __post_init__(self) -> None:
        if self.devices is not None and not (
            isinstance(self.devices, int)
            and not isinstance(self.devices, bool)
            and self.devices >= 1
        ):
            raise ValueError(f"devices must be a whole number >= 1, got {self.devices!r}")
        if not (_is_number(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"alpha_s must be a number >= 0 seconds, got {self.alpha_s!r}")
        if not _is_positive(self.beta_bytes_per_s):
            raise ValueError(
                f"beta_bytes_per_s must be a bandwidth > 0 bytes/s, got {self.beta_bytes_per_s!r}"
            )
        if self.device_memory_bytes is not None and not _is_positive(self.device_memory_bytes):
            raise ValueError(
                "device_memory_bytes must be > 0 bytes, or absent for no limit, "
                f"got {self.device_memory_bytes!r}"
            )

        if self.flops_per_s is not None and not _is_positive(self.flops_per_s):
            raise ValueError(f"flops_per_s must be > 0, got {self.flops_per_s!r}")
        if self.collective_alpha_s is not None and not (
            _is_number(self.collective_alpha_s) and self.collective_alpha_s >= 0
        ):
            raise ValueError(
                f"collective_alpha_s must be a number >= 0 seconds, got {self.collective_alpha_s!r}"
            )
        if self.collective_beta_bytes_per_s is not None and not _is_positive(
            self.collective_beta_bytes_per_s
        ):
            raise ValueError(
                "collective_beta_bytes_per_s must be a bandwidth > 0 bytes/s, got "
                f"{self.collective_beta_bytes_per_s!r}"
            )
        if not (_is_number(self.stage_overhead_s) and self.stage_overhead_s >= 0):
            raise ValueError(
                f"stage_overhead_s must be a number >= 0 seconds, got {self.stage_overhead_s!r}"
            )
        for name in ("meet_stall_s", "meet_window_s"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"{name} must be a number >= 0 seconds, got {value!r}")

    def transfer_s(self, num_bytes: float) -> float:
        """Time to move ``num_bytes`` once, one way."""
        return self.alpha_s + num_bytes / self.beta_bytes_per_s


@dataclass(frozen=True)
class OpCost:
    """Costs of one op at the cost file's batch size.

    ``id`` is the op's stable id (its qualified name in the model, with a
    source position where the name alone is not unique); ``source`` is
    ``"file:line"`` when known.

    ``fixed_s`` and ``backward_fixed_s`` are the parts of ``compute_s`` and
    ``backward_s`` that every call costs whatever its batch (dispatch, kernel
    launches, Python): a micro-batch of ``1/M`` of the batch takes
    ``fixed_s + (compute_s - fixed_s) / M``, not ``compute_s / M``.

    ``backward_input_s`` is the part of ``backward_s`` that computes the gradient
    of the op's inputs; the rest computes its weights' gradients. The zero-bubble
    schedules run the two apart (torch's ``I`` and ``W`` actions). ``None`` when not
    measured: :meth:`input_gradient_s` then takes half, as for a linear layer, whose
    two gradients are one matrix product each.

    Activation checkpointing (``syncpass plan --recompute``): ``saved_bytes`` are the
    activations the op keeps for its backward (what autograd saves, weights left out) and
    ``input_bytes`` the tensors it reads, which a checkpoint of the op keeps instead; both
    at the cost file's batch, ``None`` when not measured. ``recomputes`` says the op already
    runs its forward again in the backward as written (``checkpoint(block, x)``, a
    ``checkpoint_wrapper`` module): its ``backward_s`` includes that, its ``saved_bytes``
    are what the checkpoint keeps, and the plan keeps it so.
    """

    id: str
    compute_s: float
    backward_s: float = 0.0
    param_bytes: float = 0
    out_bytes: float = 0
    flops: float | None = None
    source: str | None = None
    fixed_s: float = 0.0
    backward_fixed_s: float = 0.0
    backward_input_s: float | None = None
    saved_bytes: float | None = None
    input_bytes: float | None = None
    recomputes: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("an op id must be a non-empty string")
        for name in (
            "compute_s",
            "backward_s",
            "param_bytes",
            "out_bytes",
            "fixed_s",
            "backward_fixed_s",
        ):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"op {self.id!r}: {name} must be a finite number >= 0")
        if self.fixed_s > self.compute_s or self.backward_fixed_s > self.backward_s:
            raise ValueError(
                f"op {self.id!r}: fixed_s and backward_fixed_s cannot exceed "
                "compute_s and backward_s"
            )
        if self.backward_input_s is not None and not (
            _is_number(self.backward_input_s) and 0 <= self.backward_input_s <= self.backward_s
        ):
            raise ValueError(
                f"op {self.id!r}: backward_input_s must be a number from 0 to backward_s"
            )
        for name in ("saved_bytes", "input_bytes"):
            value = getattr(self, name)
            if value is not None and not (_is_number(value) and 0 <= value < math.inf):
                raise ValueError(f"op {self.id!r}: {name} must be a finite number >= 0")
        if not isinstance(self.recomputes, bool):
            raise ValueError(f"op {self.id!r}: recomputes must be true or false")

    def input_gradient_s(self) -> float:
        """The part of ``backward_s`` that computes the inputs' gradients (half when not
        measured)."""
        if self.backward_input_s is None:
            return self.backward_s / 2
        return self.backward_input_s

    def with_compute_scaled(self, factor: float) -> OpCost:
        """This op with the part of its forward and backward time that scales (all but the
        fixed time per call) multiplied by ``factor``: by a batch size's ratio, or by a
        device's compute rate. ``backward_input_s`` stays the same share of the backward,
        so every figure stays consistent with every other."""
        compute = self.fixed_s + (self.compute_s - self.fixed_s) * factor
        backward = self.backward_fixed_s + (self.backward_s - self.backward_fixed_s) * factor
        backward_input = self.backward_input_s
        if backward_input is not None and self.backward_s > 0:
            backward_input = min(backward, backward_input / self.backward_s * backward)
        return dataclasses.replace(
            self, compute_s=compute, backward_s=backward, backward_input_s=backward_input
        )

    def with_time_scaled(self, factor: float) -> OpCost:
        """This op on the same device running ``factor`` times slower: every time figure,
        the fixed parts per call included, multiplied by ``factor``."""
        return dataclasses.replace(
            self,
            compute_s=self.compute_s * factor,
            backward_s=self.backward_s * factor,
            fixed_s=self.fixed_s * factor,
            backward_fixed_s=self.backward_fixed_s * factor,
            backward_input_s=(
                None if self.backward_input_s is None else self.backward_input_s * factor
            ),
        )

    def forward_step_s(self, microbatches: int = 1) -> float:
        """Forward time over one step of ``microbatches`` micro-batches."""
        return self.compute_s + (microbatches - 1) * self.fixed_s

    def backward_step_s(self, microbatches: int = 1) -> float:
        """Backward time over one step of ``microbatches`` micro-batches."""
        return self.backward_s + (microbatches - 1) * self.backward_fixed_s


#: What a live value that is not a tensor was when profiled: ``ints`` a tuple of Python
#: ints, ``size`` a ``torch.Size``, ``device`` a ``torch.device`` (each stage's own, not
#: sent), ``tensors:N`` a tuple of N tensors, ``pytree:TEMPLATE``
#: nested tuples, lists and dicts of tensors and constants (:func:`pytree_template`),
#: ``other`` anything else (an object, a dataclass, a string).
#: ``unbound``: a name the analysis finds live that held nothing when profiled (assigned
#: only in a branch not taken, OPT's LayerDrop ``dropout_probability``).
#: ``same:REF``: a tensor that was the very tensor another value live at the cut holds,
#: ``REF`` that value's name and the piece it sent it as (:func:`same_tensor_as`): sent once.
VALUE_KINDS = (
    "none",
    "unbound",
    "int",
    "float",
    "bool",
    "ints",
    "size",
    "device",
    "tensors:N",
    "mapping:...",
    "pytree:...",
    "same:...",
    "other",
)

#: The prefix of a value kind that is another value's tensor (:func:`same_tensor_as`).
SAME = "same:"


#: ``mapping:KEY=none,KEY=tensor,KEY=tensors:2``: a dict of identifier-like string keys to
#: tensors, None or tuples of tensors (Hugging Face's Qwen2 ``causal_mask_mapping``, Gemma
#: 3's rotary tables by layer type); it crosses as its tensors.
_ENTRY = r"[A-Za-z_]\w*=(none|tensor|tensors:[1-9]\d*)"
_MAPPING = re.compile(rf"mapping:{_ENTRY}(,{_ENTRY})*")


def known_kind(kind: str) -> bool:
    """Whether ``kind`` is one of :data:`VALUE_KINDS` (``tensors:2`` for ``tensors:N``,
    ``mapping:full=none,sliding=tensor`` for ``mapping:...``)."""
    if kind.startswith("tensors:"):
        count = kind.removeprefix("tensors:")
        return count.isdigit() and int(count) > 0
    if kind.startswith("mapping:"):
        return _MAPPING.fullmatch(kind) is not None
    if kind.startswith(PYTREE):
        return pytree_template(kind) is not None
    if kind.startswith(SAME):
        return same_tensor_as(kind) is not None
    return kind in VALUE_KINDS


def same_tensor_as(kind: str) -> tuple[str, str] | None:
    """The value and the piece of it (as :func:`pytree_pieces` writes pieces) that a
    ``same:REF`` kind names: ``("encoder_outputs", ".last_hidden_state")`` for
    ``same:encoder_outputs.last_hidden_state``, ``("x", "")`` for ``same:x``; ``None`` for
    any other kind, or a reference that is not a name followed by attributes and constant
    subscripts."""
    if not kind.startswith(SAME):
        return None
    reference = kind.removeprefix(SAME)
    try:
        node = ast.parse(reference, mode="eval").body
    except SyntaxError:
        return None
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Subscript) and type(_literal(node.slice)) not in (int, str):
            return None
        node = node.value
    if not isinstance(node, ast.Name) or not reference.startswith(node.id):
        return None
    return node.id, reference.removeprefix(node.id)


#: The kind of a live value no stage can send (a module, an open file, ...).
UNSENDABLE_KIND = "other"

#: The prefix of a value kind that is a nested structure of tensors and constants.
PYTREE = "pytree:"

#: What stands for a tensor in a :data:`PYTREE` template.
TENSOR_LEAF = "T"
#: What stands for a Python number there (a size, a count): sent as a 0-d tensor, since it
#: may change with the micro-batch; ``int`` or ``float`` again after the sync point.
NUMBER_LEAVES = {"I": "int", "F": "float"}
#: Every leaf a template names rather than writes out.
SENT_LEAVES = (TENSOR_LEAF, *NUMBER_LEAVES)


def _literal(node: ast.expr) -> object:
    """The constant ``node`` writes (``-1``, ``"mask"``), or ``None``."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError):
        return None


def pytree_template(kind: str) -> ast.expr | None:
    """The structure of a ``pytree:TEMPLATE`` kind: ``TEMPLATE`` is a Python literal of
    tuples, lists, dicts (keys strings or ints), sets of constants, iterators over lists
    or tuples of constants (``iter([None])``: what they have left to give) and dataclasses
    by their fields (``Output(logits=T, loss=None)``, the class by its name in the model's
    module) whose leaves are constants (``None``, booleans, strings) or what is sent:
    ``T`` for a tensor, ``I`` and ``F`` for a Python ``int`` and ``float``:
    ``pytree:(T, None, T)``, ``pytree:[None, None]``, ``pytree:{0: T, "mask": (T, I)}``.
    ``None`` for any other kind, or a template that is not of that form."""
    if not kind.startswith(PYTREE):
        return None
    try:
        tree = ast.parse(kind.removeprefix(PYTREE), mode="eval").body
    except (SyntaxError, ValueError):
        return None
    return tree if _is_template(tree) else None


def _is_number_literal(node: ast.expr) -> bool:
    """A number literal, negative too (a dict key, a set member)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    )


def _is_key(node: ast.expr | None) -> bool:
    """A dict key a subscript spells plainly: a string or a whole number."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    return _is_number_literal(node) if node is not None else False


def _is_template(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in SENT_LEAVES
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, bool | str)
    if isinstance(node, ast.Tuple | ast.List):
        return all(_is_template(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return all(
            _is_key(key) and _is_template(value)
            for key, value in zip(node.keys, node.values, strict=True)
        )
    if isinstance(node, ast.Set):  # of constants only
        return all(
            _is_number_literal(item) or (isinstance(item, ast.Constant) and _is_template(item))
            for item in node.elts
        )
    if isinstance(node, ast.Call) and _is_set_call(node):  # set(), frozenset({1, 2})
        return not node.args or _is_template(node.args[0])
    if isinstance(node, ast.Call) and _is_iterator_call(node):  # iter([None]): constants only
        items = node.args[0]
        return _is_template(items) and not any(
            isinstance(leaf, ast.Name) and leaf.id in SENT_LEAVES for leaf in ast.walk(items)
        )
    if isinstance(node, ast.Call):  # a dataclass by its fields: Output(logits=T, loss=None)
        return (
            isinstance(node.func, ast.Name)
            and node.func.id not in (*SENT_LEAVES, "iter", "set", "frozenset")
            and not node.args
            and all(
                keyword.arg is not None and _is_template(keyword.value) for keyword in node.keywords
            )
        )
    return False


def _is_iterator_call(node: ast.Call) -> bool:
    """``iter([...])`` or ``iter((...))``: an iterator over a list or tuple, written as what
    it has left to give (of constants: the stage after makes it again, nothing is sent)."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id == "iter"
        and not node.keywords
        and len(node.args) == 1
        and isinstance(node.args[0], ast.List | ast.Tuple)
    )


def _is_set_call(node: ast.Call) -> bool:
    """``set()``, ``frozenset()`` or ``frozenset({...})``: a set the template writes out."""
    return (
        isinstance(node.func, ast.Name)
        and node.func.id in ("set", "frozenset")
        and not node.keywords
        and (not node.args or (len(node.args) == 1 and isinstance(node.args[0], ast.Set)))
    )


def pytree_pieces(kind: str) -> tuple[str, ...] | None:
    """The subscripts of what a ``pytree:`` kind sends, in order: ``("[0]", "[2]")`` for
    ``pytree:(T, None, T)``, ``('["mask"][1]',)`` for ``pytree:{"mask": (None, T)}``,
    ``(".logits",)`` for ``pytree:Output(logits=T)``; ``None`` for any other kind."""
    found = _pytree_leaves(kind)
    return None if found is None else tuple(at for at, _ in found)


def pytree_leaves(kind: str) -> tuple[str, ...] | None:
    """What each piece of :func:`pytree_pieces` is: ``T``, ``I`` or ``F``."""
    found = _pytree_leaves(kind)
    return None if found is None else tuple(leaf for _, leaf in found)


def _pytree_leaves(kind: str) -> list[tuple[str, str]] | None:
    template = pytree_template(kind)
    if template is None:
        return None
    found: list[tuple[str, str]] = []

    def walk(node: ast.expr, at: str) -> None:
        if isinstance(node, ast.Name):
            found.append((at, node.id))
        elif isinstance(node, ast.Tuple | ast.List):
            for index, item in enumerate(node.elts):
                walk(item, f"{at}[{index}]")
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                walk(keyword.value, f"{at}.{keyword.arg}")
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                assert key is not None
                written = (
                    json.dumps(key.value, ensure_ascii=False)
                    if isinstance(key, ast.Constant) and isinstance(key.value, str)
                    else ast.unparse(key)
                )
                walk(value, f"{at}[{written}]")

    walk(template, "")
    return found


@dataclass(frozen=True)
class CutValue:
    """One value that crosses a cut, or that the stage after could receive instead.

    ``bytes`` are its tensors' bytes for the cost file's batch; ``grad`` says a
    gradient comes back for it in the backward. ``recompute`` are the ops whose
    statements compute it again (empty: it can only be sent); ``needs`` the values
    they read that the stage after must then receive. ``sent`` is false for a
    value that crosses only when a value computed again needs it (a size read by
    a rotary table's slice).
    """

    name: str
    bytes: float
    grad: bool = True
    recompute: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    sent: bool = True

    def __post_init__(self) -> None:
        if not (_is_number(self.bytes) and self.bytes >= 0):
            raise ValueError(f"value {self.name!r}: bytes must be a number >= 0")


@dataclass(frozen=True)
class Crossing:
    """What one cut costs as the plan crosses it: the bytes sent forward, the gradient
    bytes sent back, and the forward compute of the values the stage after computes
    again (``recomputed``) instead of receiving them."""

    forward_bytes: float
    backward_bytes: float
    recompute_s: float = 0.0
    recomputed: tuple[str, ...] = ()
    backward: bool = True  # whether a gradient transfer comes back at all


@dataclass(frozen=True)
class CutCost:
    """An admissible sync point: a cut right after op ``after``.

    ``live_bytes`` is the size of every value defined at or before the op
    and used after it, i.e. what crosses the link. ``pinned`` cuts are the
    user's own sync points: every strategy keeps them, and ``manual`` uses
    only them. ``kinds`` names the live values that were not tensors when
    profiled, with what they were (:data:`VALUE_KINDS`): a stage cannot send
    them as they are. ``values``, when the profile measured them one by one,
    are what crosses value by value (:class:`CutValue`): which need a gradient
    back, and which the stage after could compute again instead.
    """

    after: str
    live_bytes: float
    pinned: bool = False
    kinds: tuple[tuple[str, str], ...] = ()
    values: tuple[CutValue, ...] = ()

    def __post_init__(self) -> None:
        if not (_is_number(self.live_bytes) and self.live_bytes >= 0):
            raise ValueError(f"cut after {self.after!r}: live_bytes must be a number >= 0")
        for name, kind in self.kinds:
            if not known_kind(kind):
                raise ValueError(
                    f"cut after {self.after!r}: {name} has kind {kind!r}; "
                    f"known: {', '.join(VALUE_KINDS)}"
                )
        names = [value.name for value in self.values]
        if len(set(names)) != len(names):
            raise ValueError(f"cut after {self.after!r}: a value is listed twice")
        for value in self.values:
            unknown = [need for need in value.needs if need not in names]
            if unknown:
                raise ValueError(
                    f"cut after {self.after!r}: {value.name} needs {unknown[0]!r}, "
                    "which is not one of the cut's values"
                )


@dataclass(frozen=True)
class OpGroup:
    """Ops that one call runs, planned one by one but plannable as one op again: the
    children of a nested ``nn.Sequential`` (``blocks.1`` of ``x = self.blocks(x)``, whose
    ops are ``blocks.1.0``, ``blocks.1.1``, ...). ``id`` is the op id the group takes when
    planned whole; ``ops`` are its ops, consecutive and in order, those of groups nested in
    it included. The planner plans a group whole unless it is too big for a stage
    (:mod:`syncpass.plan.levels`)."""

    id: str
    ops: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a group id must be a non-empty string")
        if len(self.ops) < 2:
            raise ValueError(f"group {self.id!r} needs at least two ops")


@dataclass(frozen=True)
class Costs:
    """A whole cost file: ops in execution order and their admissible cuts."""

    batch_size: int
    training: bool
    memory_multiplier: float
    hardware: Hardware
    ops: tuple[OpCost, ...]
    cuts: tuple[CutCost, ...]
    config: SyncConfig = field(default_factory=SyncConfig)
    model: str | None = None
    version: int = COST_FILE_VERSION
    edges: tuple[tuple[str, str], ...] = ()  # def-use: (producer, consumer), INPUT/OUTPUT too
    notes: tuple[str, ...] = ()  # what was done to the figures since they were measured
    # Each layer container's length, where op ids cannot tell it (a loop over self.layers[:-1]).
    containers: tuple[tuple[str, int], ...] = ()
    # The built model's settings that decided branches (``config.return_dict`` -> True): the
    # analysis reads the same from here, so plan and rewrite plan what was profiled.
    model_settings: tuple[tuple[str, SettingValue], ...] = ()
    # Nested nn.Sequential children planned per child, outermost first (OpGroup).
    groups: tuple[OpGroup, ...] = ()
    # The fewest samples a micro-batch may hold (a batch norm in training needs more than
    # one value per channel), and what needs them: "layer4.1.bn2 (resnet.py:96)".
    min_microbatch_size: int = 1
    min_microbatch_by: str | None = None
    # The finer graph a tensor-parallel plan needs (linear-like ops, their features and the
    # values between them), when the profile recorded it (syncpass.contracts.tensor).
    tensor: TensorGraph | None = None
    # How long syncpass's speed probe took on the machine while the op times were measured
    # (syncpass.backends.torch.speed): a run elsewhere in time is predicted at its own
    # probe's speed. None where nothing was timed (counted costs, a GPU's kernels).
    speed_probe_s: float | None = None

    def __post_init__(self) -> None:
        if self.version != COST_FILE_VERSION:
            raise ValueError(f"version must be {COST_FILE_VERSION}, got {self.version!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int):
            raise ValueError("batch_size must be a whole number")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        size = self.min_microbatch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"min_microbatch_size must be a whole number >= 1 (samples), got {size!r}"
            )
        if (self.min_microbatch_by is not None) != (size > 1):
            raise ValueError(
                "min_microbatch_by names what needs min_microbatch_size samples: give it "
                "exactly when min_microbatch_size is above 1"
            )
        if not (_is_number(self.memory_multiplier) and self.memory_multiplier >= 0):
            raise ValueError("memory_multiplier must be a number >= 0")
        if self.speed_probe_s is not None and not _is_positive(self.speed_probe_s):
            raise ValueError(f"speed_probe_s must be > 0 seconds, got {self.speed_probe_s!r}")
        if not self.ops:
            raise ValueError("a cost file needs at least one op")
        position = self.op_index
        if len(position) != len(self.ops):
            ids = [op.id for op in self.ops]
            duplicate = next(op_id for op_id in ids if ids.count(op_id) > 1)
            raise ValueError(f"op id {duplicate!r} appears twice; op ids must be unique")
        last = -1
        for cut in self.cuts:
            if cut.after not in position:
                raise ValueError(f"cut after {cut.after!r} names no op")
            index = position[cut.after]
            if index == len(self.ops) - 1:
                raise ValueError(
                    f"cut after {cut.after!r}: the last op cannot be followed by a cut"
                )
            if index <= last:
                raise ValueError(
                    f"cut after {cut.after!r} is out of order or repeated; list cuts in op order"
                )
            last = index
            for value in cut.values:
                for op in value.recompute:
                    if position.get(op, index + 1) > index:
                        raise ValueError(
                            f"cut after {cut.after!r}: {value.name} is computed again by "
                            f"{op!r}, which names no op up to the cut"
                        )

        for producer, consumer in self.edges:
            if producer != INPUT and producer not in position:
                raise ValueError(f"edge from unknown op {producer!r}")
            if consumer != OUTPUT and consumer not in position:
                raise ValueError(f"edge to unknown op {consumer!r}")
        self._check_groups()

    def _check_groups(self) -> None:
        """Groups name known, consecutive ops, take ids no op has, and nest or keep apart."""
        position = self.op_index
        spans: list[tuple[int, int, str]] = []
        for group in self.groups:
            if group.id in position:
                raise ValueError(f"group {group.id!r} takes the id of an op; ids must differ")
            unknown = [op for op in group.ops if op not in position]
            if unknown:
                raise ValueError(f"group {group.id!r} names no op {unknown[0]!r}")
            places = [position[op] for op in group.ops]
            if places != list(range(places[0], places[0] + len(places))):
                raise ValueError(f"group {group.id!r}: its ops must be consecutive and in order")
            spans.append((places[0], places[-1], group.id))
        ids = [group.id for group in self.groups]
        if len(set(ids)) != len(ids):
            raise ValueError("a group id appears twice; group ids must be unique")
        for (first, last, name), (other_first, other_last, other) in itertools.combinations(
            spans, 2
        ):
            apart = last < other_first or other_last < first
            nested = (first <= other_first and other_last <= last) or (
                other_first <= first and last <= other_last
            )
            if not (apart or nested):
                raise ValueError(
                    f"groups {name!r} and {other!r} overlap without one holding the other"
                )

    @cached_property
    def op_index(self) -> dict[str, int]:
        """Position of each op id in execution order."""
        return {op.id: index for index, op in enumerate(self.ops)}

    def renamed(self, rename: Mapping[str, str]) -> Costs:
        """These costs with op ids renamed (every op, cut, value computed again and edge
        names one of ``rename``'s keys, ``INPUT`` and ``OUTPUT`` too)."""
        return dataclasses.replace(
            self,
            ops=tuple(dataclasses.replace(op, id=rename[op.id]) for op in self.ops),
            cuts=tuple(
                dataclasses.replace(
                    cut,
                    after=rename[cut.after],
                    values=tuple(
                        dataclasses.replace(
                            value, recompute=tuple(rename[op] for op in value.recompute)
                        )
                        for value in cut.values
                    ),
                )
                for cut in self.cuts
            ),
            edges=tuple((rename[a], rename[b]) for a, b in self.edges),
            groups=tuple(
                dataclasses.replace(group, ops=tuple(rename[op] for op in group.ops))
                for group in self.groups
            ),
        )

    def unsendable(self, kinds: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """The cuts a value of one of ``kinds`` crosses (stages that cannot send such a value
        take no sync point there), by the op they follow, with those values' names."""
        found = {
            cut.after: tuple(
                name
                for name, kind in cut.kinds
                if kind in kinds and name not in self._replayed_instead(cut)
            )
            for cut in self.cuts
        }
        return {after: names for after, names in found.items() if names}

    def _replayed_instead(self, cut: CutCost) -> tuple[str, ...]:
        """The values crossing ``cut`` that no stage can send (of kind ``other``: a tuple of
        the model's modules, x-transformers' ``layer_variables``) and that the stage after
        computes again instead, whatever that costs: computed again from what can be sent
        (their ``needs``), with no gradient and by ops that hold no weights."""
        kinds = dict(cut.kinds)
        by_name = {value.name: value for value in cut.values}
        found = []
        for value in cut.values:
            if kinds.get(value.name) != UNSENDABLE_KIND or not value.recompute or value.grad:
                continue
            if any(self.ops[self.op_index[op]].param_bytes for op in value.recompute):
                continue
            needs = [by_name.get(name) for name in value.needs]
            if any(kinds.get(name) == UNSENDABLE_KIND for name in value.needs) or any(
                need is None or need.grad for need in needs
            ):
                continue  # what it needs cannot be sent, or would need a gradient back
            found.append(value.name)
        return tuple(found)

    @cached_property
    def crossing_at(self) -> dict[int, Crossing]:
        """How the plan crosses each admissible cut, by position (the cut after op ``t`` is
        ``t + 1``): :meth:`crossing`."""
        return {self.op_index[cut.after] + 1: self.crossing(cut) for cut in self.cuts}

    @cached_property
    def live_bytes_at(self) -> dict[int, float]:
        """Bytes sent forward across each admissible cut, by position."""
        return {position: crossing.forward_bytes for position, crossing in self.crossing_at.items()}

    def crossing(self, cut: CutCost) -> Crossing:
        """Send or compute again: how the stages cross ``cut``.

        A value the stage after can compute again (:attr:`CutValue.recompute`), that
        needs no gradient and whose ops hold no weights, is computed again when that
        costs less than sending it:
        the forward time of its ops (a whole step's, at the cost file's batch) plus
        sending what it needs that would not cross anyway, against sending it once
        (no gradient comes back for it). Values are taken in the cut's order; one
        that a value computed again needs is sent. Without ``values`` everything
        live is sent, and a gradient of the same size comes back.
        """
        if not cut.values:
            return Crossing(cut.live_bytes, cut.live_bytes)
        beta = self.hardware.beta_bytes_per_s
        by_name = {value.name: value for value in cut.values}
        sent = {value.name for value in cut.values if value.sent}
        chosen: list[str] = []
        needed: set[str] = set()
        replayed_ops: set[str] = set()
        recompute_s = 0.0
        forced = self._replayed_instead(cut)
        for value in sorted(cut.values, key=lambda value: value.name not in forced):
            if not value.recompute or value.grad or not value.sent or value.name in needed:
                continue
            if any(self.ops[self.op_index[op]].param_bytes for op in value.recompute):
                continue  # the stage after would hold those weights too
            extra = [name for name in value.needs if name not in sent]
            if any(name in chosen or by_name[name].grad for name in value.needs):
                continue
            new_ops = [op for op in value.recompute if op not in replayed_ops]
            replay_s = sum(self.ops[self.op_index[op]].compute_s for op in new_ops)
            receive_s = sum(by_name[name].bytes for name in extra) / beta
            if replay_s + receive_s >= value.bytes / beta and value.name not in forced:
                continue
            chosen.append(value.name)
            sent.discard(value.name)
            sent.update(extra)
            needed.update(value.needs)
            replayed_ops.update(new_ops)
            recompute_s += replay_s
        return Crossing(
            forward_bytes=sum(value.bytes for value in cut.values if value.name in sent),
            backward_bytes=sum(
                value.bytes for value in cut.values if value.name in sent and value.grad
            ),
            recompute_s=recompute_s,
            recomputed=tuple(chosen),
            backward=any(value.grad for value in cut.values if value.name in sent),
        )

    def op_compute_s(self, op: OpCost, microbatches: int = 1) -> float:
        """Compute one op costs per step of ``microbatches`` micro-batches: forward,
        plus backward when training (each micro-batch pays the op's fixed part)."""
        forward = op.forward_step_s(microbatches)
        return forward + op.backward_step_s(microbatches) if self.training else forward

    def cut_comm_s(self, cut: CutCost, microbatches: int = 1) -> float:
        """Communication of one cut per step: one transfer per micro-batch (each pays
        the latency), and when training one back for the gradients (none when nothing
        sent needs one); plus the compute of what the stage after computes again
        instead of receiving it (:meth:`crossing`), charged to the cut."""
        hardware = self.hardware
        crossing = self.crossing(cut)
        latency = microbatches * hardware.alpha_s
        total = latency + crossing.forward_bytes / hardware.beta_bytes_per_s
        if self.training and crossing.backward:
            total += latency + crossing.backward_bytes / hardware.beta_bytes_per_s
        return total + crossing.recompute_s

    def op_memory_bytes(self, op: OpCost) -> float:
        """Device memory one op's stage needs for it."""
        return self.memory_multiplier * op.param_bytes + op.out_bytes


# --- JSON ------------------------------------------------------------------


def load_costs(path: str | Path) -> Costs:
    """Read and validate a cost file; errors name the file and JSON path."""
    return parse_costs(read_json(path, "cost file"), str(path))


def parse_costs(data: Any, origin: str = "<costs>") -> Costs:
    """Build :class:`Costs` from decoded JSON, checking every field by path."""
    reader = _Reader(origin)
    top = reader.mapping(data, "$")
    reader.no_unknown(
        top,
        "$",
        (
            "version",
            "batch_size",
            "training",
            "memory_multiplier",
            "hardware",
            "config",
            "ops",
            "cuts",
            "model",
            "edges",
            "notes",
            "containers",
            "model_settings",
            "groups",
            "min_microbatch_size",
            "min_microbatch_by",
            "tensor",
            "speed_probe_s",
        ),
    )
    version = reader.required(top, "$", "version")
    if version != COST_FILE_VERSION:
        raise reader.error(
            "$.version", f"unsupported version {version!r}; this syncpass reads version 1"
        )
    hardware_data = reader.mapping(reader.required(top, "$", "hardware"), "$.hardware")
    reader.no_unknown(
        hardware_data,
        "$.hardware",
        (
            "alpha_s",
            "beta_bytes_per_s",
            "device_memory_bytes",
            "name",
            "flops_per_s",
            "stage_overhead_s",
            "devices",
            "collective_alpha_s",
            "collective_beta_bytes_per_s",
            "meet_stall_s",
            "meet_window_s",
        ),
    )
    memory = hardware_data.get("device_memory_bytes")
    devices = hardware_data.get("devices")
    if devices is not None and (
        not isinstance(devices, int) or isinstance(devices, bool) or devices < 1
    ):
        raise reader.error("$.hardware.devices", f"must be a whole number >= 1, got {devices!r}")
    hardware = Hardware(
        alpha_s=reader.number(hardware_data, "$.hardware", "alpha_s", minimum=0),
        beta_bytes_per_s=reader.number(
            hardware_data, "$.hardware", "beta_bytes_per_s", minimum=0, strict=True
        ),
        device_memory_bytes=None
        if memory is None
        else reader.number(hardware_data, "$.hardware", "device_memory_bytes", 0, strict=True),
        name=reader.optional_string(hardware_data, "$.hardware", "name"),
        flops_per_s=None
        if hardware_data.get("flops_per_s") is None
        else reader.number(hardware_data, "$.hardware", "flops_per_s", 0, strict=True),
        stage_overhead_s=reader.number(
            hardware_data, "$.hardware", "stage_overhead_s", minimum=0, default=0.0
        ),
        devices=devices,
        collective_alpha_s=None
        if hardware_data.get("collective_alpha_s") is None
        else reader.number(hardware_data, "$.hardware", "collective_alpha_s", minimum=0),
        collective_beta_bytes_per_s=None
        if hardware_data.get("collective_beta_bytes_per_s") is None
        else reader.number(
            hardware_data, "$.hardware", "collective_beta_bytes_per_s", 0, strict=True
        ),
        meet_stall_s=reader.number(
            hardware_data, "$.hardware", "meet_stall_s", minimum=0, default=0.0
        ),
        meet_window_s=reader.number(
            hardware_data, "$.hardware", "meet_window_s", minimum=0, default=0.0
        ),
    )
    config = default_sync_config()
    if "config" in top:
        config_data = dict(reader.mapping(top["config"], "$.config"))
        if config_data.get("communication_cost_threshold", 0) is None:
            # JSON has no infinity: null is "no limit", as in plan files.
            config_data["communication_cost_threshold"] = math.inf
        config = sync_config_from_mapping(config_data, f"{origin}:$.config", config)

    ops_data = reader.sequence(reader.required(top, "$", "ops"), "$.ops")
    if not ops_data:
        raise reader.error("$.ops", "needs at least one op")
    ops = []
    seen: dict[str, int] = {}
    for index, item in enumerate(ops_data):
        where = f"$.ops[{index}]"
        op = reader.mapping(item, where)
        reader.no_unknown(
            op,
            where,
            (
                "id",
                "compute_s",
                "backward_s",
                "param_bytes",
                "out_bytes",
                "flops",
                "source",
                "fixed_s",
                "backward_fixed_s",
                "backward_input_s",
                "saved_bytes",
                "input_bytes",
                "recomputes",
            ),
        )
        op_id = reader.string(op, where, "id")
        if op_id in seen:
            raise reader.error(
                f"{where}.id", f"op id {op_id!r} already used by $.ops[{seen[op_id]}]"
            )
        seen[op_id] = index
        flops = op.get("flops")
        compute_s = reader.number(op, where, "compute_s", minimum=0)
        backward_s = reader.number(op, where, "backward_s", minimum=0, default=0.0)
        fixed_s = reader.number(op, where, "fixed_s", minimum=0, default=0.0)
        backward_fixed_s = reader.number(op, where, "backward_fixed_s", minimum=0, default=0.0)
        if fixed_s > compute_s:
            raise reader.error(f"{where}.fixed_s", "cannot exceed compute_s")
        if backward_fixed_s > backward_s:
            raise reader.error(f"{where}.backward_fixed_s", "cannot exceed backward_s")
        backward_input_s = None
        if op.get("backward_input_s") is not None:
            backward_input_s = reader.number(op, where, "backward_input_s", minimum=0)
            if backward_input_s > backward_s:
                raise reader.error(f"{where}.backward_input_s", "cannot exceed backward_s")
        ops.append(
            OpCost(
                id=op_id,
                compute_s=compute_s,
                backward_s=backward_s,
                fixed_s=fixed_s,
                backward_fixed_s=backward_fixed_s,
                backward_input_s=backward_input_s,
                param_bytes=reader.number(op, where, "param_bytes", minimum=0, default=0),
                out_bytes=reader.number(op, where, "out_bytes", minimum=0, default=0),
                flops=None if flops is None else reader.number(op, where, "flops", minimum=0),
                source=reader.optional_string(op, where, "source"),
                saved_bytes=_optional_bytes(reader, op, where, "saved_bytes"),
                input_bytes=_optional_bytes(reader, op, where, "input_bytes"),
                recomputes=_flag(reader, op, where, "recomputes"),
            )
        )

    cuts_data = reader.sequence(top.get("cuts", []), "$.cuts")
    cuts = []
    last_index = -1
    for index, item in enumerate(cuts_data):
        where = f"$.cuts[{index}]"
        cut = reader.mapping(item, where)
        reader.no_unknown(cut, where, ("after", "live_bytes", "pinned", "kinds", "values"))
        after = reader.string(cut, where, "after")
        if after not in seen:
            raise reader.error(f"{where}.after", f"unknown op id {after!r}; it must name an op")
        op_position = seen[after]
        if op_position == len(ops) - 1:
            raise reader.error(
                f"{where}.after", f"{after!r} is the last op; nothing follows it to sync with"
            )
        if op_position <= last_index:
            raise reader.error(
                f"{where}.after",
                f"cut after {after!r} is out of order or repeated; list cuts in op order",
            )
        last_index = op_position
        pinned = cut.get("pinned", False)
        if not isinstance(pinned, bool):
            raise reader.error(f"{where}.pinned", "must be true or false")
        kinds = cut.get("kinds", {})
        if not isinstance(kinds, dict) or not all(
            isinstance(kind, str) and known_kind(kind) for kind in kinds.values()
        ):
            raise reader.error(
                f"{where}.kinds", f"must map value names to one of {', '.join(VALUE_KINDS)}"
            )
        cuts.append(
            CutCost(
                after=after,
                live_bytes=reader.number(cut, where, "live_bytes", minimum=0),
                pinned=pinned,
                kinds=tuple(sorted((str(name), kind) for name, kind in kinds.items())),
                values=_cut_values(reader, cut, where, seen, after),
            )
        )

    edges = []
    for index, item in enumerate(reader.sequence(top.get("edges", []), "$.edges")):
        where = f"$.edges[{index}]"
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise reader.error(where, "must be a pair [producer, consumer] of op ids")
        producer, consumer = item
        if producer != INPUT and producer not in seen:
            raise reader.error(f"{where}[0]", f"unknown op id {producer!r}")
        if consumer != OUTPUT and consumer not in seen:
            raise reader.error(f"{where}[1]", f"unknown op id {consumer!r}")
        if producer != INPUT and consumer != OUTPUT and seen[producer] >= seen[consumer]:
            raise reader.error(
                where,
                f"{producer!r} runs after {consumer!r}: an edge goes from an op to a later one",
            )
        edges.append((producer, consumer))

    training = top.get("training", True)
    if not isinstance(training, bool):
        raise reader.error("$.training", "must be true or false")
    batch_size = reader.required(top, "$", "batch_size")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise reader.error("$.batch_size", f"must be a whole number >= 1, got {batch_size!r}")
    min_size = top.get("min_microbatch_size", 1)
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 1:
        raise reader.error(
            "$.min_microbatch_size", f"must be a whole number >= 1 (samples), got {min_size!r}"
        )
    min_by = reader.optional_string(top, "$", "min_microbatch_by")
    if (min_by is not None) != (min_size > 1):
        raise reader.error(
            "$.min_microbatch_by",
            "names what needs min_microbatch_size samples: give it exactly when "
            "min_microbatch_size is above 1",
        )
    return Costs(
        batch_size=batch_size,
        training=training,
        memory_multiplier=reader.number(top, "$", "memory_multiplier", minimum=0, default=1.0),
        hardware=hardware,
        ops=tuple(ops),
        cuts=tuple(cuts),
        config=config,
        model=reader.optional_string(top, "$", "model"),
        edges=tuple(edges),
        notes=tuple(str(note) for note in reader.sequence(top.get("notes", []), "$.notes")),
        containers=_containers(reader, top.get("containers", {})),
        model_settings=parse_settings(
            top.get("model_settings", {}), lambda path, message: reader.error(path, message)
        ),
        groups=_groups(reader, top.get("groups", []), seen),
        min_microbatch_size=min_size,
        min_microbatch_by=min_by,
        tensor=_tensor(reader, top.get("tensor"), batch_size),
        speed_probe_s=(
            reader.number(top, "$", "speed_probe_s", minimum=0, strict=True)
            if top.get("speed_probe_s") is not None
            else None
        ),
    )


def _tensor(reader: _Reader, value: Any, batch_size: int) -> TensorGraph | None:
    """``$.tensor``: the tensor graph (:mod:`syncpass.contracts.tensor`), when recorded."""
    if value is None:
        return None
    try:
        graph = parse_tensor_graph(value, "$.tensor")
    except ValueError as error:
        path, _, message = str(error).partition(": ")
        raise reader.error(path, message) from None
    if graph.batch_size != batch_size:
        raise reader.error(
            "$.tensor.batch_size",
            f"is {graph.batch_size}, the cost file's batch_size {batch_size}: "
            "both must describe the same batch (profile again)",
        )
    return graph


def parse_settings(
    value: Any, error: Callable[[str, str], Exception]
) -> tuple[tuple[str, SettingValue], ...]:
    """``$.model_settings`` of a cost or plan file: an attribute path of the model -> a JSON
    scalar (``error(json_path, message)`` says what is wrong)."""
    if not isinstance(value, dict):
        raise error("$.model_settings", "must be an object of attribute path -> value")
    found = []
    for path, setting in value.items():
        if not isinstance(setting, bool | int | float | str | None):
            raise error(
                f"$.model_settings.{path}",
                f"must be a number, a string, true, false or null, got {setting!r}",
            )
        found.append((str(path), setting))
    return tuple(sorted(found))


def _groups(reader: _Reader, value: Any, seen: Mapping[str, int]) -> tuple[OpGroup, ...]:
    """``$.groups``: ``[{"id": "blocks.1", "ops": ["blocks.1.0", ...]}, ...]``."""
    found = []
    for index, item in enumerate(reader.sequence(value, "$.groups")):
        where = f"$.groups[{index}]"
        group = reader.mapping(item, where)
        reader.no_unknown(group, where, ("id", "ops"))
        group_id = reader.string(group, where, "id")
        ops = reader.sequence(reader.required(group, where, "ops"), f"{where}.ops")
        if len(ops) < 2 or not all(isinstance(op, str) for op in ops):
            raise reader.error(f"{where}.ops", "must list at least two op ids")
        missing = [op for op in ops if op not in seen]
        if missing:
            raise reader.error(f"{where}.ops", f"unknown op id {missing[0]!r}; it must name an op")
        places = [seen[op] for op in ops]
        if places != list(range(places[0], places[0] + len(ops))):
            raise reader.error(f"{where}.ops", "must be consecutive ops, in order")
        if group_id in seen:
            raise reader.error(f"{where}.id", f"{group_id!r} is an op's id; a group needs its own")
        found.append(OpGroup(group_id, tuple(ops)))
    return tuple(found)


def _containers(reader: _Reader, value: Any) -> tuple[tuple[str, int], ...]:
    """``$.containers``: layer container -> its length (a whole number >= 0)."""
    if not isinstance(value, dict):
        raise reader.error("$.containers", "must be an object of container name -> length")
    found = []
    for name, length in value.items():
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise reader.error(
                f"$.containers.{name}", f"must be a whole number >= 0, got {length!r}"
            )
        found.append((str(name), length))
    return tuple(sorted(found))


def costs_to_json(costs: Costs) -> dict[str, Any]:
    """The cost file's JSON object (the inverse of :func:`parse_costs`)."""
    hardware: dict[str, Any] = {
        "alpha_s": costs.hardware.alpha_s,
        "beta_bytes_per_s": costs.hardware.beta_bytes_per_s,
    }
    if costs.hardware.device_memory_bytes is not None:
        hardware["device_memory_bytes"] = costs.hardware.device_memory_bytes
    if costs.hardware.name is not None:
        hardware["name"] = costs.hardware.name
    if costs.hardware.flops_per_s is not None:
        hardware["flops_per_s"] = costs.hardware.flops_per_s
    if costs.hardware.stage_overhead_s:
        hardware["stage_overhead_s"] = costs.hardware.stage_overhead_s
    if costs.hardware.devices is not None:
        hardware["devices"] = costs.hardware.devices
    if costs.hardware.collective_alpha_s is not None:
        hardware["collective_alpha_s"] = costs.hardware.collective_alpha_s
    if costs.hardware.collective_beta_bytes_per_s is not None:
        hardware["collective_beta_bytes_per_s"] = costs.hardware.collective_beta_bytes_per_s
    if costs.hardware.meet_stall_s or costs.hardware.meet_window_s:
        hardware["meet_stall_s"] = costs.hardware.meet_stall_s
        hardware["meet_window_s"] = costs.hardware.meet_window_s
    data: dict[str, Any] = {"version": costs.version}
    if costs.model is not None:
        data["model"] = costs.model
    data.update(
        batch_size=costs.batch_size,
        training=costs.training,
        memory_multiplier=costs.memory_multiplier,
        hardware=hardware,
        config={
            key: None if getattr(costs.config, key) == math.inf else getattr(costs.config, key)
            for key in CONFIG_KEYS
        },
        ops=[_op_to_json(op) for op in costs.ops],
        cuts=[_cut_to_json(cut) for cut in costs.cuts],
    )
    if costs.edges:
        data["edges"] = [list(edge) for edge in costs.edges]
    if costs.notes:
        data["notes"] = list(costs.notes)
    if costs.containers:
        data["containers"] = dict(costs.containers)
    if costs.model_settings:
        data["model_settings"] = dict(costs.model_settings)
    if costs.groups:
        data["groups"] = [{"id": group.id, "ops": list(group.ops)} for group in costs.groups]
    if costs.min_microbatch_size > 1:
        data["min_microbatch_size"] = costs.min_microbatch_size
        data["min_microbatch_by"] = costs.min_microbatch_by
    if costs.tensor is not None:
        data["tensor"] = tensor_graph_to_json(costs.tensor)
    if costs.speed_probe_s is not None:
        data["speed_probe_s"] = costs.speed_probe_s
    return data


def _op_to_json(op: OpCost) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": op.id,
        "compute_s": op.compute_s,
        "backward_s": op.backward_s,
        "param_bytes": op.param_bytes,
        "out_bytes": op.out_bytes,
    }
    if op.fixed_s:
        data["fixed_s"] = op.fixed_s
    if op.backward_fixed_s:
        data["backward_fixed_s"] = op.backward_fixed_s
    if op.backward_input_s is not None:
        data["backward_input_s"] = op.backward_input_s
    if op.flops is not None:
        data["flops"] = op.flops
    if op.source is not None:
        data["source"] = op.source
    if op.saved_bytes is not None:
        data["saved_bytes"] = op.saved_bytes
    if op.input_bytes is not None:
        data["input_bytes"] = op.input_bytes
    if op.recomputes:
        data["recomputes"] = True
    return data


def _optional_bytes(reader: _Reader, op: Mapping[str, Any], where: str, key: str) -> float | None:
    if op.get(key) is None:
        return None
    return reader.number(op, where, key, minimum=0)


def _flag(reader: _Reader, op: Mapping[str, Any], where: str, key: str) -> bool:
    value = op.get(key, False)
    if not isinstance(value, bool):
        raise reader.error(f"{where}.{key}", f"must be true or false, got {_json_kind(value)}")
    return value


def _cut_to_json(cut: CutCost) -> dict[str, Any]:
    data: dict[str, Any] = {"after": cut.after, "live_bytes": cut.live_bytes}
    if cut.pinned:
        data["pinned"] = True
    if cut.kinds:
        data["kinds"] = dict(cut.kinds)
    if cut.values:
        data["values"] = [_value_to_json(value) for value in cut.values]
    return data


def _value_to_json(value: CutValue) -> dict[str, Any]:
    data: dict[str, Any] = {"name": value.name, "bytes": value.bytes, "grad": value.grad}
    if value.recompute:
        data["recompute"] = list(value.recompute)
    if value.needs:
        data["needs"] = list(value.needs)
    if not value.sent:
        data["sent"] = False
    return data


def _cut_values(
    reader: _Reader, cut: Mapping[str, Any], where: str, ops: Mapping[str, int], after: str
) -> tuple[CutValue, ...]:
    """``$.cuts[i].values``: each value's name, bytes, whether a gradient comes back, the
    ops (at or before the cut) that compute it again and what they need."""
    values: list[CutValue] = []
    items = reader.sequence(cut.get("values", []), f"{where}.values")
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    for index, item in enumerate(items):
        at = f"{where}.values[{index}]"
        value = reader.mapping(item, at)
        reader.no_unknown(value, at, ("name", "bytes", "grad", "recompute", "needs", "sent"))
        name = reader.string(value, at, "name")
        if name in names[:index]:
            raise reader.error(f"{at}.name", f"{name!r} is listed twice")
        lists = {}
        for key in ("recompute", "needs"):
            entries = reader.sequence(value.get(key, []), f"{at}.{key}")
            if not all(isinstance(entry, str) and entry for entry in entries):
                raise reader.error(f"{at}.{key}", "must be a list of non-empty strings")
            lists[key] = tuple(entries)
        for op in lists["recompute"]:
            if op not in ops or ops[op] > ops[after]:
                raise reader.error(f"{at}.recompute", f"{op!r} names no op up to {after!r}")
        for need in lists["needs"]:
            if need not in names:
                raise reader.error(f"{at}.needs", f"{need!r} is not one of the cut's values")
        flags = {}
        for key in ("grad", "sent"):
            flag = value.get(key, True)
            if not isinstance(flag, bool):
                raise reader.error(f"{at}.{key}", "must be true or false")
            flags[key] = flag
        values.append(
            CutValue(
                name=name,
                bytes=reader.number(value, at, "bytes", minimum=0),
                grad=flags["grad"],
                recompute=lists["recompute"],
                needs=lists["needs"],
                sent=flags["sent"],
            )
        )
    return tuple(values)


#: The largest magnitude, and the least positive value, a figure of a cost file or
#: hardware profile may have: sums and ratios of such figures stay finite floats (a
#: compute time of 1e308 s or a bandwidth of 5e-324 bytes/s would overflow them).
MAX_MAGNITUDE = 1e30
MIN_POSITIVE = 1e-30


def _is_number(value: object) -> bool:
    """A finite number of at most :data:`MAX_MAGNITUDE` (not a bool, not NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_MAGNITUDE
    return math.isfinite(value) and abs(value) <= MAX_MAGNITUDE


def _is_positive(value: object) -> bool:
    """A number of :func:`_is_number` that is at least :data:`MIN_POSITIVE`."""
    return _is_number(value) and value >= MIN_POSITIVE  # type: ignore[operator]


class _Reader:
    """Field access on decoded JSON whose errors name the file and JSON path."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def error(self, path: str, message: str) -> SyncpassError:
        return SyncpassError(message, f"{self.origin}:{path}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.error(path, f"must be a JSON object, got {_json_kind(value)}")
        return value

    def sequence(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(path, f"must be a JSON array, got {_json_kind(value)}")
        return value

    def required(self, data: Mapping[str, Any], path: str, key: str) -> Any:
        if key not in data:
            raise self.error(path, f"missing required field {key!r}")
        return data[key]

    def no_unknown(self, data: Mapping[str, Any], path: str, known: tuple[str, ...]) -> None:
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise self.error(
                path,
                f"unknown field {', '.join(map(repr, unknown))}; known fields are {', '.join(known)}",
            )

    def number(
        self,
        data: Mapping[str, Any],
        path: str,
        key: str,
        minimum: float,
        strict: bool = False,
        default: float | None = None,
    ) -> float:
        if key not in data and default is not None:
            return default
        value = self.required(data, path, key)
        if not _is_number(value):
            raise self.error(
                f"{path}.{key}",
                f"must be a finite number of magnitude at most {MAX_MAGNITUDE:g}, got {value!r}",
            )
        least = max(minimum, MIN_POSITIVE) if strict else minimum
        if value < least or (strict and value == minimum):
            bound = f"> {minimum:g} (at least {least:g})" if strict else f">= {minimum:g}"
            raise self.error(f"{path}.{key}", f"must be {bound}, got {value!r}")
        return float(value) if isinstance(value, float) else value

    def string(self, data: Mapping[str, Any], path: str, key: str) -> str:
        value = self.required(data, path, key)
        if not isinstance(value, str) or not value:
            raise self.error(f"{path}.{key}", f"must be a non-empty string, got {value!r}")
        return value

    def optional_string(self, data: Mapping[str, Any], path: str, key: str) -> str | None:
        return None if data.get(key) is None else self.string(data, path, key)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)

"""Estimate a model's cost file from its source alone, without running anything.

:func:`estimate_costs` reads the model class, builds the same op graph as
``syncpass profile`` (:func:`syncpass.frontend.analyse_model`, so the op ids
agree) and gives each op figures from a small abstract interpreter over the
source:

1. **Construction.** The model's ``__init__`` runs abstractly, with its
   default arguments. Values are Python numbers, strings, lists and tuples;
   standard layers (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm``, ...,
   ``nn.MultiheadAttention``), containers (``nn.Sequential``,
   ``nn.ModuleList``, ``nn.ModuleDict``) and instances of the file's own
   classes, whose ``__init__`` runs the same way. Module-level constants, the
   file's helper functions (``def stage(...): return nn.Sequential(*layers)``),
   comprehensions, ``if`` on known values and simple arithmetic are
   evaluated; names resolve through the file's imports, so ``torch.nn.Linear``,
   ``nn.Linear`` and ``from torch.nn import Linear`` are one layer. The lengths
   of the layer containers the forward loops over come from here.
2. **Shapes.** The forward runs abstractly on tensors that carry only a shape
   and a kind (float, int, bool): the inputs get ``input_shapes``; each layer,
   torch function, tensor method and operator gives its output shape; a call
   of one of the file's own modules runs that module's forward the same way.
3. **Counts.** Every operation counts forward FLOPs and the FLOPs of its
   backward:

   * matrix products (``nn.Linear``, ``@``, ``torch.matmul``, convolutions,
     attention): ``2 * multiply-adds`` (bias additions not counted, as
     ``torch.utils.flop_counter`` counts); backward twice that;
   * normalisations and softmax: 5 per element; backward twice that;
   * other elementwise work (activations, dropout, ``x + y``, pooling):
     1 per element (per window element for pooling); backward the same;
   * moving data (``view``, ``transpose``, ``torch.cat``, embedding lookup): 0.

   An op's ``compute_s`` is its forward FLOPs over the hardware's
   ``flops_per_s`` (:data:`DEFAULT_FLOPS_PER_S` when the hardware gives none,
   and then the cost file's hardware records that rate, so ``--hardware``
   scales from it), ``backward_s`` likewise. ``param_bytes`` are the parameters
   of the submodules the op calls, each counted once at its first use, as
   ``syncpass profile`` attributes them; ``out_bytes`` the tensors the op
   writes; a cut's ``live_bytes`` the tensors its live names hold (one tensor
   under two names counts once). Float tensors take ``dtype_bytes`` per
   element, integer tensors 8 and boolean ones 1.

**Fallback.** An op the interpreter cannot size (an unknown layer or
function, a shape it cannot follow, a branch on a tensor's value) is listed in
:attr:`StaticEstimate.unsized` with its ``file:line`` and the reason, and
gets: forward and backward FLOPs (hence compute) equal to the **median** of
the sized ops'; every name it writes holds a tensor of the **shape of its
first input** that has one (else of the last activation sized before it);
its parameters are still those of the constructors it calls when they
resolve (zero when they do not). The cost file's notes say how many ops
were unsized.

The model is built with its ``__init__``'s default arguments (an argument
without a default is an unknown value, so what it sizes is unsized). With no
class name, the model is the file's one model class that no other class of the
file builds (``TransformerLM`` beside its ``Block``). ``training`` sets the
memory multiplier (4 for weights, gradients and two Adam moments; 1 for
inference) and ``self.training`` in the source.

This module imports neither torch nor the user's code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import re
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from syncpass.backends.torch.rewrite import strip_sync_points
from syncpass.contracts.costs import Costs, CutCost, Hardware, OpCost
from syncpass.contracts.graph import Op, OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.frontend import (
    analyse_model,
    find_forward,
    loop_containers,
    model_class_names,
    parse_source,
)
from syncpass.frontend import sequential_calls as find_sequential_calls
from syncpass.frontend.analysis import (
    ImportAliases,
    match_container_loop,
    match_sequential_call,
)

#: The compute rate assumed when the hardware gives none (a few CPU cores' worth).
DEFAULT_FLOPS_PER_S = 50e9
#: Weights, gradients and two Adam moments per parameter byte (as ``syncpass profile``).
TRAINING_MEMORY_MULTIPLIER = 4
#: Bytes per element of integer tensors (token ids are int64).
INT_BYTES = 8

_RECURSION_LIMIT = 40


# --- the contract ---------------------------------------------------------------------


@dataclass(frozen=True)
class UnsizedOp:
    """An op the estimate could not size, which got the fallback figures."""

    op_id: str
    location: str  # "file:line"
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.op_id}: {self.reason}"


@dataclass(frozen=True)
class StaticEstimate:
    """A cost file estimated from source, and the ops that got the fallback."""

    costs: Costs
    unsized: tuple[UnsizedOp, ...]

    def __post_init__(self) -> None:
        known = {op.id for op in self.costs.ops}
        for op in self.unsized:
            if op.op_id not in known:
                raise ValueError(f"unsized op {op.op_id!r} is not an op of the cost file")


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


# --- abstract values -------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Tensor:
    """A tensor known by its shape and kind; identity tells aliases apart."""

    shape: tuple[int, ...]
    kind: str = "float"  # "float", "int" or "bool"
    parameter: bool = False  # an nn.Parameter attribute of a module


@dataclass(frozen=True, eq=False)
class _Opaque:
    """A value the interpreter does not know; using it makes the op unsized."""

    reason: str


@dataclass(frozen=True)
class _Library:
    """A name from outside the file: ``torch.nn.Linear``, ``builtins.max``."""

    name: str


@dataclass(eq=False)
class _Layer:
    """A standard layer with its bound constructor arguments."""

    kind: str
    args: dict[str, object]
    text: str


@dataclass(eq=False)
class _Container:
    """``nn.Sequential``, ``nn.ModuleList`` (children by position) or ``nn.ModuleDict``."""

    kind: str
    children: list[object] = field(default_factory=list)
    keys: list[str] | None = None  # ModuleDict only
    text: str = ""


@dataclass(eq=False)
class _Instance:
    """An instance of one of the file's own classes."""

    classdef: cst.ClassDef
    attrs: dict[str, object]
    text: str


@dataclass(frozen=True)
class _Function:
    """One of the file's functions, or a method bound to an instance."""

    node: cst.FunctionDef
    owner: _Instance | None = None
    cls: cst.ClassDef | None = None  # the class that defines it, for super()


@dataclass(frozen=True)
class _ClassRef:
    node: cst.ClassDef


@dataclass(frozen=True)
class _Super:
    instance: _Instance
    cls: cst.ClassDef


@dataclass(frozen=True)
class _Method:
    """A method of a value the interpreter models (``x.view``, ``layers.append``)."""

    target: object
    name: str


#: Errors of plain Python evaluation on values of the user's code: they make a statement
#: unsized, never fail the estimate.
_PYTHON_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)
#: Longest loop or list the interpreter builds, and largest exponent it computes.
_MAX_ITEMS = 100_000
_MODULES = (_Layer, _Container, _Instance)


#: Methods of a module that register an attribute: the keyword of the value.
_REGISTERS = {"register_buffer": "tensor", "register_parameter": "param", "add_module": "module"}
_INSTANCE_METHODS = frozenset({*_REGISTERS, "parameters", "modules", "children"})


class _Unsized(Exception):
    """The interpreter cannot follow the source here; ``reason`` says why."""

    def __init__(self, reason: str, located: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.located = located


class _Return(Exception):
    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, _Opaque):
            raise _Unsized(value.reason)
        raise _Unsized(f"needs a whole number for {what}, got {_describe(value)}")
    return value


def _tensor(value: object, what: str) -> _Tensor:
    if isinstance(value, _Tensor):
        return value
    if isinstance(value, _Opaque):
        raise _Unsized(value.reason)
    raise _Unsized(f"needs a tensor for {what}, got {_describe(value)}")


def _describe(value: object) -> str:
    if isinstance(value, _Tensor):
        return f"a tensor of shape {_shape_text(value.shape)}"
    if isinstance(value, (_Layer, _Container, _Instance)):
        return value.text or type(value).__name__
    if isinstance(value, _Opaque):
        return f"an unknown value ({value.reason})"
    if isinstance(value, _Library):
        return value.name
    return repr(value) if len(repr(value)) < 40 else type(value).__name__


def _dim(index: object, rank: int, what: str = "a dimension") -> int:
    value = _int(index, what)
    if not -max(rank, 1) <= value < max(rank, 1):
        raise _Unsized(f"dimension {value} is out of range for a tensor of rank {rank}")
    return value % max(rank, 1)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(shape) for shape in shapes), default=0)
    result = []
    for position in range(rank):
        sizes = {
            shape[len(shape) - rank + position]
            for shape in shapes
            if len(shape) - rank + position >= 0
        }
        sizes.discard(1)
        if len(sizes) > 1:
            shown = " and ".join(_shape_text(shape) for shape in shapes)
            raise _Unsized(f"cannot broadcast shapes {shown} together")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _tuple_of(value: object, count: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as ``count`` ints (a kernel size, a stride)."""
    if isinstance(value, (tuple, list)):
        items = tuple(_int(item, what) for item in value)
        if len(items) != count:
            raise _Unsized(f"{what} has {len(items)} entries for {count} dimension(s)")
        return items
    return (_int(value, what),) * count


# --- standard layers --------------------------------------------------------------------

_REQUIRED = _Opaque("a required argument")
_Signature = tuple[tuple[str, object], ...]

_CONV: _Signature = (
    ("in_channels", _REQUIRED),
    ("out_channels", _REQUIRED),
    ("kernel_size", _REQUIRED),
    ("stride", 1),
    ("padding", 0),
    ("dilation", 1),
    ("groups", 1),
    ("bias", True),
)
_CONV_TRANSPOSE: _Signature = (
    ("in_channels", _REQUIRED),
    ("out_channels", _REQUIRED),
    ("kernel_size", _REQUIRED),
    ("stride", 1),
    ("padding", 0),
    ("output_padding", 0),
    ("groups", 1),
    ("bias", True),
    ("dilation", 1),
)
_BATCH_NORM: _Signature = (
    ("num_features", _REQUIRED),
    ("eps", 1e-5),
    ("momentum", 0.1),
    ("affine", True),
    ("track_running_stats", True),
)
_MAX_POOL: _Signature = (
    ("kernel_size", _REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("dilation", 1),
    ("return_indices", False),
    ("ceil_mode", False),
)
#: ``F.max_pool1d/2d``: the functional form orders ``ceil_mode`` before ``return_indices``.
_MAX_POOL_FUNCTION: _Signature = (
    ("kernel_size", _REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("dilation", 1),
    ("ceil_mode", False),
    ("return_indices", False),
)
_AVG_POOL: _Signature = (
    ("kernel_size", _REQUIRED),
    ("stride", None),
    ("padding", 0),
    ("ceil_mode", False),
    ("count_include_pad", True),
    ("divisor_override", None),
)
_ACTIVATIONS = (
    "ReLU",
    "ReLU6",
    "GELU",
    "SiLU",
    "Tanh",
    "Sigmoid",
    "LeakyReLU",
    "ELU",
    "Mish",
    "Hardswish",
    "Hardtanh",
    "Softplus",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
)

#: Constructor signatures (name, default) of the layers the estimate knows.
_LAYERS: dict[str, _Signature] = {
    "Linear": (("in_features", _REQUIRED), ("out_features", _REQUIRED), ("bias", True)),
    "Embedding": (
        ("num_embeddings", _REQUIRED),
        ("embedding_dim", _REQUIRED),
        ("padding_idx", None),
    ),
    "Conv1d": _CONV,
    "Conv2d": _CONV,
    "Conv3d": _CONV,
    "ConvTranspose1d": _CONV_TRANSPOSE,
    "ConvTranspose2d": _CONV_TRANSPOSE,
    "LayerNorm": (
        ("normalized_shape", _REQUIRED),
        ("eps", 1e-5),
        ("elementwise_affine", True),
        ("bias", True),
    ),
    "RMSNorm": (("normalized_shape", _REQUIRED), ("eps", None), ("elementwise_affine", True)),
    "BatchNorm1d": _BATCH_NORM,
    "BatchNorm2d": _BATCH_NORM,
    "GroupNorm": (
        ("num_groups", _REQUIRED),
        ("num_channels", _REQUIRED),
        ("eps", 1e-5),
        ("affine", True),
    ),
    **{name: () for name in _ACTIVATIONS},
    "Identity": (),
    "Softmax": (("dim", None),),
    "LogSoftmax": (("dim", None),),
    "MaxPool1d": _MAX_POOL,
    "MaxPool2d": _MAX_POOL,
    "AvgPool1d": _AVG_POOL,
    "AvgPool2d": _AVG_POOL,
    "AdaptiveAvgPool1d": (("output_size", _REQUIRED),),
    "AdaptiveAvgPool2d": (("output_size", _REQUIRED),),
    "AdaptiveMaxPool2d": (("output_size", _REQUIRED), ("return_indices", False)),
    "Flatten": (("start_dim", 1), ("end_dim", -1)),
    "Unflatten": (("dim", _REQUIRED), ("unflattened_size", _REQUIRED)),
    "Upsample": (("size", None), ("scale_factor", None), ("mode", "nearest")),
    "MultiheadAttention": (
        ("embed_dim", _REQUIRED),
        ("num_heads", _REQUIRED),
        ("dropout", 0.0),
        ("bias", True),
        ("add_bias_kv", False),
        ("add_zero_attn", False),
        ("kdim", None),
        ("vdim", None),
        ("batch_first", False),
    ),
}
#: Layers that take any arguments and ignore them.
_LOOSE_LAYERS = frozenset({*_ACTIVATIONS, "Identity"})


def _bind(
    signature: _Signature, args: Sequence[object], kwargs: Mapping[str, object], what: str
) -> dict[str, object]:
    """Arguments by name; keywords outside the signature (``device=``) are ignored."""
    if len(args) > len(signature):
        raise _Unsized(f"{what} takes at most {len(signature)} positional argument(s)")
    bound = {name: default for name, default in signature}
    for (name, _), value in zip(signature, args, strict=False):
        bound[name] = value
    for name, value in kwargs.items():
        if name in bound:
            bound[name] = value
    for name, value in bound.items():
        if value is _REQUIRED:
            raise _Unsized(f"{what} is missing its argument {name!r}")
        if isinstance(value, _Opaque):
            raise _Unsized(f"{what}: {name} is unknown ({value.reason})")
    return bound


def _spatial_rank(kind: str) -> int:
    return 3 if kind.endswith("3d") else 1 if kind.endswith("1d") else 2


def _layer_parameters(layer: _Layer) -> int:
    """Number of parameters of a standard layer."""
    kind, a = layer.kind, layer.args
    bias = bool(a.get("bias", False))
    if kind == "Linear":
        inputs, outputs = _int(a["in_features"], "in_features"), _int(a["out_features"], "")
        return inputs * outputs + (outputs if bias else 0)
    if kind == "Embedding":
        return _int(a["num_embeddings"], "num_embeddings") * _int(a["embedding_dim"], "")
    if kind.startswith("Conv"):
        inputs, outputs = _int(a["in_channels"], ""), _int(a["out_channels"], "")
        groups = _int(a["groups"], "groups")
        kernel = _numel(_tuple_of(a["kernel_size"], _spatial_rank(kind), "kernel_size"))
        if kind.startswith("ConvTranspose"):
            weights = inputs * (outputs // groups) * kernel
        else:
            weights = outputs * (inputs // groups) * kernel
        return weights + (outputs if bias else 0)
    if kind in ("LayerNorm", "RMSNorm"):
        if not a["elementwise_affine"]:
            return 0
        size = _numel(_tuple_of_any(a["normalized_shape"]))
        return size * (2 if kind == "LayerNorm" and bias else 1)
    if kind.startswith("BatchNorm"):
        return 2 * _int(a["num_features"], "num_features") if a["affine"] else 0
    if kind == "GroupNorm":
        return 2 * _int(a["num_channels"], "num_channels") if a["affine"] else 0
    if kind == "MultiheadAttention":
        embed = _int(a["embed_dim"], "embed_dim")
        kdim = embed if a["kdim"] is None else _int(a["kdim"], "kdim")
        vdim = embed if a["vdim"] is None else _int(a["vdim"], "vdim")
        total = embed * (embed + kdim + vdim) + embed * embed  # in and out projections
        if bias:
            total += 3 * embed + embed
        if a["add_bias_kv"]:
            total += 2 * embed
        return total
    return 0


def _tuple_of_any(value: object) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(_int(item, "a size") for item in value)
    return (_int(value, "a size"),)


def _window_output(
    size: int, kernel: int, stride: int, padding: int, dilation: int, ceil: bool
) -> int:
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= size + padding:
        out -= 1  # the last window must start inside the input (torch's rule)
    if out < 1:
        raise _Unsized(f"a window of {kernel} does not fit an input of size {size}")
    return out


# --- counting ----------------------------------------------------------------------------


@dataclass
class _Counter:
    forward: float = 0.0
    backward: float = 0.0

    def add(self, flops: float, backward_factor: float) -> None:
        self.forward += flops
        self.backward += flops * backward_factor


_MATMUL_BACKWARD = 2.0  # gradients for both operands
_ELEMENTWISE_BACKWARD = 1.0
_NORMALISE_FLOPS = 5  # per element: mean, variance, normalise, scale, shift


# --- the interpreter ----------------------------------------------------------------------


class _Interpreter:
    """Runs a file's constructors and forwards on abstract values (see the module docstring)."""

    def __init__(self, module: cst.Module, path: str, training: bool, dtype_bytes: int) -> None:
        self.module = module
        self.path = path
        self.training = training
        self.dtype_bytes = dtype_bytes
        self.imports = ImportAliases.of(module, set())
        self.counter = _Counter()
        self.depth = 0
        self._positions: Mapping[cst.CSTNode, CodeRange] | None = None
        self.globals: dict[str, object] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        for statement in module.body:
            if isinstance(statement, cst.ClassDef):
                self.classes[statement.name.value] = statement
                self.globals[statement.name.value] = _ClassRef(statement)
            elif isinstance(statement, cst.FunctionDef):
                self.globals[statement.name.value] = _Function(statement)
        for statement in module.body:  # constants, in order, once functions are known
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, (cst.Assign, cst.AnnAssign)):
                        self._global_assignment(small)

    def _global_assignment(self, small: cst.Assign | cst.AnnAssign) -> None:
        if small.value is None:
            return
        targets = (
            [target.target for target in small.targets]
            if isinstance(small, cst.Assign)
            else [small.target]
        )
        try:
            value = self.eval(small.value, {})
        except _Unsized as error:
            value = _Opaque(error.reason)
        except _PYTHON_ERRORS as error:
            value = _Opaque(f"{type(error).__name__}: {error}")
        for target in targets:
            try:
                self.assign(target, value, self.globals)
            except _Unsized:
                continue

    # --- source positions, for reasons --------------------------------------------------

    def line(self, node: cst.CSTNode) -> int | None:
        if self._positions is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
        found = self._positions.get(node)
        return None if found is None else found.start.line

    def code(self, node: cst.CSTNode) -> str:
        text = " ".join(self.module.code_for_node(node).split())
        return text if len(text) <= 60 else text[:57] + "..."

    # --- statements ------------------------------------------------------------------------

    def run_block(self, body: cst.BaseSuite, frame: dict[str, object], nested: bool) -> None:
        statements: Sequence[cst.BaseStatement | cst.BaseSmallStatement]
        if isinstance(body, cst.IndentedBlock):
            statements = body.body
        else:
            assert isinstance(body, cst.SimpleStatementSuite)
            statements = body.body
        for statement in statements:
            self.run_statement(statement, frame, nested)

    def run_statement(
        self,
        statement: cst.BaseStatement | cst.BaseSmallStatement,
        frame: dict[str, object],
        nested: bool,
    ) -> None:
        """Run one statement; inside a called function, unsized reasons get its line."""
        try:
            try:
                self._run_statement(statement, frame, nested)
            except _PYTHON_ERRORS as error:  # odd values the rules above did not expect
                raise _Unsized(
                    f"is a statement syncpass could not follow ({type(error).__name__}: {error})"
                ) from None
        except _Unsized as error:
            if not nested or error.located:
                raise
            line = self.line(statement)
            where = f" ({self.path}:{line})" if line is not None else ""
            raise _Unsized(error.reason + where, located=True) from None

    def _run_statement(
        self,
        statement: cst.BaseStatement | cst.BaseSmallStatement,
        frame: dict[str, object],
        nested: bool,
    ) -> None:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self._run_statement(small, frame, nested)
        elif isinstance(statement, cst.Assign):
            value = self.eval(statement.value, frame)
            for target in statement.targets:
                self.assign(target.target, value, frame)
        elif isinstance(statement, cst.AnnAssign):
            if statement.value is not None:
                self.assign(statement.target, self.eval(statement.value, frame), frame)
        elif isinstance(statement, cst.AugAssign):
            current = self.eval(statement.target, frame)
            value = self.binary(
                type(statement.operator).__name__.removesuffix("Assign"),
                current,
                self.eval(statement.value, frame),
            )
            self.assign(statement.target, value, frame)
        elif isinstance(statement, cst.Expr):
            if not isinstance(statement.value, (cst.SimpleString, cst.ConcatenatedString)):
                self.eval(statement.value, frame)
        elif isinstance(statement, cst.Return):
            raise _Return(None if statement.value is None else self.eval(statement.value, frame))
        elif isinstance(statement, cst.Break):
            raise _Break()
        elif isinstance(statement, cst.Continue):
            raise _Continue()
        elif isinstance(statement, cst.Raise):
            raise _Unsized("raises an exception")
        elif isinstance(statement, cst.If):
            self._run_if(statement, frame, nested)
        elif isinstance(statement, cst.For):
            self._run_for(statement, frame, nested)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                self.eval(item.item, frame)
                if item.asname is not None:
                    self.assign(item.asname.name, _Opaque("a context manager"), frame)
            self.run_block(statement.body, frame, nested)
        elif isinstance(statement, cst.Try):
            self.run_block(statement.body, frame, nested)
        elif isinstance(statement, cst.FunctionDef):
            frame[statement.name.value] = _Function(statement)
        elif isinstance(statement, cst.While):
            raise _Unsized("a while loop, whose trip count the source does not give")
        elif isinstance(
            statement,
            (cst.Pass, cst.Assert, cst.Del, cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal),
        ):
            return
        else:
            raise _Unsized(f"a {type(statement).__name__} statement syncpass cannot follow")

    def _run_if(self, statement: cst.If, frame: dict[str, object], nested: bool) -> None:
        condition = self.truth(self.eval(statement.test, frame), statement.test)
        if condition:
            self.run_block(statement.body, frame, nested)
        elif isinstance(statement.orelse, cst.If):
            self._run_if(statement.orelse, frame, nested)
        elif isinstance(statement.orelse, cst.Else):
            self.run_block(statement.orelse.body, frame, nested)

    def _run_for(self, statement: cst.For, frame: dict[str, object], nested: bool) -> None:
        for item in self.iterate(self.eval(statement.iter, frame), statement.iter):
            self.assign(statement.target, item, frame)
            try:
                self.run_block(statement.body, frame, nested)
            except _Break:
                return
            except _Continue:
                continue
        if statement.orelse is not None:
            self.run_block(statement.orelse.body, frame, nested)

    def truth(self, value: object, node: cst.BaseExpression) -> bool:
        if value is None or isinstance(value, (bool, int, float, str, tuple, list, range)):
            return bool(value)
        if isinstance(value, _MODULES):
            return True
        if isinstance(value, _Tensor):
            raise _Unsized(f"branches on a tensor's value ({self.code(node)})")
        if isinstance(value, _Opaque):
            raise _Unsized(f"branches on an unknown value ({self.code(node)}: {value.reason})")
        return True

    def iterate(self, value: object, node: cst.CSTNode) -> list[object]:
        if isinstance(value, (list, tuple, range, str)) and len(value) > _MAX_ITEMS:
            raise _Unsized(f"loops over {len(value)} items, more than syncpass follows")
        if isinstance(value, (list, tuple, range, str)):
            return list(value)
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, _Container):
            return list(value.keys) if value.keys is not None else list(value.children)
        if isinstance(value, _Tensor) and value.shape:
            return [_Tensor(value.shape[1:], value.kind) for _ in range(value.shape[0])]
        if isinstance(value, _Opaque):
            raise _Unsized(f"loops over an unknown value ({self.code(node)}: {value.reason})")
        raise _Unsized(f"loops over {_describe(value)}, whose items syncpass does not know")

    def assign(self, target: cst.BaseExpression, value: object, frame: dict[str, object]) -> None:
        if isinstance(target, cst.Name):
            frame[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            items = self.iterate(value, target)
            elements = list(target.elements)
            starred = [i for i, e in enumerate(elements) if isinstance(e, cst.StarredElement)]
            if starred:
                star = starred[0]
                after = len(elements) - star - 1
                if len(items) < len(elements) - 1:
                    raise _Unsized(f"unpacks {len(items)} values into {len(elements)} names")
                groups: list[object] = [
                    *items[:star],
                    list(items[star : len(items) - after]),
                    *items[len(items) - after :],
                ]
            else:
                if len(items) != len(elements):
                    raise _Unsized(f"unpacks {len(items)} values into {len(elements)} names")
                groups = items
            for element, item in zip(elements, groups, strict=True):
                self.assign(element.value, item, frame)
        elif isinstance(target, cst.Attribute):
            owner = self.eval(target.value, frame)
            if isinstance(owner, _Instance):
                owner.attrs[target.attr.value] = value
        elif isinstance(target, cst.Subscript):
            owner = self.eval(target.value, frame)
            if isinstance(owner, list) and len(target.slice) == 1:
                part = target.slice[0].slice
                if isinstance(part, cst.Index):
                    owner[_int(self.eval(part.value, frame), "an index")] = value
            elif isinstance(owner, dict) and len(target.slice) == 1:
                part = target.slice[0].slice
                if isinstance(part, cst.Index):
                    owner[self.eval(part.value, frame)] = value
        # anything else (a starred target, an attribute of a tensor) changes nothing we track

    # --- expressions -------------------------------------------------------------------------

    def eval(self, node: cst.BaseExpression, frame: dict[str, object]) -> object:
        if isinstance(node, cst.Name):
            return self.lookup(node.value, frame)
        if isinstance(node, cst.Integer):
            return int(node.evaluated_value)
        if isinstance(node, cst.Float):
            return float(node.evaluated_value)
        if isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            return value if isinstance(value, str) else _Opaque("a bytes literal")
        if isinstance(node, (cst.ConcatenatedString, cst.FormattedString)):
            return _Opaque("a formatted string")
        if isinstance(node, cst.Ellipsis):
            return Ellipsis
        if isinstance(node, cst.Attribute):
            return self.attribute(self.eval(node.value, frame), node.attr.value, node)
        if isinstance(node, cst.Call):
            return self.eval_call(node, frame)
        if isinstance(node, cst.BinaryOperation):
            left = self.eval(node.left, frame)
            right = self.eval(node.right, frame)
            return self.binary(type(node.operator).__name__, left, right)
        if isinstance(node, cst.UnaryOperation):
            return self.unary(node, self.eval(node.expression, frame))
        if isinstance(node, cst.BooleanOperation):
            left = self.eval(node.left, frame)
            is_and = isinstance(node.operator, cst.And)
            if self.truth(left, node.left) != is_and:
                return left
            return self.eval(node.right, frame)
        if isinstance(node, cst.Comparison):
            return self.compare(node, frame)
        if isinstance(node, cst.IfExp):
            chosen = (
                node.body if self.truth(self.eval(node.test, frame), node.test) else node.orelse
            )
            return self.eval(chosen, frame)
        if isinstance(node, (cst.Tuple, cst.List)):
            items: list[object] = []
            for element in node.elements:
                if isinstance(element, cst.StarredElement):
                    items.extend(self.iterate(self.eval(element.value, frame), element))
                else:
                    items.append(self.eval(element.value, frame))
            return tuple(items) if isinstance(node, cst.Tuple) else items
        if isinstance(node, cst.Dict):
            result: dict[object, object] = {}
            for item in node.elements:
                if not isinstance(item, cst.DictElement):
                    raise _Unsized("a dict with ** unpacking")
                result[self.hashable(self.eval(item.key, frame))] = self.eval(item.value, frame)
            return result
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
            return self.comprehension(node, frame)
        if isinstance(node, cst.Subscript):
            return self.subscript(node, frame)
        if isinstance(node, cst.Lambda):
            return _Opaque("a lambda")
        return _Opaque(f"{type(node).__name__} expression")

    def hashable(self, value: object) -> object:
        try:
            hash(value)
        except TypeError:
            raise _Unsized("uses an unhashable dictionary key") from None
        return value

    def lookup(self, name: str, frame: Mapping[str, object]) -> object:
        if name in frame:
            return frame[name]
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        if name in self.globals:
            return self.globals[name]
        qualified = self.imports.qualify(name)
        if qualified != name or name in self.imports.targets:
            return _Library(qualified)
        raise _Unsized(f"reads {name!r}, which syncpass cannot resolve")

    def comprehension(
        self, node: cst.ListComp | cst.GeneratorExp, frame: dict[str, object]
    ) -> list[object]:
        results: list[object] = []

        def loop(clause: cst.CompFor | None, scope: dict[str, object]) -> None:
            if clause is None:
                results.append(self.eval(node.elt, scope))
                return
            for item in self.iterate(self.eval(clause.iter, scope), clause.iter):
                inner = dict(scope)
                self.assign(clause.target, item, inner)
                if all(self.truth(self.eval(test.test, inner), test.test) for test in clause.ifs):
                    loop(clause.inner_for_in, inner)

        loop(node.for_in, dict(frame))
        return results

    def subscript(self, node: cst.Subscript, frame: dict[str, object]) -> object:
        value = self.eval(node.value, frame)
        parts: list[object] = []
        for element in node.slice:
            part = element.slice
            if isinstance(part, cst.Index):
                parts.append(self.eval(part.value, frame))
            else:
                assert isinstance(part, cst.Slice)
                bounds = [
                    None if bound is None else self.eval(bound, frame)
                    for bound in (part.lower, part.upper, part.step)
                ]
                for bound in bounds:
                    if bound is not None:
                        _int(bound, "a slice bound")
                parts.append(slice(*bounds))
        index: object = parts[0] if len(parts) == 1 else tuple(parts)
        return self.index(value, index, node)

    def index(self, value: object, index: object, node: cst.CSTNode) -> object:
        if isinstance(value, _Tensor):
            return self.index_tensor(value, index)
        if isinstance(value, _Container):
            if value.keys is not None:
                if index not in value.keys:
                    raise _Unsized(f"{value.text} has no entry {index!r}")
                return value.children[value.keys.index(str(index))]
            if isinstance(index, slice):
                return _Container(value.kind, value.children[index], None, value.text)
            try:
                return value.children[_int(index, "an index")]
            except IndexError:
                raise _Unsized(f"index {index} is out of range of {value.text}") from None
        if isinstance(value, (list, tuple, str, range, dict)):
            try:
                return value[index]  # type: ignore[call-overload,index]
            except (IndexError, KeyError, TypeError) as error:
                raise _Unsized(f"cannot index {_describe(value)} by {index!r}: {error}") from None
        if isinstance(value, _Opaque):
            raise _Unsized(value.reason)
        raise _Unsized(f"indexes {_describe(value)} ({self.code(node)})")

    def index_tensor(self, tensor: _Tensor, index: object) -> _Tensor:
        items = list(index) if isinstance(index, tuple) else [index]
        if sum(item is Ellipsis for item in items) > 1:
            raise _Unsized("indexes with more than one ...")
        consuming = [item for item in items if item is not None and item is not Ellipsis]
        if len(consuming) > len(tensor.shape):
            raise _Unsized(f"indexes a tensor of rank {len(tensor.shape)} with {len(consuming)}")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            items[at : at + 1] = [slice(None)] * (len(tensor.shape) - len(consuming))
        shape: list[int] = []
        dim = 0
        for item in items:
            if item is None:
                shape.append(1)
                continue
            size = tensor.shape[dim]
            dim += 1
            if isinstance(item, slice):
                shape.append(len(range(*item.indices(size))))
            elif isinstance(item, list) and all(isinstance(i, int) for i in item):
                shape.append(len(item))  # x[:, [-1], :] keeps the dimension
            elif isinstance(item, int) and not isinstance(item, bool):
                if not -size <= item < size:
                    raise _Unsized(f"index {item} is out of range of a dimension of {size}")
            else:
                raise _Unsized(f"indexes a tensor with {_describe(item)}")
        shape.extend(tensor.shape[dim:])
        return _Tensor(tuple(shape), tensor.kind)

    # --- operators ------------------------------------------------------------------------------

    _PYTHON_OPERATORS: Mapping[str, Callable[[object, object], object]] = {
        "Add": operator.add,
        "Subtract": operator.sub,
        "Multiply": operator.mul,
        "Divide": operator.truediv,
        "FloorDivide": operator.floordiv,
        "Modulo": operator.mod,
        "Power": operator.pow,
        "LeftShift": operator.lshift,
        "RightShift": operator.rshift,
        "BitAnd": operator.and_,
        "BitOr": operator.or_,
        "BitXor": operator.xor,
    }

    def binary(self, name: str, left: object, right: object) -> object:
        for side in (left, right):
            if isinstance(side, _Opaque):
                raise _Unsized(side.reason)
        if isinstance(left, _Tensor) or isinstance(right, _Tensor):
            if name == "MatrixMultiply":
                return self.matmul(_tensor(left, "@"), _tensor(right, "@"))
            shapes = [side.shape for side in (left, right) if isinstance(side, _Tensor)]
            for side in (left, right):
                if not isinstance(side, (_Tensor, int, float, bool)):
                    raise _Unsized(f"combines a tensor with {_describe(side)}")
            shape = _broadcast(*shapes)
            self.counter.add(_numel(shape), _ELEMENTWISE_BACKWARD)
            return _Tensor(shape, self._result_kind(left, right, name))
        python = self._PYTHON_OPERATORS.get(name)
        if _too_large(name, left, right):
            raise _Unsized(f"computes {name} with an operand above {_MAX_ITEMS}")
        if python is None:
            raise _Unsized(f"applies {name} to {_describe(left)} and {_describe(right)}")
        try:
            return python(left, right)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as error:
            raise _Unsized(
                f"cannot compute {_describe(left)} {name} {_describe(right)}: {error}"
            ) from None

    @staticmethod
    def _result_kind(left: object, right: object, name: str) -> str:
        kinds = {
            side.kind if isinstance(side, _Tensor) else "float" if isinstance(side, float) else ""
            for side in (left, right)
        }
        if name == "Divide" or "float" in kinds:
            return "float"
        return "int" if "int" in kinds else "bool"

    def unary(self, node: cst.UnaryOperation, value: object) -> object:
        if isinstance(value, _Opaque):
            raise _Unsized(value.reason)
        if isinstance(node.operator, cst.Not):
            return not self.truth(value, node.expression)
        if isinstance(value, _Tensor):
            self.counter.add(_numel(value.shape), _ELEMENTWISE_BACKWARD)
            return _Tensor(value.shape, value.kind)
        if isinstance(value, (int, float)):
            if isinstance(node.operator, cst.Minus):
                return -value
            if isinstance(node.operator, cst.Plus):
                return +value
            if isinstance(node.operator, cst.BitInvert) and isinstance(value, int):
                return ~value
        raise _Unsized(f"applies a unary operator to {_describe(value)}")

    def compare(self, node: cst.Comparison, frame: dict[str, object]) -> object:
        left = self.eval(node.left, frame)
        result: object = True
        for target in node.comparisons:
            right = self.eval(target.comparator, frame)
            op = target.operator
            if isinstance(op, (cst.Is, cst.IsNot)):
                if isinstance(left, _Opaque) or isinstance(right, _Opaque):
                    # An unknown value is not None: it stands for something that exists.
                    same = left is right
                else:
                    same = left is right or (left is None and right is None)
                outcome: object = same if isinstance(op, cst.Is) else not same
            elif isinstance(left, _Tensor) or isinstance(right, _Tensor):
                shapes = [side.shape for side in (left, right) if isinstance(side, _Tensor)]
                shape = _broadcast(*shapes)
                self.counter.add(_numel(shape), 0.0)
                outcome = _Tensor(shape, "bool")
            else:
                for side in (left, right):
                    if isinstance(side, _Opaque):
                        raise _Unsized(side.reason)
                compare: Callable[[object, object], object] | None = {
                    cst.Equal: operator.eq,
                    cst.NotEqual: operator.ne,
                    cst.LessThan: operator.lt,
                    cst.LessThanEqual: operator.le,
                    cst.GreaterThan: operator.gt,
                    cst.GreaterThanEqual: operator.ge,
                    cst.In: lambda a, b: operator.contains(b, a),
                    cst.NotIn: lambda a, b: not operator.contains(b, a),
                }.get(type(op))
                if compare is None:
                    raise _Unsized(f"a comparison syncpass cannot evaluate ({self.code(node)})")
                try:
                    outcome = compare(left, right)
                except TypeError as error:
                    raise _Unsized(f"cannot compare ({self.code(node)}): {error}") from None
            if len(node.comparisons) == 1:
                return outcome
            if not self.truth(outcome, node):
                return False
            left = right
            result = outcome
        return result

    # --- attributes ------------------------------------------------------------------------------

    def attribute(self, value: object, name: str, node: cst.CSTNode) -> object:
        if isinstance(value, _Library):
            return _Library(f"{value.name}.{name}")
        if isinstance(value, _Instance):
            if name in value.attrs:
                return value.attrs[name]
            if name == "training":
                return self.training
            found = self.find_method(value.classdef, name)
            if found is not None:
                return _Function(found[0], value, found[1])
            if name in _INSTANCE_METHODS:
                return _Method(value, name)
            raise _Unsized(f"{value.text} has no attribute {name!r} that syncpass could resolve")
        if isinstance(value, _Tensor):
            if name == "shape":
                return value.shape
            if name == "ndim":
                return len(value.shape)
            if name in ("T", "mT"):
                shape = value.shape
                if name == "T":
                    return _Tensor(tuple(reversed(shape)), value.kind)
                return _Tensor((*shape[:-2], shape[-1], shape[-2]), value.kind)
            if name in ("dtype", "device", "is_cuda", "requires_grad"):
                return _Opaque(f"a tensor's {name}")
            return _Method(value, name)
        if isinstance(value, _Layer):
            if name in value.args:
                return value.args[name]
            if name == "training":
                return self.training
            if name in ("weight", "bias"):
                return self._layer_tensor(value, name)
            return _Method(value, name)
        if isinstance(value, _Super):
            return self._super_attribute(value, name)
        if isinstance(value, _Opaque):
            return value
        if isinstance(value, _Container) and value.keys is not None and name in value.keys:
            return value.children[value.keys.index(name)]
        if isinstance(value, (_Container, list, dict)):
            return _Method(value, name)
        raise _Unsized(f"reads .{name} of {_describe(value)} ({self.code(node)})")

    def _layer_tensor(self, layer: _Layer, name: str) -> object:
        a = layer.args
        if layer.kind == "Linear":
            out = _int(a["out_features"], "out_features")
            return _Tensor(
                (out, _int(a["in_features"], "in_features")) if name == "weight" else (out,)
            )
        if layer.kind == "Embedding" and name == "weight":
            return _Tensor((_int(a["num_embeddings"], ""), _int(a["embedding_dim"], "")))
        return _Opaque(f"the {name} of {layer.text}")

    def find_method(
        self, classdef: cst.ClassDef, name: str, seen: frozenset[str] = frozenset()
    ) -> tuple[cst.FunctionDef, cst.ClassDef] | None:
        """A method of a class of the file or of its bases in the file."""
        for statement in classdef.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
                return statement, classdef
        for base in self.user_bases(classdef):
            if base.name.value not in seen:
                found = self.find_method(base, name, seen | {classdef.name.value})
                if found is not None:
                    return found
        return None

    def user_bases(self, classdef: cst.ClassDef) -> list[cst.ClassDef]:
        return [
            self.classes[base.value.value]
            for base in classdef.bases
            if isinstance(base.value, cst.Name) and base.value.value in self.classes
        ]

    def _super_attribute(self, value: _Super, name: str) -> object:
        for base in self.user_bases(value.cls):
            found = self.find_method(base, name)
            if found is not None:
                return _Function(found[0], value.instance, found[1])
        if name == "__init__":
            return _Library("syncpass.noop")
        raise _Unsized(f"super().{name} is not in the file")

    # --- calls -------------------------------------------------------------------------------------

    def eval_call(self, node: cst.Call, frame: dict[str, object]) -> object:
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "super"
            and "super" not in frame
            and not node.args
        ):
            owner, cls = frame.get("__self__"), frame.get("__class__")
            if isinstance(owner, _Instance) and isinstance(cls, _ClassRef):
                return _Super(owner, cls.node)
            raise _Unsized("super() outside a method")
        function = self.eval(node.func, frame)
        args: list[object] = []
        kwargs: dict[str, object] = {}
        for arg in node.args:
            value = self.eval(arg.value, frame)
            if arg.star == "*":
                args.extend(self.iterate(value, arg))
            elif arg.star == "**":
                if not isinstance(value, dict):
                    raise _Unsized(f"unpacks {_describe(value)} as keywords")
                kwargs.update({str(key): item for key, item in value.items()})
            elif arg.keyword is not None:
                kwargs[arg.keyword.value] = value
            else:
                args.append(value)
        return self.call(function, args, kwargs, node)

    def call(
        self, function: object, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        if isinstance(function, _Library):
            return self.call_library(function.name, args, kwargs, node)
        if isinstance(function, _ClassRef):
            return self.instantiate(function.node, args, kwargs, self.code(node))
        if isinstance(function, _Function):
            return self.run_function(function, args, kwargs)
        if isinstance(function, _MODULES):
            return self.call_module(function, args, kwargs, self.code(node.func))
        if isinstance(function, _Method):
            return self.call_method(function, args, kwargs, node)
        if isinstance(function, _Opaque):
            raise _Unsized(f"{self.code(node.func)} is unknown: {function.reason}")
        raise _Unsized(f"calls {_describe(function)}, which is not callable")

    def run_function(
        self, function: _Function, args: list[object], kwargs: dict[str, object]
    ) -> object:
        if self.depth >= _RECURSION_LIMIT:
            raise _Unsized("calls nest deeper than syncpass follows")
        frame: dict[str, object] = {}
        if function.owner is not None:
            args = [function.owner, *args]
            frame["__self__"] = function.owner
            if function.cls is not None:
                frame["__class__"] = _ClassRef(function.cls)
        self.bind_parameters(function.node, args, kwargs, frame)
        self.depth += 1
        try:
            self.run_block(function.node.body, frame, nested=True)
        except _Return as result:
            return result.value
        finally:
            self.depth -= 1
        return None

    def bind_parameters(
        self,
        function: cst.FunctionDef,
        args: list[object],
        kwargs: dict[str, object],
        frame: dict[str, object],
    ) -> None:
        params = function.params
        positional = [*params.posonly_params, *params.params]
        name = function.name.value
        for position, param in enumerate(positional):
            key = param.name.value
            if position < len(args):
                frame[key] = args[position]
            elif key in kwargs:
                frame[key] = kwargs.pop(key)
            elif param.default is not None:
                frame[key] = self.eval(param.default, {})
            else:
                frame[key] = _Opaque(f"{name}() was called without its argument {key!r}")
        extra = args[len(positional) :]
        if isinstance(params.star_arg, cst.Param):
            frame[params.star_arg.name.value] = tuple(extra)
        elif extra:
            raise _Unsized(f"{name}() gets {len(extra)} more positional argument(s) than it takes")
        for param in params.kwonly_params:
            key = param.name.value
            if key in kwargs:
                frame[key] = kwargs.pop(key)
            elif param.default is not None:
                frame[key] = self.eval(param.default, {})
            else:
                frame[key] = _Opaque(f"{name}() was called without its argument {key!r}")
        if params.star_kwarg is not None:
            frame[params.star_kwarg.name.value] = dict(kwargs)

    def instantiate(
        self, classdef: cst.ClassDef, args: list[object], kwargs: dict[str, object], text: str
    ) -> _Instance:
        instance = _Instance(classdef, self.class_attributes(classdef), text)
        found = self.find_method(classdef, "__init__")
        if found is None and _is_dataclass(classdef):
            fields = list(instance.attrs)
            if len(args) > len(fields):
                raise _Unsized(f"{text} gets more arguments than {classdef.name.value} has fields")
            instance.attrs.update(zip(fields, args, strict=False))
            instance.attrs.update({key: value for key, value in kwargs.items() if key in fields})
        elif found is not None:
            init, owner = found
            frame: dict[str, object] = {"__self__": instance, "__class__": _ClassRef(owner)}
            self.bind_parameters(init, [instance, *args], dict(kwargs), frame)
            self.depth += 1
            try:
                self.run_constructor(init.body, frame)
            except _Return:
                pass
            finally:
                self.depth -= 1
        return instance

    def class_attributes(
        self, classdef: cst.ClassDef, seen: frozenset[str] = frozenset()
    ) -> dict[str, object]:
        """Values assigned in the class body (and its bases' in the file): dataclass fields,
        class constants."""
        attrs: dict[str, object] = {}
        for base in reversed(self.user_bases(classdef)):
            if base.name.value not in seen:
                attrs.update(self.class_attributes(base, seen | {classdef.name.value}))
        for statement in classdef.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                    if small.value is None:
                        attrs[small.target.value] = _Opaque(
                            f"the field {small.target.value!r} has no default"
                        )
                        continue
                    targets: list[cst.BaseExpression] = [small.target]
                    value_node = small.value
                elif isinstance(small, cst.Assign):
                    targets = [target.target for target in small.targets]
                    value_node = small.value
                else:
                    continue
                try:
                    value = self.eval(value_node, {})
                except (_Unsized, *_PYTHON_ERRORS):
                    value = _Opaque(f"the class attribute {self.code(value_node)}")
                for target in targets:
                    if isinstance(target, cst.Name):
                        attrs[target.value] = value
        return attrs

    def run_constructor(self, body: cst.BaseSuite, frame: dict[str, object]) -> None:
        """An ``__init__`` body: a statement that cannot be followed leaves what it assigns
        unknown (and is otherwise skipped), so one odd line costs only what it builds."""
        statements: Sequence[cst.BaseStatement | cst.BaseSmallStatement] = body.body
        for statement in statements:
            try:
                if isinstance(statement, cst.If):
                    condition = self.eval(statement.test, frame)
                    if isinstance(condition, (_Opaque, _Tensor)):
                        continue  # unknown branch: neither side is built
                    if self.truth(condition, statement.test):
                        self.run_constructor(statement.body, frame)
                    elif isinstance(statement.orelse, cst.Else):
                        self.run_constructor(statement.orelse.body, frame)
                    elif isinstance(statement.orelse, cst.If):
                        self.run_constructor(cst.IndentedBlock(body=[statement.orelse]), frame)
                    continue
                self.run_statement(statement, frame, nested=False)
            except _Unsized as error:
                reason = error.reason
                line = self.line(statement)
                if not error.located and line is not None:
                    reason = f"{reason} ({self.path}:{line})"
                for target in _assigned_targets(statement):
                    try:
                        self.assign(target, _Opaque(reason), frame)
                    except _Unsized:
                        continue

    def call_module(
        self, module: object, args: list[object], kwargs: dict[str, object], callee: str
    ) -> object:
        """Run a module's forward; an unsized reason inside names the module."""
        if isinstance(module, _Layer):
            return self.apply_layer(module, args, kwargs)
        if isinstance(module, _Container):
            if module.kind != "Sequential":
                raise _Unsized(f"calls {callee}, an nn.{module.kind}, which has no forward")
            value: object = args[0] if len(args) == 1 and not kwargs else None
            if value is None:
                raise _Unsized(f"calls the nn.Sequential {callee} with more than one input")
            for position, child in enumerate(module.children):
                try:
                    value = self.call_module(child, [value], {}, f"{callee}[{position}]")
                except _Unsized as error:
                    raise _Unsized(error.reason, error.located) from None
            return value
        assert isinstance(module, _Instance)
        found = self.find_method(module.classdef, "forward")
        if found is None:
            raise _Unsized(f"{callee} is {module.text}, which has no forward")
        try:
            return self.run_function(_Function(found[0], module, found[1]), args, dict(kwargs))
        except _Unsized as error:
            raise _Unsized(f"{callee} is {module.text}, whose forward {error.reason}") from None

    # --- standard layers' forwards ---------------------------------------------------------------

    def apply_layer(self, layer: _Layer, args: list[object], kwargs: dict[str, object]) -> object:
        kind, a = layer.kind, layer.args
        if kind == "MultiheadAttention":
            return self.multihead_attention(layer, args, kwargs)
        if not args:
            raise _Unsized(f"calls {layer.text} without an input")
        x = _tensor(args[0], f"the input of {layer.text}")
        shape = x.shape
        if kind == "Identity":
            return x
        if kind == "Linear":
            inputs, outputs = _int(a["in_features"], ""), _int(a["out_features"], "")
            if not shape or shape[-1] != inputs:
                raise _Unsized(
                    f"{layer.text} expects a last dimension of {inputs}, gets {_shape_text(shape)}"
                )
            self.counter.add(2 * _numel(shape[:-1]) * inputs * outputs, _MATMUL_BACKWARD)
            return _Tensor((*shape[:-1], outputs))
        if kind == "Embedding":
            return _Tensor((*shape, _int(a["embedding_dim"], "")))
        if kind.startswith("Conv"):
            return self.convolution(layer, x)
        if kind in ("LayerNorm", "RMSNorm", "GroupNorm") or kind.startswith("BatchNorm"):
            self.counter.add(_NORMALISE_FLOPS * _numel(shape), _MATMUL_BACKWARD)
            return _Tensor(shape, x.kind)
        if kind in ("Softmax", "LogSoftmax"):
            self.counter.add(_NORMALISE_FLOPS * _numel(shape), _MATMUL_BACKWARD)
            return _Tensor(shape, x.kind)
        if kind in _ACTIVATIONS:
            self.counter.add(_numel(shape), _ELEMENTWISE_BACKWARD)
            return _Tensor(shape, x.kind)
        if "Pool" in kind:
            return self.pool(layer, x)
        if kind == "Flatten":
            return _flatten(x, a["start_dim"], a["end_dim"])
        if kind == "Unflatten":
            handler = _TENSOR_FUNCTIONS["unflatten"]
            return handler(self, [x, a["dim"], a["unflattened_size"]], {})
        if kind == "Upsample":
            return self.resize(x, a["size"], a["scale_factor"])
        raise _Unsized(f"{layer.text} is a layer syncpass cannot size")

    def convolution(self, layer: _Layer, x: _Tensor) -> _Tensor:
        a = layer.args
        rank = _spatial_rank(layer.kind)
        shape = x.shape
        if len(shape) not in (rank + 1, rank + 2):
            raise _Unsized(f"{layer.text} expects {rank + 2} dimensions, gets {_shape_text(shape)}")
        inputs, outputs = _int(a["in_channels"], ""), _int(a["out_channels"], "")
        groups = _int(a["groups"], "groups")
        channel = len(shape) - rank - 1
        if shape[channel] != inputs:
            raise _Unsized(f"{layer.text} expects {inputs} channels, gets {_shape_text(shape)}")
        kernel = _tuple_of(a["kernel_size"], rank, "kernel_size")
        stride = _tuple_of(a["stride"], rank, "stride")
        dilation = _tuple_of(a["dilation"], rank, "dilation")
        spatial = shape[channel + 1 :]
        batch = _numel(shape[:channel])
        if layer.kind.startswith("ConvTranspose"):
            padding = _tuple_of(a["padding"], rank, "padding")
            extra = _tuple_of(a["output_padding"], rank, "output_padding")
            out = tuple(
                (size - 1) * s - 2 * p + d * (k - 1) + e + 1
                for size, s, p, d, k, e in zip(
                    spatial, stride, padding, dilation, kernel, extra, strict=True
                )
            )
            flops = 2 * batch * inputs * _numel(spatial) * (outputs // groups) * _numel(kernel)
        else:
            if a["padding"] == "same":
                out = spatial
            else:
                padding = (
                    (0,) * rank
                    if a["padding"] == "valid"
                    else _tuple_of(a["padding"], rank, "padding")
                )
                out = tuple(
                    _window_output(size, k, s, p, d, False)
                    for size, k, s, p, d in zip(
                        spatial, kernel, stride, padding, dilation, strict=True
                    )
                )
            flops = 2 * batch * outputs * _numel(out) * (inputs // groups) * _numel(kernel)
        self.counter.add(flops, _MATMUL_BACKWARD)
        return _Tensor((*shape[:channel], outputs, *out))

    def pool(self, layer: _Layer, x: _Tensor) -> object:
        a = layer.args
        rank = _spatial_rank(layer.kind)
        shape = x.shape
        if len(shape) < rank + 1:
            raise _Unsized(f"{layer.text} gets too few dimensions: {_shape_text(shape)}")
        spatial = shape[len(shape) - rank :]
        if layer.kind.startswith("Adaptive"):
            wanted = a["output_size"]
            sizes = list(wanted) if isinstance(wanted, (tuple, list)) else [wanted] * rank
            out = tuple(
                size if want is None else _int(want, "output_size")
                for size, want in zip(spatial, sizes, strict=True)
            )
            self.counter.add(_numel(shape), _ELEMENTWISE_BACKWARD)
        else:
            out = _pooled(
                spatial,
                a["kernel_size"],
                a["stride"],
                a["padding"],
                a.get("dilation", 1),
                bool(a["ceil_mode"]),
            )
            kernel = _numel(_tuple_of(a["kernel_size"], rank, "kernel_size"))
            self.counter.add(_numel(shape[: len(shape) - rank]) * _numel(out) * kernel, 1.0)
        result = _Tensor((*shape[: len(shape) - rank], *out), x.kind)
        if a.get("return_indices"):
            return (result, _Tensor(result.shape, "int"))
        return result

    def resize(self, x: _Tensor, size: object, scale: object) -> _Tensor:
        spatial_rank = len(x.shape) - 2
        if spatial_rank < 1:
            raise _Unsized(f"resizes a tensor of shape {_shape_text(x.shape)}")
        if size is not None:
            out = _tuple_of(size, spatial_rank, "size")
        elif scale is not None:
            factors = list(scale) if isinstance(scale, (tuple, list)) else [scale] * spatial_rank
            out = tuple(
                math.floor(length * _number(factor))
                for length, factor in zip(x.shape[2:], factors, strict=True)
            )
        else:
            raise _Unsized("resizes without a size or a scale factor")
        result = _Tensor((*x.shape[:2], *out), x.kind)
        self.counter.add(_numel(result.shape), _ELEMENTWISE_BACKWARD)
        return result

    def multihead_attention(
        self, layer: _Layer, args: list[object], kwargs: dict[str, object]
    ) -> object:
        names = ("query", "key", "value", "key_padding_mask", "need_weights")
        bound = dict(zip(names, args, strict=False))
        bound.update({key: value for key, value in kwargs.items() if key in names})
        if not all(name in bound for name in names[:3]):
            raise _Unsized(f"calls {layer.text} without query, key and value")
        query = _tensor(bound["query"], "the query")
        key = _tensor(bound["key"], "the key")
        a = layer.args
        embed, heads = _int(a["embed_dim"], ""), _int(a["num_heads"], "")
        kdim = embed if a["kdim"] is None else _int(a["kdim"], "")
        vdim = embed if a["vdim"] is None else _int(a["vdim"], "")
        if len(query.shape) == 2:
            batch, target, source = 1, query.shape[0], key.shape[0]
        elif len(query.shape) == 3:
            first = bool(a["batch_first"])
            batch = query.shape[0] if first else query.shape[1]
            target = query.shape[1] if first else query.shape[0]
            source = key.shape[1] if first else key.shape[0]
        else:
            raise _Unsized(f"{layer.text} gets a query of shape {_shape_text(query.shape)}")
        projections = 2 * batch * (target * embed * embed + source * (kdim + vdim) * embed)
        attention = 4 * batch * target * source * embed
        output = 2 * batch * target * embed * embed
        self.counter.add(projections + attention + output, _MATMUL_BACKWARD)
        self.counter.add(_NORMALISE_FLOPS * batch * heads * target * source, _MATMUL_BACKWARD)
        out = _Tensor(query.shape)
        need = bound.get("need_weights", True)
        if need is False:
            return (out, None)
        weights = (batch, target, source) if len(query.shape) == 3 else (target, source)
        return (out, _Tensor(weights))

    # --- library functions --------------------------------------------------------------------------

    def call_library(
        self, name: str, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        if name == "syncpass.noop":
            return None
        short = name.rsplit(".", 1)[-1]
        if name.startswith("builtins."):
            return self.call_builtin(short, args, kwargs, node)
        if name.startswith("math."):
            return _call_math(short, args)
        if name.startswith("torch.nn.") and not name.startswith("torch.nn.functional."):
            if short in _LAYERS:
                return self.construct_layer(short, args, kwargs, node)
            if short in ("Sequential", "ModuleList", "ModuleDict"):
                return self.construct_container(short, args, kwargs, node)
            if short == "Parameter":
                return _Tensor(
                    _tensor(args[0] if args else None, "nn.Parameter").shape, parameter=True
                )
            if ".init." in name:
                return None
            if short[:1].isupper():
                raise _Unsized(f"nn.{short} is a layer syncpass cannot size")
        if name.startswith("torch.") or name.startswith("einops"):
            return self.tensor_function(short, args, kwargs, name)
        raise _Unsized(f"calls {name}, which syncpass cannot size")

    def call_builtin(
        self, short: str, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        if short in ("isinstance", "hasattr", "callable", "print", "getattr", "setattr"):
            if short == "print":
                return None
            if short == "getattr" and len(args) >= 2 and isinstance(args[1], str):
                return self.attribute(args[0], args[1], node)
            raise _Unsized(f"calls {short}(), which syncpass does not evaluate")
        if short == "len":
            value = args[0] if args else None
            if isinstance(value, _Tensor) and value.shape:
                return value.shape[0]
            if isinstance(value, _Container):
                return len(value.children)
            if isinstance(value, (list, tuple, str, dict, range)):
                return len(value)
            raise _Unsized(f"takes len() of {_describe(value)}")
        if short in (
            "enumerate",
            "zip",
            "reversed",
            "sorted",
            "list",
            "tuple",
            "sum",
            "any",
            "all",
        ):
            items = [self.iterate(arg, node) for arg in args]
            if short == "enumerate":
                start = _int(args[1] if len(args) > 1 else kwargs.get("start", 0), "start")
                return list(enumerate(items[0], start))
            if short == "zip":
                return list(zip(*items, strict=False))
            if short == "reversed":
                return list(reversed(items[0]))
            if short in ("list", "tuple"):
                sequence = items[0] if items else []
                return list(sequence) if short == "list" else tuple(sequence)
            if short == "sum":
                total: object = args[1] if len(args) > 1 else 0
                for item in items[0]:
                    total = self.binary("Add", total, item)
                return total
        if short == "dict":
            try:
                return dict(*args, **kwargs)
            except (TypeError, ValueError) as error:
                raise _Unsized(f"dict() fails here: {error}") from None
        functions: dict[str, Callable[..., object]] = {
            "max": max,
            "min": min,
            "abs": abs,
            "int": int,
            "float": float,
            "bool": bool,
            "round": round,
            "range": range,
            "divmod": divmod,
            "pow": pow,
            "str": str,
            "sorted": sorted,
            "any": any,
            "all": all,
        }
        function = functions.get(short)
        if function is None:
            raise _Unsized(f"calls {short}(), which syncpass does not evaluate")
        for value in (*args, *kwargs.values()):
            if isinstance(value, _Opaque):
                raise _Unsized(value.reason)
            if not _is_plain(value):
                raise _Unsized(f"calls {short}() on {_describe(value)}")
        try:
            return function(*args, **kwargs)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError) as error:
            raise _Unsized(f"{short}() fails here: {error}") from None

    def construct_layer(
        self, kind: str, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> _Layer:
        text = self.code(node)
        if kind in _LOOSE_LAYERS:
            return _Layer(kind, {}, text)
        layer = _Layer(kind, _bind(_LAYERS[kind], args, kwargs, text), text)
        _layer_parameters(layer)  # arguments of the wrong type show here, not at first use
        return layer

    def construct_container(
        self, kind: str, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> _Container:
        text = self.code(node)
        if kind == "Sequential":
            if len(args) == 1 and isinstance(args[0], dict):
                items = list(args[0].items())
                return self._container(kind, [value for _, value in items], text, None)
            return self._container(kind, args, text, None)
        source = args[0] if args else kwargs.get("modules", [])
        if kind == "ModuleDict":
            if isinstance(source, dict):
                pairs = list(source.items())
            else:
                pairs = [_pair(item) for item in self.iterate(source, node)]
            return self._container(
                kind, [value for _, value in pairs], text, [str(key) for key, _ in pairs]
            )
        return self._container(kind, self.iterate(source, node), text, None)

    @staticmethod
    def _container(
        kind: str, children: list[object], text: str, keys: list[str] | None
    ) -> _Container:
        for child in children:
            if isinstance(child, _Opaque):
                raise _Unsized(child.reason)
            if not isinstance(child, _MODULES):
                raise _Unsized(f"{text} holds {_describe(child)}, not a module")
        return _Container(kind, list(children), keys, text)

    def call_method(
        self, method: _Method, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        target, name = method.target, method.name
        if isinstance(target, _Tensor):
            return self.tensor_function(name, [target, *args], kwargs, f"Tensor.{name}")
        if isinstance(target, _Instance) and name in _REGISTERS:
            key = _arg(args, kwargs, 0, "name", None)
            value = _arg(args, kwargs, 1, _REGISTERS[name], None)
            if not isinstance(key, str):
                raise _Unsized(f"{name}() with a name syncpass does not know")
            target.attrs[key] = value
            return None
        if isinstance(target, list):
            if name == "append":
                target.append(args[0])
                return None
            if name == "extend":
                target.extend(self.iterate(args[0], node))
                return None
            if name == "insert":
                target.insert(_int(args[0], "an index"), args[1])
                return None
            if name == "pop":
                return target.pop(*[_int(arg, "an index") for arg in args])
        if isinstance(target, dict):
            if name in ("items", "keys", "values"):
                return list(getattr(target, name)())
            if name == "get":
                return target.get(self.hashable(args[0]), args[1] if len(args) > 1 else None)
        if isinstance(target, _Container):
            if name in ("append", "add_module") and target.keys is None:
                target.children.append(self._container("", [args[-1]], "", None).children[0])
                return None
            if name == "extend":
                target.children.extend(
                    self._container("", self.iterate(args[0], node), "", None).children
                )
                return None
            if name in ("items", "keys", "values") and target.keys is not None:
                pairs = list(zip(target.keys, target.children, strict=True))
                if name == "items":
                    return pairs
                return [pair[0 if name == "keys" else 1] for pair in pairs]
            if name in ("children", "modules"):
                return list(target.children)
        raise _Unsized(f"calls .{name}() of {_describe(target)}, which syncpass cannot follow")

    # --- torch functions and tensor methods ------------------------------------------------------------

    def tensor_function(
        self, name: str, args: list[object], kwargs: dict[str, object], qualified: str
    ) -> object:
        """``torch.<name>``, ``torch.nn.functional.<name>`` or the tensor method ``name``
        (``args[0]`` is then the tensor)."""
        handler = _TENSOR_FUNCTIONS.get(name)
        if handler is None:
            raise _Unsized(f"calls {qualified}, whose output shape syncpass does not know")
        try:
            return handler(self, args, kwargs)
        except _Unsized as error:
            raise _Unsized(f"calls {qualified}, which {error.reason}") from None
        except (IndexError, KeyError):
            raise _Unsized(f"calls {qualified} with arguments syncpass cannot read") from None

    def matmul(self, a: _Tensor, b: _Tensor) -> _Tensor:
        left, right = a.shape, b.shape
        if not left or not right:
            raise _Unsized("multiplies a scalar tensor as a matrix")
        lhs = (1, *left) if len(left) == 1 else left
        rhs = (*right, 1) if len(right) == 1 else right
        if lhs[-1] != rhs[-2]:
            raise _Unsized(
                f"multiplies {_shape_text(left)} by {_shape_text(right)}: inner sizes differ"
            )
        batch = _broadcast(lhs[:-2], rhs[:-2])
        self.counter.add(2 * _numel(batch) * lhs[-2] * lhs[-1] * rhs[-1], _MATMUL_BACKWARD)
        shape = (*batch, lhs[-2], rhs[-1])
        if len(left) == 1:
            shape = (*batch, rhs[-1])
        if len(right) == 1:
            shape = shape[:-1]
        return _Tensor(shape, a.kind)

    def elementwise(
        self, args: list[object], kwargs: dict[str, object], flops: int, backward: float
    ) -> _Tensor:
        tensors = [arg for arg in (*args, *kwargs.values()) if isinstance(arg, _Tensor)]
        if not tensors:
            raise _Unsized("gets no tensor")
        shape = _broadcast(*(tensor.shape for tensor in tensors))
        self.counter.add(flops * _numel(shape), backward)
        return _Tensor(shape, tensors[0].kind)


def _too_large(name: str, left: object, right: object) -> bool:
    """A power, shift or sequence repetition that would take long or fill memory."""
    big = any(isinstance(side, int) and abs(side) > _MAX_ITEMS for side in (left, right))
    if name in ("Power", "LeftShift"):
        return big
    sequence = any(isinstance(side, (str, list, tuple)) for side in (left, right))
    return name == "Multiply" and big and sequence


def _is_dataclass(classdef: cst.ClassDef) -> bool:
    return any(
        m.matches(
            decorator.decorator,
            m.Name("dataclass")
            | m.Attribute(attr=m.Name("dataclass"))
            | m.Call(func=m.Name("dataclass") | m.Attribute(attr=m.Name("dataclass"))),
        )
        for decorator in classdef.decorators
    )


def _assigned_targets(
    statement: cst.BaseStatement | cst.BaseSmallStatement,
) -> list[cst.BaseExpression]:
    if not isinstance(statement, cst.SimpleStatementLine):
        return []
    targets: list[cst.BaseExpression] = []
    for small in statement.body:
        if isinstance(small, cst.Assign):
            targets.extend(target.target for target in small.targets)
        elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            targets.append(small.target)
    return targets


def _pair(item: object) -> tuple[object, object]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise _Unsized(f"needs (name, module) pairs, got {_describe(item)}")


def _is_plain(value: object) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(item) for item in value)
    return value is None or isinstance(value, (int, float, str, range, dict))


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, _Opaque):
            raise _Unsized(value.reason)
        raise _Unsized(f"needs a number, got {_describe(value)}")
    return value


def _call_math(short: str, args: list[object]) -> object:
    function = getattr(math, short, None)
    if short in ("pi", "e", "inf") or not callable(function):
        raise _Unsized(f"uses math.{short}, which syncpass does not evaluate")
    try:
        return function(*[_number(arg) for arg in args])
    except (TypeError, ValueError, OverflowError) as error:
        raise _Unsized(f"math.{short}() fails here: {error}") from None


def _pooled(
    spatial: tuple[int, ...],
    kernel: object,
    stride: object,
    padding: object,
    dilation: object,
    ceil: bool,
) -> tuple[int, ...]:
    rank = len(spatial)
    kernels = _tuple_of(kernel, rank, "kernel_size")
    strides = kernels if stride is None else _tuple_of(stride, rank, "stride")
    paddings = _tuple_of(padding, rank, "padding")
    dilations = _tuple_of(dilation, rank, "dilation")
    return tuple(
        _window_output(size, k, s, p, d, ceil)
        for size, k, s, p, d in zip(spatial, kernels, strides, paddings, dilations, strict=True)
    )


def _flatten(x: _Tensor, start: object, end: object) -> _Tensor:
    shape = x.shape
    if not shape:
        return _Tensor((1,), x.kind)
    first, last = _dim(start, len(shape)), _dim(end, len(shape))
    if first > last:
        raise _Unsized("flattens with start_dim after end_dim")
    merged = _numel(shape[first : last + 1])
    return _Tensor((*shape[:first], merged, *shape[last + 1 :]), x.kind)


def _sizes(args: Sequence[object]) -> list[object]:
    """``view(2, 3)`` and ``view((2, 3))`` alike."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return list(args[0])
    return list(args)


def _reshape(x: _Tensor, sizes: list[object]) -> _Tensor:
    dims = [_int(size, "a size") for size in sizes]
    total = _numel(x.shape)
    if dims.count(-1) > 1:
        raise _Unsized("has more than one -1 size")
    if -1 in dims:
        known = _numel([dim for dim in dims if dim != -1])
        if known == 0 or total % known:
            raise _Unsized(f"cannot reshape {_shape_text(x.shape)} to {_shape_text(dims)}")
        dims[dims.index(-1)] = total // known
    if _numel(dims) != total:
        raise _Unsized(f"reshapes {_shape_text(x.shape)} ({total} elements) to {_shape_text(dims)}")
    return _Tensor(tuple(dims), x.kind)


def _arg(
    args: Sequence[object], kwargs: Mapping[str, object], position: int, name: str, default: object
) -> object:
    if position < len(args):
        return args[position]
    return kwargs.get(name, default)


def _dtype_kind(value: object, default: str) -> str:
    if isinstance(value, _Library):
        short = value.name.rsplit(".", 1)[-1]
        if short in _DTYPES:
            return _DTYPES[short]
    return default


_DTYPES = {
    "float": "float",
    "float16": "float",
    "float32": "float",
    "float64": "float",
    "bfloat16": "float",
    "half": "float",
    "double": "float",
    "long": "int",
    "int": "int",
    "int64": "int",
    "int32": "int",
    "int16": "int",
    "int8": "int",
    "uint8": "int",
    "bool": "bool",
}

_TensorHandler = Callable[[_Interpreter, list[object], dict[str, object]], object]
_TENSOR_FUNCTIONS: dict[str, _TensorHandler] = {}


def _handles(*names: str) -> Callable[[_TensorHandler], _TensorHandler]:
    def register(handler: _TensorHandler) -> _TensorHandler:
        for name in names:
            _TENSOR_FUNCTIONS[name] = handler
        return handler

    return register


@_handles(
    "relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs",
    "neg", "sin", "cos", "dropout", "leaky_relu", "elu", "softplus", "mish", "hardswish",
    "hardtanh", "relu6", "erf", "clamp", "clip", "square", "reciprocal", "sign", "masked_fill",
    "tril", "triu", "add", "sub", "mul", "div", "pow", "maximum", "minimum", "where", "lerp",
    "masked_fill_", "add_", "mul_", "clamp_", "dropout1d", "dropout2d", "floor", "ceil", "round",
)  # fmt: skip
def _elementwise(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    return interp.elementwise(args, kwargs, 1, _ELEMENTWISE_BACKWARD)


@_handles(
    "softmax", "log_softmax", "layer_norm", "group_norm", "batch_norm", "rms_norm",
    "instance_norm", "normalize",
)  # fmt: skip
def _normalising(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0] if args else kwargs.get("input"), "the input")
    interp.counter.add(_NORMALISE_FLOPS * _numel(x.shape), _MATMUL_BACKWARD)
    return _Tensor(x.shape, x.kind)


@_handles("contiguous", "detach", "to", "requires_grad_", "cpu", "cuda", "type_as")
def _same(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the tensor")
    if len(args) > 1 and isinstance(args[1], _Tensor):  # x.to(other) / x.type_as(other)
        return _Tensor(x.shape, args[1].kind)
    wanted = _dtype_kind(kwargs.get("dtype", args[1] if len(args) > 1 else None), x.kind)
    return x if wanted == x.kind else _Tensor(x.shape, wanted)


def _conversion(kind: str | None) -> _TensorHandler:
    def convert(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        x = _tensor(args[0], "the tensor")
        return _Tensor(x.shape, kind or x.kind)

    return convert


for _name, _kind in (
    ("clone", None),
    ("float", "float"),
    ("half", "float"),
    ("double", "float"),
    ("bfloat16", "float"),
    ("long", "int"),
    ("int", "int"),
    ("bool", "bool"),
):
    _TENSOR_FUNCTIONS[_name] = _conversion(_kind)


@_handles("view", "reshape")
def _view(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the tensor")
    sizes = _sizes(args[1:]) if len(args) > 1 else _sizes([kwargs.get("shape", ())])
    return _reshape(x, sizes)


@_handles("view_as", "reshape_as", "expand_as")
def _like_other(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x, other = _tensor(args[0], "the tensor"), _tensor(args[1], "the other tensor")
    return _Tensor(other.shape, x.kind)


@_handles("flatten")
def _flatten_call(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    return _flatten(x, _arg(args, kwargs, 1, "start_dim", 0), _arg(args, kwargs, 2, "end_dim", -1))


@_handles("unflatten")
def _unflatten(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    dim = _dim(_arg(args, kwargs, 1, "dim", None), len(x.shape))
    part = _reshape(_Tensor(x.shape[dim : dim + 1]), _sizes([_arg(args, kwargs, 2, "sizes", ())]))
    return _Tensor((*x.shape[:dim], *part.shape, *x.shape[dim + 1 :]), x.kind)


@_handles("transpose", "swapaxes", "swapdims")
def _transpose(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    shape = list(x.shape)
    first = _dim(_arg(args, kwargs, 1, "dim0", None), len(shape))
    second = _dim(_arg(args, kwargs, 2, "dim1", None), len(shape))
    shape[first], shape[second] = shape[second], shape[first]
    return _Tensor(tuple(shape), x.kind)


@_handles("t")
def _t(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    return _Tensor(tuple(reversed(x.shape)), x.kind)


@_handles("permute")
def _permute(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    dims = [_dim(dim, len(x.shape)) for dim in _sizes(args[1:] or [kwargs.get("dims", ())])]
    if sorted(dims) != list(range(len(x.shape))):
        raise _Unsized(f"permutes {_shape_text(x.shape)} by {dims}")
    return _Tensor(tuple(x.shape[dim] for dim in dims), x.kind)


@_handles("unsqueeze")
def _unsqueeze(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    dim = _dim(_arg(args, kwargs, 1, "dim", None), len(x.shape) + 1)
    return _Tensor((*x.shape[:dim], 1, *x.shape[dim:]), x.kind)


@_handles("squeeze")
def _squeeze(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    dim = _arg(args, kwargs, 1, "dim", None)
    if dim is None:
        return _Tensor(tuple(size for size in x.shape if size != 1), x.kind)
    at = _dim(dim, len(x.shape))
    if x.shape[at] != 1:
        return x
    return _Tensor((*x.shape[:at], *x.shape[at + 1 :]), x.kind)


@_handles("expand")
def _expand(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    sizes = [_int(size, "a size") for size in _sizes(args[1:])]
    padded = (1,) * (len(sizes) - len(x.shape)) + x.shape
    if len(padded) != len(sizes):
        raise _Unsized(f"gets {len(sizes)} sizes for a tensor of rank {len(x.shape)}")
    shape = tuple(have if size == -1 else size for have, size in zip(padded, sizes, strict=True))
    return _Tensor(shape, x.kind)


@_handles("repeat")
def _repeat(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    times = [_int(size, "a count") for size in _sizes(args[1:])]
    padded = (1,) * (len(times) - len(x.shape)) + x.shape
    if len(padded) != len(times):
        raise _Unsized(f"gets {len(times)} counts for a tensor of rank {len(x.shape)}")
    return _Tensor(tuple(have * count for have, count in zip(padded, times, strict=True)), x.kind)


@_handles("size")
def _size(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the tensor")
    dim = _arg(args, kwargs, 1, "dim", None)
    return x.shape if dim is None else x.shape[_dim(dim, len(x.shape))]


@_handles("dim", "ndimension")
def _rank(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    return len(_tensor(args[0], "the tensor").shape)


@_handles("numel")
def _count(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    return _numel(_tensor(args[0], "the tensor").shape)


def _reduce_by(name: str) -> _TensorHandler:
    def reduce(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        x = _tensor(args[0], "the input")
        if len(args) > 1 and isinstance(args[1], _Tensor):  # torch.max(a, b): elementwise
            return interp.elementwise(args, kwargs, 1, _ELEMENTWISE_BACKWARD)
        dim = _arg(args, kwargs, 1, "dim", None)
        keep = bool(_arg(args, kwargs, 2, "keepdim", False))
        interp.counter.add(_numel(x.shape), _ELEMENTWISE_BACKWARD)
        shape: tuple[int, ...] = ()
        if dim is not None:
            listed = dim if isinstance(dim, (tuple, list)) else [dim]
            dims = {_dim(item, len(x.shape)) for item in listed}
            shape = tuple(
                1 if position in dims else size
                for position, size in enumerate(x.shape)
                if keep or position not in dims
            )
        if name in ("argmax", "argmin"):
            return _Tensor(shape, "int")
        if name in ("max", "min") and dim is not None:
            return (_Tensor(shape, x.kind), _Tensor(shape, "int"))  # values, indices
        return _Tensor(shape, x.kind)

    return reduce


for _name in (
    "mean", "sum", "amax", "amin", "std", "var", "norm", "logsumexp", "prod", "argmax",
    "argmin", "max", "min",
):  # fmt: skip
    _TENSOR_FUNCTIONS[_name] = _reduce_by(_name)


def _split_by(kind: str) -> _TensorHandler:
    def split(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        x = _tensor(args[0], "the input")
        if kind == "unbind":
            dim = _dim(_arg(args, kwargs, 1, "dim", 0), len(x.shape))
            rest = (*x.shape[:dim], *x.shape[dim + 1 :])
            return tuple(_Tensor(rest, x.kind) for _ in range(x.shape[dim]))
        how = _arg(args, kwargs, 1, "split_size_or_sections" if kind == "split" else "chunks", None)
        dim = _dim(_arg(args, kwargs, 2, "dim", 0), len(x.shape))
        size = x.shape[dim]
        if isinstance(how, (list, tuple)):
            pieces = [_int(piece, "a section") for piece in how]
            if sum(pieces) != size:
                raise _Unsized(f"splits a dimension of {size} into {pieces}")
        else:
            count = _int(how, "the split size")
            if count < 1:
                raise _Unsized("splits into pieces of size 0")
            step = count if kind == "split" else -(-size // count)
            pieces = [min(step, size - start) for start in range(0, size, step)]
        return tuple(
            _Tensor((*x.shape[:dim], piece, *x.shape[dim + 1 :]), x.kind) for piece in pieces
        )

    return split


for _name in ("split", "chunk", "unbind"):
    _TENSOR_FUNCTIONS[_name] = _split_by(_name)


def _join_by(kind: str) -> _TensorHandler:
    def join(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        parts = _arg(args, kwargs, 0, "tensors", None)
        if not isinstance(parts, (list, tuple)) or not parts:
            raise _Unsized(f"gets {_describe(parts)} instead of a list of tensors")
        tensors = [_tensor(part, "each piece") for part in parts]
        first = tensors[0].shape
        if kind == "stack":
            dim = _dim(_arg(args, kwargs, 1, "dim", 0), len(first) + 1)
            if any(tensor.shape != first for tensor in tensors):
                raise _Unsized("stacks tensors of different shapes")
            return _Tensor((*first[:dim], len(tensors), *first[dim:]), tensors[0].kind)
        dim = _dim(_arg(args, kwargs, 1, "dim", 0), len(first))
        for tensor in tensors:
            if len(tensor.shape) != len(first) or any(
                a != b for i, (a, b) in enumerate(zip(tensor.shape, first, strict=True)) if i != dim
            ):
                shown = ", ".join(_shape_text(t.shape) for t in tensors)
                raise _Unsized(f"joins tensors whose shapes differ off dim {dim}: {shown}")
        total = sum(tensor.shape[dim] for tensor in tensors)
        return _Tensor((*first[:dim], total, *first[dim + 1 :]), tensors[0].kind)

    return join


for _name in ("cat", "concat", "concatenate", "stack"):
    _TENSOR_FUNCTIONS[_name] = _join_by(_name)


@_handles("matmul", "mm", "bmm")
def _matmul(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    return interp.matmul(_tensor(args[0], "the left operand"), _tensor(args[1], "the right"))


@_handles("linear")
def _linear(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    weight = _tensor(_arg(args, kwargs, 1, "weight", None), "the weight")
    if len(weight.shape) != 2 or not x.shape or x.shape[-1] != weight.shape[1]:
        raise _Unsized(f"applies a weight {_shape_text(weight.shape)} to {_shape_text(x.shape)}")
    interp.counter.add(2 * _numel(x.shape) * weight.shape[0], _MATMUL_BACKWARD)
    return _Tensor((*x.shape[:-1], weight.shape[0]))


@_handles("embedding")
def _embedding(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    ids = _tensor(args[0], "the ids")
    weight = _tensor(_arg(args, kwargs, 1, "weight", None), "the weight")
    return _Tensor((*ids.shape, weight.shape[-1]))


@_handles("scaled_dot_product_attention")
def _attention(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    query = _tensor(_arg(args, kwargs, 0, "query", None), "the query")
    key = _tensor(_arg(args, kwargs, 1, "key", None), "the key")
    value = _tensor(_arg(args, kwargs, 2, "value", None), "the value")
    if len(query.shape) < 2 or len(key.shape) < 2 or len(value.shape) < 2:
        raise _Unsized("gets a query, key or value of rank below 2")
    rows = _numel(query.shape[:-1])
    source = key.shape[-2]
    # Q K^T and the weighted sum of V, as torch.utils.flop_counter counts attention.
    interp.counter.add(2 * rows * source * (query.shape[-1] + value.shape[-1]), _MATMUL_BACKWARD)
    interp.counter.add(_NORMALISE_FLOPS * rows * source, _MATMUL_BACKWARD)
    return _Tensor((*query.shape[:-1], value.shape[-1]), query.kind)


def _pool_by(name: str) -> _TensorHandler:
    kind = ("MaxPool" if name.startswith("max") else "AvgPool") + name[-2:]

    signature = _MAX_POOL_FUNCTION if kind.startswith("MaxPool") else _LAYERS[kind]

    def pool(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        layer_args = _bind(signature, args[1:], kwargs, name)
        return interp.pool(_Layer(kind, layer_args, name), _tensor(args[0], "the input"))

    return pool


def _adaptive_pool(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    size = _arg(args, kwargs, 1, "output_size", None)
    layer = _Layer("AdaptiveAvgPool2d", {"output_size": size}, "adaptive_avg_pool2d")
    return interp.pool(layer, _tensor(args[0], "the input"))


for _name in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"):
    _TENSOR_FUNCTIONS[_name] = _pool_by(_name)
_TENSOR_FUNCTIONS["adaptive_avg_pool2d"] = _adaptive_pool
_TENSOR_FUNCTIONS["adaptive_max_pool2d"] = _adaptive_pool


@_handles("interpolate", "upsample")
def _interpolate(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    return interp.resize(
        x, _arg(args, kwargs, 1, "size", None), _arg(args, kwargs, 2, "scale_factor", None)
    )


@_handles("pad")
def _pad(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    pads = [_int(p, "a padding") for p in _sizes([_arg(args, kwargs, 1, "pad", ())])]
    shape = list(x.shape)
    for position in range(len(pads) // 2):
        shape[-1 - position] += pads[2 * position] + pads[2 * position + 1]
    return _Tensor(tuple(shape), x.kind)


@_handles(
    "cross_entropy", "mse_loss", "l1_loss", "nll_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "smooth_l1_loss", "kl_div",
)  # fmt: skip
def _loss(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the input")
    interp.counter.add(_NORMALISE_FLOPS * _numel(x.shape), _ELEMENTWISE_BACKWARD)
    reduction = kwargs.get("reduction", "mean")
    return _Tensor(x.shape[:1] if reduction == "none" else ())


@_handles("arange")
def _arange(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    bounds = [_number(arg) for arg in args[:3]]
    if not bounds and "end" in kwargs:
        bounds = [_number(kwargs["end"])]
    start, end, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds, 1.0)[:3]
    if step == 0:
        raise _Unsized("steps by 0")
    count = max(0, math.ceil((end - start) / step))
    integral = all(isinstance(arg, int) for arg in args[:3])
    kind = _dtype_kind(kwargs.get("dtype"), "int" if integral else "float")
    return _Tensor((count,), kind)


def _creator(default_kind: str) -> _TensorHandler:
    def create(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
        sizes = _sizes(args) if args else _sizes([kwargs.get("size", ())])
        shape = tuple(_int(size, "a size") for size in sizes)
        return _Tensor(shape, _dtype_kind(kwargs.get("dtype"), default_kind))

    return create


def _full(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    shape = tuple(_int(size, "a size") for size in _sizes([_arg(args, kwargs, 0, "size", ())]))
    return _Tensor(shape, _dtype_kind(kwargs.get("dtype"), "float"))


def _randint(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    size = kwargs.get("size", args[-1] if args else ())
    return _Tensor(tuple(_int(s, "a size") for s in _sizes([size])), "int")


def _like(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    x = _tensor(args[0], "the tensor")
    return _Tensor(x.shape, _dtype_kind(kwargs.get("dtype"), x.kind))


for _name in ("zeros", "ones", "empty", "randn", "rand"):
    _TENSOR_FUNCTIONS[_name] = _creator("float")
_TENSOR_FUNCTIONS["full"] = _full
_TENSOR_FUNCTIONS["randint"] = _randint
for _name in ("zeros_like", "ones_like", "empty_like", "randn_like", "rand_like", "full_like"):
    _TENSOR_FUNCTIONS[_name] = _like


def _new_creator(interp: _Interpreter, args: list[object], kwargs: dict[str, object]) -> object:
    tensor = _tensor(args[0], "the tensor")
    sizes = _sizes(args[1:])
    return _Tensor(tuple(_int(size, "a size") for size in sizes), tensor.kind)


for _name in ("new_zeros", "new_ones", "new_empty"):
    _TENSOR_FUNCTIONS[_name] = _new_creator


# --- the estimate -------------------------------------------------------------------------------


def _resolve_path(root: _Instance, dotted: str) -> object | None:
    """``blocks.3`` of the model: an attribute path, indexing containers by position or key."""
    value: object = root
    for part in dotted.split("."):
        if isinstance(value, _Instance):
            value = value.attrs.get(part)
        elif isinstance(value, _Container):
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


def _parameters(value: object, found: dict[int, int], seen: set[int] | None = None) -> None:
    """Parameter counts of ``value`` and everything it holds, by identity (shared once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, _Layer):
        try:
            found[id(value)] = _layer_parameters(value)
        except _Unsized:
            found[id(value)] = 0
    elif isinstance(value, _Tensor) and value.parameter:
        found[id(value)] = _numel(value.shape)
    elif isinstance(value, _Container):
        for child in value.children:
            _parameters(child, found, seen)
    elif isinstance(value, _Instance):
        for attr in value.attrs.values():
            _parameters(attr, found, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _parameters(item, found, seen)


def _value_tensors(value: object, seen: set[int]) -> Iterator[_Tensor]:
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, _Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _value_tensors(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _value_tensors(item, seen)


@dataclass
class _OpFigures:
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    out_bytes: float = 0.0
    live_bytes: float = 0.0
    unsized: str | None = None


class _ForwardRun:
    """The model's forward run op by op, each op's figures recorded."""

    def __init__(
        self,
        interp: _Interpreter,
        model: _Instance,
        graph: OpGraph,
        forward: cst.FunctionDef,
        frame: dict[str, object],
    ) -> None:
        self.interp = interp
        self.model = model
        self.graph = graph
        self.forward = forward
        self.frame = frame
        self.last_activation: _Tensor | None = None
        self.finished = False

    def bytes_of(self, names: Sequence[str]) -> float:
        seen: set[int] = set()
        total = 0
        for name in names:
            for tensor in _value_tensors(self.frame.get(name), seen):
                size = {"float": self.interp.dtype_bytes, "int": INT_BYTES, "bool": 1}[tensor.kind]
                total += _numel(tensor.shape) * size
        return float(total)

    def run(self) -> list[_OpFigures]:
        assert isinstance(self.forward.body, cst.IndentedBlock)
        statements = list(self.forward.body.body)
        by_statement: dict[int, list[int]] = {}
        for position, op in enumerate(self.graph.ops):
            by_statement.setdefault(op.statement, []).append(position)
        live = {cut.after: cut.live for cut in self.graph.cuts}
        figures = [_OpFigures() for _ in self.graph.ops]
        for index, statement in enumerate(statements):
            positions = by_statement.get(index, [])
            if not positions:
                if not self.finished:
                    with contextlib.suppress(_Unsized, _Return, _Break, _Continue):
                        self.interp.run_statement(statement, self.frame, nested=False)
                continue
            for position in positions:
                op = self.graph.ops[position]
                figures[position] = self.run_op(op, statement)
                figures[position].out_bytes = self.bytes_of(op.writes)
                figures[position].live_bytes = self.bytes_of(live.get(op.id, ()))
        return figures

    def run_op(self, op: Op, statement: cst.BaseStatement) -> _OpFigures:
        interp = self.interp
        interp.counter = _Counter()
        reason: str | None = None
        if self.finished:
            reason = "runs after the forward has returned"
        else:
            try:
                self._execute(op, statement)
            except _Return:
                self.finished = True
            except (_Break, _Continue):
                reason = "a break or continue outside a loop syncpass follows"
            except _Unsized as error:
                reason = error.reason
            except RecursionError:
                reason = "nests deeper than syncpass follows"
        if reason is not None:
            self._fallback(op)
            return _OpFigures(unsized=reason)
        for name in op.writes:
            value = self.frame.get(name)
            if isinstance(value, _Tensor) and value.kind == "float":
                self.last_activation = value
        return _OpFigures(interp.counter.forward, interp.counter.backward)

    def _execute(self, op: Op, statement: cst.BaseStatement) -> None:
        interp = self.interp
        if op.loop is None:
            interp.run_statement(statement, self.frame, nested=False)
            return
        container = _resolve_path(self.model, op.loop.container)
        if not isinstance(container, _Container):
            raise _Unsized(f"self.{op.loop.container} is not a container syncpass knows")
        child = container.children[op.loop.index]
        sequential = match_sequential_call(statement)
        if isinstance(statement, cst.For):
            loop = match_container_loop(statement)
            assert loop is not None
            self.frame[loop.item] = child
            if loop.index_name is not None:
                self.frame[loop.index_name] = self._enumerated_index(statement, op.loop.index)
            interp.run_block(statement.body, self.frame, nested=False)
        elif sequential is not None:
            first = op.loop.index == (sequential.start or 0)
            value = self.frame.get(sequential.argument if first else sequential.target)
            callee = f"self.{op.loop.container}[{op.loop.index}]"
            self.frame[sequential.target] = interp.call_module(child, [value], {}, callee)
        else:
            raise _Unsized("an op syncpass cannot match to its source")

    def _enumerated_index(self, statement: cst.For, index: int) -> int:
        loop = match_container_loop(statement)
        assert loop is not None and isinstance(statement.iter, cst.Call)
        start = 0
        if len(statement.iter.args) > 1:
            start = _int(self.interp.eval(statement.iter.args[1].value, {}), "start")
        return start + index - (loop.start or 0)

    def _fallback(self, op: Op) -> None:
        """Every name the op writes takes the shape of its first sized input."""
        shape: _Tensor | None = None
        for name in op.reads:
            value = self.frame.get(name)
            if isinstance(value, _Tensor):
                shape = value
                break
        shape = shape or self.last_activation
        written: object = _Opaque("unsized") if shape is None else _Tensor(shape.shape)
        for name in op.writes:
            self.frame[name] = written  # one tensor: several names of it count once
        if shape is not None:
            self.last_activation = shape


def _input_kinds(
    interp: _Interpreter,
    model: _Instance,
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
            except _Unsized:
                callee = None
            while (
                isinstance(callee, _Container) and callee.kind == "Sequential" and callee.children
            ):
                callee = callee.children[0]
            if (isinstance(callee, _Layer) and callee.kind == "Embedding") or (
                isinstance(callee, _Library) and callee.name.endswith("functional.embedding")
            ):
                kind = "int"
        kinds.append(kind)
    return kinds


def estimate_costs(
    text: str,
    path: str,
    class_name: str | None,
    input_shapes: Sequence[tuple[int, ...]],
    hardware: Hardware,
    *,
    training: bool = True,
    dtype_bytes: int = 4,
    depth: int = 1,
    input_dtypes: Sequence[str] | None = None,
) -> StaticEstimate:
    """Estimate the cost file of ``class_name`` (or the file's only model) from ``text``.

    ``input_shapes`` are the shapes of the forward's positional inputs, in
    order; ``input_dtypes`` says which are ``"float"`` and which ``"int"``
    (token ids), by default int when an input is first passed to an
    ``nn.Embedding``. ``depth`` 2 plans calls of ``nn.Sequential`` submodules
    per child, as ``syncpass profile --depth 2`` does. The op ids are exactly
    those of :func:`syncpass.frontend.analyse_model` for the same source, so
    ``syncpass rewrite --costs`` accepts the result. Raises
    :class:`SyncpassError` for a file it cannot analyse or inputs that do not
    fit the forward.
    """
    if not input_shapes:
        raise SyncpassError("give the shape of at least one forward input (--input-shape)")
    for shape in input_shapes:
        if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise SyncpassError(
                f"input shape {shape!r} must be one or more whole sizes >= 1 (e.g. 8x128)"
            )
    if dtype_bytes < 1 or depth < 1:
        raise SyncpassError("dtype_bytes and depth must be at least 1")
    text = strip_sync_points(text, path)
    module = parse_source(text, path)
    model_def = find_forward(module, class_name or _root_model_class(module), path)
    name = model_def.class_name
    interp = _Interpreter(module, path, training, dtype_bytes)
    model = interp.instantiate(model_def.classdef, [], {}, f"{name}()")

    sizes: dict[str, int] = {}
    for container in loop_containers(module, name, path):
        value = _resolve_path(model, container)
        if isinstance(value, _Container):
            sizes[container] = len(value.children)
    expand: dict[str, int] = {}
    if depth >= 2:
        for container in find_sequential_calls(module, name, path):
            value = _resolve_path(model, container)
            if isinstance(value, _Container) and value.kind == "Sequential":
                expand[container] = len(value.children)
    graph = analyse_model(module, path, name, sizes, text, expand)

    frame = _bind_inputs(interp, model, model_def.forward, graph, input_shapes, input_dtypes)
    figures = _ForwardRun(interp, model, graph, model_def.forward, frame).run()
    params = _attributed_parameters(model, graph, dtype_bytes)

    rate = hardware.flops_per_s or DEFAULT_FLOPS_PER_S
    sized = [figure for figure in figures if figure.unsized is None]
    median_forward = statistics.median(f.forward_flops for f in sized) if sized else 0.0
    median_backward = statistics.median(f.backward_flops for f in sized) if sized else 0.0
    ops = []
    unsized = []
    for op, figure, param_bytes in zip(graph.ops, figures, params, strict=True):
        forward_flops, backward_flops = figure.forward_flops, figure.backward_flops
        if figure.unsized is not None:
            forward_flops, backward_flops = median_forward, median_backward
            unsized.append(UnsizedOp(op.id, str(op.location), figure.unsized))
        ops.append(
            OpCost(
                id=op.id,
                compute_s=forward_flops / rate,
                backward_s=backward_flops / rate,
                param_bytes=param_bytes,
                out_bytes=figure.out_bytes,
                flops=forward_flops,
                source=str(op.location),
            )
        )
    by_id = {op.id: figure for op, figure in zip(graph.ops, figures, strict=True)}
    cuts = tuple(
        CutCost(after=cut.after, live_bytes=by_id[cut.after].live_bytes, pinned=cut.pinned)
        for cut in graph.cuts
    )
    notes = [_summary_note(hardware, rate, input_shapes, unsized)]
    if hardware.flops_per_s is None:
        hardware = dataclasses.replace(hardware, flops_per_s=rate)
    costs = Costs(
        batch_size=input_shapes[0][0],
        training=training,
        memory_multiplier=TRAINING_MEMORY_MULTIPLIER if training else 1,
        hardware=hardware,
        ops=tuple(ops),
        cuts=cuts,
        model=name,
        edges=graph.edges,
        notes=tuple(notes),
    )
    return StaticEstimate(costs, tuple(unsized))


def _root_model_class(module: cst.Module) -> str | None:
    """The file's model class that no other class of the file builds (directly or through
    the file's functions), when exactly one is: ``TransformerLM`` beside its ``Block``.
    Otherwise ``None``, and the analysis asks for ``--model``."""
    names = model_class_names(module)
    defined = {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef))
    }
    refs = {
        name: {node.value for node in m.findall(statement, m.Name()) if isinstance(node, cst.Name)}
        & set(defined)
        for name, statement in defined.items()
    }
    used: set[str] = set()
    for name in names:
        stack, seen = list(refs[name] - {name}), {name}
        while stack:
            other = stack.pop()
            if other in seen:
                continue
            seen.add(other)
            used.add(other)
            if isinstance(defined[other], cst.FunctionDef):
                stack.extend(refs[other])
    roots = [name for name in names if name not in used]
    return roots[0] if len(roots) == 1 else None


def _summary_note(
    hardware: Hardware, rate: float, shapes: Sequence[tuple[int, ...]], unsized: list[UnsizedOp]
) -> str:
    source = (
        "the hardware's rate"
        if hardware.flops_per_s is not None
        else "syncpass's default: the hardware gives no FLOP/s"
    )
    inputs = ", ".join("x".join(map(str, shape)) for shape in shapes)
    if unsized:
        named = ", ".join(op.op_id for op in unsized[:5]) + (", ..." if len(unsized) > 5 else "")
        sizing = (
            f"{len(unsized)} op(s) unsized ({named}): they got the median compute of the "
            "others and their input's shape"
        )
    else:
        sizing = "0 ops unsized"
    return (
        f"static estimate from source, not measured: FLOP counts at {rate:.3g} FLOP/s "
        f"({source}), inputs {inputs}; {sizing}"
    )


def _bind_inputs(
    interp: _Interpreter,
    model: _Instance,
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
    frame["__class__"] = _ClassRef(model.classdef)
    for name, shape, kind in zip(bound, shapes, kinds, strict=True):
        frame[name] = _Tensor(tuple(shape), kind)
    if isinstance(star, cst.Param):  # forward(self, *inputs): the rest, as floats
        frame[star.name.value] = tuple(_Tensor(tuple(shape)) for shape in shapes[len(bound) :])
    for param in params[len(shapes) :]:
        assert param.default is not None
        try:
            frame[param.name.value] = interp.eval(param.default, {})
        except _Unsized as error:
            frame[param.name.value] = _Opaque(error.reason)
    for param in forward.params.kwonly_params:
        if param.default is None:
            frame[param.name.value] = _Opaque(f"the keyword input {param.name.value!r}")
            continue
        try:
            frame[param.name.value] = interp.eval(param.default, {})
        except _Unsized as error:
            frame[param.name.value] = _Opaque(error.reason)
    return frame


def _attributed_parameters(model: _Instance, graph: OpGraph, dtype_bytes: int) -> list[float]:
    """Bytes of the parameters of the submodules each op calls, each once at its first use
    (what :func:`syncpass.backends.torch.measure.parameter_bytes` measures)."""
    seen: set[int] = set()
    result = []
    for op in graph.ops:
        total = 0
        for call in op.calls:
            if not call.startswith("self."):
                continue
            target = _resolve_path(model, call.removeprefix("self."))
            if not isinstance(target, (*_MODULES, _Tensor)):
                continue
            found: dict[int, int] = {}
            _parameters(target, found)
            for identity, count in found.items():
                if identity not in seen:
                    seen.add(identity)
                    total += count
        result.append(float(total * dtype_bytes))
    return result

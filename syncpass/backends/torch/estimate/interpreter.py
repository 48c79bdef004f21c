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
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from syncpass.backends.torch.estimate.containers import (
    CONTAINERS,
    call_container_method,
    construct_container,
    index_container,
)
from syncpass.backends.torch.estimate.flops import (
    Counter,
)
from syncpass.backends.torch.estimate.layers import (
    LAYERS,
    apply_layer,
    construct_layer,
    layer_parameters,
    layer_weight,
)
from syncpass.backends.torch.estimate.tensors import (
    apply_operator,
    apply_unary,
    call_tensor_function,
    compare_tensors,
    index_tensor,
    tensor_attribute,
)
from syncpass.backends.torch.estimate.values import (
    MODULES,
    Break,
    ClassRef,
    Container,
    Continue,
    Function,
    Instance,
    Layer,
    Library,
    Method,
    Opaque,
    Return,
    Super,
    Tensor,
    Unsized,
    argument,
    as_int,
    as_number,
    as_tensor,
    describe,
    numel,
    unfollowed_method,
)
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
from syncpass.rewrite.driver import strip_sync_points

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


#: Errors of plain Python evaluation on values of the user's code: they make a statement
#: unsized, never fail the estimate.
_PYTHON_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)
#: Longest loop or list the interpreter builds, and largest exponent it computes.
_MAX_ITEMS = 100_000


#: Methods of a module that register an attribute: the keyword of the value.
_REGISTERS = {"register_buffer": "tensor", "register_parameter": "param", "add_module": "module"}
_INSTANCE_METHODS = frozenset({*_REGISTERS, "parameters", "modules", "children"})


# --- the interpreter ----------------------------------------------------------------------


class Interpreter:
    """Runs a file's constructors and forwards on abstract values (see the module docstring)."""

    def __init__(self, module: cst.Module, path: str, training: bool, dtype_bytes: int) -> None:
        self.module = module
        self.path = path
        self.training = training
        self.dtype_bytes = dtype_bytes
        self.imports = ImportAliases.of(module, set())
        self.counter = Counter()
        self.depth = 0
        self._positions: Mapping[cst.CSTNode, CodeRange] | None = None
        self.globals: dict[str, object] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        for statement in module.body:
            if isinstance(statement, cst.ClassDef):
                self.classes[statement.name.value] = statement
                self.globals[statement.name.value] = ClassRef(statement)
            elif isinstance(statement, cst.FunctionDef):
                self.globals[statement.name.value] = Function(statement)
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
        except Unsized as error:
            value = Opaque(error.reason)
        except _PYTHON_ERRORS as error:
            value = Opaque(f"{type(error).__name__}: {error}")
        for target in targets:
            try:
                self.assign(target, value, self.globals)
            except Unsized:
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
                raise Unsized(
                    f"is a statement syncpass could not follow ({type(error).__name__}: {error})"
                ) from None
        except Unsized as error:
            if not nested or error.located:
                raise
            line = self.line(statement)
            where = f" ({self.path}:{line})" if line is not None else ""
            raise Unsized(error.reason + where, located=True) from None

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
            raise Return(None if statement.value is None else self.eval(statement.value, frame))
        elif isinstance(statement, cst.Break):
            raise Break()
        elif isinstance(statement, cst.Continue):
            raise Continue()
        elif isinstance(statement, cst.Raise):
            raise Unsized("raises an exception")
        elif isinstance(statement, cst.If):
            self._run_if(statement, frame, nested)
        elif isinstance(statement, cst.For):
            self._run_for(statement, frame, nested)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                self.eval(item.item, frame)
                if item.asname is not None:
                    self.assign(item.asname.name, Opaque("a context manager"), frame)
            self.run_block(statement.body, frame, nested)
        elif isinstance(statement, cst.Try):
            self.run_block(statement.body, frame, nested)
        elif isinstance(statement, cst.FunctionDef):
            frame[statement.name.value] = Function(statement)
        elif isinstance(statement, cst.While):
            raise Unsized("a while loop, whose trip count the source does not give")
        elif isinstance(
            statement,
            (cst.Pass, cst.Assert, cst.Del, cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal),
        ):
            return
        else:
            raise Unsized(f"a {type(statement).__name__} statement syncpass cannot follow")

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
            except Break:
                return
            except Continue:
                continue
        if statement.orelse is not None:
            self.run_block(statement.orelse.body, frame, nested)

    def truth(self, value: object, node: cst.BaseExpression) -> bool:
        if value is None or isinstance(value, (bool, int, float, str, tuple, list, range)):
            return bool(value)
        if isinstance(value, MODULES):
            return True
        if isinstance(value, Tensor):
            raise Unsized(f"branches on a tensor's value ({self.code(node)})")
        if isinstance(value, Opaque):
            raise Unsized(f"branches on an unknown value ({self.code(node)}: {value.reason})")
        return True

    def iterate(self, value: object, node: cst.CSTNode) -> list[object]:
        if isinstance(value, (list, tuple, range, str)) and len(value) > _MAX_ITEMS:
            raise Unsized(f"loops over {len(value)} items, more than syncpass follows")
        if isinstance(value, (list, tuple, range, str)):
            return list(value)
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, Container):
            return list(value.keys) if value.keys is not None else list(value.children)
        if isinstance(value, Tensor) and value.shape:
            return [Tensor(value.shape[1:], value.kind) for _ in range(value.shape[0])]
        if isinstance(value, Opaque):
            raise Unsized(f"loops over an unknown value ({self.code(node)}: {value.reason})")
        raise Unsized(f"loops over {describe(value)}, whose items syncpass does not know")

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
                    raise Unsized(f"unpacks {len(items)} values into {len(elements)} names")
                groups: list[object] = [
                    *items[:star],
                    list(items[star : len(items) - after]),
                    *items[len(items) - after :],
                ]
            else:
                if len(items) != len(elements):
                    raise Unsized(f"unpacks {len(items)} values into {len(elements)} names")
                groups = items
            for element, item in zip(elements, groups, strict=True):
                self.assign(element.value, item, frame)
        elif isinstance(target, cst.Attribute):
            owner = self.eval(target.value, frame)
            if isinstance(owner, Instance):
                owner.attrs[target.attr.value] = value
        elif isinstance(target, cst.Subscript):
            owner = self.eval(target.value, frame)
            if isinstance(owner, list) and len(target.slice) == 1:
                part = target.slice[0].slice
                if isinstance(part, cst.Index):
                    owner[as_int(self.eval(part.value, frame), "an index")] = value
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
            return value if isinstance(value, str) else Opaque("a bytes literal")
        if isinstance(node, (cst.ConcatenatedString, cst.FormattedString)):
            return Opaque("a formatted string")
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
                    raise Unsized("a dict with ** unpacking")
                result[self.hashable(self.eval(item.key, frame))] = self.eval(item.value, frame)
            return result
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
            return self.comprehension(node, frame)
        if isinstance(node, cst.Subscript):
            return self.subscript(node, frame)
        if isinstance(node, cst.Lambda):
            return Opaque("a lambda")
        return Opaque(f"{type(node).__name__} expression")

    def hashable(self, value: object) -> object:
        try:
            hash(value)
        except TypeError:
            raise Unsized("uses an unhashable dictionary key") from None
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
            return Library(qualified)
        raise Unsized(f"reads {name!r}, which syncpass cannot resolve")

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
                        as_int(bound, "a slice bound")
                parts.append(slice(*bounds))
        index: object = parts[0] if len(parts) == 1 else tuple(parts)
        return self.index(value, index, node)

    def index(self, value: object, index: object, node: cst.CSTNode) -> object:
        if isinstance(value, Tensor):
            return index_tensor(value, index)
        if isinstance(value, Container):
            return index_container(value, index)
        if isinstance(value, (list, tuple, str, range, dict)):
            try:
                return value[index]  # type: ignore[call-overload,index]
            except (IndexError, KeyError, TypeError) as error:
                raise Unsized(f"cannot index {describe(value)} by {index!r}: {error}") from None
        if isinstance(value, Opaque):
            raise Unsized(value.reason)
        raise Unsized(f"indexes {describe(value)} ({self.code(node)})")

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
            if isinstance(side, Opaque):
                raise Unsized(side.reason)
        if isinstance(left, Tensor) or isinstance(right, Tensor):
            return apply_operator(name, left, right, self.counter)
        python = self._PYTHON_OPERATORS.get(name)
        if _too_large(name, left, right):
            raise Unsized(f"computes {name} with an operand above {_MAX_ITEMS}")
        if python is None:
            raise Unsized(f"applies {name} to {describe(left)} and {describe(right)}")
        try:
            return python(left, right)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as error:
            raise Unsized(
                f"cannot compute {describe(left)} {name} {describe(right)}: {error}"
            ) from None

    def unary(self, node: cst.UnaryOperation, value: object) -> object:
        if isinstance(value, Opaque):
            raise Unsized(value.reason)
        if isinstance(node.operator, cst.Not):
            return not self.truth(value, node.expression)
        if isinstance(value, Tensor):
            return apply_unary(value, self.counter)
        if isinstance(value, (int, float)):
            if isinstance(node.operator, cst.Minus):
                return -value
            if isinstance(node.operator, cst.Plus):
                return +value
            if isinstance(node.operator, cst.BitInvert) and isinstance(value, int):
                return ~value
        raise Unsized(f"applies a unary operator to {describe(value)}")

    def compare(self, node: cst.Comparison, frame: dict[str, object]) -> object:
        left = self.eval(node.left, frame)
        result: object = True
        for target in node.comparisons:
            right = self.eval(target.comparator, frame)
            op = target.operator
            if isinstance(op, (cst.Is, cst.IsNot)):
                if isinstance(left, Opaque) or isinstance(right, Opaque):
                    # An unknown value is not None: it stands for something that exists.
                    same = left is right
                else:
                    same = left is right or (left is None and right is None)
                outcome: object = same if isinstance(op, cst.Is) else not same
            elif isinstance(left, Tensor) or isinstance(right, Tensor):
                outcome = compare_tensors(left, right, self.counter)
            else:
                for side in (left, right):
                    if isinstance(side, Opaque):
                        raise Unsized(side.reason)
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
                    raise Unsized(f"a comparison syncpass cannot evaluate ({self.code(node)})")
                try:
                    outcome = compare(left, right)
                except TypeError as error:
                    raise Unsized(f"cannot compare ({self.code(node)}): {error}") from None
            if len(node.comparisons) == 1:
                return outcome
            if not self.truth(outcome, node):
                return False
            left = right
            result = outcome
        return result

    # --- attributes ------------------------------------------------------------------------------

    def attribute(self, value: object, name: str, node: cst.CSTNode) -> object:
        if isinstance(value, Library):
            return Library(f"{value.name}.{name}")
        if isinstance(value, Instance):
            if name in value.attrs:
                return value.attrs[name]
            if name == "training":
                return self.training
            found = self.find_method(value.classdef, name)
            if found is not None:
                return Function(found[0], value, found[1])
            if name in _INSTANCE_METHODS:
                return Method(value, name)
            raise Unsized(f"{value.text} has no attribute {name!r} that syncpass could resolve")
        if isinstance(value, Tensor):
            return tensor_attribute(value, name)
        if isinstance(value, Layer):
            if name in value.args:
                return value.args[name]
            if name == "training":
                return self.training
            if name in ("weight", "bias"):
                return layer_weight(value, name)
            return Method(value, name)
        if isinstance(value, Super):
            return self._super_attribute(value, name)
        if isinstance(value, Opaque):
            return value
        if isinstance(value, Container) and value.keys is not None and name in value.keys:
            return value.children[value.keys.index(name)]
        if isinstance(value, (Container, list, dict)):
            return Method(value, name)
        raise Unsized(f"reads .{name} of {describe(value)} ({self.code(node)})")

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

    def _super_attribute(self, value: Super, name: str) -> object:
        for base in self.user_bases(value.cls):
            found = self.find_method(base, name)
            if found is not None:
                return Function(found[0], value.instance, found[1])
        if name == "__init__":
            return Library("syncpass.noop")
        raise Unsized(f"super().{name} is not in the file")

    # --- calls -------------------------------------------------------------------------------------

    def eval_call(self, node: cst.Call, frame: dict[str, object]) -> object:
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "super"
            and "super" not in frame
            and not node.args
        ):
            owner, cls = frame.get("__self__"), frame.get("__class__")
            if isinstance(owner, Instance) and isinstance(cls, ClassRef):
                return Super(owner, cls.node)
            raise Unsized("super() outside a method")
        function = self.eval(node.func, frame)
        args: list[object] = []
        kwargs: dict[str, object] = {}
        for arg in node.args:
            value = self.eval(arg.value, frame)
            if arg.star == "*":
                args.extend(self.iterate(value, arg))
            elif arg.star == "**":
                if not isinstance(value, dict):
                    raise Unsized(f"unpacks {describe(value)} as keywords")
                kwargs.update({str(key): item for key, item in value.items()})
            elif arg.keyword is not None:
                kwargs[arg.keyword.value] = value
            else:
                args.append(value)
        return self.call(function, args, kwargs, node)

    def call(
        self, function: object, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        if isinstance(function, Library):
            return self.call_library(function.name, args, kwargs, node)
        if isinstance(function, ClassRef):
            return self.instantiate(function.node, args, kwargs, self.code(node))
        if isinstance(function, Function):
            return self.run_function(function, args, kwargs)
        if isinstance(function, MODULES):
            return self.call_module(function, args, kwargs, self.code(node.func))
        if isinstance(function, Method):
            return self.call_method(function, args, kwargs, node)
        if isinstance(function, Opaque):
            raise Unsized(f"{self.code(node.func)} is unknown: {function.reason}")
        raise Unsized(f"calls {describe(function)}, which is not callable")

    def run_function(
        self, function: Function, args: list[object], kwargs: dict[str, object]
    ) -> object:
        if self.depth >= _RECURSION_LIMIT:
            raise Unsized("calls nest deeper than syncpass follows")
        frame: dict[str, object] = {}
        if function.owner is not None:
            args = [function.owner, *args]
            frame["__self__"] = function.owner
            if function.cls is not None:
                frame["__class__"] = ClassRef(function.cls)
        self.bind_parameters(function.node, args, kwargs, frame)
        self.depth += 1
        try:
            self.run_block(function.node.body, frame, nested=True)
        except Return as result:
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
                frame[key] = Opaque(f"{name}() was called without its argument {key!r}")
        extra = args[len(positional) :]
        if isinstance(params.star_arg, cst.Param):
            frame[params.star_arg.name.value] = tuple(extra)
        elif extra:
            raise Unsized(f"{name}() gets {len(extra)} more positional argument(s) than it takes")
        for param in params.kwonly_params:
            key = param.name.value
            if key in kwargs:
                frame[key] = kwargs.pop(key)
            elif param.default is not None:
                frame[key] = self.eval(param.default, {})
            else:
                frame[key] = Opaque(f"{name}() was called without its argument {key!r}")
        if params.star_kwarg is not None:
            frame[params.star_kwarg.name.value] = dict(kwargs)

    def instantiate(
        self, classdef: cst.ClassDef, args: list[object], kwargs: dict[str, object], text: str
    ) -> Instance:
        instance = Instance(classdef, self.class_attributes(classdef), text)
        found = self.find_method(classdef, "__init__")
        if found is None and _is_dataclass(classdef):
            fields = list(instance.attrs)
            if len(args) > len(fields):
                raise Unsized(f"{text} gets more arguments than {classdef.name.value} has fields")
            instance.attrs.update(zip(fields, args, strict=False))
            instance.attrs.update({key: value for key, value in kwargs.items() if key in fields})
        elif found is not None:
            init, owner = found
            frame: dict[str, object] = {"__self__": instance, "__class__": ClassRef(owner)}
            self.bind_parameters(init, [instance, *args], dict(kwargs), frame)
            self.depth += 1
            try:
                self.run_constructor(init.body, frame)
            except Return:
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
                        attrs[small.target.value] = Opaque(
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
                except (Unsized, *_PYTHON_ERRORS):
                    value = Opaque(f"the class attribute {self.code(value_node)}")
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
                    if isinstance(condition, (Opaque, Tensor)):
                        continue  # unknown branch: neither side is built
                    if self.truth(condition, statement.test):
                        self.run_constructor(statement.body, frame)
                    elif isinstance(statement.orelse, cst.Else):
                        self.run_constructor(statement.orelse.body, frame)
                    elif isinstance(statement.orelse, cst.If):
                        self.run_constructor(cst.IndentedBlock(body=[statement.orelse]), frame)
                    continue
                self.run_statement(statement, frame, nested=False)
            except Unsized as error:
                reason = error.reason
                line = self.line(statement)
                if not error.located and line is not None:
                    reason = f"{reason} ({self.path}:{line})"
                for target in _assigned_targets(statement):
                    try:
                        self.assign(target, Opaque(reason), frame)
                    except Unsized:
                        continue

    def call_module(
        self, module: object, args: list[object], kwargs: dict[str, object], callee: str
    ) -> object:
        """Run a module's forward; an unsized reason inside names the module."""
        if isinstance(module, Layer):
            return apply_layer(module, args, kwargs, self.counter)
        if isinstance(module, Container):
            if module.kind != "Sequential":
                raise Unsized(f"calls {callee}, an nn.{module.kind}, which has no forward")
            value: object = args[0] if len(args) == 1 and not kwargs else None
            if value is None:
                raise Unsized(f"calls the nn.Sequential {callee} with more than one input")
            for position, child in enumerate(module.children):
                try:
                    value = self.call_module(child, [value], {}, f"{callee}[{position}]")
                except Unsized as error:
                    raise Unsized(error.reason, error.located) from None
            return value
        assert isinstance(module, Instance)
        found = self.find_method(module.classdef, "forward")
        if found is None:
            raise Unsized(f"{callee} is {module.text}, which has no forward")
        try:
            return self.run_function(Function(found[0], module, found[1]), args, dict(kwargs))
        except Unsized as error:
            raise Unsized(f"{callee} is {module.text}, whose forward {error.reason}") from None

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
            if short in LAYERS:
                return construct_layer(short, args, kwargs, self.code(node))
            if short in CONTAINERS:
                text = self.code(node)
                return construct_container(short, args, kwargs, text, self.iterate, node)
            if short == "Parameter":
                return Tensor(
                    as_tensor(args[0] if args else None, "nn.Parameter").shape, parameter=True
                )
            if ".init." in name:
                return None
            if short[:1].isupper():
                raise Unsized(f"nn.{short} is a layer syncpass cannot size")
        if name.startswith("torch.") or name.startswith("einops"):
            return call_tensor_function(short, args, kwargs, name, self.counter)
        raise Unsized(f"calls {name}, which syncpass cannot size")

    def call_builtin(
        self, short: str, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        if short in ("isinstance", "hasattr", "callable", "print", "getattr", "setattr"):
            if short == "print":
                return None
            if short == "getattr" and len(args) >= 2 and isinstance(args[1], str):
                return self.attribute(args[0], args[1], node)
            raise Unsized(f"calls {short}(), which syncpass does not evaluate")
        if short == "len":
            value = args[0] if args else None
            if isinstance(value, Tensor) and value.shape:
                return value.shape[0]
            if isinstance(value, Container):
                return len(value.children)
            if isinstance(value, (list, tuple, str, dict, range)):
                return len(value)
            raise Unsized(f"takes len() of {describe(value)}")
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
                start = as_int(args[1] if len(args) > 1 else kwargs.get("start", 0), "start")
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
                raise Unsized(f"dict() fails here: {error}") from None
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
            raise Unsized(f"calls {short}(), which syncpass does not evaluate")
        for value in (*args, *kwargs.values()):
            if isinstance(value, Opaque):
                raise Unsized(value.reason)
            if not _is_plain(value):
                raise Unsized(f"calls {short}() on {describe(value)}")
        try:
            return function(*args, **kwargs)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError) as error:
            raise Unsized(f"{short}() fails here: {error}") from None

    def call_method(
        self, method: Method, args: list[object], kwargs: dict[str, object], node: cst.Call
    ) -> object:
        target, name = method.target, method.name
        if isinstance(target, Tensor):
            qualified = f"Tensor.{name}"
            return call_tensor_function(name, [target, *args], kwargs, qualified, self.counter)
        if isinstance(target, Instance) and name in _REGISTERS:
            key = argument(args, kwargs, 0, "name", None)
            value = argument(args, kwargs, 1, _REGISTERS[name], None)
            if not isinstance(key, str):
                raise Unsized(f"{name}() with a name syncpass does not know")
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
                target.insert(as_int(args[0], "an index"), args[1])
                return None
            if name == "pop":
                return target.pop(*[as_int(arg, "an index") for arg in args])
        if isinstance(target, dict):
            if name in ("items", "keys", "values"):
                return list(getattr(target, name)())
            if name == "get":
                return target.get(self.hashable(args[0]), args[1] if len(args) > 1 else None)
        if isinstance(target, Container):
            return call_container_method(target, name, args, self.iterate, node)
        raise unfollowed_method(target, name)


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


def _is_plain(value: object) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_plain(item) for item in value)
    return value is None or isinstance(value, (int, float, str, range, dict))


def _call_math(short: str, args: list[object]) -> object:
    function = getattr(math, short, None)
    if short in ("pi", "e", "inf") or not callable(function):
        raise Unsized(f"uses math.{short}, which syncpass does not evaluate")
    try:
        return function(*[as_number(arg) for arg in args])
    except (TypeError, ValueError, OverflowError) as error:
        raise Unsized(f"math.{short}() fails here: {error}") from None


# --- the estimate -------------------------------------------------------------------------------


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


def _parameters(value: object, found: dict[int, int], seen: set[int] | None = None) -> None:
    """Parameter counts of ``value`` and everything it holds, by identity (shared once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, Layer):
        try:
            found[id(value)] = layer_parameters(value)
        except Unsized:
            found[id(value)] = 0
    elif isinstance(value, Tensor) and value.parameter:
        found[id(value)] = numel(value.shape)
    elif isinstance(value, Container):
        for child in value.children:
            _parameters(child, found, seen)
    elif isinstance(value, Instance):
        for attr in value.attrs.values():
            _parameters(attr, found, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _parameters(item, found, seen)


def _value_tensors(value: object, seen: set[int]) -> Iterator[Tensor]:
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
    forward_flops: float = 0.0
    backward_flops: float = 0.0
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
    ) -> None:
        self.interp = interp
        self.model = model
        self.graph = graph
        self.forward = forward
        self.frame = frame
        self.last_activation: Tensor | None = None
        self.finished = False

    def bytes_of(self, names: Sequence[str]) -> float:
        seen: set[int] = set()
        total = 0
        for name in names:
            for tensor in _value_tensors(self.frame.get(name), seen):
                size = {"float": self.interp.dtype_bytes, "int": INT_BYTES, "bool": 1}[tensor.kind]
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
        return OpFigures(interp.counter.forward, interp.counter.backward)

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
    interp = Interpreter(module, path, training, dtype_bytes)
    model = interp.instantiate(model_def.classdef, [], {}, f"{name}()")

    sizes: dict[str, int] = {}
    for container in loop_containers(module, name, path):
        value = resolve_path(model, container)
        if isinstance(value, Container):
            sizes[container] = len(value.children)
    expand: dict[str, int] = {}
    if depth >= 2:
        for container in find_sequential_calls(module, name, path):
            value = resolve_path(model, container)
            if isinstance(value, Container) and value.kind == "Sequential":
                expand[container] = len(value.children)
    graph = analyse_model(module, path, name, sizes, text, expand)

    frame = bind_inputs(interp, model, model_def.forward, graph, input_shapes, input_dtypes)
    figures = ForwardRun(interp, model, graph, model_def.forward, frame).run()
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
    for name, shape, kind in zip(bound, shapes, kinds, strict=True):
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


def _attributed_parameters(model: Instance, graph: OpGraph, dtype_bytes: int) -> list[float]:
    """Bytes of the parameters of the submodules each op calls, each once at its first use
    (what :func:`syncpass.backends.torch.measure.parameter_bytes` measures)."""
    seen: set[int] = set()
    result = []
    for op in graph.ops:
        total = 0
        for call in op.calls:
            if not call.startswith("self."):
                continue
            target = resolve_path(model, call.removeprefix("self."))
            if not isinstance(target, (*MODULES, Tensor)):
                continue
            found: dict[int, int] = {}
            _parameters(target, found)
            for identity, count in found.items():
                if identity not in seen:
                    seen.add(identity)
                    total += count
        result.append(float(total * dtype_bytes))
    return result

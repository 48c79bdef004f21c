"""A small Python evaluator over a model file's source, on abstract values.

:class:`Interpreter` runs the file's constructors and forwards: statements,
expressions, calls of the file's own functions and classes, Python's builtins
and ``math``. It knows torch only through the tables it dispatches to: layers
(:mod:`.layers`), containers (:mod:`.containers`) and tensor functions
(:mod:`.tensors`). What it cannot follow raises
:class:`~syncpass.backends.torch.estimate.values.Unsized` with the reason.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from syncpass.backends.torch.estimate.containers import (
    CONTAINERS,
    call_container_method,
    construct_container,
    index_container,
)
from syncpass.backends.torch.estimate.flops import Counter
from syncpass.backends.torch.estimate.layers import (
    LAYERS,
    apply_layer,
    construct_layer,
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
    unfollowed_method,
)
from syncpass.frontend.analysis import ImportAliases

#: Deepest nesting of calls the interpreter follows.
_RECURSION_LIMIT = 40
#: Errors of plain Python evaluation on values of the user's code: they make a statement
#: unsized, never fail the estimate.
_PYTHON_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, RecursionError)
#: Longest loop or list the interpreter builds, and largest exponent it computes.
_MAX_ITEMS = 100_000
#: Most expressions one unit of work evaluates (a module constant, the model's
#: construction, one op of the forward): past it, that unit is unsized, so a few lines of
#: constants (``fib(35)``, nested comprehensions) cannot run for minutes.
MAX_STEPS = 1_000_000
#: Methods of a module that register an attribute: the keyword of the value.
_REGISTERS = {"register_buffer": "tensor", "register_parameter": "param", "add_module": "module"}
_INSTANCE_METHODS = frozenset({*_REGISTERS, "parameters", "modules", "children"})


class Interpreter:
    """Runs a file's constructors and forwards on abstract values (see the module docstring)."""

    def __init__(self, module: cst.Module, path: str, training: bool) -> None:
        self.module = module
        self.path = path
        self.training = training
        self.imports = ImportAliases.of(module, set())
        self.counter = Counter()
        self.depth = 0
        self.steps = 0  # expressions evaluated in this unit of work (see MAX_STEPS)
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
        self.steps = 0
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
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Unsized(f"takes more than {MAX_STEPS:,} steps to follow")
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
                frame[key] = self._default(param.default)
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
                frame[key] = self._default(param.default)
            else:
                frame[key] = Opaque(f"{name}() was called without its argument {key!r}")
        if params.star_kwarg is not None:
            frame[params.star_kwarg.name.value] = dict(kwargs)

    def _default(self, default: cst.BaseExpression) -> object:
        """A parameter's default, or an unknown value when it cannot be evaluated
        (``functools.partial(nn.GELU, ...)``, an enum member): unsized only where used."""
        try:
            return self.eval(default, {})
        except Unsized as error:
            return Opaque(error.reason)

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
    if name == "Power" and isinstance(left, int) and isinstance(right, int):
        return big or abs(left).bit_length() * right > 64 * _MAX_ITEMS  # the result's bits
    if name in ("Power", "LeftShift"):
        return big
    if name != "Multiply":
        return False
    for sequence, times in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(times, int):
            return big or len(sequence) * times > _MAX_ITEMS
    return False


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

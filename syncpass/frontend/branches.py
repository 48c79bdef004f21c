"""Branches decided before the run: an ``if`` of the forward whose test is known is planned
as the branch it takes.

timm's ``VisionTransformer.forward_features`` chooses how to run its blocks::

    if attn_mask is not None or is_causal:
        for blk in self.blocks:
            x = blk(x, attn_mask=attn_mask, is_causal=is_causal)
    elif self.grad_checkpointing and not torch.jit.is_scripting():
        x = checkpoint_seq(self.blocks, x)
    else:
        x = self.blocks(x)

Planned as written, the ``if`` is one region, and no stage can end inside the
blocks. Inlined into ``forward`` (:mod:`syncpass.frontend.inline`), the method's
``attn_mask`` and ``is_causal`` are its defaults, and the test is known: the
eager stages plan (and run) the branch it takes, ``x = self.blocks(x)``. A test
is decided when it reads only

* names the forward assigns once, to a constant, before the ``if`` (an inlined
  method's defaults: ``attn_mask = None``), none of them a forward parameter;
* the forward's parameters with a constant default that it never assigns
  (timm's ``forward(self, x, attn_mask=None, is_causal=False)``): the stages
  are run with the example's positional inputs only, so each such parameter
  the example does not reach has its default (:class:`AssumedDefault`; the
  profile checks that the example does not pass it);
* the forward's parameters the example passes: the profile records what each
  positional input is (``input:K`` in the model's settings, ``null`` for
  ``None``, else its type's name), and a parameter given anything but ``None``
  is :data:`PASSED`: ``is None`` is false and ``is not None`` true, whatever
  it holds, and nothing else about it is known (Hugging Face's BERT: ``if
  input_ids is not None and inputs_embeds is not None: raise ... elif
  input_ids is not None: ...`` takes the ``elif`` when the example passes
  ``input_ids``);
* ``self.NAME`` where ``__init__`` assigns it once, to a constant
  (``self.grad_checkpointing = False``), and the forward never does: the
  value is assumed (:class:`AssumedAttribute`) and the profile checks it on the
  built model, since another method may change it
  (``set_grad_checkpointing()``);
* ``torch.jit.is_scripting()``, ``torch.jit.is_tracing()``,
  ``torch.compiler.is_compiling()`` and ``torch._dynamo.is_compiling()``, which are
  false: the stages run eagerly;
* a setting of a configuration object the model holds, ``self.config.NAME`` (or
  ``self.transformer.config.NAME`` in a submodule's inlined forward): the value
  the built model has (:data:`ValueLookup`). The profile reads it off the model it
  builds and records it in the cost file (``model_settings``), so that planning
  and rewriting decide the same branches; where no model was built (``--static``)
  such a test stays undecided;
* any other attribute of the built model, ``self.NAME`` or ``self.a.b``, read off
  it as the example built it and recorded with the settings, unless the forward
  assigns it or the path reads ``training`` (which ``train()``/``eval()`` change):
  a number, string, bool or ``None`` is known; another object (a submodule, a
  callable) only as not ``None``, like what the example passes; a tensor not at all
  (x-transformers' ``self.looped = looped`` and ``if exists(self.rotary_pos_emb):``);
* a call of a function of the model's file whose body is one ``return EXPR``
  (``def exists(val): return val is not None``), with plain parameters: ``EXPR``
  with the arguments bound;
* literals, combined with ``not``, ``and``, ``or``, ``is``, ``is not``, ``==``,
  ``!=``, ``<``, ``<=``, ``>``, ``>=`` (numbers), ``|``, ``&`` (booleans, whole
  numbers), ``+``, ``-``, ``*`` (numbers) and ``A if T else B``.

A name is known from a statement ``name = value`` whose value is known (``a, b = x,
y`` and ``name |= value`` too), until another statement binds it: ``flag = None``,
and Hugging Face's ``return_dict = return_dict if return_dict is not None else
self.config.return_dict``, where the
parameter keeps its default (``None``) up to that statement, its only assignment,
so the name is the config's setting from then on.

The branch taken replaces the ``if`` (its statements verbatim, comments kept);
an ``if`` none of whose branches is taken goes. A branch taken that ends with a
``return`` (and jumps nowhere else) ends the function there: the statements after
the ``if`` never run, and go too (Hugging Face's ``if not return_dict: return
tuple(...)`` with ``return_dict=False``). An ``if`` whose test reads anything
else, or whose branch taken holds any other ``return``, ``yield``, ``break`` or
``continue``, stays as written (a region).

Nothing here imports torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncpass.frontend.analysis import method_of, self_path
from syncpass.frontend.numbers import (
    GatherBindingsVisitor,
    dotted_name,
    self_attribute,
)

#: A constant a test may read: what ``ast.literal_eval`` gives for a literal.
Constant = bool | int | float | str | None

#: Calls that are false whenever the stages run (eagerly, not scripted, traced or compiled).
EAGER_FALSE = frozenset(
    {
        "torch.jit.is_scripting",
        "torch.jit.is_tracing",
        "torch.compiler.is_compiling",
        "torch._dynamo.is_compiling",
    }
)

#: What :func:`constant_value` gives for anything but a literal.
UNKNOWN = object()


class Passed:
    """What the example passes for a parameter, when that is not ``None`` (a tensor): only
    ``is None`` and ``is not None`` are known of it. :data:`PASSED` is the one instance."""

    def __repr__(self) -> str:
        return "<passed>"


#: A parameter the example gives something other than ``None`` (:class:`Passed`).
PASSED = Passed()

#: What a decided test may have read: a :data:`Constant`, or :data:`PASSED`.
Known = Constant | Passed


def input_key(position: int) -> str:
    """The settings key of the example's positional input ``position`` (``input:0``): a
    key no attribute path can be."""
    return f"input:{position}"


def input_setting(value: object) -> Constant:
    """What the settings record of an example's input: ``None``, or its type's name."""
    return None if value is None else type(value).__name__


#: What the built model holds at a path from ``self`` (``"config.return_dict"``): a
#: :data:`Constant`, or :data:`UNKNOWN`.
ValueLookup = Callable[[str], object]

#: The types a looked-up setting may have to decide a test.
_CONSTANT_TYPES = (bool, int, float, str, type(None))


def no_values(path: str) -> object:
    """The lookup where no model was built: nothing is known."""
    return UNKNOWN


def recorded_values(settings: Sequence[tuple[str, Constant]]) -> ValueLookup:
    """The lookup of settings read off a model before (a cost file's ``model_settings``)."""
    known = dict(settings)

    def lookup(path: str) -> object:
        if path.startswith(_CLASS):
            return known.get(object_key(path.removeprefix(_CLASS)), UNKNOWN)
        if path in known:
            return known[path]
        return PASSED if object_key(path) in known else UNKNOWN

    return lookup


class ObjectValues:
    """The lookup of a built model's settings: ``path``'s value (an attribute chain from the
    model, ``"transformer.config.use_cache"``) when it is a :data:`Constant`, and what the
    example passes (``inputs``, its positional inputs: :func:`input_key`). What it
    answered is kept in :attr:`read`, to be recorded with the model's costs."""

    def __init__(self, model: object, inputs: Sequence[object] = ()) -> None:
        self.model = model
        self.inputs = {input_key(k): input_setting(value) for k, value in enumerate(inputs)}
        self.read: dict[str, Constant] = {}

    def __call__(self, path: str) -> object:
        if path.startswith("input:"):
            if path not in self.inputs:
                return UNKNOWN
            self.read[path] = self.inputs[path]
            return self.inputs[path]
        if path.startswith(_CLASS):
            held = self(path.removeprefix(_CLASS))
            return (
                self.read.get(object_key(path.removeprefix(_CLASS)), UNKNOWN)
                if held is PASSED
                else UNKNOWN
            )
        target = self.model
        for part in path.split("."):
            try:
                target = getattr(target, part)
            except Exception:  # a property that raises is a setting nobody can know
                return UNKNOWN
        if type(target) not in _CONSTANT_TYPES:
            if _is_data(target):
                return UNKNOWN
            # An object (a module, a callable): only that it is not None is known of it.
            self.read[object_key(path)] = type(target).__name__
            return PASSED
        self.read[path] = target  # type: ignore[assignment]
        return target


_CLASS = "class:"


def class_key(path: str) -> str:
    """The lookup key of the name of the class of the object the built model holds at
    ``path`` (a submodule handed to ``__init__``): recorded as :func:`object_key`."""
    return f"{_CLASS}{path}"


def object_key(path: str) -> str:
    """The settings key recording that the model holds an object (not ``None``, not a
    :data:`Constant`) at ``path``: a key no attribute path can be."""
    return f"object:{path}"


def _is_data(value: object) -> bool:
    """Whether ``value`` is data (a tensor or an array): its truth is the data's, and
    whether it is ``None`` may change with what the model is given."""
    kind = type(value)
    return kind.__name__ in ("Tensor", "Parameter", "ndarray", "Array", "ArrayImpl") or any(
        base.__name__ == "Tensor" for base in kind.__mro__
    )


def config_path(node: cst.BaseExpression) -> str | None:
    """``"config.NAME"`` for ``self.config.NAME``, ``"a.b.config.NAME"`` for
    ``self.a.b.config.NAME``: a setting read from a configuration object; else ``None``."""
    parts: list[str] = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not (isinstance(node, cst.Name) and node.value == "self"):
        return None
    if len(parts) < 2 or parts[1] != "config":
        return None
    return ".".join(reversed(parts))


_JUMP = m.Return() | m.Yield() | m.Break() | m.Continue()
_NESTED = m.FunctionDef() | m.Lambda() | m.ClassDef()


@dataclass(frozen=True)
class AssumedAttribute:
    """``self.<name>`` read by a decided test: ``value``, as ``__init__`` sets it."""

    name: str
    value: Constant


@dataclass(frozen=True)
class AssumedDefault:
    """A forward parameter read by a decided test: its default ``value``, or what the
    example passes (``None``, or :data:`PASSED`). ``position`` is its place among the
    positional parameters (0 after ``self``), ``None`` for a keyword-only one."""

    name: str
    value: Known
    position: int | None


@dataclass(frozen=True)
class FoldedBranch:
    """An ``if`` planned as the branch it takes.

    ``line`` is the ``if``'s line in the file (0 when not known), ``test`` its first
    test as written, ``taken`` which branch runs (``"if"``, ``"elif N"`` for the
    N-th ``elif``, ``"else"``, or ``"none"``), ``reads`` the values the tests read
    (``attn_mask=None``); ``assumed`` are the attributes and ``defaults`` the forward's
    parameters among them. ``file`` is the file the ``if`` is in when it is not the
    model's (a method inherited from a base class of another module), as reports show it.
    """

    line: int
    test: str
    taken: str
    reads: tuple[tuple[str, Known], ...]
    assumed: tuple[AssumedAttribute, ...]
    defaults: tuple[AssumedDefault, ...] = ()
    file: str = ""

    def where(self, path: str) -> str:
        """``FILE:LINE`` of the ``if``, ``path`` being the model's file."""
        file = self.file or path
        return f"{file}:{self.line}" if self.line else file

    def describe(self, path: str) -> str:
        where = self.where(path)
        branch = "no branch" if self.taken == "none" else f"the {self.taken} branch"
        values = ", ".join(f"{name}={value!r}" for name, value in self.reads)
        return f"{branch} of `if {self.test}:` at {where} ({values or 'constant tests'})"


def constant_value(node: cst.BaseExpression) -> object:
    """The value of a literal (a number, a string, ``True``, ``False``, ``None``, a negative
    number), else :data:`UNKNOWN`."""
    if isinstance(node, cst.Integer | cst.Float | cst.SimpleString):
        value: object = node.evaluated_value
        return value
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = constant_value(node.expression)
        if isinstance(inner, int | float) and not isinstance(inner, bool):
            return -inner
    return UNKNOWN


_SUPER_INIT = m.Call(
    func=m.Attribute(value=m.Call(func=m.Name("super"), args=[]), attr=m.Name("__init__"))
)


def init_constants(
    classdef: cst.ClassDef, init_method: str = "__init__", bases: Sequence[cst.ClassDef] = ()
) -> dict[str, Constant]:
    """``self.NAME`` that the class's ``__init__`` (or ``init_method``: a Flax module's
    ``setup``) assigns exactly once, to a constant.

    ``bases`` are the classes after it in its method resolution order (read from source:
    :mod:`syncpass.frontend.bases`): the ``__init__`` that runs is the first one defined,
    and the next one's runs too where it calls ``super().__init__(...)``; a name counts
    when those assign it once in all."""
    gathered = GatherBindingsVisitor()
    found_init = False
    for cls in (classdef, *bases):
        init = method_of(cls, init_method)
        if init is None:
            continue
        found_init = True
        init.visit(gathered)
        if init_method != "__init__" or not m.findall(init, _SUPER_INIT):
            break
    if not found_init:
        return {}
    counts = Counter(name for name, _ in gathered.bindings)
    found: dict[str, Constant] = {}
    for name, value in gathered.bindings:
        if not name.startswith("self.") or counts[name] != 1 or value is None:
            continue
        if isinstance(value, cst.BaseExpression):
            constant = constant_value(value)
            if constant is not UNKNOWN:
                found[name.removeprefix("self.")] = constant  # type: ignore[assignment]
    return found


@dataclass(frozen=True)
class KnownName:
    """A name the forward has assigned a known ``value``, and what that value rests on: the
    values its expression read, and the attributes and defaults it assumed."""

    value: Known
    reads: tuple[tuple[str, Known], ...] = ()
    assumed: tuple[tuple[str, Constant], ...] = ()
    defaults: tuple[AssumedDefault, ...] = ()


class _Test:
    """Evaluates a test with what is known; records what it read."""

    def __init__(
        self,
        names: dict[str, KnownName],
        attributes: dict[str, Constant],
        defaults: dict[str, AssumedDefault],
        values: ValueLookup = no_values,
        helpers: Mapping[str, cst.FunctionDef] | None = None,
        rebound: frozenset[str] = frozenset(),
    ) -> None:
        self.names = names
        self.attributes = attributes
        self.defaults = defaults
        self.values = values
        self.helpers = helpers or {}
        self.rebound = rebound
        self.reads: dict[str, Known] = {}
        self.assumed: dict[str, Constant] = {}
        self.assumed_defaults: dict[str, AssumedDefault] = {}

    def name_of(self, value: Known) -> KnownName:
        """A name assigned the expression just evaluated, of ``value``."""
        return KnownName(
            value,
            tuple(self.reads.items()),
            tuple(self.assumed.items()),
            tuple(self.assumed_defaults.values()),
        )

    def value(self, node: cst.BaseExpression) -> object:
        constant = constant_value(node)
        if constant is not UNKNOWN:
            return constant
        if isinstance(node, cst.Name):
            if node.value in self.names:
                known = self.names[node.value]
                self.reads.update((key, read) for key, read in known.reads if key != node.value)
                self.reads[node.value] = known.value
                self.assumed.update(known.assumed)
                self.assumed_defaults.update((d.name, d) for d in known.defaults)
                return known.value
            if node.value in self.defaults:
                default = self.defaults[node.value]
                self.reads[node.value] = default.value
                self.assumed_defaults[node.value] = default
                return default.value
            return UNKNOWN
        path = config_path(node)
        if path is not None:
            setting = self.values(path)
            if setting is UNKNOWN:
                return UNKNOWN
            self.reads[f"self.{path}"] = setting  # type: ignore[assignment]
            return setting
        if isinstance(node, cst.IfExp):
            chosen = self.value(node.test)
            if chosen is UNKNOWN or chosen is PASSED:
                return UNKNOWN
            return self.value(node.body if chosen else node.orelse)
        attribute = self_attribute(node)
        if attribute is not None and attribute in self.attributes:
            self.reads[f"self.{attribute}"] = self.attributes[attribute]
            self.assumed[attribute] = self.attributes[attribute]
            return self.attributes[attribute]
        held = self_path(node)
        if held and self._readable(held):
            found = self.values(held)
            if found is not UNKNOWN:
                self.reads[f"self.{held}"] = found  # type: ignore[assignment]
            return found
        if isinstance(node, cst.Call):
            return self._helper_value(node)
        if isinstance(node, cst.BinaryOperation):
            return self._operation(node)
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            inner = self.value(node.expression)
            return UNKNOWN if inner is UNKNOWN or inner is PASSED else not inner
        if isinstance(node, cst.BooleanOperation):
            left = self.value(node.left)
            if left is UNKNOWN or left is PASSED:  # a tensor's truth is the data's
                return UNKNOWN
            if isinstance(node.operator, cst.And):
                return self.value(node.right) if left else left
            return left if left else self.value(node.right)
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
            target = node.comparisons[0]
            left, right = self.value(node.left), self.value(target.comparator)
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            operator = target.operator
            if left is PASSED or right is PASSED:
                # Only that it is not None is known of what the example passes.
                if isinstance(operator, cst.Is | cst.IsNot) and None in (left, right):
                    return isinstance(operator, cst.IsNot)
                return UNKNOWN
            if isinstance(operator, cst.Is):
                return left is right
            if isinstance(operator, cst.IsNot):
                return left is not right
            if isinstance(operator, cst.Equal):
                return left == right
            if isinstance(operator, cst.NotEqual):
                return left != right
            ordered = (bool, int, float)
            if type(left) in ordered and type(right) in ordered:
                if isinstance(operator, cst.LessThan):
                    return left < right  # type: ignore[operator]
                if isinstance(operator, cst.LessThanEqual):
                    return left <= right  # type: ignore[operator]
                if isinstance(operator, cst.GreaterThan):
                    return left > right  # type: ignore[operator]
                if isinstance(operator, cst.GreaterThanEqual):
                    return left >= right  # type: ignore[operator]
        return UNKNOWN

    def _operation(self, node: cst.BinaryOperation) -> object:
        """``a | b``, ``a & b`` of booleans or whole numbers; ``a + b``, ``a - b``, ``a * b``
        of numbers (a string, a tensor or anything unknown: unknown)."""
        left, right = self.value(node.left), self.value(node.right)
        numbers = (bool, int, float)
        if type(left) not in numbers or type(right) not in numbers:
            return UNKNOWN
        a, b = left, right
        operator = node.operator
        if isinstance(operator, cst.BitOr | cst.BitAnd):
            if isinstance(a, float) or isinstance(b, float):
                return UNKNOWN
            return (a | b) if isinstance(operator, cst.BitOr) else (a & b)  # type: ignore[operator]
        if isinstance(operator, cst.Add):
            return a + b  # type: ignore[operator]
        if isinstance(operator, cst.Subtract):
            return a - b  # type: ignore[operator]
        if isinstance(operator, cst.Multiply):
            return a * b  # type: ignore[operator]
        return UNKNOWN

    def _readable(self, path: str) -> bool:
        """Whether ``self.<path>`` may be read off the built model: not the module's mode
        (``training``, which ``train()``/``eval()`` change), nor an attribute the forward
        itself assigns."""
        parts = path.split(".")
        return "training" not in parts and parts[0] not in self.rebound

    def _helper_value(self, node: cst.Call) -> object:
        """A call known before the run: one of :data:`EAGER_FALSE`, or of a function of the
        model's module whose body is one ``return`` of an expression (``def exists(val):
        return val is not None``), evaluated with its parameters bound to the arguments."""
        if not node.args and dotted_name(node.func) in EAGER_FALSE:
            return False
        if not isinstance(node.func, cst.Name) or node.func.value in self.names:
            return UNKNOWN
        helper = self.helpers.get(node.func.value)
        if helper is None:
            return UNKNOWN
        returned = one_returned_expression(helper)
        bound = _bound_constants(helper, node) if returned is not None else None
        if returned is None or bound is None:
            return UNKNOWN
        given: dict[str, KnownName] = {}
        for name, argument in bound.items():
            value = (
                argument if not isinstance(argument, cst.BaseExpression) else self.value(argument)
            )
            if value is UNKNOWN:
                return UNKNOWN
            given[name] = KnownName(value)  # type: ignore[arg-type]
        # Without the helper itself: a helper that calls itself is not evaluated.
        others = {name: f for name, f in self.helpers.items() if name != node.func.value}
        return _Test(given, {}, {}, helpers=others).value(returned)


def one_returned_expression(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """``EXPR`` of a function whose body is ``return EXPR`` alone (a docstring aside), with
    no decorator; else ``None``."""
    if function.decorators or not isinstance(function.body, cst.IndentedBlock):
        return None
    body = list(function.body.body)
    if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
        body = body[1:]
    if len(body) != 1 or not m.matches(body[0], m.SimpleStatementLine(body=[m.Return()])):
        return None
    statement = body[0]
    assert isinstance(statement, cst.SimpleStatementLine)
    returned = statement.body[0]
    assert isinstance(returned, cst.Return)
    return returned.value


def _bound_constants(
    function: cst.FunctionDef, call: cst.Call
) -> dict[str, cst.BaseExpression | Constant] | None:
    """Each parameter of ``function`` -> the argument ``call`` gives it, or its literal
    default; ``None`` where the call does not bind as plainly (``*args``, ``**kwargs``,
    keyword-only or positional-only parameters)."""
    params = function.params
    if (
        params.posonly_params
        or params.kwonly_params
        or not isinstance(params.star_arg, cst.MaybeSentinel)
        or params.star_kwarg is not None
    ):
        return None
    names = [param.name.value for param in params.params]
    bound: dict[str, cst.BaseExpression | Constant] = {}
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword is not None else None
        if name is None:
            if position >= len(names):
                return None
            name = names[position]
        if name not in names or name in bound:
            return None
        bound[name] = arg.value
    for param in params.params:
        if param.name.value not in bound:
            if param.default is None:
                return None
            default = constant_value(param.default)
            if default is UNKNOWN:
                return None
            bound[param.name.value] = default  # type: ignore[assignment]
    return bound


#: The last module :func:`module_helpers` read, and what it found: a forward's inlined
#: methods fold their branches one after another against the same module.
_LAST_HELPERS: list[tuple[cst.Module, dict[str, cst.FunctionDef]]] = []


def module_helpers(module: cst.Module) -> dict[str, cst.FunctionDef]:
    """The module's top-level functions a test may call (:meth:`_Test._helper_value`): those
    defined once, whose body is one ``return``."""
    if _LAST_HELPERS and _LAST_HELPERS[0][0] is module:
        return _LAST_HELPERS[0][1]
    found = _module_helpers(module)
    _LAST_HELPERS[:] = [(module, found)]
    return found


def _module_helpers(module: cst.Module) -> dict[str, cst.FunctionDef]:
    counts = Counter(
        statement.name.value for statement in module.body if isinstance(statement, cst.FunctionDef)
    )
    return {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, cst.FunctionDef)
        and counts[statement.name.value] == 1
        and one_returned_expression(statement) is not None
    }


def _statements(suite: cst.BaseSuite) -> list[cst.BaseStatement]:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    assert isinstance(suite, cst.SimpleStatementSuite)
    return [cst.SimpleStatementLine(body=suite.body)]


def _jumps(statements: Sequence[cst.BaseStatement]) -> bool:
    """Whether ``statements`` return, yield, break or continue (outside nested functions)."""
    for statement in statements:
        inside = (m.findall(holder, _JUMP) for holder in m.findall(statement, _NESTED))
        nested = {id(node) for nodes in inside for node in nodes}
        if any(id(node) not in nested for node in m.findall(statement, _JUMP)):
            return True
    return False


def _ends_in_return(statements: Sequence[cst.BaseStatement]) -> bool:
    """Whether ``statements`` end with a ``return`` and hold no other jump: a branch after
    which the function they are the top level of runs nothing more (Hugging Face's ``if not
    return_dict: return tuple(...)``)."""
    if not statements:
        return False
    last = statements[-1]
    if not (
        isinstance(last, cst.SimpleStatementLine)
        and isinstance(last.body[-1], cst.Return)
        and not m.findall(last.body[-1], m.Yield())
    ):
        return False
    rest = cst.SimpleStatementLine(body=last.body[:-1]) if len(last.body) > 1 else None
    return not _jumps([*statements[:-1], *([rest] if rest is not None else [])])


def _decide(statement: cst.If, test: _Test) -> tuple[str, list[cst.BaseStatement]] | None:
    """``(taken, statements)`` of the branch ``statement`` takes, or ``None``."""
    branch: cst.If | cst.Else | None = statement
    index = 0
    while isinstance(branch, cst.If):
        value = test.value(branch.test)
        if value is UNKNOWN or value is PASSED:
            return None
        if value:
            taken = "if" if index == 0 else f"elif {index}"
            return taken, _statements(branch.body)
        branch, index = branch.orelse, index + 1
    if branch is None:
        return "none", []
    return "else", _statements(branch.body)


def parameter_defaults(
    forward: cst.FunctionDef, values: ValueLookup = no_values
) -> dict[str, AssumedDefault]:
    """The forward's parameters (``self`` aside) whose value is known before the run: what
    the example passes (``values`` answers its positional inputs, :func:`input_key`), else
    a constant default."""
    params = forward.params
    positional = [*params.posonly_params, *params.params][1:]
    found: dict[str, AssumedDefault] = {}
    for position, param in [
        *enumerate(positional),
        *((None, param) for param in params.kwonly_params),
    ]:
        given = UNKNOWN if position is None else values(input_key(position))
        value: object
        if given is not UNKNOWN:
            value = None if given is None else PASSED
        else:
            value = UNKNOWN if param.default is None else constant_value(param.default)
        if value is not UNKNOWN:
            found[param.name.value] = AssumedDefault(param.name.value, value, position)  # type: ignore[arg-type]
    return found


def _assigned_name(statement: cst.BaseStatement) -> tuple[str, cst.BaseExpression] | None:
    """``(name, value)`` of ``name = value``, a statement of one assignment to one name; of
    ``name |= value`` (x-transformers' ``return_hiddens |= return_gumbel_log_probs``),
    ``name = name | value``."""
    small = (
        statement.body[0]
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        else None
    )
    if (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
    ):
        return small.targets[0].target.value, small.value
    if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
        operator = _AUGMENTED.get(type(small.operator))
        if operator is not None:
            value = cst.BinaryOperation(small.target, operator(), small.value)
            return small.target.value, value
    return None


def _assigned_names(statement: cst.BaseStatement) -> list[tuple[str, cst.BaseExpression]]:
    """What :func:`_assigned_name` finds; for ``a, b = x, y`` (x-transformers' ``b, n,
    ..., has_memory_tokens, ... = x.shape[0], ..., self.num_memory_tokens > 0, ...``),
    each name with its expression."""
    found = _assigned_name(statement)
    if found is not None:
        return [found]
    small = (
        statement.body[0]
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
        else None
    )
    if not (
        isinstance(small, cst.Assign)
        and len(small.targets) == 1
        and isinstance(target := small.targets[0].target, cst.Tuple)
        and isinstance(small.value, cst.Tuple)
        and len(target.elements) == len(small.value.elements)
    ):
        return []
    pairs = []
    for left, right in zip(target.elements, small.value.elements, strict=True):
        if isinstance(left, cst.StarredElement) or isinstance(right, cst.StarredElement):
            return []
        if isinstance(left.value, cst.Name):
            pairs.append((left.value.value, right.value))
    return pairs


#: The augmented assignments a name stays known through, as the operation they run.
_AUGMENTED: dict[type[cst.BaseAugOp], type[cst.BaseBinaryOp]] = {
    cst.BitOrAssign: cst.BitOr,
    cst.BitAndAssign: cst.BitAnd,
    cst.AddAssign: cst.Add,
    cst.SubtractAssign: cst.Subtract,
    cst.MultiplyAssign: cst.Multiply,
}


class _Known:
    """What the statements of a forward make known, statement by statement.

    A parameter holds what the call gave it until a statement binds it: an inlined
    method's, what the call binds (``given``); the forward's, what the example passes
    or else its default, where the settings record the example's inputs (T5's ``if
    encoder_outputs is None: encoder_outputs = self.encoder(...)``). Where they do not
    (a cost file written before they did, no model built), the example may pass any
    parameter, so one is taken for its default only when the forward never assigns it,
    or in the value of its one assignment (``return_dict = return_dict if return_dict
    is not None else self.config.return_dict``). A name bound by ``name = value`` with a
    known value is known until another statement binds it."""

    def __init__(
        self,
        statements: Sequence[cst.BaseStatement],
        attributes: dict[str, Constant],
        forward: cst.FunctionDef,
        given: dict[str, AssumedDefault] | None,
        values: ValueLookup,
        helpers: Mapping[str, cst.FunctionDef] | None = None,
    ) -> None:
        gathered = GatherBindingsVisitor()
        for statement in statements:
            statement.visit(gathered)
        self.counts = Counter(name for name, _ in gathered.bindings)
        assigned = {
            name.removeprefix("self.").partition(".")[0]
            for name in self.counts
            if name.startswith("self.")
        }
        self.rebound = frozenset(assigned)
        self.helpers = helpers
        self.attributes = {
            name: value for name, value in attributes.items() if name not in assigned
        }
        self.parameters = parameter_defaults(forward, values) if given is None else given
        # Whether each parameter's value on entry is known: the example's inputs recorded.
        self.until_bound = given is not None or values(input_key(0)) is not UNKNOWN
        self.defaults = {
            name: default
            for name, default in self.parameters.items()
            if self.until_bound or self.counts[name] == 0
        }
        self.values = values
        self.names: dict[str, KnownName] = {}

    def test(self) -> _Test:
        return self._test(self.defaults)

    def _test(self, defaults: dict[str, AssumedDefault]) -> _Test:
        return _Test(self.names, self.attributes, defaults, self.values, self.helpers, self.rebound)

    def passed(self, statement: cst.BaseStatement) -> None:
        """What is known once ``statement`` has run."""
        found = _assigned_names(statement)
        # Every value is computed before any name is bound, as Python does.
        known: list[tuple[str, object, _Test]] = []
        for name, expression in found:
            defaults = self.defaults
            if name in self.parameters and self.counts[name] == 1:
                defaults = {**defaults, name: self.parameters[name]}
            test = self._test(defaults)
            known.append((name, test.value(expression), test))
        gathered = GatherBindingsVisitor()
        statement.visit(gathered)
        for bound, _ in gathered.bindings:
            self.names.pop(bound, None)
            self.defaults.pop(bound, None)  # no longer what the call gave it
        for name, value, test in known:
            if value is not UNKNOWN:
                test.reads.pop(name, None)  # the value it had before: not what it holds now
                self.names[name] = test.name_of(value)  # type: ignore[arg-type]


def known_names(
    statements: Sequence[cst.BaseStatement],
    forward: cst.FunctionDef,
    given: dict[str, AssumedDefault] | None = None,
    values: ValueLookup = no_values,
    attributes: dict[str, Constant] | None = None,
    helpers: Mapping[str, cst.FunctionDef] | None = None,
) -> dict[str, KnownName]:
    """The names known after ``statements`` (the start of ``forward``'s body), as
    :func:`fold_branches` knows them (:class:`_Known`)."""
    known = _Known(statements, attributes or {}, forward, given, values, helpers)
    for statement in statements:
        known.passed(statement)
    return known.names


def fold_branches(
    statements: Sequence[cst.BaseStatement],
    attributes: dict[str, Constant],
    forward: cst.FunctionDef,
    config: cst.Module,
    line_of: Callable[[cst.CSTNode], int],
    given: dict[str, AssumedDefault] | None = None,
    values: ValueLookup = no_values,
    file_of: Callable[[cst.CSTNode], str] | None = None,
) -> tuple[list[cst.BaseStatement], list[FoldedBranch], list[int]]:
    """``statements`` (the body of ``forward``, expanded) with each top-level ``if`` that is
    decided replaced by the branch it takes, what was folded, and for each statement
    returned the index of the one of ``statements`` it comes from. ``attributes`` are the
    model's :func:`init_constants`; ``config`` the module, for printing tests. ``given``
    replaces the parameters' defaults (:func:`parameter_defaults`): what a call of an
    inlined method binds them to. ``values`` answers the model's settings (``self.config.X``).
    ``file_of`` names the file a statement is in when it is not the model's (``""`` when
    it is): the note on a branch from another file says ``FILE:LINE``."""
    known = _Known(statements, attributes, forward, given, values, module_helpers(config))
    result: list[cst.BaseStatement] = []
    folded: list[FoldedBranch] = []
    sources: list[int] = []
    for index, statement in enumerate(statements):
        if isinstance(statement, cst.If):
            test = known.test()
            decided = _decide(statement, test)
            returns = decided is not None and _ends_in_return(decided[1])
            if decided is not None and (returns or not _jumps(decided[1])):
                taken, body = decided
                line = line_of(statement)
                file = file_of(statement) if file_of is not None else ""
                text = config.code_for_node(statement.test)
                first = body[0] if body else None
                if isinstance(first, cst.SimpleStatementLine | cst.BaseCompoundStatement):
                    at = f" (line {line})" if line else ""
                    if file:
                        at = f" ({file}:{line})" if line else f" ({file})"
                    note = cst.EmptyLine(
                        comment=cst.Comment(f"# syncpass: the {taken} branch of `if {text}:`{at}")
                    )
                    lines = (*statement.leading_lines, note, *first.leading_lines)
                    body[0] = first.with_changes(leading_lines=lines)
                result.extend(body)
                sources.extend([index] * len(body))
                for ran in body:
                    known.passed(ran)
                folded.append(
                    FoldedBranch(
                        line=line,
                        test=text,
                        taken=taken,
                        reads=tuple(test.reads.items()),
                        assumed=tuple(
                            AssumedAttribute(name, value) for name, value in test.assumed.items()
                        ),
                        defaults=tuple(test.assumed_defaults.values()),
                        file=file,
                    )
                )
                if returns:
                    break  # the branch returns: nothing after the `if` runs
                continue
        result.append(statement)
        sources.append(index)
        known.passed(statement)
    return result, folded, sources

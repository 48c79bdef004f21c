"""What plainly holds a host value in a function: a Python number, a size, a setting.

Reading a host value never waits for a device, and a traced JAX program sees
it as a constant, known when the function is traced. The rules are static
(libcst only, nothing runs):

* literals (numbers, strings, ``True``/``False``/``None``), ``len(...)``, the
  number builtins (``int``, ``min``, ``range``...) and ``math`` functions of
  host values;
* sizes: ``x.shape``, ``x.shape[0]``, ``x.ndim``, ``x.size(1)``, ``x.numel()``,
  and the names unpacked from them (``b, t, c = x.shape``);
* parameters annotated with one of the rules' types (``eps: float``), or with
  no annotation and a literal default (``train=False``); another parameter
  stays out even when the body rebinds it to one (``if t is None: t = 1.0``);
* attributes of ``self`` set from host values (given by the caller), and in
  ``__init__`` attributes of its arguments (``config.eps``);
* local names bound only ever to host values. This is a fixpoint: every name
  starts as a host value, and each with a binding that is not one is dropped
  until nothing changes.

:class:`HostRules` says what else counts. :data:`NUMBER_RULES` know numbers
only (what the lint's "may be a tensor" needs); :data:`JAX_RULES` add what a
JAX trace never turns into an array: parameters annotated ``str``, object
constructions (a call of a class, ``nn.Dense(4)``, ``functools.partial(...)``)
and functions (``jax.nn.gelu``, a ``lambda``, a nested ``def``).

:func:`host_values` is the entry point.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncpass.frontend.analysis import ImportAliases

#: Attributes and methods of a tensor or array that are Python values known on the host.
HOST_ATTRIBUTES = frozenset(
    {"shape", "ndim", "training", "requires_grad", "is_cuda", "is_leaf", "itemsize", "dtype"}
)
HOST_METHODS = frozenset(
    {"size", "dim", "ndimension", "numel", "nelement", "element_size", "get_device", "stride"}
)
NUMBER_FUNCTIONS = frozenset(
    {"builtins.len", "builtins.int", "builtins.float", "builtins.bool", "builtins.round"}
    | {"builtins.abs", "builtins.min", "builtins.max", "builtins.range"}
)
NUMBER_TYPES = frozenset({"int", "float", "bool"})
#: Library prefixes whose capitalised callables still make arrays (``jax.random.PRNGKey``).
_ARRAY_LIBRARIES = ("jax.", "numpy.", "torch.")
_FUNCTION_FACTORIES = frozenset({"functools.partial"})


@dataclass(frozen=True)
class HostRules:
    """What counts as a host value besides numbers and sizes.

    ``parameter_types``: annotations that make a parameter a host value;
    ``string_defaults``: whether an unannotated parameter defaulting to a
    string is one; ``attributes``: further array attributes that are host
    values (``x.size`` in JAX); ``objects``: whether constructions and
    functions are (see the module docstring).
    """

    parameter_types: frozenset[str] = NUMBER_TYPES
    string_defaults: bool = False
    attributes: frozenset[str] = frozenset()
    objects: bool = False


#: Numbers only: what the lint reads as "not a tensor".
NUMBER_RULES = HostRules()
#: What a JAX trace keeps as a Python value: numbers, strings, objects, functions.
JAX_RULES = HostRules(
    parameter_types=NUMBER_TYPES | {"str"},
    string_defaults=True,
    attributes=frozenset({"size", "nbytes"}),
    objects=True,
)


@dataclass(frozen=True)
class HostValues:
    """What is known to hold a host value in one function."""

    names: frozenset[str]
    attributes: frozenset[str]  # of self
    imports: ImportAliases
    rules: HostRules = NUMBER_RULES
    #: In ``__init__``, attributes of the arguments are settings: ``config.eps`` is a
    #: number (an argument itself is one only when annotated or defaulting to one).
    settings: frozenset[str] = frozenset()

    def holds(self, node: cst.BaseExpression) -> bool:
        """Whether ``node`` is plainly a host value: reading it never waits for a device."""
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.BaseString)):
            return True
        if isinstance(node, cst.Name):
            if node.value in self.names or node.value in ("True", "False", "None"):
                return True
            return self.rules.objects and self._is_object(node)
        if isinstance(node, cst.Attribute):
            if node.attr.value in HOST_ATTRIBUTES or node.attr.value in self.rules.attributes:
                return True
            if self_attribute(node) in self.attributes:
                return True
            if self.rules.objects and self._is_object(node):
                return True
            return self._setting(node.value)
        if isinstance(node, cst.Subscript):  # x.shape[0], sizes[1:]
            return self.holds(node.value)
        if isinstance(node, cst.Call):
            return self._call_holds(node)
        if isinstance(node, cst.Lambda):
            return self.rules.objects
        if isinstance(node, cst.UnaryOperation):
            return self.holds(node.expression)
        if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
            return self.holds(node.left) and self.holds(node.right)
        if isinstance(node, cst.Comparison):
            return self.holds(node.left) and all(
                self.holds(target.comparator) for target in node.comparisons
            )
        if isinstance(node, cst.IfExp):
            return self.holds(node.body) and self.holds(node.orelse)
        if isinstance(node, (cst.Tuple, cst.List)):
            return all(
                isinstance(element, cst.Element) and self.holds(element.value)
                for element in node.elements
            )
        return False

    def _setting(self, node: cst.BaseExpression) -> bool:
        """``config`` of ``config.eps`` (or ``config.attn`` of ``config.attn.eps``) in
        ``__init__``: an argument, or an attribute chain of one."""
        if isinstance(node, cst.Name):
            return node.value in self.settings
        return isinstance(node, cst.Attribute) and self._setting(node.value)

    def _is_object(self, node: cst.BaseExpression) -> bool:
        """A name the file imports or defines at its top level (a module, function or class),
        or an attribute of one: ``jax.nn.gelu``, ``nn.Dense``, ``helper``."""
        name = dotted_name(node)
        if name is None:
            return False
        root = name.partition(".")[0]
        return root not in self.imports.local_names and root in self.imports.targets

    def _call_holds(self, node: cst.Call) -> bool:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in HOST_METHODS:
            return True  # x.size(0), x.numel(): known on the host
        qualified = qualified_name(node.func, self.imports)
        if qualified is None:
            return False
        if qualified.startswith("math."):
            return all(self.holds(arg.value) for arg in node.args)
        if self.rules.objects and _constructs_object(qualified):
            return True
        return qualified in NUMBER_FUNCTIONS and (
            qualified == "builtins.len" or all(self.holds(arg.value) for arg in node.args)
        )


def _constructs_object(qualified: str) -> bool:
    """A call that makes an object, not an array: a class (``flax.linen.Dense``, a class of
    the file) or ``functools.partial``."""
    if qualified in _FUNCTION_FACTORIES:
        return True
    if qualified.startswith(_ARRAY_LIBRARIES) or qualified.startswith("builtins."):
        return False
    return qualified.rpartition(".")[2][:1].isupper()


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``"a.b.c"`` for the expression ``a.b.c``; ``None`` for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def qualified_name(node: cst.BaseExpression, imports: ImportAliases) -> str | None:
    """What a called name stands for (``T.cuda.synchronize`` -> ``torch.cuda.synchronize``);
    ``None`` for what is not a dotted name, or starts with a local variable."""
    name = dotted_name(node)
    if name is None or name.partition(".")[0] in imports.local_names:
        return None
    return imports.qualify(name)


def self_attribute(node: cst.BaseExpression) -> str | None:
    """``name`` for ``self.name``, else ``None``."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return node.attr.value
    return None


def host_parameters(function: cst.FunctionDef, rules: HostRules = NUMBER_RULES) -> set[str]:
    """Parameters annotated with one of ``rules.parameter_types``, or unannotated with a
    literal default (``train=False``)."""
    names = set()
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        annotation = param.annotation.annotation if param.annotation is not None else None
        if (isinstance(annotation, cst.Name) and annotation.value in rules.parameter_types) or (
            annotation is None
            and param.default is not None
            and _literal(param.default, rules.string_defaults)
        ):
            names.add(param.name.value)
    return names


def _literal(node: cst.BaseExpression, strings: bool) -> bool:
    """A number or ``True``/``False`` literal, or a string one when ``strings``."""
    if isinstance(node, (cst.Integer, cst.Float)) or m.matches(
        node, m.Name("True") | m.Name("False")
    ):
        return True
    return strings and isinstance(node, (cst.SimpleString, cst.ConcatenatedString))


def parameters(function: cst.FunctionDef) -> set[str]:
    """Every parameter name of ``function``, ``*args`` and ``**kwargs`` included."""
    params = function.params
    names = {
        param.name.value
        for param in (*params.posonly_params, *params.params, *params.kwonly_params)
    }
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names


#: A binding's value: an expression, a ``def``/``class`` statement, or ``None`` (unseen).
Binding = cst.BaseExpression | cst.FunctionDef | cst.ClassDef | None


class GatherBindingsVisitor(cst.CSTVisitor):
    """Every binding of a name (or of ``self.attr``) in a function, with the value bound.

    A value of ``None`` is a binding the analysis cannot see the value of (a
    ``for`` target over anything but ``range``, ``with ... as``, unpacking of
    something that is not a size).
    """

    def __init__(self) -> None:
        self.bindings: list[tuple[str, Binding]] = []

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            self.bindings.append((target.value, value))
        elif (attribute := self_attribute(target)) is not None:
            self.bindings.append((f"self.{attribute}", value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            # `b, t, c = x.shape`: each is a size; `a, b = f(x)`: unknown.
            sizes = value is not None and is_size_tuple(value)
            for element in target.elements:
                self._bind(element.value, value if sizes else None)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value, None)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        annotation = node.annotation.annotation
        if isinstance(annotation, cst.Name) and annotation.value in NUMBER_TYPES:
            self._bind(node.target, cst.Integer("0"))  # declared a number
        else:
            self._bind(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        # n += x.size(0) keeps a number a number; n += t makes it a tensor.
        self._bind(node.target, cst.BinaryOperation(node.target, cst.Add(), node.value))

    def visit_For(self, node: cst.For) -> None:
        ranged = m.matches(node.iter, m.Call(func=m.Name("range")))
        self._bind(node.target, cst.Integer("0") if ranged else None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, node.value)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target, None)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.bindings.append((node.name.value, node))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.bindings.append((node.name.value, node))


def is_size_tuple(node: cst.BaseExpression) -> bool:
    """``x.shape``, ``x.size()``, ``x.shape[1:]``: a tuple of sizes."""
    if isinstance(node, cst.Subscript):
        return is_size_tuple(node.value)
    if isinstance(node, cst.Attribute):
        return node.attr.value == "shape"
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in ("size", "stride")
    return False


def host_values(
    function: cst.FunctionDef,
    module: cst.Module,
    known: frozenset[str] = frozenset(),
    attributes: frozenset[str] = frozenset(),
    settings: bool = False,
    rules: HostRules = NUMBER_RULES,
) -> HostValues:
    """What holds a host value in ``function``: its names bound only ever to host values.

    ``known``: module-level numbers (:func:`module_numbers`); ``attributes``:
    host-value attributes of ``self``; ``settings``: the arguments are
    settings (``__init__``), whose attributes are host values. Start from
    every name assumed a host value and drop, until nothing changes, each name
    with a binding that is not one; what remains is consistent. A parameter
    that is not plainly a host value stays out even when the body rebinds it
    to one (``if t is None: t = 1.0``).
    """
    gather = GatherBindingsVisitor()
    function.body.visit(gather)
    arguments = parameters(function)
    host_arguments = host_parameters(function, rules)
    bound = {name for name, _ in gather.bindings}
    names = (set(known) - arguments) | host_arguments | (bound - arguments)
    imports = ImportAliases.of(module, arguments | {n for n in bound if "." not in n})
    roots = frozenset(arguments - {"self"}) if settings else frozenset()
    while True:
        values = HostValues(frozenset(names), attributes, imports, rules, roots)
        dropped = {
            name
            for name, value in gather.bindings
            if name in names and not _binding_holds(values, value)
        }
        if not dropped:
            return values
        names -= dropped


def _binding_holds(values: HostValues, value: Binding) -> bool:
    if value is None:
        return False
    if isinstance(value, (cst.FunctionDef, cst.ClassDef)):
        return values.rules.objects
    return values.holds(value)


def module_numbers(module: cst.Module) -> frozenset[str]:
    """Module-level names assigned a literal number (``EPS = 1e-6``)."""
    names = set()
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, (cst.Integer, cst.Float))
            ):
                names.add(small.targets[0].target.value)
    return frozenset(names)

"""Find implicit host-device synchronisation in model ``forward`` methods.

A GPU runs kernels asynchronously: the host queues work and moves on. A few
innocent-looking calls make the host wait until the device has finished
everything queued so far, and then copy a value back; in a forward pass that
empties the device's queue every step, and in a pipeline it stalls the
stages behind. The rules:

=====  ==============================================================
SP101  ``t.item()``
SP102  ``t.tolist()``
SP103  ``t.cpu()``, ``t.to("cpu")``
SP104  ``t.numpy()``
SP105  ``float(t)``, ``int(t)``, ``bool(t)`` of what may be a tensor
SP106  ``print(...)`` of what may be a tensor
SP107  ``torch.cuda.synchronize()`` (and the accelerator/mps/xpu ones)
=====  ==============================================================

Only the ``forward`` methods of classes are read (and functions nested in
them). The check is static, from libcst: it never imports torch or the
user's code. "What may be a tensor" is anything not plainly a Python number:
literals, ``len(...)``, sizes (``x.shape[0]``, ``x.size(1)``, ``x.ndim``,
``x.numel()``), parameters annotated ``int``/``float``/``bool`` (or defaulting
to a number), attributes set in ``__init__`` from such values or from
attributes of its arguments (``config.eps``), and local names assigned only
from them are numbers; everything else may be a tensor.

A finding is suppressed by ``# noqa: SP101`` on its line (several codes with
commas), or by a bare ``# noqa``, as flake8 reads them.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from syncpass.frontend.analysis import ImportAliases
from syncpass.frontend.source import parse_source

#: Rule codes and what each finds.
RULES: dict[str, str] = {
    "SP101": ".item()",
    "SP102": ".tolist()",
    "SP103": ".cpu()",
    "SP104": ".numpy()",
    "SP105": "float/int/bool of a tensor",
    "SP106": "print of a tensor",
    "SP107": "explicit device synchronize",
}

_WHY = "and waits for all queued device work"
_METHODS = {
    "item": ("SP101", f"`.item()` copies a tensor value to the host {_WHY}"),
    "tolist": ("SP102", f"`.tolist()` copies a whole tensor to the host {_WHY}"),
    "cpu": ("SP103", f"`.cpu()` copies a tensor to host memory {_WHY}"),
    "numpy": ("SP104", f"`.numpy()` needs the tensor's data on the host, so it copies it {_WHY}"),
}
_CONVERSIONS = ("builtins.float", "builtins.int", "builtins.bool")
_SYNCHRONIZE = (
    "torch.cuda.synchronize",
    "torch.accelerator.synchronize",
    "torch.mps.synchronize",
    "torch.xpu.synchronize",
)
#: Attributes and methods of a tensor that are Python values known on the host.
_HOST_ATTRIBUTES = frozenset(
    {"shape", "ndim", "training", "requires_grad", "is_cuda", "is_leaf", "itemsize", "dtype"}
)
_HOST_METHODS = frozenset(
    {"size", "dim", "ndimension", "numel", "nelement", "element_size", "get_device", "stride"}
)
_NUMBER_FUNCTIONS = frozenset(
    {"builtins.len", "builtins.int", "builtins.float", "builtins.bool", "builtins.round"}
    | {"builtins.abs", "builtins.min", "builtins.max", "builtins.range"}
)
_NUMBER_TYPES = frozenset({"int", "float", "bool"})


@dataclass(frozen=True)
class Finding:
    """One implicit synchronisation: ``path:line:column`` (1-based), rule and why."""

    code: str
    path: str
    line: int
    column: int
    message: str

    def __post_init__(self) -> None:
        if self.code not in RULES:
            raise ValueError(f"unknown rule {self.code!r}; rules are {', '.join(RULES)}")

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.code} {self.message}"


def lint_source(text: str, path: str) -> tuple[Finding, ...]:
    """The unsuppressed findings in ``text`` (a :class:`SyncpassError` if it does not parse)."""
    if "forward" not in text:  # no model here; skip the parse
        return ()
    return lint_module(parse_source(text, path), path, text)


def lint_module(module: cst.Module, path: str, text: str | None = None) -> tuple[Finding, ...]:
    """The unsuppressed findings in an already parsed module."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    visitor = GatherHostSyncVisitor(path, module)
    wrapper.visit(visitor)
    noqa = noqa_lines(module.code if text is None else text)
    return tuple(
        finding
        for finding in sorted(visitor.findings, key=lambda f: (f.line, f.column, f.code))
        if not _suppressed(finding, noqa)
    )


# --- suppression -----------------------------------------------------------------

_NOQA = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.IGNORECASE
)


def noqa_lines(text: str) -> dict[int, frozenset[str] | None]:
    """Line -> the codes its ``# noqa`` comment lists (``None``: a bare ``# noqa``, all)."""
    found: dict[int, frozenset[str] | None] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type != tokenize.COMMENT:
                continue
            match = _NOQA.search(token.string)
            if match is None:
                continue
            codes = match.group("codes")
            found[token.start[0]] = (
                None
                if codes is None
                else frozenset(code.strip().upper() for code in codes.split(","))
            )
    except (tokenize.TokenError, SyntaxError):  # the parse already accepted it; be safe
        pass
    return found


def _suppressed(finding: Finding, noqa: dict[int, frozenset[str] | None]) -> bool:
    if finding.line not in noqa:
        return False
    codes = noqa[finding.line]
    return codes is None or finding.code in codes


# --- what is plainly a Python number ------------------------------------------------


@dataclass(frozen=True)
class _Numbers:
    """What is known to hold a Python number (or another host value) in one method."""

    names: frozenset[str]
    attributes: frozenset[str]  # of self
    imports: ImportAliases
    #: In ``__init__``, attributes of the arguments are settings: ``config.eps`` is a
    #: number (an argument itself is one only when annotated or defaulting to one).
    settings: frozenset[str] = frozenset()

    def holds(self, node: cst.BaseExpression) -> bool:
        """Whether ``node`` is plainly a host value: reading it never waits for a device."""
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.BaseString)):
            return True
        if isinstance(node, cst.Name):
            return node.value in self.names or node.value in ("True", "False", "None")
        if isinstance(node, cst.Attribute):
            if node.attr.value in _HOST_ATTRIBUTES:
                return True
            if _self_attribute(node) in self.attributes:
                return True
            return self._setting(node.value)
        if isinstance(node, cst.Subscript):  # x.shape[0], sizes[1:]
            return self.holds(node.value)
        if isinstance(node, cst.Call):
            return self._call_holds(node)
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

    def _call_holds(self, node: cst.Call) -> bool:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in _HOST_METHODS:
            return True  # x.size(0), x.numel(): known on the host
        qualified = _qualified(node.func, self.imports)
        if qualified is None:
            return False
        if qualified.startswith("math."):
            return all(self.holds(arg.value) for arg in node.args)
        return qualified in _NUMBER_FUNCTIONS and (
            qualified == "builtins.len" or all(self.holds(arg.value) for arg in node.args)
        )


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _qualified(node: cst.BaseExpression, imports: ImportAliases) -> str | None:
    """What a called name stands for (``T.cuda.synchronize`` -> ``torch.cuda.synchronize``);
    ``None`` for what is not a dotted name, or starts with a local variable."""
    name = _dotted(node)
    if name is None or name.partition(".")[0] in imports.local_names:
        return None
    return imports.qualify(name)


def _self_attribute(node: cst.BaseExpression) -> str | None:
    """``name`` for ``self.name``, else ``None``."""
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return node.attr.value
    return None


def _number_parameters(function: cst.FunctionDef) -> set[str]:
    """Parameters annotated ``int``/``float``/``bool``, or defaulting to a number."""
    names = set()
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        annotation = param.annotation.annotation if param.annotation is not None else None
        if (isinstance(annotation, cst.Name) and annotation.value in _NUMBER_TYPES) or (
            annotation is None
            and param.default is not None
            and m.matches(param.default, m.Integer() | m.Float() | m.Name("True") | m.Name("False"))
        ):
            names.add(param.name.value)
    return names


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    names = {
        param.name.value
        for param in (*params.posonly_params, *params.params, *params.kwonly_params)
    }
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            names.add(star.name.value)
    return names


class _GatherAssignmentsVisitor(cst.CSTVisitor):
    """Every binding of a name (or of ``self.attr``) in a method, with the value bound.

    A value of ``None`` is a binding the analysis cannot see the value of (a
    ``for`` target over anything but ``range``, ``with ... as``, an augmented
    assignment, unpacking of something that is not a size).
    """

    def __init__(self) -> None:
        self.bindings: list[tuple[str, cst.BaseExpression | None]] = []

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            self.bindings.append((target.value, value))
        elif (attribute := _self_attribute(target)) is not None:
            self.bindings.append((f"self.{attribute}", value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            # `b, t, c = x.shape`: each is a size; `a, b = f(x)`: unknown.
            sizes = value is not None and _is_size_tuple(value)
            for element in target.elements:
                inner = element.value
                self._bind(inner, value if sizes else None)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value, None)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        annotation = node.annotation.annotation
        if isinstance(annotation, cst.Name) and annotation.value in _NUMBER_TYPES:
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


def _is_size_tuple(node: cst.BaseExpression) -> bool:
    """``x.shape``, ``x.size()``, ``x.shape[1:]``: a tuple of sizes."""
    if isinstance(node, cst.Subscript):
        return _is_size_tuple(node.value)
    if isinstance(node, cst.Attribute):
        return node.attr.value == "shape"
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        return node.func.attr.value in ("size", "stride")
    return False


def _numbers_in(
    function: cst.FunctionDef,
    module: cst.Module,
    known: frozenset[str],
    attributes: frozenset[str],
    settings: bool = False,
) -> _Numbers:
    """What holds a number in ``function``: its names bound only ever to numbers.

    ``known``: module-level numbers; ``attributes``: number attributes of
    ``self``; ``settings``: the arguments are settings (``__init__``), whose
    attributes are numbers. Start from every name assumed a number and drop,
    until nothing changes, each name with a binding that is not one; what
    remains is consistent. A parameter that is not plainly a number stays out
    even when the body rebinds it to one (``if t is None: t = 1.0``).
    """
    gather = _GatherAssignmentsVisitor()
    function.body.visit(gather)
    parameters = _parameters(function)
    numeric_parameters = _number_parameters(function)
    bound = {name for name, _ in gather.bindings}
    names = (set(known) - parameters) | numeric_parameters | (bound - parameters)
    imports = ImportAliases.of(module, parameters | {n for n in bound if "." not in n})
    roots = frozenset(parameters - {"self"}) if settings else frozenset()
    while True:
        numbers = _Numbers(frozenset(names), attributes, imports, roots)
        dropped = {
            name
            for name, value in gather.bindings
            if name in names and (value is None or not numbers.holds(value))
        }
        if not dropped:
            return numbers
        names -= dropped


def _module_numbers(module: cst.Module) -> frozenset[str]:
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


def _method(classdef: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for statement in classdef.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


# --- the visitor -----------------------------------------------------------------------


class GatherHostSyncVisitor(cst.CSTVisitor):
    """Collect the host-device synchronisations in every class's ``forward``."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str, module: cst.Module) -> None:
        super().__init__()
        self.path = path
        self.findings: list[Finding] = []
        self._module_numbers = _module_numbers(module)
        self._module = module
        self._forwards: dict[cst.FunctionDef, _Numbers] = {}
        self._stack: list[_Numbers] = []

    # Which methods are read, and what is known to be a number in each.

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        forward = _method(node, "forward")
        if forward is None:
            return
        init = _method(node, "__init__")
        attributes: frozenset[str] = frozenset()
        if init is not None:
            in_init = _numbers_in(init, self._module, self._module_numbers, frozenset(), True)
            attributes = frozenset(
                name.removeprefix("self.") for name in in_init.names if name.startswith("self.")
            )
        self._forwards[forward] = _numbers_in(
            forward, self._module, self._module_numbers, attributes
        )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node in self._forwards:
            self._stack.append(self._forwards[node])

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if original_node in self._forwards:
            self._stack.pop()

    # The rules.

    def visit_Call(self, node: cst.Call) -> None:
        if not self._stack:
            return
        numbers = self._stack[-1]
        for code, message in self._check_call(node, numbers):
            self._report(node, code, message)

    def _check_call(self, node: cst.Call, numbers: _Numbers) -> Iterator[tuple[str, str]]:
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _METHODS and not (method == "item" and node.args):
                yield _METHODS[method]
            elif method == "to" and _moves_to_cpu(node):
                yield "SP103", f'`.to("cpu")` copies a tensor to host memory {_WHY}'
        qualified = _qualified(func, numbers.imports)
        if qualified is None:
            return
        if qualified in _CONVERSIONS and len(node.args) == 1 and not node.args[0].keyword:
            if not numbers.holds(node.args[0].value):
                short = qualified.removeprefix("builtins.")
                yield (
                    "SP105",
                    f"`{short}()` of a tensor copies its value to the host {_WHY} "
                    "(for sizes use x.shape or x.size(); else keep it a tensor)",
                )
        elif qualified == "builtins.print" and any(
            not _prints_plainly(arg.value, numbers) for arg in node.args if not arg.keyword
        ):
            yield (
                "SP106",
                f"`print()` of a tensor copies its values to the host {_WHY}",
            )
        elif qualified in _SYNCHRONIZE:
            yield (
                "SP107",
                f"`{qualified}()` blocks the host until the device is idle; a pipeline "
                "stage waiting here stalls every stage behind it",
            )

    def _report(self, node: cst.CSTNode, code: str, message: str) -> None:
        position = self.get_metadata(PositionProvider, node).start
        self.findings.append(Finding(code, self.path, position.line, position.column + 1, message))


def _moves_to_cpu(node: cst.Call) -> bool:
    """``t.to("cpu")``, ``t.to(device="cpu")``, ``t.to(torch.device("cpu"))``."""
    for arg in node.args:
        if arg.keyword is not None and arg.keyword.value != "device":
            continue
        value = arg.value
        if m.matches(value, m.Call(func=m.Attribute(attr=m.Name("device")) | m.Name("device"))):
            assert isinstance(value, cst.Call)
            value = value.args[0].value if value.args else value
        if isinstance(value, cst.SimpleString) and value.evaluated_value in ("cpu", b"cpu"):
            return True
    return False


def _prints_plainly(node: cst.BaseExpression, numbers: _Numbers) -> bool:
    """A ``print`` argument that formats no tensor: text, numbers, f-strings of those."""
    if isinstance(node, cst.FormattedString):
        return all(
            numbers.holds(part.expression)
            for part in node.parts
            if isinstance(part, cst.FormattedStringExpression)
        )
    if isinstance(node, cst.ConcatenatedString):
        return _prints_plainly(node.left, numbers) and _prints_plainly(node.right, numbers)
    return numbers.holds(node)


def format_findings(findings: Iterable[Finding]) -> str:
    """One ``path:line:col: CODE message`` line per finding."""
    return "".join(f"{finding}\n" for finding in findings)

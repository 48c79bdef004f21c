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
from them are numbers; everything else may be a tensor (the rules are
:mod:`syncpass.frontend.numbers`, shared with the JAX analysis). It is the torch
backend's ``lint`` hook, which ``syncpass check`` runs.

A finding is suppressed by ``# noqa: SP101`` on its line (several codes with
commas), or by a bare ``# noqa``, as flake8 reads them.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from syncpass.frontend.findings import Finding
from syncpass.frontend.numbers import HostValues, host_values, module_numbers, qualified_name
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


def finding(code: str, path: str, line: int, column: int, message: str) -> Finding:
    """A finding of one of this lint's :data:`RULES`; any other code is a bug here."""
    if code not in RULES:
        raise ValueError(f"unknown rule {code!r}; rules are {', '.join(RULES)}")
    return Finding(code, path, line, column, message)


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


# --- the methods read -----------------------------------------------------------


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
        self._module_numbers = module_numbers(module)
        self._module = module
        self._forwards: dict[cst.FunctionDef, HostValues] = {}
        self._stack: list[HostValues] = []

    # Which methods are read, and what is known to be a number in each.

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        forward = _method(node, "forward")
        if forward is None:
            return
        init = _method(node, "__init__")
        attributes: frozenset[str] = frozenset()
        if init is not None:
            in_init = host_values(init, self._module, self._module_numbers, frozenset(), True)
            attributes = frozenset(
                name.removeprefix("self.") for name in in_init.names if name.startswith("self.")
            )
        self._forwards[forward] = host_values(
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

    def _check_call(self, node: cst.Call, numbers: HostValues) -> Iterator[tuple[str, str]]:
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _METHODS and not (method == "item" and node.args):
                yield _METHODS[method]
            elif method == "to" and _moves_to_cpu(node):
                yield "SP103", f'`.to("cpu")` copies a tensor to host memory {_WHY}'
        qualified = qualified_name(func, numbers.imports)
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
        self.findings.append(finding(code, self.path, position.line, position.column + 1, message))


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


def _prints_plainly(node: cst.BaseExpression, numbers: HostValues) -> bool:
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

"""Write a tensor-parallel plan into a Flax model's source: the collectives around the calls
of split layers, the split layers' feature counts divided, the weights' layout after the
model.

:func:`gather_flax_sites` reads what the JAX backend must know of the source: where each
module class builds its submodules in ``setup`` (``self.fc = nn.Dense(...)``: the class,
the attribute, the line and how the features are given) and where a submodule is called
(``self.fc(...)``: the line, and how many positional arguments). :class:`InsertFlaxCollectivesCommand`
carries out the :class:`FlaxEdit` s the backend decided: a call wrapped in a runtime
function (``reduce_from_tensor_parallel_region(self.proj(h))``), a call's first argument
wrapped (``self.fc(copy_to_tensor_parallel_region(h))``), a comment line above the
statement of each, a constructor's features divided by ``tp_size()``; then a block of text
after the last statement, and the imports. It never decides: an edit whose site is
missing is reported back and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import PositionProvider

from syncpass.frontend.numbers import self_attribute
from syncpass.transformers.common import divided_by_tp_size, with_footer

__all__ = [
    "RUNTIME_MODULE",
    "FlaxCallSite",
    "FlaxConstruction",
    "FlaxEdit",
    "gather_flax_sites",
    "insert_flax_collectives",
]

#: What generated code imports the collectives and ``tp_size`` from.
RUNTIME_MODULE = "syncpass.backends.jax.tensor_parallel"


@dataclass(frozen=True)
class FlaxConstruction:
    """``self.ATTRIBUTE = CALLEE(...)`` in ``setup`` of class ``cls``: its line, the
    callee's last name (``Dense``), and whether the features are its first positional
    argument or the ``features=`` keyword (``has_features``)."""

    cls: str
    attribute: str
    line: int
    callee: str
    has_features: bool


@dataclass(frozen=True)
class FlaxCallSite:
    """A call ``self.ATTRIBUTE(...)`` in a method of class ``cls``: its lines, the lines of
    the simple statement that holds it, and its positional arguments."""

    cls: str
    attribute: str
    start: int
    end: int
    statement: int
    positional: int


@dataclass(frozen=True)
class FlaxEdit:
    """One change at the call of ``self.ATTRIBUTE`` that starts on ``line``: ``wrap`` puts
    the call in ``function(...)``; ``wrap-argument`` puts its first argument in it;
    ``divide`` divides the features of the construction of ``self.ATTRIBUTE`` on ``line``
    by ``tp_size()``; ``heads`` divides an attention module's ``num_heads`` and
    ``qkv_features`` (given as ``features`` where the call leaves it to its default). ``comment`` (without ``#``) goes on a line of its own above the
    statement that holds the call."""

    kind: str
    line: int
    attribute: str
    function: str = ""
    comment: str = ""
    features: int = 0  # ``heads``: the module's input features, its default ``qkv_features``


def _callee_name(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Name):
        return node.value
    return ""


class _GatherFlaxSites(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.constructions: list[FlaxConstruction] = []
        self.calls: list[FlaxCallSite] = []
        self._classes: list[str] = []
        self._functions: list[str] = []
        self._statements: list[int] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._statements.append(self.get_metadata(PositionProvider, node).start.line)
        if not self._classes or self._functions[-1:] != ["setup"] or len(node.body) != 1:
            return
        small = node.body[0]
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            return
        attribute = self_attribute(small.targets[0].target)
        if attribute is None or not isinstance(small.value, cst.Call):
            return
        call = small.value
        positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
        keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
        self.constructions.append(
            FlaxConstruction(
                self._classes[-1],
                attribute,
                self.get_metadata(PositionProvider, node).start.line,
                _callee_name(call.func),
                bool(positional) or "features" in keywords,
            )
        )

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine) -> None:
        self._statements.pop()

    def visit_Call(self, node: cst.Call) -> None:
        attribute = self_attribute(node.func)
        if attribute is None or not self._classes or not self._statements:
            return
        where = self.get_metadata(PositionProvider, node)
        self.calls.append(
            FlaxCallSite(
                self._classes[-1],
                attribute,
                where.start.line,
                where.end.line,
                self._statements[-1],
                sum(arg.keyword is None and not arg.star for arg in node.args),
            )
        )


def gather_flax_sites(module: cst.Module) -> tuple[list[FlaxConstruction], list[FlaxCallSite]]:
    """The submodule constructions in ``setup`` and the ``self.X(...)`` calls of ``module``."""
    visitor = _GatherFlaxSites()
    cst.MetadataWrapper(module).visit(visitor)
    return visitor.constructions, visitor.calls


def _heads_divided(call: cst.Call, features: int) -> cst.Call:
    """An attention module's construction with ``num_heads`` (its keyword or first
    positional argument) and ``qkv_features`` (given, else ``features``) divided."""
    args = list(call.args)
    positional = [i for i, arg in enumerate(args) if arg.keyword is None and not arg.star]
    named = {arg.keyword.value: i for i, arg in enumerate(args) if arg.keyword is not None}
    heads = named.get("num_heads", positional[0] if positional else None)
    if heads is not None:
        args[heads] = args[heads].with_changes(value=divided_by_tp_size(args[heads].value))
    if "qkv_features" in named:
        at = named["qkv_features"]
        args[at] = args[at].with_changes(value=divided_by_tp_size(args[at].value))
    else:
        if args:
            args[-1] = args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        args.append(
            cst.Arg(
                keyword=cst.Name("qkv_features"),
                value=divided_by_tp_size(cst.Integer(str(features))),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
        )
    return call.with_changes(args=args)


class InsertFlaxCollectivesCommand(VisitorBasedCodemodCommand):
    """Carries out :class:`FlaxEdit` s and appends ``footer`` after the last statement."""

    METADATA_DEPENDENCIES = (PositionProvider,)
    DESCRIPTION = "Write a tensor-parallel plan's collectives into a Flax model."

    def __init__(
        self,
        context: CodemodContext,
        edits: Sequence[FlaxEdit],
        footer: str,
        imports: Sequence[str],
    ) -> None:
        super().__init__(context)
        self.edits = tuple(edits)
        self.footer = footer
        self.imports = tuple(imports)
        self.done: set[FlaxEdit] = set()
        self._comments: list[list[FlaxEdit]] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._comments.append([])

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        comments = self._comments.pop()
        if not comments:
            return updated_node
        lines = [cst.EmptyLine(comment=cst.Comment(f"# {edit.comment}")) for edit in comments]
        return updated_node.with_changes(leading_lines=(*updated_node.leading_lines, *lines))

    def _at(self, node: cst.CSTNode, kinds: tuple[str, ...], attribute: str) -> list[FlaxEdit]:
        line = self.get_metadata(PositionProvider, node).start.line
        return [
            edit
            for edit in self.edits
            if edit.kind in kinds and edit.line == line and edit.attribute == attribute
        ]

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if len(original_node.targets) != 1 or not isinstance(updated_node.value, cst.Call):
            return updated_node
        attribute = self_attribute(original_node.targets[0].target)
        edits = [] if attribute is None else self._at(original_node, ("divide", "heads"), attribute)
        if not edits:
            return updated_node
        call = updated_node.value
        args = list(call.args)
        if edits[0].kind == "heads":
            self.done.update(edits)
            return updated_node.with_changes(value=_heads_divided(call, edits[0].features))
        for index, arg in enumerate(args):
            if (arg.keyword is None and not arg.star) or (
                arg.keyword is not None and arg.keyword.value == "features"
            ):
                args[index] = arg.with_changes(value=divided_by_tp_size(arg.value))
                self.done.update(edits)
                break
        return updated_node.with_changes(value=call.with_changes(args=args))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        attribute = self_attribute(original_node.func)
        if attribute is None:
            return updated_node
        edits = self._at(original_node, ("wrap", "wrap-argument"), attribute)
        result: cst.BaseExpression = updated_node
        for edit in sorted(edits, key=lambda e: e.kind != "wrap-argument"):
            if edit.kind == "wrap-argument":
                args = list(updated_node.args)
                first = next(
                    (i for i, arg in enumerate(args) if arg.keyword is None and not arg.star), None
                )
                if first is None:
                    continue
                args[first] = args[first].with_changes(
                    value=cst.Call(func=cst.Name(edit.function), args=[cst.Arg(args[first].value)])
                )
                updated_node = updated_node.with_changes(args=args)
                result = updated_node
            else:
                result = cst.Call(func=cst.Name(edit.function), args=[cst.Arg(result)])
            self.done.add(edit)
            if self._comments and edit.comment:
                self._comments[-1].append(edit)
        return result

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for name in self.imports:
            AddImportsVisitor.add_needed_import(self.context, RUNTIME_MODULE, name)
        return with_footer(updated_node, self.footer)


def insert_flax_collectives(
    module: cst.Module, edits: Sequence[FlaxEdit], footer: str, imports: Sequence[str]
) -> tuple[cst.Module, tuple[FlaxEdit, ...]]:
    """``module`` with ``edits`` carried out, ``footer`` appended and the runtime's
    ``imports`` scheduled; the edits whose site was not found."""
    command = InsertFlaxCollectivesCommand(CodemodContext(), edits, footer, imports)
    result = command.transform_module(module)
    return result, tuple(edit for edit in edits if edit not in command.done)

"""Write a tensor-parallel plan into a torch model's source: collectives in the forwards,
sizes divided where a reshape's dimension is split, the weights' layout after the model.

:class:`GatherTensorSitesVisitor` reads what the planner must know of the source (each
simple statement's lines, the name it assigns and the call it makes; each call's method
name and arguments). :class:`InsertTensorCollectivesCommand` carries out the edits the
torch backend decided (:class:`TensorEdit`): a line before or after a statement, an
argument divided by ``tp_size()``, and a block of text after the module's last
statement; it schedules the imports it is given. It never decides: an edit whose site is
missing or ambiguous is a warning and no change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import PositionProvider

from syncpass.transformers.common import divided_by_tp_size, with_footer

__all__ = [
    "RUNTIME_MODULE",
    "CallSite",
    "GatherTensorSitesVisitor",
    "InsertTensorCollectivesCommand",
    "StatementSite",
    "TensorEdit",
    "gather_tensor_sites",
    "insert_tensor_collectives",
]

#: What generated code imports the conjugate functions and ``tp_size`` from.
RUNTIME_MODULE = "syncpass.backends.torch.tensor_parallel"


@dataclass(frozen=True)
class StatementSite:
    """A simple statement: its lines, the one name it assigns (``x = ...``, ``x: T = ...``;
    ``None`` otherwise), what its value is (a call's method or function name, an
    operator's torch name such as ``add``, else ``""``), and the name its outermost call reads first, if a bare name;
    ``returns``: it is ``return VALUE``."""

    start: int
    end: int
    target: str | None
    value: str
    first_arg: str | None
    returns: bool = False


@dataclass(frozen=True)
class CallSite:
    """A call of a method or function ``name``: its lines, positional arguments (their
    code) and whether one is starred or a keyword names a size."""

    start: int
    end: int
    name: str
    args: tuple[str, ...]
    starred: bool


@dataclass(frozen=True)
class TensorEdit:
    """One change: ``before``/``after`` put ``code`` on a line of its own before or after
    the simple statement holding ``line``; ``divide`` divides positional argument
    ``position`` of the call of ``name`` on ``line`` by ``tp_size()``; ``return`` puts the
    value of the ``return`` statement holding ``line`` in the call on ``code``'s second line
    (for its ``__value__``), below the comment on its first."""

    kind: str
    line: int
    code: str = ""
    name: str = ""
    position: int = 0


#: A binary operator's call as torch names it (``x + y`` runs ``Tensor.add``).
_OPERATORS: dict[type[cst.BaseBinaryOp], str] = {
    cst.Add: "add",
    cst.Multiply: "mul",
    cst.Subtract: "sub",
    cst.Divide: "truediv",
    cst.MatrixMultiply: "matmul",
}


def _callee(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        if isinstance(func, cst.Name):
            return func.value
    if isinstance(node, cst.BinaryOperation):
        return _OPERATORS.get(type(node.operator), "")
    return ""


class GatherTensorSitesVisitor(cst.CSTVisitor):
    """Collects the :class:`StatementSite` and :class:`CallSite` of a module."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.statements: list[StatementSite] = []
        self.calls: list[CallSite] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        where = self.get_metadata(PositionProvider, node)
        target: str | None = None
        value = ""
        first: str | None = None
        returns = False
        if len(node.body) == 1:
            small = node.body[0]
            expression: cst.BaseExpression | None = None
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                if isinstance(small.targets[0].target, cst.Name):
                    target = small.targets[0].target.value
                expression = small.value
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                if isinstance(small.target, cst.Name):
                    target = small.target.value
                expression = small.value
            elif isinstance(small, cst.Expr | cst.Return) and small.value is not None:
                expression = small.value
                returns = isinstance(small, cst.Return)
            if expression is not None:
                value = _callee(expression)
                if isinstance(expression, cst.Call) and expression.args:
                    arg = expression.args[0].value
                    first = arg.value if isinstance(arg, cst.Name) else None
        self.statements.append(
            StatementSite(where.start.line, where.end.line, target, value, first, returns)
        )

    def visit_Call(self, node: cst.Call) -> None:
        name = _callee(node)
        if not name:
            return
        where = self.get_metadata(PositionProvider, node)
        positional = [arg for arg in node.args if arg.keyword is None]
        starred = any(arg.star for arg in node.args)
        module = cst.Module(body=())
        self.calls.append(
            CallSite(
                where.start.line,
                where.end.line,
                name,
                tuple(module.code_for_node(arg.value) for arg in positional),
                starred,
            )
        )


def gather_tensor_sites(module: cst.Module) -> GatherTensorSitesVisitor:
    """The statements and calls of ``module``."""
    visitor = GatherTensorSitesVisitor()
    cst.MetadataWrapper(module).visit(visitor)
    return visitor


class InsertTensorCollectivesCommand(VisitorBasedCodemodCommand):
    """Carries out :class:`TensorEdit` s and appends ``footer`` after the last statement."""

    METADATA_DEPENDENCIES = (PositionProvider,)
    DESCRIPTION = "Write a tensor-parallel plan's collectives into a torch model's forwards."

    def __init__(
        self,
        context: CodemodContext,
        edits: Sequence[TensorEdit],
        footer: str,
        imports: Sequence[tuple[str, str]],
    ) -> None:
        super().__init__(context)
        self.edits = tuple(edits)
        self.footer = footer
        self.imports = tuple(imports)
        self.done: set[TensorEdit] = set()

    def _around(self, kind: str, start: int, end: int) -> list[TensorEdit]:
        return [e for e in self.edits if e.kind == kind and start <= e.line <= end]

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        where = self.get_metadata(PositionProvider, original_node)
        before = self._around("before", where.start.line, where.end.line)
        after = self._around("after", where.start.line, where.end.line)
        for edit in self._around("return", where.start.line, where.end.line):
            wrapped = _return_wrapped(updated_node, edit)
            if wrapped is not updated_node:  # else not found: reported as a missed edit
                updated_node = wrapped
                self.done.add(edit)
        if not before and not after:
            return updated_node
        config = self.module.config_for_parsing
        newline = str(config.default_newline)
        lines = []
        for edit in before:
            lines.append(cst.parse_statement(edit.code + newline, config))
        lines.append(updated_node)
        for edit in after:
            lines.append(cst.parse_statement(edit.code + newline, config))
        self.done.update(before + after)
        return cst.FlattenSentinel(lines)  # type: ignore[arg-type]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        name = _callee(original_node)
        if not name:
            return updated_node
        where = self.get_metadata(PositionProvider, original_node)
        edits = [
            e
            for e in self.edits
            if e.kind == "divide"
            and e.name == name
            and where.start.line <= e.line <= where.end.line
        ]
        if not edits:
            return updated_node
        args = list(updated_node.args)
        positional = [index for index, arg in enumerate(args) if arg.keyword is None]
        for edit in edits:
            if edit.position >= len(positional):
                continue
            index = positional[edit.position]
            value = args[index].value
            if isinstance(value, cst.Tuple | cst.List):  # split((q, k, v), ...): each size
                elements = [
                    element.with_changes(value=divided_by_tp_size(element.value))
                    for element in value.elements
                ]
                args[index] = args[index].with_changes(value=value.with_changes(elements=elements))
            else:
                args[index] = args[index].with_changes(value=divided_by_tp_size(value))
            self.done.add(edit)
        return updated_node.with_changes(args=args)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for module, name in self.imports:
            AddImportsVisitor.add_needed_import(self.context, module, name)
        return with_footer(updated_node, self.footer)


def _return_wrapped(line: cst.SimpleStatementLine, edit: TensorEdit) -> cst.SimpleStatementLine:
    """``return VALUE`` as ``return CALL(VALUE, ...)`` below the comment ``# ...``
    (``edit.code``: the comment, then the call with ``__value__`` for its first argument)."""
    small = line.body[0]
    if not isinstance(small, cst.Return) or small.value is None:
        return line
    comment, _, template = edit.code.partition("\n")
    call = cst.parse_expression(template)
    assert isinstance(call, cst.Call)
    wrapped = call.with_changes(args=(call.args[0].with_changes(value=small.value), *call.args[1:]))
    return line.with_changes(
        body=(small.with_changes(value=wrapped),),
        leading_lines=(*line.leading_lines, cst.EmptyLine(comment=cst.Comment(comment))),
    )


def insert_tensor_collectives(
    module: cst.Module,
    edits: Sequence[TensorEdit],
    footer: str,
    imports: Sequence[tuple[str, str]],
) -> tuple[cst.Module, tuple[TensorEdit, ...]]:
    """``module`` with ``edits`` carried out, ``footer`` appended and ``imports`` (module,
    name) scheduled; the edits whose site was not found."""
    command = InsertTensorCollectivesCommand(CodemodContext(), edits, footer, imports)
    result = command.transform_module(module)
    return result, tuple(edit for edit in edits if edit not in command.done)

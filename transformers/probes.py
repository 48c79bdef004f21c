"""Instrument a copy of a model's forward with probes at its op boundaries, for profiling.

:class:`InsertProbesCommand` rewrites ``class_name.forward`` so that it calls a
probe object (a global named :data:`PROBE`) at every op boundary of the op
graph (:mod:`syncpass.contracts.graph`):

* ``PROBE.begin()`` as the first statement;
* after every top-level statement that is an op (a simple statement or a
  region; a ``return`` gets none, as nothing after it runs):
  ``PROBE.boundary(STATEMENT, None, locals())``;
* at the end of every iteration of a loop over a layer container:
  ``PROBE.boundary(STATEMENT, INDEX, locals())``, where ``INDEX`` is the
  container index of the iteration. The loop is enumerated for this
  (``for __syncpass_iteration__, block in enumerate(self.blocks):``), so the
  user's own index variable, if any, is left alone.

The probe returns a dict of values to rebind (the profiler routes live tensors
through an autograd identity to time the backward pass); each site's
``rebind`` names are re-assigned from it when present, so a name that is not
bound at run time (assigned only in one branch of an ``if``) stays unbound.

The output is an instrumented *copy* for execution, never written over the
user's file: :func:`probed_forward_source` returns a module holding only
``class <class_name>:`` with the instrumented forward, which the profiler
executes in the user's module namespace and binds to the live model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand

from syncpass.frontend.analysis import find_forward, match_container_loop, match_sequential_call

#: The global name the instrumented forward calls; the profiler binds it to its probe.
PROBE = "__syncpass_probe__"
#: The local holding the values the probe returns for rebinding.
LIVE = "__syncpass_live__"
#: The enumeration counter added to instrumented container loops.
ITERATION = "__syncpass_iteration__"
CHILD = "__syncpass_child__"


@dataclass(frozen=True)
class ProbeSite:
    """Where a probe goes: after top-level forward statement ``statement``.

    With ``loop`` the statement is a loop over a layer container and the probe
    goes at the end of each iteration instead. ``rebind`` names the locals the
    probe may replace there.
    """

    statement: int
    loop: bool = False
    rebind: tuple[str, ...] = ()
    # A sequential call planned per child with nested children among them: the place of
    # each op below the call's container (``(0,)``, ``(1, 0)``, ``(1, 1)``, ``(2,)``).
    nested: tuple[tuple[int, ...], ...] = ()


def _statement(code: str, tree: cst.Module) -> cst.BaseStatement:
    return cst.parse_statement(code, config=tree.config_for_parsing)


def _is_return(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Return) for small in statement.body
    )


def _probe_lines(site: ProbeSite, index: str, tree: cst.Module) -> list[cst.BaseStatement]:
    lines = [_statement(f"{LIVE} = {PROBE}.boundary({site.statement}, {index}, locals())\n", tree)]
    # One `if` per name: a name the probe did not return (not a tensor that
    # needs a gradient, or not bound) keeps its value, or stays unbound.
    lines += [
        _statement(f"if {name!r} in {LIVE}: {name} = {LIVE}[{name!r}]\n", tree)
        for name in site.rebind
    ]
    return lines


class InsertProbesCommand(VisitorBasedCodemodCommand):
    """Insert profiling probes at the op boundaries of ``class_name.forward``.

    A site that does not fit the forward (an index out of range, a ``loop``
    site that is not a loop over a layer container) is a warning and no change.
    """

    DESCRIPTION = "Insert syncpass profiling probes at the op boundaries of a model's forward."

    def __init__(
        self, context: CodemodContext, class_name: str, sites: Sequence[ProbeSite]
    ) -> None:
        super().__init__(context)
        self.class_name = class_name
        self.sites = {site.statement: site for site in sites}

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        found = [
            (class_index, statement)
            for class_index, statement in enumerate(tree.body)
            if isinstance(statement, cst.ClassDef) and statement.name.value == self.class_name
        ]
        if len(found) != 1:
            self.warn(f"no single class {self.class_name} to instrument; nothing changed")
            return tree
        class_index, classdef = found[0]
        members = list(classdef.body.body)
        for method_index, member in enumerate(members):
            if isinstance(member, cst.FunctionDef) and member.name.value == "forward":
                probed = self._probe_forward(member, tree)
                if probed is None:
                    return tree
                members[method_index] = probed
                break
        else:
            self.warn(f"class {self.class_name} has no forward; nothing changed")
            return tree
        body = list(tree.body)
        body[class_index] = classdef.with_changes(body=classdef.body.with_changes(body=members))
        return tree.with_changes(body=body)

    def _probe_forward(self, forward: cst.FunctionDef, tree: cst.Module) -> cst.FunctionDef | None:
        if not isinstance(forward.body, cst.IndentedBlock):
            self.warn(f"{self.class_name}.forward has no indented body; nothing changed")
            return None
        statements = list(forward.body.body)
        for planned in self.sites.values():
            if not 0 <= planned.statement < len(statements):
                self.warn(f"probe site {planned} is outside the forward; nothing changed")
                return None
        new_body: list[cst.BaseStatement] = [_statement(f"{PROBE}.begin()\n", tree)]
        for index, statement in enumerate(statements):
            site = self.sites.get(index)
            if site is None:
                new_body.append(statement)
            elif site.loop and match_sequential_call(statement) is not None:
                new_body.extend(self._probe_sequential(statement, site, tree))
            elif site.loop:
                probed_loop = self._probe_loop(statement, site, tree)
                if probed_loop is None:
                    return None
                new_body.append(probed_loop)
            else:
                new_body.append(statement)
                if not _is_return(statement):  # nothing after a return would run
                    new_body.extend(_probe_lines(site, "None", tree))
        return forward.with_changes(body=forward.body.with_changes(body=new_body))

    def _probe_loop(
        self, statement: cst.BaseStatement, site: ProbeSite, tree: cst.Module
    ) -> cst.For | None:
        loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
        if loop is None:
            self.warn(f"statement {site.statement} is not a loop over a layer container")
            return None
        assert isinstance(statement, cst.For)
        target = statement.target
        if isinstance(target, cst.Tuple) and not target.lpar:
            target = target.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        new_target = cst.Tuple(
            [cst.Element(cst.Name(ITERATION)), cst.Element(target)], lpar=[], rpar=[]
        )
        new_iter = cst.Call(func=cst.Name("enumerate"), args=[cst.Arg(statement.iter)])
        # enumerate counts from 0 over the slice; the probe wants the container index.
        index = f"{ITERATION} + {loop.start}" if loop.start else ITERATION
        if loop.start is not None and loop.start < 0:  # self.layers[-3:]: counted from the end
            index = f"{ITERATION} + len(self.{loop.container}) - {-loop.start}"
        probe = _probe_lines(site, index, tree)
        body = statement.body
        if isinstance(body, cst.SimpleStatementSuite):  # `for b in self.blocks: x = b(x)`
            first: list[cst.BaseStatement] = [cst.SimpleStatementLine(body=body.body)]
            new_suite = cst.IndentedBlock(body=[*first, *probe])
        else:
            assert isinstance(body, cst.IndentedBlock)
            new_suite = body.with_changes(body=[*body.body, *probe])
        return statement.with_changes(target=new_target, iter=new_iter, body=new_suite)

    def _probe_sequential(
        self, statement: cst.BaseStatement, site: ProbeSite, tree: cst.Module
    ) -> list[cst.BaseStatement]:
        """``h = self.seq(x)`` runs child by child, with a probe after each (``--depth 2``)."""
        call = match_sequential_call(statement)
        assert call is not None and isinstance(statement, cst.SimpleStatementLine)
        assign = statement.body[0]
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        if site.nested:
            # One call a statement, each child by its place (``self.blocks[1][0]``), the
            # probe naming it so: ``"1.0"``.
            func = assign.value.func
            if isinstance(func, cst.Subscript):  # self.blocks[2:]: the places are absolute
                func = func.value
            base = tree.code_for_node(func)
            lines = [_statement(f"{call.target} = {call.argument}\n", tree)]
            for place in site.nested:
                child = base + "".join(f"[{index}]" for index in place)
                lines.append(_statement(f"{call.target} = {child}({call.target})\n", tree))
                key = repr(".".join(str(index) for index in place)) if len(place) > 1 else place[0]
                lines.extend(_probe_lines(site, str(key), tree))
            return lines
        container = tree.code_for_node(assign.value.func)
        index = f"{ITERATION} + {call.start}" if call.start else ITERATION
        loop = _statement(
            f"for {ITERATION}, {CHILD} in enumerate({container}):\n"
            f"    {call.target} = {CHILD}({call.target})\n",
            tree,
        )
        assert isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)
        probed = loop.with_changes(
            body=loop.body.with_changes(body=[*loop.body.body, *_probe_lines(site, index, tree)])
        )
        return [_statement(f"{call.target} = {call.argument}\n", tree), probed]


def insert_probes(
    module: cst.Module, class_name: str, sites: Sequence[ProbeSite], filename: str
) -> tuple[cst.Module, tuple[str, ...]]:
    """Run :class:`InsertProbesCommand`; the instrumented module and the warnings it gave."""
    context = CodemodContext(filename=filename)
    probed = InsertProbesCommand(context, class_name, sites).transform_module(module)
    return probed, tuple(context.warnings)


def probed_forward_source(
    module: cst.Module, class_name: str, sites: Sequence[ProbeSite], filename: str
) -> tuple[str, tuple[str, ...]]:
    """Source of ``class <class_name>:`` holding only the instrumented forward.

    Bases, decorators of the class and its other members are dropped: the
    profiler takes the forward function from it and binds it to the user's
    live model, so only the function matters. The class statement itself is
    kept so that name mangling and zero-argument ``super()`` compile as in the
    original. Returns the source and the warnings of the transformation (empty
    source when it changed nothing).
    """
    probed, warnings = insert_probes(module, class_name, sites, filename)
    if warnings:
        return "", warnings
    forward = find_forward(probed, class_name, filename).forward
    shell = cst.ClassDef(
        name=cst.Name(class_name),
        body=cst.IndentedBlock(body=[forward.with_changes(leading_lines=())]),
    )
    return probed.with_changes(body=[shell], header=(), footer=()).code, ()

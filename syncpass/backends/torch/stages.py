"""The torch backend's eager form: the plan written out as one ``PipelineStage`` module per stage.

The hooks of ``--backend torch_stages`` (its spec is
:data:`syncpass.backends.torch.backend.STAGES_BACKEND`). It leaves the model's
class and ``forward`` as they are and writes, after the class, a subclass per stage whose ``forward`` is that
stage's slice of the original statements (:mod:`syncpass.transformers.torch_stages`).
``syncpass run`` builds each rank's stage with ``Stage<k>.of(model)`` and runs it
under ``torch.distributed.pipelining.PipelineStage`` and torch's schedules:
nothing is traced or exported, so any Python the forward runs eagerly runs in a
stage too.

The forward it plans is the one :func:`expand_source` gives: the model's own
methods and a submodule holding the layer stack inlined
(:mod:`syncpass.frontend.inline`), and for a model class that inherits its forward,
the base's forward read from source with the class's overrides
(:mod:`syncpass.frontend.bases`). This module decides what each stage's code
holds (:func:`stage_codes`), from the op graph and the plan's sync sites:

* **what crosses a sync point**: every value defined before it and used after
  it, as the analysis finds it; a value needed further on is sent on by each
  stage in between (so values may reach any later stage, and the planner
  knows it: :attr:`Backend.carries_values`);
* **what is not sent**: the model's parameters with a constant default
  (``output_hidden_states: bool = False``) and ``**kwargs`` are declared again,
  with the same default, by every later stage that reads them (torch's
  schedules give a later stage nothing but what the stage before sends); a
  local computed only from those (``all_hidden_states = () if output_hidden_states
  else None``) is computed again, by the same statement, in each stage that
  needs it;
* **what the profile saw** (``cuts[].kinds``): a Python number crosses as a 0-d
  tensor and is turned back in the next stage, a value that was ``None`` is set
  to ``None`` by the stage that reads it, anything else that is no tensor is an
  error at the sync point;
* **what a stage holds**: the submodules, parameters and buffers its
  statements reach through ``self`` (also through the model's own methods it
  calls), and of a layer container only the layers its ops run; everything
  else is ``None`` in the stage.

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from syncpass.backends.torch.analysis import analyse as analyse_traced
from syncpass.backends.torch.rewrite import strip_sync_points as strip_pipe_splits
from syncpass.contracts.costs import pytree_leaves, same_tensor_as
from syncpass.contracts.graph import Cut, Op, OpGraph, Replayable, SourceLocation
from syncpass.core.errors import SyncpassError
from syncpass.frontend.analysis import (
    DICT_VIEWS,
    enumerated_index_loop,
    find_forward,
    loop_key,
    match_container_loop,
    match_sequential_call,
    method_of,
    model_class_names,
    recordable_loop,
    recorded_loop_comment,
    while_index_loop,
)
from syncpass.frontend.bases import Ancestry, SourceClass, read_ancestry
from syncpass.frontend.branches import (
    PASSED,
    FoldedBranch,
    ValueLookup,
    module_helpers,
    no_values,
    one_returned_expression,
    recorded_values,
)
from syncpass.frontend.inline import (
    ModuleClasses,
    SourceLines,
    inline_own_methods,
    mentioned_names,
    opaque_decorators,
)
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.common import CheckpointSite, SyncSite
from syncpass.transformers.torch_stages import (
    STAGES_COMMENT,
    StageCode,
    insert_stages,
    method_bodies,
    remove_stages,
    self_paths,
    split_forward,
    stage_class_name,
    tensor_count,
    tested_self_paths,
)


@dataclass(frozen=True)
class ExpandedSource:
    """The user's source and the forward the eager form plans from it.

    ``base`` is the text without the stages (or ``pipe_split()`` calls) syncpass
    wrote, ``module`` its tree (where the stages go); ``expanded`` is that tree with
    each model class's own methods inlined into its forward
    (:mod:`syncpass.frontend.inline`), ``inlined`` the calls inlined and ``branches``
    the ``if`` statements decided (:mod:`syncpass.frontend.branches`), by class.
    ``inherited`` names, for a class that inherits its forward, the base class that
    defines it and that class's file (what the profile checks the built model runs).
    """

    base: str
    module: cst.Module
    expanded: cst.Module
    inlined: dict[str, tuple[str, ...]]
    branches: dict[str, tuple[FoldedBranch, ...]]
    inherited: dict[str, InheritedForward] = dataclasses.field(default_factory=dict)
    # Per class, per statement of its expanded forward: the file it is in ("" for the
    # user's) and its line there (:func:`at_user_lines`).
    lines: dict[str, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)


def at_user_lines(graph: OpGraph, source: ExpandedSource) -> OpGraph:
    """``graph`` (built from the expanded module, whose lines are its own) with each op and
    region where its statement is in the file the user wrote: a statement inlined from a
    method at that method's line (in its own file, for a base class of another module),
    one the expansion wrote (an argument bound) at the line before it."""
    lines = source.lines.get(graph.model_class, ())
    if not lines:
        return graph
    filled: list[tuple[str, int]] = []
    for file, line in lines:
        filled.append((file, line) if line or not filled else filled[-1])

    def moved(location: SourceLocation, statement: int) -> SourceLocation:
        if statement >= len(filled) or not filled[statement][1]:
            return location
        file, line = filled[statement]
        return dataclasses.replace(location, path=file or location.path, line=line)

    ops = tuple(
        dataclasses.replace(op, location=moved(op.location, op.statement)) for op in graph.ops
    )
    statements = {op.location: op.statement for op in graph.ops if op.region is not None}
    regions = []
    for region in graph.regions:
        statement = statements.get(region.location)
        if statement is None:
            regions.append(region)
            continue
        location = moved(region.location, statement)
        end = region.end_line + location.line - region.location.line
        regions.append(dataclasses.replace(region, location=location, end_line=end))
    return dataclasses.replace(graph, ops=ops, regions=tuple(regions))


@dataclass(frozen=True)
class InheritedForward:
    """A model class's forward defined by a base class: its name and file."""

    class_name: str
    file: Path


def import_roots() -> tuple[Path, ...]:
    """Where a base class's module is looked for (after the model file's folder): the
    folders of ``sys.path``, the current one for ``""``."""
    return tuple(Path(entry) if entry else Path.cwd() for entry in sys.path)


def _ancestry(classes: ModuleClasses, name: str, path: str) -> tuple[Ancestry, SourceClass] | None:
    """The bases of the model class ``name``, read from source, and the one whose forward it
    runs, when it inherits its forward (``None`` when it defines it, or is not in the file)."""
    module = classes.module
    where = classes.positions.get(name, ())
    classdef = module.body[where[0]] if where else None
    if not isinstance(classdef, cst.ClassDef) or method_of(classdef) is not None:
        return None
    ancestry = read_ancestry(module, name, path, import_roots())
    found = ancestry.method("forward")
    if isinstance(found, str):
        raise SyncpassError(f"class {name} has no forward method: {found}", ancestry.model.where)
    return ancestry, found[0]


def expand_source(
    text: str,
    path: str,
    class_name: str | None,
    values: ValueLookup = no_values,
    values_of: str | None = None,
) -> ExpandedSource:
    """What the eager form plans and profiles of ``text`` (:class:`ExpandedSource`);
    ``values`` answers the settings (``self.config.return_dict``) of the built model, of
    class ``values_of``, that decide branches (:mod:`syncpass.frontend.branches`): the
    other classes' forwards are expanded without them."""
    stripped, parsed = _without_stages(text, path)
    base = strip_pipe_splits(stripped, path, class_name)
    module = parsed if parsed is not None and base is stripped else parse_source(base, path)
    expanded = module
    inlined = {}
    branches = {}
    inherited = {}
    statement_lines: dict[str, tuple[tuple[str, int], ...]] = {}
    # Every model class's forward is expanded: which one is the model is the analysis's to
    # say (from --model, the cost file or the example), and the others' code is never run.
    lines = SourceLines(module)
    classes = ModuleClasses.of(module)
    expanded_classes = classes
    for name in [class_name] if class_name is not None else model_class_names(module):
        known = values if name == values_of else no_values
        found = _ancestry(classes, name, path)
        ancestry = found[0] if found is not None else None
        result = inline_own_methods(
            expanded,
            name,
            lines,
            values=known,
            ancestry=ancestry,
            classes=expanded_classes,
            originals=classes,
        )
        if result.module is not expanded:
            expanded_classes = ModuleClasses.of(result.module)
        expanded, inlined[name], branches[name] = result.module, result.methods, result.branches
        if result.lines:
            statement_lines[name] = result.lines
        elif expanded is not module:  # another class's expansion above it moved its lines
            statement_lines[name] = _own_lines(expanded, name, lines)
        looped = _index_loops_enumerated(expanded, name)
        looped = annotate_recorded_loops(looped, name, _recorded_in(known))
        if looped is not expanded:
            expanded, expanded_classes = looped, ModuleClasses.of(looped)
        if found is not None:
            owner = found[1]
            inherited[name] = InheritedForward(owner.name, Path(path).parent / owner.file.path)
    return ExpandedSource(base, module, expanded, inlined, branches, inherited, statement_lines)


def _own_lines(
    module: cst.Module, name: str, lines: Callable[[cst.CSTNode], int]
) -> tuple[tuple[str, int], ...]:
    """The user's line of each statement of class ``name``'s forward in ``module``, where
    the expansion left it as written (another class's expansion above it moved it)."""
    found = ModuleClasses.of(module).single(name)
    forward = method_of(found[1]) if found is not None else None
    if forward is None or not isinstance(forward.body, cst.IndentedBlock):
        return ()
    return tuple(("", lines(statement)) for statement in forward.body.body)


def _recorded_in(values: ValueLookup) -> Callable[[int], object]:
    """The container the settings ``values`` record for the loop at each statement."""
    return lambda index: values(loop_key(index))


def _with_forward_body(
    module: cst.Module,
    name: str,
    rewrite: Callable[[list[cst.BaseStatement], cst.FunctionDef], list[cst.BaseStatement]],
) -> cst.Module:
    """``module`` with class ``name``'s forward (the last one defined: the one Python runs)
    given the body ``rewrite`` makes of its statements; ``module`` itself when that changes
    no statement, or there is no such indented forward."""
    for position, statement in enumerate(module.body):
        if not (isinstance(statement, cst.ClassDef) and statement.name.value == name):
            continue
        members = list(statement.body.body)
        for place in reversed(range(len(members))):
            forward = members[place]
            if isinstance(forward, cst.FunctionDef) and forward.name.value == "forward":
                break
        else:
            return module
        assert isinstance(forward, cst.FunctionDef)
        if not isinstance(forward.body, cst.IndentedBlock):
            return module
        body = rewrite(list(forward.body.body), forward)
        if all(new is old for new, old in zip(body, forward.body.body, strict=True)):
            return module
        members[place] = forward.with_changes(body=forward.body.with_changes(body=body))
        classdef = statement.with_changes(body=statement.body.with_changes(body=members))
        return module.with_changes(
            body=[*module.body[:position], classdef, *module.body[position + 1 :]]
        )
    return module


def annotate_recorded_loops(
    module: cst.Module, name: str, containers: Callable[[int], object]
) -> cst.Module:
    """``module`` with each top-level loop of class ``name``'s forward that ``containers``
    (by statement) says runs one layer of a container an iteration
    (:mod:`syncpass.backends.torch.census`) marked so on its header
    (:func:`recorded_loop_comment`); ``module`` itself when there is none."""

    def marked(body: list[cst.BaseStatement], _: cst.FunctionDef) -> list[cst.BaseStatement]:
        for index, line in enumerate(body):
            container = containers(index)
            if not isinstance(container, str) or not isinstance(line, cst.For):
                continue
            if not recordable_loop(line) or not isinstance(line.body, cst.IndentedBlock):
                continue
            # After the user's own comment (a `# noqa`), if the header has one.
            own = line.body.header.comment
            written = recorded_loop_comment(container)
            comment = cst.Comment(written if own is None else f"{own.value}  {written}")
            header = line.body.header.with_changes(
                whitespace=line.body.header.whitespace if own else cst.SimpleWhitespace("  "),
                comment=comment,
            )
            body[index] = line.with_changes(body=line.body.with_changes(header=header))
        return body

    return _with_forward_body(module, name, marked)


def _index_loops_enumerated(module: cst.Module, name: str) -> cst.Module:
    """``module`` with each top-level loop of class ``name``'s forward that runs a layer
    container by index (``for i in range(len(self.layers)): x = self.layers[i](x)``, or
    the same as a ``while`` stepping ``i``) written as the layer loop it is
    (:func:`enumerated_index_loop`, :func:`while_index_loop`), so that the stages run it
    over slices; ``module`` itself when there is none."""

    def looped(lines: list[cst.BaseStatement], forward: cst.FunctionDef) -> list[cst.BaseStatement]:
        names = mentioned_names([forward])
        return [
            (enumerated_index_loop(line, names) or line)
            if isinstance(line, cst.For)
            else (while_index_loop(lines[place - 1], line, lines[place + 1 :], names) or line)
            if isinstance(line, cst.While) and place > 0
            else line
            for place, line in enumerate(lines)
        ]

    return _with_forward_body(module, name, looped)


def expand_text(text: str, path: str, class_name: str | None) -> str:
    """The source the eager form estimates (no model built): the expanded module's code."""
    code: str = expand_source(text, path, class_name).expanded.code
    return code


def check_branches(
    model: object,
    inputs: tuple[object, ...],
    source: ExpandedSource,
    path: str,
    class_name: str | None,
) -> None:
    """What the decided branches of ``source``'s model assumed, checked on the built
    ``model`` and the example's positional ``inputs``: an attribute other than
    ``__init__`` sets it, or a parameter whose default was assumed that the example
    passes with another value (``None`` for a ``None`` default is the default), is an
    error at the ``if``."""
    for branch in source.branches.get(class_name or type(model).__name__, ()):
        taken = "no" if branch.taken == "none" else f"the {branch.taken}"
        where = branch.where(path)
        for default in branch.defaults:
            if default.position is not None and default.position < len(inputs):
                given = inputs[default.position]
                if default.value is PASSED and given is not None:
                    continue  # decided with what the example passes
                if given is default.value or (
                    type(given) is type(default.value) and given == default.value
                ):
                    continue
                raise SyncpassError(
                    f"the stages run {taken} branch of `if {branch.test}:`, decided with "
                    f"{default.name} = {default.value!r} (its default), but the example passes "
                    f"{default.name}: pass only the inputs before it, or move the choice out "
                    "of the forward",
                    where,
                )
        for assumed in branch.assumed:
            value = getattr(model, assumed.name, None)
            if type(value) is type(assumed.value) and value == assumed.value:
                continue
            raise SyncpassError(
                f"the stages run {taken} branch of `if {branch.test}:`, decided with "
                f"self.{assumed.name} = {assumed.value!r} as __init__ sets it, but the model "
                f"has {value!r}: build the model with self.{assumed.name} as __init__ leaves "
                "it, or move the choice out of the forward",
                where,
            )


def analyse(text: str, path: str, known: KnownOps, class_name: str | None) -> ModelSource:
    """The model of ``text`` as the eager form plans it: its forward with the model's own
    methods inlined, without the stages (or ``pipe_split()`` calls) syncpass wrote.

    The returned ``module`` is the user's source (where the stages go); ``handle``
    holds the expanded one (where their statements come from).
    """
    settings = recorded_values(known.settings)
    source = expand_source(text, path, class_name, settings, known.model or class_name)
    if source.expanded is source.module:
        # No class changed: the expanded module is the parsed base itself, analysed as it
        # is rather than printed and parsed again (a second round trip of the whole file).
        planned = analyse_traced(source.base, path, known, class_name, source.module)
    else:
        planned = analyse_traced(source.expanded.code, path, known, class_name)
    model = planned.graph.model_class
    graph = dataclasses.replace(
        at_user_lines(planned.graph, source),
        inlined=source.inlined.get(model, ()),
        branches=tuple(branch.describe(path) for branch in source.branches.get(model, ())),
        cuts=_sent_at_cuts(planned.graph, find_forward(source.expanded, model, path).forward),
    )
    return ModelSource(
        text=text, base=source.base, module=source.module, graph=graph, handle=source.expanded
    )


def written_cuts(text: str, path: str, source: ModelSource) -> tuple[str, ...]:
    """The op ids after which the stage classes in ``text`` cut ``source``'s graph (the file's
    model analysed, :func:`analyse`): where each stage but the last ends."""
    graph = source.graph
    model = graph.model_class
    classes = {
        statement.name.value: statement
        for statement in parse_source(text, path).body
        if isinstance(statement, cst.ClassDef)
    }
    planned = _planned(source)
    forward = find_forward(planned, model, path).forward
    assert isinstance(forward.body, cst.IndentedBlock)
    by_code = {planned.code_for_node(s).strip(): i for i, s in enumerate(forward.body.body)}
    cuts = []
    index = 0
    while f"{stage_class_name(model, index + 1)}" in classes:
        stage = classes[stage_class_name(model, index)]
        method = next(
            member
            for member in stage.body.body
            if isinstance(member, cst.FunctionDef) and member.name.value == "forward"
        )
        assert isinstance(method.body, cst.IndentedBlock)
        last = method.body.body[-2] if len(method.body.body) > 1 else method.body.body[-1]
        cuts.append(_last_op(last, planned, by_code, graph, path))
        index += 1
    return tuple(cuts)


def _last_op(
    statement: cst.BaseStatement,
    module: cst.Module,
    by_code: dict[str, int],
    graph: OpGraph,
    path: str,
) -> str:
    """The id of the last op ``statement`` (a stage's last before its ``return``) runs."""
    if module.code_for_node(statement).strip() not in by_code:
        statement = _unannotated(statement)
    loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
    sequential = match_sequential_call(statement)
    ranged = loop or sequential
    if ranged is not None:
        # The last op of the container's last item run: the item itself, or the last child
        # of a nested nn.Sequential planned per child (``self.blocks[:2]`` ends in blocks.1.3).
        ran: dict[int, str] = {}
        for op in graph.ops:
            if op.loop is None:
                continue
            item = f"{op.loop.container}.{op.loop.index}"
            head = item.removeprefix(ranged.container + ".").partition(".")[0]
            if item.startswith(ranged.container + ".") and head.isdigit():
                ran[int(head)] = op.id
        size = dict(graph.containers).get(ranged.container, max(ran, default=-1) + 1)
        iterations = range(size)[ranged.start : ranged.stop]
        if iterations and iterations[-1] in ran:
            return ran[iterations[-1]]
    found = by_code.get(module.code_for_node(statement).strip())
    ops = [op for op in graph.ops if op.statement == found]
    if found is None or not ops:
        raise SyncpassError(
            "a stage class ends with a statement that is not one of the model's forward: "
            "the stages were edited, or written for another version of the model; "
            "run syncpass rewrite again",
            path,
        )
    return ops[-1].id


def _unannotated(statement: cst.BaseStatement) -> cst.BaseStatement:
    """``x: torch.Tensor = value`` as ``x = value``, the forward's line a typed stage
    declares the one value it sends on (where the forward's own line is not annotated)."""
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.AnnAssign)
        and statement.body[0].value is not None
    ):
        annotated = statement.body[0]
        assert annotated.value is not None
        plain = cst.Assign(targets=[cst.AssignTarget(annotated.target)], value=annotated.value)
        return statement.with_changes(body=[plain])
    return statement


def _without_stages(text: str, path: str) -> tuple[str, cst.Module | None]:
    """:func:`strip`, and the tree of what it returns when it parsed ``text`` to take the
    stages out: the file with the stage classes removed, whose code is that text (the
    ``--check`` of a rewritten file reads it from there rather than parsing it again)."""
    if STAGES_COMMENT not in text:
        return text, None
    module = remove_stages(parse_source(text, path))
    stripped: str = module.code
    return stripped, module


def strip(text: str, path: str, class_name: str | None = None) -> str:
    """``text`` without the stage classes syncpass wrote (unchanged if there are none)."""
    if STAGES_COMMENT not in text:
        return text
    stripped: str = remove_stages(parse_source(text, path)).code
    return stripped


def remove(module: cst.Module, source: ModelSource, path: str) -> str:
    """The code of ``module`` without the stage classes syncpass wrote.

    When what is left is ``source``'s own tree, statement for statement (the same
    nodes, and the same header, footer and settings), its code is ``source.base``
    without printing it: the tree is the one ``base`` was parsed into, and printing
    is a function of the tree. Anything else is printed and compared as it is."""
    stripped = remove_stages(module)
    if _same_nodes(stripped, source.module):
        return source.base
    code: str = stripped.code
    return code


def _same_nodes(one: cst.Module, other: cst.Module) -> bool:
    """Whether two modules hold the very same statement nodes and equal module fields."""
    if len(one.body) != len(other.body) or any(
        a is not b for a, b in zip(one.body, other.body, strict=True)
    ):
        return False
    return all(
        getattr(one, field.name) == getattr(other, field.name)
        for field in dataclasses.fields(cst.Module)
        if field.name != "body"
    )


def insert(
    source: ModelSource,
    sites: Sequence[SyncSite],
    path: str,
    checkpoints: Sequence[CheckpointSite] = (),
) -> tuple[cst.Module, tuple[str, ...]]:
    """``source``'s module with one stage class per stage of the plan after the model, the
    ops of ``checkpoints`` recomputing in their stage's backward."""
    if not sites and not checkpoints:
        return source.module, ()
    _refuse_opaque_decorators(source, path)
    try:
        codes = stage_codes(source, sites, path)
    except SyncpassError as error:
        return source.module, (error.message,)
    return insert_stages(
        source.module,
        source.graph.model_class,
        sites,
        codes,
        path,
        _planned(source),
        checkpoints,
        dict(source.graph.containers),
    )


def _refuse_opaque_decorators(source: ModelSource, path: str) -> None:
    """Stop at a decorator of the model's forward that the stages would leave out: each
    stage runs a slice of the forward's statements, so what a wrapper does around the whole
    call (Hugging Face's ``@filter_output_hidden_states`` sets ``output_hidden_states``
    first and filters the output after) happens in none of them, and the split would
    compute something else than the model the profile ran."""
    model = source.graph.model_class
    planned = find_forward(_planned(source), model, path).forward
    opaque = opaque_decorators(planned)
    if not opaque:
        return
    where = path
    try:
        written = find_forward(source.module, model, path).forward
    except SyncpassError:  # the forward is inherited: its decorators are the base's
        written = None
    if written is not None and written.decorators:
        where = f"{path}:{SourceLines(source.module)(written.decorators[0])}"
    named = ", ".join(f"@{cst.Module([]).code_for_node(d.decorator)}" for d in opaque)
    raise SyncpassError(
        f"{model}.forward is wrapped in {named}, which the stages cannot run: each stage "
        "runs a slice of the forward's statements, and what a decorator does around the "
        "whole call would happen in none of them. Split the module the forward calls "
        "(the base model it wraps) or a subclass whose forward is not decorated",
        where,
    )


def _planned(source: ModelSource) -> cst.Module:
    """The module whose forward the graph was built from (the expanded one)."""
    return source.handle if isinstance(source.handle, cst.Module) else source.module


def _cut_positions(graph: OpGraph, sites: Sequence[SyncSite]) -> list[int]:
    """For each site, the number of ops before it (in graph order)."""
    positions = []
    for site in sites:
        found = None
        for position, op in enumerate(graph.ops):
            if op.statement != site.statement:
                continue
            place = None if site.split_after is None else (site.split_after, *site.split_inside)
            if place is None or (op.loop is not None and op.loop.path[: len(place)] == place):
                found = position + 1
        if found is None:
            raise SyncpassError(f"no op of the forward is at the planned site {site}")
        positions.append(found)
    return positions


def _constant_default(param: cst.Param) -> bool:
    """A default no caller would pass a tensor for: a number, a string, True or False."""
    value = param.default
    if isinstance(value, cst.UnaryOperation):
        value = value.expression
    return isinstance(value, (cst.Integer, cst.Float, cst.SimpleString)) or (
        isinstance(value, cst.Name) and value.value in ("True", "False")
    )


#: Values a stage sends packed as tensors and its successor unpacks: Python numbers as 0-d
#: tensors, tuples of ints as 1-d ones (and ``tensors:N``, a tuple sent as its tensors).
PACKED_KINDS = ("int", "float", "bool", "ints", "size")


def _need_torch(module: cst.Module, name: str, op: Op) -> None:
    """The stages send a number as ``torch.as_tensor(...)``: the file must import torch."""
    imports_torch = any(
        isinstance(statement, cst.SimpleStatementLine)
        and any(
            isinstance(small, cst.Import)
            and any(
                isinstance(alias.name, cst.Name)
                and alias.name.value == "torch"
                and alias.asname is None
                for alias in small.names
            )
            for small in statement.body
        )
        for statement in module.body
    )
    if not imports_torch:
        raise SyncpassError(
            f"{name} (a Python number or shape) crosses the sync point after {op.id}: the stages "
            "send it as torch.as_tensor(...), which needs `import torch` in the file",
            str(op.location),
        )


def _unsent_params(forward: cst.FunctionDef) -> set[str]:
    """The forward's parameters a later stage declares again instead of receiving."""
    params = forward.params
    names = {
        param.name.value
        for param in (*params.posonly_params, *params.params, *params.kwonly_params)
        if param.default is not None and _constant_default(param)
    }
    if isinstance(params.star_kwarg, cst.Param):
        names.add(params.star_kwarg.name.value)
    return names


def _unsent_at(before: int, ops: Sequence[Op], unsent: set[str]) -> set[str]:
    """The unsent parameters that still hold what the caller passed after the first
    ``before`` ops: a parameter the forward assigns (``output_hidden_states = ... or
    self.config.output_hidden_states``, ``kwargs = {**kwargs, ...}``) is a local from
    there on, sent or computed again like any other."""
    assigned = {name for op in ops[:before] for name in op.writes}
    return unsent - assigned


@dataclass(frozen=True)
class _Replay:
    """How a later stage computes a value again instead of receiving it: the top-level
    ``statements`` that compute it (its own, then what it reads), and what it ``needs``
    received to run them (what an alias names: ``kwargs = {"position_ids": position_ids,
    **kwargs}`` needs ``position_ids``)."""

    statements: tuple[int, ...]
    needs: tuple[str, ...] = ()


def _replay(
    name: str, before: int, ops: Sequence[Op], unsent: set[str], receiving: bool = False
) -> _Replay | None:
    """How ``name`` is computed again after the first ``before`` ops, or ``None`` when it must
    be sent (a model input the forward has not assigned, or a value computed from tensors).

    The statements that compute it (outside loops and regions) run again, with those of
    what they read that are computed again in turn: one, or several that each build on the
    last (x-transformers' ``layer_variables = (self.layer_types, ..., self.layers, ...)``,
    then reordered by ``layer_variables = tuple(... for layer_variable in
    layer_variables)``). A value computed from the unsent
    parameters alone is computed again; so is an alias (``Op.alias``: it computes nothing),
    from what it names, received (``needs``), when those still hold what they held at the
    alias. With ``receiving``, any statement may read values received so: how the stage
    after *could* compute ``name`` again, which the plan weighs against sending it
    (:func:`_chosen_replay`)."""
    writers = [op for op in ops[:before] if name in op.writes]
    if not writers or any(op.region is not None or op.loop is not None for op in writers):
        return None
    if len(writers) > 1 and any(op.alias for op in writers):
        return None
    statements: list[int] = []
    needs: list[str] = []
    for order, writer in enumerate(writers):
        statements.append(writer.statement)
        position = ops.index(writer)
        for read in writer.reads:
            if read == name and order > 0:
                continue  # what the writer before made, run again too
            if read in _unsent_at(position, ops, unsent):
                continue
            inner = _replay(read, position, ops, unsent)
            if inner is not None and (writer.alias or not inner.needs):
                statements.extend(inner.statements)
                needs.extend(inner.needs)
            elif (writer.alias or receiving) and not any(
                read in op.writes for op in ops[position + 1 : before]
            ):
                needs.append(read)
            else:
                return None
    return _Replay(tuple(dict.fromkeys(statements)), tuple(dict.fromkeys(needs)))


@dataclass(frozen=True)
class _Crossing:
    """How the values live at a cut reach the stage after it: parameters it ``declared``
    again, values it computes again (``replayed``), and what the stage before sends it
    (``received``: the values no stage can compute again, and what the replays need)."""

    declared: tuple[str, ...]
    replayed: tuple[tuple[str, _Replay], ...]
    received: tuple[str, ...]


def _crossing(live: Sequence[str], before: int, ops: Sequence[Op], unsent: set[str]) -> _Crossing:
    declared_here = _unsent_at(before, ops, unsent)
    declared: list[str] = []
    replayed: dict[str, _Replay] = {}
    received: list[str] = []
    pending = list(live)
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        replay = None if name in declared_here else _replay(name, before, ops, unsent)
        if name in declared_here:
            declared.append(name)
        elif replay is None:
            received.append(name)
        else:
            replayed[name] = replay
            pending.extend(replay.needs)
    return _Crossing(tuple(declared), tuple(replayed.items()), tuple(received))


def sent_across_cuts(graph: OpGraph, expanded: str, path: str) -> OpGraph:
    """``graph`` (of the forward in ``expanded``, as :func:`expand_text` gives it) with what
    the stages send across each cut: what the profile measures there."""
    forward = find_forward(parse_source(expanded, path), graph.model_class, path).forward
    return dataclasses.replace(graph, cuts=_sent_at_cuts(graph, forward))


def _sent_at_cuts(graph: OpGraph, forward: cst.FunctionDef) -> tuple[Cut, ...]:
    """The graph's cuts with what the stages send across each (:func:`_crossing`), and
    which of it the stage after could compute again instead (:func:`_replay`)."""
    unsent = _unsent_params(forward)
    positions = {op.id: position + 1 for position, op in enumerate(graph.ops)}
    cuts = []
    for cut in graph.cuts:
        before = positions[cut.after]
        received = _crossing(cut.live, before, graph.ops, unsent).received
        replayable = []
        for name in received:
            replay = _replay(name, before, graph.ops, unsent, receiving=True)
            if replay is None or name in replay.needs:
                continue
            statements = set(replay.statements)
            ops = tuple(op.id for op in graph.ops[:before] if op.statement in statements)
            replayable.append(Replayable(name, ops, replay.needs))
        cuts.append(dataclasses.replace(cut, sent=received, replayable=tuple(replayable)))
    return tuple(cuts)


#: A submodule's own method by its path from the model (``encoder.get_rel_embedding``):
#: the submodule's path and the method, or ``None`` when the path names none.
SubmoduleMethod = Callable[[str], "tuple[str, cst.FunctionDef] | None"]


def _reach(
    paths: Sequence[str],
    methods: dict[str, cst.FunctionDef],
    seen: set[str],
    submodule_method: SubmoduleMethod | None = None,
) -> tuple[list[str], bool]:
    """``paths`` with the paths the model's own methods among them reach, and those a
    submodule's own method reaches (DeBERTa's ``self.encoder.get_rel_embedding()`` reads
    ``self.rel_embeddings`` of the encoder), methods left out."""
    reached: list[str] = []
    bare = False
    for path in paths:
        head = path.split(".")[0]
        if head in methods:
            if head not in seen:
                seen.add(head)
                inner, inner_bare = self_paths([methods[head].body])
                more, more_bare = _reach(inner, methods, seen, submodule_method)
                reached.extend(more)
                bare = bare or inner_bare or more_bare
            continue
        found = submodule_method(path) if submodule_method is not None else None
        if found is not None:
            if path not in seen:
                seen.add(path)
                owner, method = found
                inner, _ = self_paths([method.body])  # `self` there is the submodule
                more, _ = _reach(
                    [f"{owner}.{inner_path}" for inner_path in inner], {}, seen, submodule_method
                )
                reached.extend(more)
            continue
        reached.append(path)
    return reached, bare


def _submodule_methods(module: cst.Module, model_class: str) -> SubmoduleMethod:
    """The lookup of submodules' methods: the class of each submodule along a path is the
    one ``__init__`` builds it from (``self.encoder = DebertaV2Encoder(config)``, a class
    of the file), and the path's last part a method that class defines."""
    classes = {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, cst.ClassDef)
    }
    built = m.Assign(
        targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name()))],
        value=m.Call(func=m.Name()),
    )

    def child_class(classdef: cst.ClassDef, name: str) -> cst.ClassDef | None:
        init = method_of(classdef, "__init__")
        for assign in m.findall(init, built) if init is not None else ():
            assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
            target, func = assign.targets[0].target, assign.value.func
            assert isinstance(target, cst.Attribute) and isinstance(func, cst.Name)
            if target.attr.value == name and func.value in classes:
                return classes[func.value]
        return None

    def lookup(path: str) -> tuple[str, cst.FunctionDef] | None:
        *owner, name = path.split(".")
        classdef = classes.get(model_class)
        for part in owner:
            classdef = child_class(classdef, part) if classdef is not None else None
        method = method_of(classdef, name) if classdef is not None and owner else None
        return (".".join(owner), method) if method is not None else None

    return lookup


def stage_codes(source: ModelSource, sites: Sequence[SyncSite], path: str) -> list[StageCode]:
    """What each stage's code takes, sends, computes again and holds (module docstring)."""
    graph = source.graph
    ordered = sorted(sites, key=lambda site: site.stage)
    positions = _cut_positions(graph, ordered)
    bounds = [0, *positions, len(graph.ops)]
    planned = _planned(source)
    forward = find_forward(planned, graph.model_class, path).forward
    unsent = _unsent_params(forward)
    methods = method_bodies(planned, graph.model_class)
    submodule_method = _submodule_methods(planned, graph.model_class)
    pieces, warnings = split_forward(planned, graph.model_class, ordered, path)
    if warnings or len(pieces) != len(bounds) - 1:
        raise SyncpassError("; ".join(warnings) or "the forward does not cut at the planned sites")
    statements = list(forward.body.body) if isinstance(forward.body, cst.IndentedBlock) else []

    defaults: list[tuple[str, ...]] = [()]
    replays: list[tuple[int, ...]] = [()]
    receives: list[list[str]] = [[]]
    for number, (site, position) in enumerate(zip(ordered, positions, strict=True), start=1):
        reads = set(mentioned_names(pieces[number]))
        declared: list[str] = []
        again: list[int] = []
        crossing = _crossing(site.values, position, graph.ops, unsent)
        replayed = [(name, replay) for name, replay in crossing.replayed if name in reads]
        # A later stage that reads a value computed from constants computes it itself;
        # what the plan chose to compute again rather than send, this stage computes.
        replayed += [
            (name, _chosen_replay(name, position, graph.ops, unsent)) for name in site.recomputed
        ]
        needed: list[str] = []
        for _name, replay in replayed:
            again.extend(replay.statements)
            reads.update(replay.needs)
            needed.extend(replay.needs)
            declared.extend(
                read
                for index in replay.statements
                for op in graph.ops
                if op.statement == index
                for read in op.reads
                if read in unsent
            )
        declared.extend(name for name in crossing.declared if name in reads)
        receives.append(
            list(
                dict.fromkeys(
                    [
                        *(name for name in crossing.received if name not in site.recomputed),
                        *(name for name in needed if name not in declared),
                    ]
                )
            )
        )
        defaults.append(tuple(dict.fromkeys(declared)))
        replays.append(tuple(sorted(set(again))))
    _receive_what_is_sent(receives, defaults, replays, bounds, graph.ops)

    all_kinds = {name: kind for site in ordered for name, kind in site.kinds}
    takes: list[tuple[str, ...]] = [()]
    nones: list[tuple[str, ...]] = [()]
    own_devices: list[tuple[str, ...]] = [()]
    scalars: list[tuple[tuple[str, str], ...]] = [()]
    aliases: list[tuple[tuple[str, str], ...]] = [()]
    for number, (site, position) in enumerate(zip(ordered, positions, strict=True), start=1):
        reads = set(mentioned_names(pieces[number])) | set(receives[number])
        # A value live at the sync point that its kinds do not list was a tensor there, even
        # if it was None at an earlier one (a parameter the forward assigns: `if
        # inputs_embeds is None: inputs_embeds = self.wte(input_ids)`); another sync point's
        # kind stands only for what this one does not hold (a value a replay needs).
        live = set(site.values)
        kinds = {
            **{name: kind for name, kind in all_kinds.items() if name not in live},
            **dict(site.kinds),
        }
        sent: list[str] = []
        nothing: list[str] = []
        numbers: list[tuple[str, str]] = []
        devices: list[str] = []
        for name in receives[number]:
            kind = kinds.get(name)
            if kind == "unbound":
                continue  # held nothing when profiled: nothing to send, and nothing read it
            if kind == "none":
                if name in reads:  # None when profiled: nothing to send, the stage says so
                    nothing.append(name)
            elif kind == "device":
                if name in reads:  # each stage's own: the device its inputs are on
                    devices.append(name)
            elif kind is not None and tensor_count(kind) is not None:
                if any(leaf != "T" for leaf in pytree_leaves(kind) or ()):
                    _need_torch(source.module, name, graph.ops[position - 1])
                sent.append(name)
                numbers.append((name, kind))
            elif kind in PACKED_KINDS:
                assert kind is not None
                _need_torch(source.module, name, graph.ops[position - 1])
                sent.append(name)
                numbers.append((name, kind))
            elif kind == "other":
                op = graph.ops[position - 1]
                raise SyncpassError(
                    f"{name} crosses the sync point after {op.id} but was not a tensor when "
                    "profiled (a tuple, a string, an object): torch's PipelineStage sends only "
                    f"tensors; compute {name} again after the sync point, or from tensors",
                    str(op.location),
                )
            else:
                sent.append(name)
        packed = dict(numbers)
        if devices and not any(name not in packed for name in sent):
            op = graph.ops[position - 1]
            raise SyncpassError(
                f"{devices[0]} (a torch.device) crosses the sync point after {op.id}, and the "
                "stage after receives no tensor whose device it could take instead: move the "
                "sync point, or read the device off a tensor after it",
                str(op.location),
            )
        same = _sent_once(sent, dict(site.kinds))
        bound = {name for name, _ in same}
        takes.append(tuple(name for name in sent if name not in bound))
        nones.append(tuple(nothing))
        scalars.append(tuple(numbers))
        own_devices.append(tuple(devices))
        aliases.append(same)

    # A nested nn.Sequential planned per child: the containers that hold it are sliced by
    # the stages (self.blocks[2:]), and what they hold is the ops' to say, too.
    loop_containers = {
        container
        for op in graph.ops
        if op.loop is not None
        for container in (op.loop.container, *op.loop.zipped, op.loop.top, *op.loop.groups())
    }
    # A container a recorded loop runs a layer of per iteration is read whole by the
    # statements that build what the loop runs over (x-transformers' layer_variables):
    # the container, its layers as None but the stage's own.
    recorded = {
        found.container
        for statement in statements
        if isinstance(statement, cst.For)
        and (found := match_container_loop(statement)) is not None
        and found.recorded
    }
    paths_by_stage: list[list[str]] = []
    any_bare = False
    testers = none_testers(planned)
    shells_by_stage: list[tuple[str, ...]] = []
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        code = [*(statements[i] for i in replays[index]), *pieces[index]]
        paths, bare, tested = tested_self_paths(code, testers)
        shells_by_stage.append(tested)
        reached, reached_bare = _reach(paths, methods, set(), submodule_method)
        layers = [
            f"{container}.{op.loop.index}"
            for op in graph.ops[start:end]
            if op.loop is not None
            for container in (op.loop.container, *op.loop.zipped)
        ]
        counted = [
            _from_the_start(path, dict(graph.containers))
            for path in _unsliced(reached, loop_containers, recorded)
        ]
        # A container read whole that holds none of the stage's layers (the first stage of
        # x-transformers builds layer_variables and runs no layer): held with nothing in it.
        shells = [
            f"{container}.{OTHER_STAGES}"
            for container in recorded
            if container in reached
            and not any(layer.startswith(container + ".") for layer in layers)
        ]
        paths_by_stage.append(list(dict.fromkeys([*counted, *layers, *sorted(shells)])))
        any_bare = any_bare or bare or reached_bare
    if any_bare:
        # The forward hands `self` itself to something: any stage may reach anything.
        union = list(dict.fromkeys(path for paths in paths_by_stage for path in paths))
        paths_by_stage = [union for _ in paths_by_stage]
    # A module a stage only tests for None: held with nothing in it (its parameters are the
    # stage's that runs it), so that the test answers as the model's does.
    paths_by_stage = [
        [
            *holds,
            *(
                f"{path}.{ONLY_TESTED}"
                for path in only_tested
                if not any(path == k or path.startswith(k + ".") for k in holds)
            ),
        ]
        for holds, only_tested in zip(paths_by_stage, shells_by_stage, strict=True)
    ]

    codes = []
    count = len(bounds) - 1
    for index in range(count):
        sends = takes[index + 1] if index + 1 < count else ()
        comment = ""
        if index + 1 < count:
            numbered, _, rest = ordered[index].comment.partition(": ")
            recomputed = ordered[index].recomputed
            computes = (
                f"; the next stage computes {', '.join(recomputed)} again" if recomputed else ""
            )
            once = "".join(
                f"; {name} is {reference}, sent once" for name, reference in aliases[index + 1]
            )
            comment = f"{numbered}: sends {', '.join(sends) or 'nothing'}{once}{computes}; {rest}"
        codes.append(
            StageCode(
                index=index,
                takes=takes[index],
                defaults=defaults[index],
                replays=replays[index],
                sends=sends,
                keeps=_outermost(paths_by_stage[index]),
                comment=comment,
                nones=nones[index],
                devices=own_devices[index],
                received_kinds=scalars[index],
                sent_kinds=scalars[index + 1] if index + 1 < count else (),
                same=aliases[index],
            )
        )
    return codes


def _sent_once(sent: Sequence[str], kinds: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The values of ``sent`` that were the very tensor another of them holds when profiled
    (a ``same:`` kind of this sync point, ``kinds``), with that tensor's reference: T5's
    ``("encoder_hidden_states", "encoder_outputs.last_hidden_state")``. The stage before
    sends the tensor once, and the stage after binds the name to it."""
    found = []
    for name in sent:
        target = same_tensor_as(kinds.get(name, ""))
        if target is not None and target[0] != name and target[0] in sent:
            found.append((name, "".join(target)))
    return tuple(found)


def _chosen_replay(name: str, before: int, ops: Sequence[Op], unsent: set[str]) -> _Replay:
    """How the stage after the first ``before`` ops computes ``name`` again, as the plan
    chose (:attr:`SyncSite.recomputed`); a plan that does not fit the source is refused."""
    replay = _replay(name, before, ops, unsent, receiving=True)
    if replay is None:
        op = ops[before - 1]
        raise SyncpassError(
            f"the plan has the stage after {op.id} compute {name} again, which this source "
            "cannot do; profile and plan the model again",
            str(op.location),
        )
    return replay


def _receive_what_is_sent(
    receives: list[list[str]],
    defaults: Sequence[tuple[str, ...]],
    replays: Sequence[tuple[int, ...]],
    bounds: Sequence[int],
    ops: Sequence[Op],
) -> None:
    """Make each stage receive what it must send on and does not compute itself: a size
    that a later stage needs to compute a value again, where the stages in between
    received that value instead (``receives[k]``: what stage ``k`` receives)."""
    for index in range(len(receives) - 1, 1, -1):
        start, end = bounds[index - 1], bounds[index]
        replayed = set(replays[index - 1])
        made = {
            name
            for position, op in enumerate(ops)
            if start <= position < end or op.statement in replayed
            for name in op.writes
        }
        has = made | set(receives[index - 1]) | set(defaults[index - 1])
        receives[index - 1].extend(name for name in receives[index] if name not in has)


#: What a stage's ``keeps`` name inside a module it only tests for ``None``
#: (``"head.(only tested)"``): no parameter, buffer or submodule is that, so the stage
#: holds the module with nothing in it.
ONLY_TESTED = "(only tested)"

#: What a stage's ``keeps`` name inside a layer container it reads whole but runs none of
#: the layers of (``"attn_layers.layers.(other stages')"``): the stage holds the container
#: with each of its layers ``None``, as a stage that runs some holds the others'.
OTHER_STAGES = "(other stages')"


def none_testers(module: cst.Module) -> frozenset[str]:
    """The functions of ``module`` that only test their one argument for ``None``
    (``def exists(val): return val is not None``)."""
    found = set()
    for name, helper in module_helpers(module).items():
        params = helper.params.params
        returned = one_returned_expression(helper)
        if len(params) != 1 or not isinstance(returned, cst.Comparison):
            continue
        test = m.Comparison(
            left=m.Name(params[0].name.value),
            comparisons=[m.ComparisonTarget(m.Is() | m.IsNot(), m.Name("None"))],
        )
        if m.matches(returned, test):
            found.add(name)
    return frozenset(found)


def _unsliced(
    paths: Sequence[str], loop_containers: set[str], referenced: Collection[str] = ()
) -> list[str]:
    """``paths`` with slices resolved: a slice of a layer container the plan runs per layer
    holds what its ops say (nothing here); a slice of anything else holds all of it. A
    container of ``referenced`` read whole holds what its ops say too."""
    found = []
    for path in paths:
        if path in referenced:
            continue
        if path.endswith("[:]"):
            container = path[: -len("[:]")]
            if container not in loop_containers:
                found.append(container)
        elif path.rpartition(".")[0] in loop_containers and path.rpartition(".")[2] in DICT_VIEWS:
            continue  # list(self.layers.values())[2:4]: the layers are the ops' to say
        else:
            found.append(path)
    return found


def _from_the_start(path: str, sizes: dict[str, int]) -> str:
    """``layers.-1`` -> ``layers.6`` for a container of 7; the container itself if its
    length is unknown."""
    parts = path.split(".")
    for position, part in enumerate(parts):
        if part.startswith("-") and part[1:].isdigit():
            container = ".".join(parts[:position])
            if container not in sizes:
                return container
            parts[position] = str(sizes[container] - int(part[1:]))
    return ".".join(parts)


def _outermost(paths: Sequence[str]) -> tuple[str, ...]:
    """``paths`` without those inside another one (``blocks`` covers ``blocks.3``), sorted."""
    kept = set(paths)
    return tuple(
        sorted(
            path
            for path in kept
            if not any(path.startswith(other + ".") for other in kept if other != path)
        )
    )

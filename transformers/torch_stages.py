"""Write and remove eager pipeline stages: one subclass of the model per stage, beside the model.

The eager form of a torch plan leaves the user's class and its ``forward``
byte for byte as they are and writes, right after the class, the stage
boundaries explicitly (as torchtitan builds its stages, but in the user's
file)::

    # syncpass stages: Net.forward in 2 pipeline stages (torch.distributed.pipelining.PipelineStage)
    class NetStage(Net):
        '''... holds only the submodules its slice uses ...'''
        keeps: tuple[str, ...] = ()
        sends: tuple[str, ...] = ()

        @classmethod
        def of(cls, model): ...   # the same parameter objects, under the same names


    class NetStage0(NetStage):
        keeps = ("embed", "blocks.0", "blocks.1")
        sends = ("h",)

        def forward(self, x):
            h = self.embed(x)
            for block in self.blocks[:2]:
                h = block(h)
            return h  # syncpass sync 1/1: h; 64 KiB, 1.8 ms/step predicted


    class NetStage1(NetStage):
        ...

Each stage's ``forward`` is the slice of the original statements it runs
(verbatim, comments kept; a loop cut by a sync point runs over a slice of its
container), taking what the stage before sends and returning what the next
one needs. What each stage takes, sends, recomputes and keeps is decided by
the backend (:class:`StageCode`); this module only writes it, and
:func:`remove_stages` takes it out again (found by :data:`STAGES_COMMENT`).

Nothing here imports torch.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext

from syncpass.contracts.costs import (
    NUMBER_LEAVES,
    PYTREE,
    SENT_LEAVES,
    TENSOR_LEAF,
    pytree_leaves,
    pytree_pieces,
    pytree_template,
)
from syncpass.frontend.analysis import self_path
from syncpass.transformers.checkpoints import CheckpointRefused, checkpoint_piece
from syncpass.transformers.common import (
    LINE_WIDTH,
    CheckpointSite,
    InsertSyncPointsCommand,
    SyncSite,
    is_sync_comment,
    sync_comment,
)
from syncpass.transformers.torch_checkpoints import TORCH_STAGES

#: The comment that opens the block of stage classes syncpass writes.
STAGES_COMMENT = "# syncpass stages"
_STAGES_COMMENT = re.compile(r"^#\s*syncpass stages\b")
_STAGE_COUNT = re.compile(r"^# syncpass stages: [\w.]+ in (\d+) PipelineStage modules?$", re.M)


def written_stage_count(text: str) -> int | None:
    """How many stages the file's eager stage classes say they are (their header comment),
    or ``None`` for a file without them."""
    found = _STAGE_COUNT.search(text)
    return None if found is None else int(found.group(1))


@dataclass(frozen=True)
class StageCode:
    """What one stage's code holds: decided by the backend, written here.

    ``takes`` are the names its ``forward`` receives from the stage before
    (stage 0 keeps the model's own parameters instead); ``defaults`` are the
    model's parameters with constant defaults that it reads, declared again
    with the same default; ``replays`` indexes the forward's top-level
    statements it runs again before its own (cheap values the stage before
    cannot send); ``sends`` is what it returns to the next stage (nothing for
    the last, which returns what the model returns); ``keeps`` the submodule,
    parameter and buffer paths it holds; ``comment`` the text of the sync
    comment on its return line. ``nones`` are values that were ``None`` when
    profiled, which the stage sets itself; ``devices`` those that were a
    ``torch.device``, which it reads off a tensor it receives (each stage runs on its
    own device). ``received_kinds`` are the values it
    receives packed as tensors, with their kind, which it unpacks: a Python number
    (``int``/``float``/``bool``) or a tuple of ints (``ints``, ``size`` for a
    ``torch.Size``) arrives as one tensor, a tuple of N tensors (``tensors:N``) as its
    N tensors, one by one; ``sent_kinds`` those it sends packed so. ``same`` are values
    it receives as another's tensor, sent once (``("encoder_hidden_states",
    "encoder_outputs.last_hidden_state")``), which it binds to that tensor.
    """

    index: int
    takes: tuple[str, ...]
    defaults: tuple[str, ...]
    replays: tuple[int, ...]
    sends: tuple[str, ...]
    keeps: tuple[str, ...]
    comment: str = ""
    nones: tuple[str, ...] = ()
    received_kinds: tuple[tuple[str, str], ...] = ()
    sent_kinds: tuple[tuple[str, str], ...] = ()
    devices: tuple[str, ...] = ()  # torch.device values: the stage's own, read off its inputs
    recomputes: tuple[str, ...] = ()  # the ops it checkpoints (rewrite --recompute)
    same: tuple[tuple[str, str], ...] = ()  # (name, the tensor it is): received once


def tensor_count(kind: str | None) -> int | None:
    """How many tensors a value of ``kind`` crosses as, when it crosses as its tensors: N
    for a tuple (``tensors:N``), the tensor entries of a mapping (``mapping:...``, whose
    ``None`` entries the stage after puts back itself), the tensor leaves of a nested
    structure (``pytree:...``, whose constants the stage after writes itself); else
    ``None``."""
    pieces = tensor_pieces(kind)
    return None if pieces is None else len(pieces)


def tensor_pieces(kind: str | None) -> tuple[str, ...] | None:
    """The subscripts of a value of ``kind`` that cross as tensors, when it crosses as its
    tensors: ``("[0]", "[1]")`` for ``tensors:2``; ``('["sliding"]',)`` for
    ``mapping:full=none,sliding=tensor``; ``('["local"][0]', '["local"][1]')`` for
    ``mapping:local=tensors:2``; ``("[0]", "[2]")`` for ``pytree:(T, None, T)``; else
    ``None``."""
    if kind is None:
        return None
    if kind.startswith(PYTREE):
        return pytree_pieces(kind)
    if kind.startswith("tensors:"):
        return tuple(f"[{k}]" for k in range(int(kind.removeprefix("tensors:"))))
    entries = mapping_entries(kind)
    if entries is None:
        return None
    pieces: list[str] = []
    for key, entry in entries:
        if entry == "tensor":
            pieces.append(f'["{key}"]')
        elif entry.startswith("tensors:"):
            pieces.extend(f'["{key}"]{at}' for at in tensor_pieces(entry) or ())
    return tuple(pieces)


def mapping_entries(kind: str) -> tuple[tuple[str, str], ...] | None:
    """``(key, entry)`` of a ``mapping:KEY=none,KEY=tensor,KEY=tensors:N`` kind (``entry``
    ``none``, ``tensor`` or ``tensors:N``), else ``None``."""
    if not kind.startswith("mapping:"):
        return None
    pairs = [entry.partition("=") for entry in kind.removeprefix("mapping:").split(",")]
    return tuple((key, entry) for key, _, entry in pairs)


def _one_per_tensor(
    names: Sequence[str], kinds: Sequence[tuple[str, str]], piece: str
) -> list[str]:
    """``names`` with each value that crosses as its tensors spelled as its pieces (``piece``
    formats one from ``name``, its position ``k`` and its subscripts ``at``)."""
    kind_of = dict(kinds)
    spelled = []
    for name in names:
        pieces = tensor_pieces(kind_of.get(name))
        spelled.extend(
            [name]
            if pieces is None
            else [piece.format(name=name, k=k, at=at) for k, at in enumerate(pieces)]
        )
    return spelled


def _received_names(stage: StageCode) -> list[str]:
    """The parameters a later stage takes: a tuple of N tensors as ``name_0 .. name_<N-1>``."""
    return _one_per_tensor(stage.takes, stage.received_kinds, "{name}_{k}")


def _sent_names(stage: StageCode) -> list[str]:
    """What a stage's outputs are, one per tensor sent (``position_embeddings[1]``,
    ``causal_mask_mapping["sliding_attention"]``)."""
    return _one_per_tensor(stage.sends, stage.sent_kinds, "{name}{at}")


def stage_class_name(model: str, index: int | None = None) -> str:
    """``NetStage`` (the base) or ``NetStage1`` (stage 1 of ``Net``)."""
    return f"{model}Stage" if index is None else f"{model}Stage{index}"


#: The names the base stage class may take, in order: ``NetStage`` unless the file has a
#: ``NetStage`` of its own (timm's ``ConvNeXtStage`` is a stage of ``ConvNeXt``).
_BASE_SUFFIXES = ("Stage", "StageBase", "PipelineStageBase")


def stage_base_name(module: cst.Module, model: str) -> str | None:
    """The name of the base stage class to write for ``model`` in ``module``: the first of
    :data:`_BASE_SUFFIXES` that names nothing at the top of the file (but syncpass's own
    stage classes), or ``None`` when all do."""
    taken = set()
    for statement in module.body:
        if _is_stage_class(statement, model):
            continue
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
            taken.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    taken.update(_bound_name(alias) for alias in small.names)
                elif isinstance(small, (cst.Assign, cst.AnnAssign)):
                    targets = (
                        [target.target for target in small.targets]
                        if isinstance(small, cst.Assign)
                        else [small.target]
                    )
                    taken.update(t.value for t in targets if isinstance(t, cst.Name))
    return next((model + suffix for suffix in _BASE_SUFFIXES if model + suffix not in taken), None)


def _bound_name(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    name: cst.BaseExpression = alias.name
    while isinstance(name, cst.Attribute):  # import a.b binds a
        name = name.value
    return name.value if isinstance(name, cst.Name) else ""


def is_stages_comment(text: str) -> bool:
    """Whether a comment opens a block of stage classes syncpass wrote."""
    return bool(_STAGES_COMMENT.match(text))


def _model_class(module: cst.Module, class_name: str) -> tuple[int, cst.ClassDef] | None:
    found = [
        (index, statement)
        for index, statement in enumerate(module.body)
        if isinstance(statement, cst.ClassDef) and statement.name.value == class_name
    ]
    return found[0] if len(found) == 1 else None


def _forward(classdef: cst.ClassDef) -> cst.FunctionDef | None:
    methods = [
        member
        for member in classdef.body.body
        if isinstance(member, cst.FunctionDef) and member.name.value == "forward"
    ]
    return methods[0] if len(methods) == 1 else None


class _SplitForwardCommand(InsertSyncPointsCommand):
    """The forward's body with a marker line at each site, loops split: cut into stage slices."""

    DESCRIPTION = "Split a forward's statements at the planned sync points."
    WRITE_HAND_WRITTEN = True  # a stage ends at the user's own pipe_split() too

    def __init__(self, context: CodemodContext, class_name: str, sites: Sequence[SyncSite]) -> None:
        super().__init__(context, sites)
        self.class_name = class_name
        self.body: list[cst.BaseStatement] | None = None

    @property
    def title(self) -> str:
        return f"{self.class_name}.forward"

    def find_function(self, tree: cst.Module) -> cst.FunctionDef | None:
        found = _model_class(tree, self.class_name)
        return None if found is None else _forward(found[1])

    def replace_body(self, tree: cst.Module, new_body: Sequence[cst.BaseStatement]) -> cst.Module:
        self.body = list(new_body)
        return tree

    def schedule_import(self) -> None:
        """The stages need no import: they run the model's own code."""

    def sync_statement(self, site: SyncSite) -> str:
        return "pass"


def _is_marker(statement: cst.BaseStatement) -> bool:
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    comment = statement.trailing_whitespace.comment
    return (
        len(statement.body) == 1
        and isinstance(statement.body[0], cst.Pass)
        and comment is not None
        and is_sync_comment(comment.value)
    )


def split_forward(
    module: cst.Module, class_name: str, sites: Sequence[SyncSite], path: str
) -> tuple[list[list[cst.BaseStatement]], tuple[str, ...]]:
    """The forward's statements cut at ``sites`` (one list per stage), and warnings."""
    if not sites:  # one stage (a plan that only checkpoints): the whole forward
        found = _model_class(module, class_name)
        forward = _forward(found[1]) if found is not None else None
        if forward is None or not isinstance(forward.body, cst.IndentedBlock):
            return [], (f"{class_name} has no single indented forward",)
        return [list(forward.body.body)], ()
    context = CodemodContext(filename=path)
    command = _SplitForwardCommand(context, class_name, sites)
    command.transform_module_impl(module)
    if command.body is None:
        return [], tuple(context.warnings)
    pieces: list[list[cst.BaseStatement]] = [[]]
    for statement in command.body:
        if _is_marker(statement):
            pieces.append([])
        else:
            pieces[-1].append(statement)
    return pieces, tuple(context.warnings)


class _GatherSelfPathsVisitor(cst.CSTVisitor):
    """Every ``self.a.b`` / ``self.a[3]`` a piece of code reads, outermost first; and whether
    it uses ``self`` bare (hands the whole model to something). A path read only to be
    tested for ``None`` (``self.head is None``, ``isinstance(self.head, ...)``, or the
    argument of one of ``testers``, functions that test their argument so: ``exists``)
    goes into ``tested`` instead."""

    def __init__(self, testers: Collection[str] = ()) -> None:
        super().__init__()
        self.paths: dict[str, None] = {}
        self.tested: dict[str, None] = {}
        self.bare_self = False
        self.testers = testers
        self.tests: set[int] = set()  # the nodes tested for None

    def visit_Comparison(self, node: cst.Comparison) -> None:
        if len(node.comparisons) == 1 and isinstance(
            node.comparisons[0].operator, cst.Is | cst.IsNot
        ):
            sides = (node.left, node.comparisons[0].comparator)
            if any(m.matches(side, m.Name("None")) for side in sides):
                self.tests.update(id(side) for side in sides)

    def visit_Call(self, node: cst.Call) -> None:
        name = node.func.value if isinstance(node.func, cst.Name) else None
        first = node.args[0] if node.args else None
        tests = name == "isinstance" or (name in self.testers and len(node.args) == 1)
        if first is not None and first.keyword is None and not first.star and tests:
            self.tests.add(id(first.value))

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        path = self_path(node)
        if path is not None:
            (self.tested if id(node) in self.tests else self.paths)[path] = None
            return False
        return True

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        path = self_path(node)
        if path is not None:
            self.paths[path] = None
            return False
        base = self_path(node.value)
        if base:
            index = node.slice[0].slice if len(node.slice) == 1 else None
            if isinstance(index, cst.Index):
                # self.layers[-1] (counted from the end: the caller knows the length), or
                # self.layers[i] (any layer: the whole container).
                value = index.value
                negative = (
                    isinstance(value, cst.UnaryOperation)
                    and isinstance(value.operator, cst.Minus)
                    and isinstance(value.expression, cst.Integer)
                )
                if negative:
                    assert isinstance(value, cst.UnaryOperation)
                    assert isinstance(value.expression, cst.Integer)
                    self.paths[f"{base}.-{value.expression.value}"] = None
                else:
                    self.paths[base] = None
                index.visit(self)
                return False
            # A slice (``self.blocks[2:4]``, ``self.pos[:seq]``): of a layer container, which
            # layers it holds is the plan's to say (the caller decides); the bounds are read.
            self.paths[f"{base}[:]"] = None
            for element in node.slice:
                element.visit(self)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "self":
            self.bare_self = True


def self_paths(statements: Sequence[cst.CSTNode]) -> tuple[tuple[str, ...], bool]:
    """The ``self.`` paths ``statements`` read (``"blocks.3"``, ``"ln_f"``; a slice of one as
    ``"blocks[:]"``), and whether they use ``self`` other than through an attribute."""
    paths, bare, tested = tested_self_paths(statements)
    return tuple(dict.fromkeys([*paths, *tested])), bare


def tested_self_paths(
    statements: Sequence[cst.CSTNode], testers: Collection[str] = ()
) -> tuple[tuple[str, ...], bool, tuple[str, ...]]:
    """:func:`self_paths`, and apart from them the paths ``statements`` only test for
    ``None`` (``exists(self.to_logits)``, ``testers`` naming such functions): a stage that
    holds such a module with nothing in it answers the test as the model does."""
    visitor = _GatherSelfPathsVisitor(testers)
    for statement in statements:
        statement.visit(visitor)
    tested = tuple(path for path in visitor.tested if path not in visitor.paths)
    return tuple(visitor.paths), visitor.bare_self, tested


def method_bodies(module: cst.Module, class_name: str) -> dict[str, cst.FunctionDef]:
    """The model class's own methods by name (what a stage may call through ``self``)."""
    found = _model_class(module, class_name)
    if found is None:
        return {}
    # A property's setter and deleter share its name: the getter is what a read runs.
    accessor = m.Decorator(decorator=m.Attribute(attr=m.Name("setter") | m.Name("deleter")))
    return {
        member.name.value: member
        for member in found[1].body.body
        if isinstance(member, cst.FunctionDef)
        and not any(m.matches(decorator, accessor) for decorator in member.decorators)
    }


_BASE_TEMPLATE = '''\
class {base}({model}):
    """One pipeline stage of {model}: a slice of its forward.

    A stage holds only the submodules, parameters and buffers its slice uses,
    under the unsplit model's names (a {model} state dict loads into it
    with strict=False); build stage k with ``{model}Stage<k>.of(model)``
    and hand it to PipelineStage.
    """

    keeps: tuple[str, ...] = ()  # what the stage holds; everything else is None
    sends: tuple[str, ...] = ()  # what its forward returns to the next stage

    @classmethod
    def of(cls, model: {model}) -> {returns}:
        """This stage of ``model``: the same parameter objects, the others None."""

        keeps = cls.keeps  # the stage's, then with what its objects use

        def covered(path: str) -> bool:
            return any(path == k or path.startswith(k + ".") for k in keeps)

        def below(path: str) -> bool:
            return any(k.startswith(path + ".") for k in keeps)

        def kept(module: object, prefix: str, into: type[object]) -> object:
            part = into.__new__(into)
            part.__dict__.update(module.__dict__)
            for table in ("_parameters", "_buffers", "_modules"):
                entries = dict(module.__dict__[table])
                for place, (name, value) in enumerate(entries.items()):
                    # A child by its name, or by its place: "body.0" is a named
                    # nn.Sequential's first child, as slicing it counts.
                    paths = [prefix + name]
                    if table == "_modules":
                        paths.append(prefix + str(place))
                    inside = [p for p in paths if below(p)]
                    if value is None or any(covered(p) for p in paths):
                        continue
                    if not inside:
                        entries[name] = None
                    elif table == "_modules":
                        entries[name] = kept(value, inside[0] + ".", type(value))
                    # else a parameter or buffer whose attribute the stage reads:
                    # kept whole
                part.__dict__[table] = entries
            return part

        def held(path: str) -> bool:
            return any(path == k or path.startswith(k + ".") for k in cls.keeps)

        stage = kept(model, "", cls)
        assert isinstance(stage, cls)
        # A plain object the stage uses may hold modules of the model (a tied head
        # that is not a module and calls the embedding's weight): the stage keeps
        # those too, so that their parameters are its own (its optimizer and
        # gradients reach them).
        paths = {{id(module): path for path, module in model.named_modules() if path}}
        used = [
            paths[id(part)]
            for owner, module in stage.named_modules()
            for name, value in vars(module).items()
            if held(f"{{owner}}.{{name}}".lstrip("."))
            for part in getattr(value, "__dict__", {{}}).values()
            if id(part) in paths
        ]
        extra = tuple(dict.fromkeys(path for path in used if not held(path)))
        if extra:
            keeps = cls.keeps + extra
            stage = kept(model, "", cls)
            assert isinstance(stage, cls)
        return stage
'''


def _tuple_code(names: Sequence[str], indent: str = "    ", width: int = 88) -> str:
    """``("a", "b")``, or one name per line when that would not fit in ``width`` columns."""
    if not names:
        return "()"
    quoted = [f"'{name}'" if '"' in name else f'"{name}"' for name in names]
    one_line = "(" + ", ".join(quoted) + ("," if len(names) == 1 else "") + ")"
    if len(indent) + len("sends = ") + len(one_line) <= width:
        return one_line
    inner = "".join(f"{indent}    {name},\n" for name in quoted)
    return f"(\n{inner}{indent})"


def _defers_annotations(module: cst.Module) -> bool:
    """Whether ``module`` has ``from __future__ import annotations``."""
    future = m.ImportFrom(
        module=m.Name("__future__"),
        names=[m.ZeroOrMore(), m.ImportAlias(m.Name("annotations")), m.ZeroOrMore()],
    )
    return any(
        m.matches(statement, m.SimpleStatementLine(body=[future])) for statement in module.body
    )


def _binds_torch(module: cst.Module) -> bool:
    """Whether ``module`` binds ``torch`` to the torch package (``import torch``) at its top."""
    plain = m.Import(
        names=[m.ZeroOrMore(), m.ImportAlias(m.Name("torch"), asname=None), m.ZeroOrMore()]
    )
    return any(
        m.matches(statement, m.SimpleStatementLine(body=[plain])) for statement in module.body
    )


def _typed(forward: cst.FunctionDef, stage: StageCode, module: cst.Module) -> bool:
    """Whether a stage's method is annotated, as the model's ``forward`` is when it annotates
    every parameter and what it returns, so that a type checker holds the stage to what it
    holds the model to: what crosses is tensors (``torch.Tensor``), unless a value is
    received packed as a number (it changes type)."""
    params = _all_params(forward.params)[1:]  # self aside
    annotated = forward.returns is not None and all(p.annotation is not None for p in params)
    packed = any(kind in _UNPACK for _, kind in stage.received_kinds)
    return annotated and not packed and _binds_torch(module)


def _sent_annotation(stage: StageCode) -> cst.Annotation:
    """What a stage that is not the last returns: a tensor, or a tuple of them."""
    sent = _sent(stage)
    one = len(sent) == 1 and not sent[0].startswith("*")
    return cst.Annotation(
        cst.parse_expression("torch.Tensor" if one else "tuple[torch.Tensor, ...]")
    )


def _sent_value_typed(
    body: list[cst.BaseStatement], stage: StageCode, params: cst.Parameters
) -> list[cst.BaseStatement]:
    """A typed stage that sends one value made in its body (``skip = self.enc[:3](x)``,
    a module call, which a type checker reads as ``Any``) declares it ``torch.Tensor`` where
    the body first names it, as the method says it returns; a stage that sends a parameter
    or a tuple, or first names the value otherwise, is left as it is."""
    sent = _sent(stage)
    if len(sent) != 1 or sent[0].startswith("*"):
        return body
    name = sent[0]
    if any(param.name.value == name for param in _all_params(params)):
        return body
    for index, statement in enumerate(body):
        if not m.findall(statement, m.Name(name)):
            continue
        single = m.SimpleStatementLine(
            body=[m.Assign(targets=[m.AssignTarget(target=m.Name(name))])]
        )
        if m.matches(statement, single):
            assert isinstance(statement, cst.SimpleStatementLine)
            assign = statement.body[0]
            assert isinstance(assign, cst.Assign)
            typed = cst.AnnAssign(
                target=assign.targets[0].target,
                annotation=cst.Annotation(cst.parse_expression("torch.Tensor")),
                value=assign.value,
            )
            return [*body[:index], statement.with_changes(body=[typed]), *body[index + 1 :]]
        return body
    return body


def _param_items(params: cst.Parameters) -> list[cst.Param | cst.ParamStar]:
    """Each parameter in order, the bare ``*`` of keyword-only ones among them."""
    star: list[cst.Param | cst.ParamStar] = []
    if isinstance(params.star_arg, cst.Param | cst.ParamStar):
        star = [params.star_arg]
    double = [params.star_kwarg] if isinstance(params.star_kwarg, cst.Param) else []
    return [*params.posonly_params, *params.params, *star, *params.kwonly_params, *double]


def _same_signature(
    forward: cst.FunctionDef, params: cst.Parameters, returns: cst.Annotation | None
) -> bool:
    """Whether a stage's method takes and returns what the model's ``forward`` does, as a type
    checker compares an override (names aside). Where not, the method says it overrides
    ``forward`` knowingly: a stage runs a slice of it, on what the stage before sends."""
    code = cst.Module([]).code_for_node

    def shape(of: cst.Parameters) -> list[str] | None:
        stars = (of.star_arg, of.star_kwarg)
        if of.posonly_params or of.kwonly_params or any(isinstance(x, cst.CSTNode) for x in stars):
            return None
        if any(param.default is not None for param in of.params):
            return None
        return [code(p.annotation.annotation) if p.annotation else "" for p in of.params]

    theirs, ours = shape(forward.params), shape(params)
    if theirs is None or ours is None:
        return forward.params.deep_equals(params) and _same_annotation(forward.returns, returns)
    return theirs == ours and _same_annotation(forward.returns, returns)


def _same_annotation(one: cst.Annotation | None, other: cst.Annotation | None) -> bool:
    if one is None or other is None:
        return one is other
    code = cst.Module([]).code_for_node
    return code(one.annotation) == code(other.annotation)


#: What a stage's method says where its signature is not ``forward``'s.
_OVERRIDE_IGNORE = "# type: ignore[override]"


def _laid_out(method: cst.FunctionDef, module: cst.Module, ignore: bool) -> cst.FunctionDef:
    """A typed stage method's ``def`` line as black and ruff lay it out inside the class: on
    one line where it fits in :data:`LINE_WIDTH`, else one parameter a line; with
    ``# type: ignore[override]`` on its first line when ``ignore``. A
    first stage whose parameters the user laid out over several lines keeps their layout."""
    code = module.code_for_node
    empty = cst.Module([])
    header = code(method.params)
    if "\n" in header or "#" in header:  # the user's own layout, comments and all
        if not ignore:
            return method
        comment = cst.Comment(_OVERRIDE_IGNORE)
        before = method.whitespace_before_params
        if isinstance(before, cst.ParenthesizedWhitespace):
            first = before.first_line.with_changes(
                whitespace=cst.SimpleWhitespace("  "), comment=comment
            )
            return method.with_changes(
                whitespace_before_params=before.with_changes(first_line=first)
            )
        assert isinstance(method.body, cst.IndentedBlock)
        line = method.body.header.with_changes(
            whitespace=cst.SimpleWhitespace("  "), comment=comment
        )
        return method.with_changes(body=method.body.with_changes(header=line))
    stars = {id(method.params.star_arg): "*", id(method.params.star_kwarg): "**"}
    items = [
        "*"
        if isinstance(item, cst.ParamStar)
        else empty.code_for_node(
            item.with_changes(
                star=stars.get(id(item), ""),
                comma=cst.MaybeSentinel.DEFAULT,
                whitespace_after_param=cst.SimpleWhitespace(""),
            )
        )
        for item in _param_items(method.params)
    ]
    arrow = (
        "" if method.returns is None else f" -> {empty.code_for_node(method.returns.annotation)}"
    )
    name = method.name.value
    pragma = f"  {_OVERRIDE_IGNORE}" if ignore else ""
    indent = 4  # the class body's, as the class header writes it
    one_line = f"def {name}({', '.join(items)}){arrow}:"
    if indent + len(one_line) <= LINE_WIDTH:
        text = one_line + pragma
    else:  # the trailing comma keeps a formatter with a wider line length from joining them
        inner = "".join(f"    {item},\n" for item in items)
        text = f"def {name}({pragma}\n{inner}){arrow}:"
    parsed = cst.parse_statement(f"{text}\n    pass\n", config=module.config_for_parsing)
    assert isinstance(parsed, cst.FunctionDef) and isinstance(method.body, cst.IndentedBlock)
    assert isinstance(parsed.body, cst.IndentedBlock)
    return method.with_changes(
        params=parsed.params,
        whitespace_before_params=parsed.whitespace_before_params,
        returns=parsed.returns,
        whitespace_before_colon=parsed.whitespace_before_colon,
        body=method.body.with_changes(header=parsed.body.header),
    )


def _stage_params(forward: cst.FunctionDef, stage: StageCode, typed: bool) -> cst.Parameters:
    """Stage 0: the model's own parameters. Later stages: what they take (tensors, annotated
    as such when ``typed``), then the constant defaults they read as keyword-only parameters
    (the schedule passes them nothing)."""
    if stage.index == 0:
        return forward.params
    own = {param.name.value: param for param in _all_params(forward.params)}
    self_param = forward.params.params[0] if forward.params.params else cst.Param(cst.Name("self"))
    tensor = cst.Annotation(cst.parse_expression("torch.Tensor")) if typed else None
    taken = [cst.Param(cst.Name(name), annotation=tensor) for name in _received_names(stage)]
    star_kwarg = forward.params.star_kwarg
    kwargs = star_kwarg.name.value if isinstance(star_kwarg, cst.Param) else None
    defaults = [
        own[name].with_changes(comma=cst.MaybeSentinel.DEFAULT, star="")
        for name in stage.defaults
        if name in own and name != kwargs
    ]
    extra = (
        star_kwarg.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        if isinstance(star_kwarg, cst.Param) and kwargs in stage.defaults
        else None
    )
    return cst.Parameters(
        params=[self_param.with_changes(comma=cst.MaybeSentinel.DEFAULT), *taken],
        star_arg=cst.ParamStar() if defaults else cst.MaybeSentinel.DEFAULT,
        kwonly_params=defaults,
        star_kwarg=extra,
    )


def _all_params(params: cst.Parameters) -> list[cst.Param]:
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    for extra in (params.star_arg, params.star_kwarg):
        if isinstance(extra, cst.Param):
            found.append(extra)
    return found


def _sent(stage: StageCode) -> list[str]:
    """The expressions a stage returns: its values, numbers and tuples of ints as tensors on a
    sent tensor's device, a tuple of tensors as its tensors (``*name``)."""
    kinds = dict(stage.sent_kinds)
    tensors = [name for name in stage.sends if name not in kinds]
    device = f", device={tensors[0]}.device" if tensors else ""
    sent = []
    for name in stage.sends:
        kind = kinds.get(name)
        if kind is None:
            sent.append(name)
        elif kind.startswith("tensors:"):
            sent.append(f"*{name}")
        elif (leaves := pytree_leaves(kind)) is not None:  # its tensors; numbers packed
            sent.extend(
                f"{name}{at}" if leaf == TENSOR_LEAF else f"torch.as_tensor({name}{at}{device})"
                for at, leaf in zip(tensor_pieces(kind) or (), leaves, strict=True)
            )
        elif (entries := tensor_pieces(kind)) is not None:  # a mapping: its tensor entries
            sent.extend(f"{name}{at}" for at in entries)
        else:
            sent.append(f"torch.as_tensor({name}{device})")
    return sent


#: How a later stage turns a value it received packed as tensors back (by kind).
_UNPACK = {
    "int": "{name} = int({name})",
    "float": "{name} = float({name})",
    "bool": "{name} = bool({name})",
    "ints": "{name} = tuple({name}.tolist())",
    "size": "{name} = torch.Size({name}.tolist())",
}


def _rebuilt_mapping(name: str, entries: Sequence[tuple[str, str]]) -> str:
    """The items of a mapping put together again from the tensors received for it
    (``name_0``, ``name_1``, ... in the order :func:`tensor_pieces` sends them)."""
    received = itertools.count()
    items = []
    for key, entry in entries:
        if entry == "tensor":
            value = f"{name}_{next(received)}"
        elif entry.startswith("tensors:"):
            parts = [f"{name}_{next(received)}" for _ in tensor_pieces(entry) or ()]
            value = f"({', '.join(parts)},)"
        else:
            value = "None"
        items.append(f'"{key}": {value}')
    return ", ".join(items)


def _rebuilt_pytree(name: str, kind: str) -> str:
    """A ``pytree:`` value put together again: its template with each tensor the one received
    for it (``name_0``, ``name_1``, ... in the order :func:`tensor_pieces` sends them)."""
    template = pytree_template(kind)
    assert template is not None
    received = itertools.count()

    class Received(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            if node.id not in SENT_LEAVES:
                return node  # a dataclass's name
            piece = ast.Name(f"{name}_{next(received)}", ast.Load())
            if node.id == TENSOR_LEAF:
                return piece
            return ast.Call(ast.Name(NUMBER_LEAVES[node.id], ast.Load()), [piece], [])

    return ast.unparse(Received().visit(template))


def _prelude(stage: StageCode, config: cst.Module) -> list[cst.BaseStatement]:
    """What a stage sets before its own statements: received values unpacked, values that
    were None."""
    lines = []
    for name, kind in stage.received_kinds:
        count = tensor_count(kind)
        entries = mapping_entries(kind)
        if kind.startswith(PYTREE):
            value = _rebuilt_pytree(name, kind)
            why = f"its {count} tensor(s) sent" if count else "the same when profiled: nothing sent"
            lines.append(f"{name} = {value}  # {why}\n")
        elif entries is not None:
            items = _rebuilt_mapping(name, entries)
            why = f"its {count} tensor(s) sent" if count else "no tensor in it"
            lines.append(f"{name} = {{{items}}}  # a mapping, {why}\n")
        elif count is None:
            lines.append(
                _UNPACK[kind].format(name=name) + "  # the stage before sends it as a tensor\n"
            )
        else:
            parts = ", ".join(f"{name}_{k}" for k in range(count))
            lines.append(f"{name} = ({parts},)  # the stage before sends its {count} tensors\n")
    lines += [
        f"{name} = {reference}  # the same tensor when profiled: sent once\n"
        for name, reference in stage.same
    ]
    lines += [f"{name} = None  # None when profiled: nothing to send\n" for name in stage.nones]
    if stage.devices:
        packed = dict(stage.received_kinds)
        tensor = next(name for name in stage.takes if name not in packed)
        lines += [
            f"{name} = {tensor}.device  # this stage's device: its inputs' one\n"
            for name in stage.devices
        ]
    return [cst.parse_statement(line, config=config.config_for_parsing) for line in lines]


def _return_lines(
    stage: StageCode, config: cst.Module, forward: cst.FunctionDef
) -> list[cst.BaseStatement]:
    """``return ...  # syncpass sync ...``: the comment on the line above where the line
    would be wider than :data:`LINE_WIDTH` (a formatter would break the return up)."""
    sent = _sent(stage)
    # A tuple of tensors alone is returned as one: ``return *name`` is no Python.
    value = f"({sent[0]},)" if len(sent) == 1 and sent[0].startswith("*") else ", ".join(sent)
    comment = sync_comment(stage.comment)
    assert isinstance(forward.body, cst.IndentedBlock)
    indent = 4 + len(forward.body.indent or config.default_indent)  # class body, then method
    code = f"return {value}  {comment}\n"
    if indent + len(code) - 1 > LINE_WIDTH:
        code = f"{comment}\nreturn {value}\n"
    line = cst.parse_statement(code, config=config.config_for_parsing)
    assert isinstance(line, cst.SimpleStatementLine)
    return [line]


def _stage_class(
    model: str,
    base: str,
    forward: cst.FunctionDef,
    statements: Sequence[cst.BaseStatement],
    replayed: Sequence[cst.BaseStatement],
    stage: StageCode,
    count: int,
    module: cst.Module,
) -> cst.ClassDef:
    """``class NetStage<k>(NetStage)`` with its keeps, sends and slice of ``forward``."""
    last = stage.index == count - 1
    own = list(statements)
    if own and m.matches(
        own[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())])
    ):
        own = own[1:]  # forward's docstring: the stage class has its own
    body = [*_prelude(stage, module), *replayed, *own]
    if not body:
        body = [cst.parse_statement("pass\n", config=module.config_for_parsing)]
    # The first statement opens the method: its blank lines go, its comments stay.
    first = body[0]
    if isinstance(first, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        comments = tuple(line for line in first.leading_lines if line.comment is not None)
        body[0] = first.with_changes(leading_lines=comments)
    if not last:
        body.extend(_return_lines(stage, module, forward))
    typed = _typed(forward, stage, module)
    params = _stage_params(forward, stage, typed)
    returns = forward.returns if last else _sent_annotation(stage) if typed else None
    if typed and not last:
        body = _sent_value_typed(body, stage, params)
    ignore = typed and not _same_signature(forward, params, returns)
    assert isinstance(forward.body, cst.IndentedBlock)
    method = forward.with_changes(
        params=params,
        # A later stage's parameters are syncpass's: one line, whatever the forward's layout.
        whitespace_before_params=(
            forward.whitespace_before_params if stage.index == 0 else cst.SimpleWhitespace("")
        ),
        returns=returns,
        body=forward.body.with_changes(body=tuple(body)),
        leading_lines=(cst.EmptyLine(indent=False),),
        decorators=(),
    )
    if typed:
        method = _laid_out(method, module, ignore)
    header = (
        f"class {stage_class_name(model, stage.index)}({base}):\n"
        f'    """Stage {stage.index} of {count} of {model}.forward."""\n\n'
        f"    keeps = {_tuple_code(stage.keeps)}\n"
        + (f"    sends = {_tuple_code(_sent_names(stage))}\n" if stage.sends else "")
        + (f"    recomputes = {_tuple_code(stage.recomputes)}\n" if stage.recomputes else "")
    )
    skeleton = cst.parse_statement(header, config=module.config_for_parsing)
    assert isinstance(skeleton, cst.ClassDef) and isinstance(skeleton.body, cst.IndentedBlock)
    # The method keeps the forward's own indentation: re-indent through the class's body.
    inner = skeleton.body.with_changes(body=(*skeleton.body.body, method))
    return skeleton.with_changes(body=inner, leading_lines=(cst.EmptyLine(), cst.EmptyLine()))


def insert_stages(
    module: cst.Module,
    class_name: str,
    sites: Sequence[SyncSite],
    stages: Sequence[StageCode],
    path: str,
    planned: cst.Module | None = None,
    checkpoints: Sequence[CheckpointSite] = (),
    sizes: Mapping[str, int] | None = None,
) -> tuple[cst.Module, tuple[str, ...]]:
    """``module`` with the stage classes of ``stages`` after ``class_name``, and warnings.

    The stages' statements come from the forward of ``planned`` (the module the
    plan was made for, with the model's own methods inlined; ``module`` itself
    when not given), the classes go into ``module``. With one stage (no sync
    point) the module is returned unchanged. The ops of ``checkpoints`` recompute in
    the backward (:mod:`syncpass.transformers.checkpoints`, torch's form; ``sizes`` are the
    layer containers' lengths), and each stage that has some lists them in ``recomputes``.
    """
    if len(stages) < 2 and not checkpoints:
        return module, ()
    planned = module if planned is None else planned
    found = _model_class(module, class_name)
    planned_class = _model_class(planned, class_name)
    if found is None or planned_class is None:
        return module, (f"no single top-level class {class_name} to write stages for",)
    index, _ = found
    forward = _forward(planned_class[1])
    if forward is None or not isinstance(forward.body, cst.IndentedBlock):
        return module, (f"{class_name} has no single indented forward to cut into stages",)
    pieces, warnings = split_forward(planned, class_name, sites, path)
    if warnings:
        return module, warnings
    if len(pieces) != len(stages):
        return module, (
            f"the forward cuts into {len(pieces)} piece(s) at the sites, not {len(stages)}",
        )
    statements = list(forward.body.body)
    base_name = stage_base_name(module, class_name)
    if base_name is None:
        return module, (
            f"the file already defines {', '.join(class_name + s for s in _BASE_SUFFIXES)}: "
            "no name is left for the base stage class",
        )
    # Quoted only where annotations are evaluated: the class is not bound yet inside it.
    returns = base_name if _defers_annotations(module) else f'"{base_name}"'
    base_code = _BASE_TEMPLATE.format(base=base_name, model=class_name, returns=returns)
    base = cst.parse_statement(base_code, config=module.config_for_parsing)
    note = cst.EmptyLine(
        comment=cst.Comment(
            f"{STAGES_COMMENT}: {class_name}.forward in {len(stages)} PipelineStage "
            + ("module" if len(stages) == 1 else "modules")
        )
    )
    base = base.with_changes(leading_lines=(cst.EmptyLine(), cst.EmptyLine(), note))
    if checkpoints and not _binds_torch(module):
        return module, (
            f"the stages checkpoint with torch.utils.checkpoint.checkpoint, and {path} does "
            "not bind torch (import torch); add the import, or drop --recompute",
        )
    classes: list[cst.BaseStatement] = [base]
    for stage, piece in zip(stages, pieces, strict=True):
        own = [site for site in checkpoints if site.stage == stage.index]
        if own:
            assert isinstance(forward.body, cst.IndentedBlock)
            column = 4 + len(forward.body.indent or module.default_indent)
            try:
                piece = checkpoint_piece(
                    piece, statements, own, sizes or {}, module, column, TORCH_STAGES
                )
            except CheckpointRefused as refused:
                return module, (f"stage {stage.index}: {refused}",)
            stage = dataclasses.replace(stage, recomputes=tuple(site.op for site in own))
        replayed = [statements[position] for position in stage.replays]
        classes.append(
            _stage_class(
                class_name, base_name, forward, piece, replayed, stage, len(stages), module
            )
        )
    body = [*module.body[: index + 1], *classes, *module.body[index + 1 :]]
    return module.with_changes(body=body), ()


def _is_stage_class(statement: cst.BaseStatement, model: str) -> bool:
    if not isinstance(statement, cst.ClassDef):
        return False
    name = statement.name.value
    bases = {model + suffix for suffix in _BASE_SUFFIXES}
    if name in bases:
        return any(
            line.comment is not None and is_stages_comment(line.comment.value)
            for line in statement.leading_lines
        )
    parents = [arg.value for arg in statement.bases]
    return (
        re.fullmatch(rf"{re.escape(stage_class_name(model))}\d+", name) is not None
        and len(parents) == 1
        and isinstance(parents[0], cst.Name)
        and parents[0].value in bases
    )


def written_models(module: cst.Module) -> tuple[str, ...]:
    """The models whose stage classes syncpass wrote into ``module``."""
    names = []
    for statement in module.body:
        if not isinstance(statement, cst.ClassDef):
            continue
        for suffix in sorted(_BASE_SUFFIXES, key=len, reverse=True):  # NetPipelineStageBase
            if statement.name.value.endswith(suffix):
                model = statement.name.value[: -len(suffix)]
                if _is_stage_class(statement, model):
                    names.append(model)
                    break
    return tuple(dict.fromkeys(names))


def remove_stages(module: cst.Module) -> cst.Module:
    """``module`` without the stage classes syncpass wrote (unchanged if there are none)."""
    models = written_models(module)
    if not models:
        return module
    body = [
        statement
        for statement in module.body
        if not any(_is_stage_class(statement, model) for model in models)
    ]
    return module.with_changes(body=body)

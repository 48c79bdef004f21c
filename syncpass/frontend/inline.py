"""Bring the layer stack into sight: a model's own methods, inlined into its ``forward``.

Much model code keeps ``forward`` short and the work in methods of its own:
torchvision's ResNet runs ``return self._forward_impl(x)``, timm's ViT
``x = self.forward_features(x)`` then ``x = self.forward_head(x)``. Planned as
written, each call is one op, and nothing can be cut inside it. The eager stage
form plans the forward with those calls replaced by the methods' statements,
so the stages can be cut anywhere in them (the user's file keeps its own
methods; only the stages run the inlined statements).

The same goes for a submodule that holds the layer stack (vit-pytorch's
``x = self.transformer(x)``, a ``Transformer`` whose forward loops over its
layers): when ``__init__`` builds it from a class of the same file
(``self.transformer = Transformer(...)``) and that class's ``forward`` loops
over a layer container, its forward is inlined with ``self`` read as
``self.transformer`` (``for attn, ff in self.transformer.layers:``), so the op
ids are the layers' module paths (``transformer.layers.3``). So is a submodule
whose class builds such a submodule itself, at any depth (Hugging Face's Flax
GPT-2: ``self.transformer`` builds ``self.h``, whose ``__call__`` loops over the
blocks: ``transformer.h.blocks.3``). Submodules without a loop (a block, an
MLP) stay one op each. ``forward_method`` and ``init_method`` say which methods
compute a module and build its submodules (``__call__`` and ``setup`` for Flax).

A call is inlined when it is a whole top-level statement of ``forward``
(``name = self.method(...)``, ``x, aux = self.method(...)``, ``return
self.method(...)``), the method is a plain one of the same class (not a static or
class method, a property, or ``forward`` itself) whose parameter defaults, if
any, are constants, its body ends with its only ``return`` (no ``yield``; a
``return`` inside a top-level ``if`` is allowed when that ``if`` is decided by
what the call binds, :mod:`syncpass.frontend.branches`, and removed), none of
the names it binds is read after the call
before being assigned again (so the inlined statements cannot clobber a value
the forward still needs), and none of the names it reads from the module is a
local of the forward (which would shadow it). Arguments that are not the
parameter's own name become an assignment first (``x = features``). Inlining
repeats, so a method that calls another is followed too; a method is never
inlined into itself.

``**kwargs`` handed on (``self.transformer(x, mask=mask, **kwargs)``) binds the
method's own ``**`` parameter when the call names every other parameter
(Hugging Face's LM heads call their base model so): the method then reads the
forward's dict, under its own name (an assignment first if the names differ).
A method that pops keys from it pops them for the forward too; the stages are
called with no keyword arguments, so in them the dict is empty either way.

Decorators may change what a call does, so a decorated method is followed only
when each decorator is one of :data:`TRANSPARENT_DECORATORS`: Hugging Face's
wrappers around every model's ``forward``, which in a training step with the
default arguments compute nothing the loss depends on. The stages run the
method's statements without them, and the report says which were left out;
``syncpass run --verify`` compares the loss and every gradient with the unsplit
model, decorators included.

A model class that inherits its forward (timm's DeiT) is expanded from the forward
of its base, read from source (:mod:`syncpass.frontend.bases`): the methods are
those Python runs for the class, its overrides first, and the expanded class
defines the forward (and holds the base methods it still calls). A statement
from a base's method must read nothing from that module's globals that the
user's module binds otherwise (the stage classes run in the user's module): such
a method stays one call, and for the forward itself the expansion stops with the
name and the base's line.

The result records where each statement of the expanded forward comes from
(:class:`Origin`, in :class:`Frame` terms), so that a backend writing into the
user's own functions (JAX's transfers) can put a sync point in the function it
falls in (:meth:`Inlined.home`).

Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import libcst as cst
import libcst.matchers as m
from libcst.metadata import PositionProvider

from syncpass.core.errors import SyncpassError
from syncpass.frontend.analysis import (
    match_container_loop,
    method_of,
    recordable_loop,
    self_path,
    target_names,
)
from syncpass.frontend.bases import Ancestry, SourceClass
from syncpass.frontend.branches import (
    UNKNOWN,
    AssumedAttribute,
    AssumedDefault,
    Constant,
    FoldedBranch,
    KnownName,
    ValueLookup,
    class_key,
    constant_value,
    fold_branches,
    init_constants,
    known_names,
    no_values,
    one_returned_expression,
    parameter_defaults,
)
from syncpass.frontend.numbers import GatherBindingsVisitor, parameters

#: How many rounds of inlining at most (each may expose further calls).
MAX_ROUNDS = 8

#: Decorators a followed method may carry, by name, and what each does that the stages
#: leave out (none of it changes the loss of a training step with the default arguments).
TRANSPARENT_DECORATORS = {
    "auto_docstring": "writes the docstring",
    "deprecate_kwarg": "accepts a deprecated keyword under its new name",
    "can_return_tuple": "turns the output into a tuple when return_dict=False is asked",
    "merge_with_config_defaults": "takes use_cache and is_causal from the config when not passed",
    "capture_outputs": "collects hidden states and attentions when output_* is asked",
    "check_model_inputs": "collects hidden states and attentions when output_* is asked",
}


@dataclass(frozen=True)
class Frame:
    """A function whose statements the expanded forward runs: the forward itself (frame 0)
    or one call inlined into it, of ``method`` of ``class_name``, reached at ``path`` from
    the model (``""`` for the model's own methods, ``"transformer.h"`` for a submodule's).
    ``last`` is the index of its last top-level statement (its ``return``); ``file`` the
    file the method is in when it is not the model's (a base class's, as reports show it).
    """

    class_name: str
    method: str
    path: str
    last: int
    file: str = ""


@dataclass(frozen=True)
class Origin:
    """Where a statement of the expanded forward comes from: ``(frame, index)`` from the
    forward down to the inlined call it is in, ``index`` a top-level statement of that
    frame's function in the user's file (``-1``: an argument bound before the body). A
    statement of a decided ``if`` has the ``if``'s origin; a method's ``return`` becomes the
    assignment of its call's target, with the ``return``'s index."""

    steps: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Inlined:
    """The module with the forward expanded, the methods that were inlined (in order) and
    the branches decided (:mod:`syncpass.frontend.branches`); the functions whose
    statements it runs (``frames``) and, per statement of the expanded forward, where it
    comes from (``origins``; empty when nothing changed)."""

    module: cst.Module
    methods: tuple[str, ...]
    branches: tuple[FoldedBranch, ...] = ()
    frames: tuple[Frame, ...] = ()
    origins: tuple[Origin, ...] = ()
    # Per statement of the expanded forward, the file it is in ("" for the user's) and
    # its line there (0 where it is one the expansion wrote: an argument bound).
    lines: tuple[tuple[str, int], ...] = ()

    def home(self, after: int) -> tuple[int, int] | None:
        """``(frame, index)``: the function, and its statement, after which a sync point
        after statement ``after`` of the expanded forward goes in the user's file; ``None``
        when it has no such place (it falls inside a statement there, or between a call's
        arguments and its body), or its function runs more than once in the forward."""
        steps = self.origins[after].steps
        following = self.origins[after + 1].steps if after + 1 < len(self.origins) else ()
        for level in reversed(range(len(steps))):
            frame, index = steps[level]
            if following[: level + 1] == steps[: level + 1] or index < 0:
                return None
            if index == self.frames[frame].last and level:
                continue  # the method's return: the sync point follows its call
            return (frame, index) if self.single(frame) else None
        return None

    def single(self, frame: int) -> bool:
        """Whether the function of ``frame`` is inlined nowhere else in the forward."""
        key = (self.frames[frame].class_name, self.frames[frame].method)
        return sum((f.class_name, f.method) == key for f in self.frames) == 1


class _BoundNamesVisitor(cst.CSTVisitor):
    """Names a function body binds (assignments, loop targets, with/except names, imports)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def _bind(self, target: cst.CSTNode) -> None:
        # `x`, `x, (y, *z)`: names bound; `self.x`, `h[i]`: an object changed, nothing bound.
        self.names.update(name.value for name in target_names(target)[0])

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target)  # `del h`: the name is unbound, as clobbering as a binding

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.names.add(node.name.value)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # self.x = ... binds no local

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        return False


class _MentionsVisitor(cst.CSTVisitor):
    """Every plain name mentioned (attribute names and keywords aside)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[str, None] = {}

    def visit_Name(self, node: cst.Name) -> None:
        self.names[node.value] = None

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def mentioned_names(statements: Sequence[cst.CSTNode]) -> tuple[str, ...]:
    """The plain names ``statements`` mention, in order (a superset of what they read:
    assignment targets count too; attribute names and keywords do not)."""
    visitor = _MentionsVisitor()
    for statement in statements:
        statement.visit(visitor)
    return tuple(visitor.names)


_CONSTANT = (
    m.Integer() | m.Float() | m.SimpleString() | m.Name("True") | m.Name("False") | m.Name("None")
)
_NESTED = m.FunctionDef() | m.Lambda() | m.ClassDef()


_TARGET = m.Name() | m.Tuple(elements=[m.AtLeastN(m.Element(value=m.Name()), n=1)])


def _target_names(target: cst.BaseExpression) -> tuple[str, ...]:
    """``("x",)`` for ``x``; ``("x", "aux")`` for ``x, aux``."""
    if isinstance(target, cst.Name):
        return (target.value,)
    assert isinstance(target, cst.Tuple)
    names = []
    for element in target.elements:
        assert isinstance(element.value, cst.Name)
        names.append(element.value.value)
    return tuple(names)


def _names_of(expression: cst.BaseExpression) -> tuple[str, ...] | None:
    """``("x",)`` for ``x``, ``("x", "aux")`` for ``x, aux``; ``None`` for anything else."""
    return _target_names(expression) if m.matches(expression, _TARGET) else None


def _call_of(
    statement: cst.BaseStatement,
) -> tuple[tuple[str, ...] | None, str, cst.Call] | None:
    """``(targets, method, call)`` for ``target = self.method(...)`` (``x, aux = ...`` too)
    or ``return self.method(...)`` (targets ``None``); ``method`` is a dotted path for a
    submodule's (``self.transformer.h``)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    call_matcher = m.Call(func=m.Attribute(attr=m.Name()))
    targets: tuple[str, ...] | None
    if m.matches(small, m.Return(value=call_matcher)):
        assert isinstance(small, cst.Return) and isinstance(small.value, cst.Call)
        targets = None
        call = small.value
    elif m.matches(small, m.Assign(targets=[m.AssignTarget(target=_TARGET)], value=call_matcher)):
        assert isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)
        targets, call = _target_names(small.targets[0].target), small.value
    elif m.matches(small, m.AnnAssign(target=m.Name(), value=call_matcher)):
        # `out: Output = self.transformer(x)`: the annotation says nothing the stages need.
        assert isinstance(small, cst.AnnAssign) and isinstance(small.value, cst.Call)
        assert isinstance(small.target, cst.Name)
        targets, call = (small.target.value,), small.value
    else:
        return None
    method = self_path(call.func)
    return (targets, method, call) if method else None


def _decorator_name(decorator: cst.Decorator) -> str | None:
    """``deprecate_kwarg`` for ``@deprecate_kwarg(...)``, ``@utils.auto_docstring`` and
    ``@auto_docstring``."""
    expression = decorator.decorator
    if isinstance(expression, cst.Call):
        expression = expression.func
    if isinstance(expression, cst.Attribute):
        return expression.attr.value
    return expression.value if isinstance(expression, cst.Name) else None


def _followed_decorators(method: cst.FunctionDef) -> tuple[str, ...] | None:
    """The method's decorators, if each is transparent (else ``None``: not inlined)."""
    names = tuple(_decorator_name(decorator) for decorator in method.decorators)
    if not all(name in TRANSPARENT_DECORATORS for name in names):
        return None  # a decorator may change what the call does
    return tuple(name for name in names if name is not None)


def opaque_decorators(method: cst.FunctionDef) -> tuple[cst.Decorator, ...]:
    """The decorators of ``method`` that are not :data:`TRANSPARENT_DECORATORS`: what they
    do around the call is unknown, and a slice of the body cannot run it."""
    return tuple(
        decorator
        for decorator in method.decorators
        if _decorator_name(decorator) not in TRANSPARENT_DECORATORS
    )


def _plain_method(method: cst.FunctionDef) -> bool:
    if method.asynchronous is not None or _followed_decorators(method) is None:
        return False
    params = method.params
    if params.posonly_params:
        return False
    if isinstance(params.star_arg, cst.Param | cst.ParamStar):
        return False
    if not params.params or params.params[0].name.value != "self":
        return False
    return all(
        param.default is None or m.matches(param.default, _CONSTANT)
        for param in (*params.params[1:], *params.kwonly_params)
    )


def _returns_only_at_end(method: cst.FunctionDef) -> cst.BaseExpression | None:
    """The expression the method's last statement returns, if that is its only return."""
    if not isinstance(method.body, cst.IndentedBlock) or not method.body.body:
        return None
    last = method.body.body[-1]
    if not (
        isinstance(last, cst.SimpleStatementLine)
        and len(last.body) == 1
        and isinstance(last.body[0], cst.Return)
        and last.body[0].value is not None
    ):
        return None
    for statement in method.body.body[:-1]:
        found = m.findall(statement, m.Return() | m.Yield() | m.Global() | m.Nonlocal())
        nested = m.findall(statement, _NESTED)
        inside_nested = {
            id(node) for holder in nested for node in m.findall(holder, m.Return() | m.Yield())
        }
        if any(id(node) not in inside_nested for node in found):
            return None
    if m.findall(last.body[0], m.Yield()):
        return None
    return last.body[0].value


def _bind_arguments(
    method: cst.FunctionDef, call: cst.Call
) -> list[tuple[str, cst.BaseExpression]] | None:
    """``(parameter, expression)`` for each parameter but ``self`` (a ``**`` one last), or
    ``None`` if the call cannot be matched (``*args``, a missing argument, ``**kwargs``
    handed to a method without a ``**`` parameter, a keyword the method does not take).

    A keyword the method does not name goes into its ``**`` parameter, as Python binds it
    (``self.encoder(x, position_ids=p, **kwargs)`` into ``forward(self, x, **kwargs)``
    binds ``kwargs`` to ``{"position_ids": p, **kwargs}``). A parameter with a default that
    the call does not name, when it hands on ``**kwargs``, takes its value from them as
    Python would (``mask = kwargs.get("mask", None)``), and the method's ``**`` parameter
    gets the rest (Hugging Face's ``self.vit(pixel_values, **kwargs)`` into
    ``forward(self, pixel_values, bool_masked_pos=None, **kwargs)``)."""
    positional = list(method.params.params[1:])
    params = [*positional, *method.params.kwonly_params]
    names = {param.name.value for param in params}
    star = method.params.star_kwarg
    bound: dict[str, cst.BaseExpression] = {}
    extra: list[cst.DictElement] = []
    handed_on: cst.BaseExpression | None = None
    position = 0
    for arg in call.args:
        if arg.star == "*":
            return None
        if arg.star == "**":
            if handed_on is not None:
                return None
            handed_on = arg.value
        elif arg.keyword is None:
            if position >= len(positional):
                return None
            bound[positional[position].name.value] = arg.value
            position += 1
        else:
            name = arg.keyword.value
            if name in bound:
                return None
            if name in names:
                bound[name] = arg.value
            elif isinstance(star, cst.Param):
                extra.append(cst.DictElement(cst.SimpleString(f'"{name}"'), arg.value))
            else:
                return None
    if handed_on is not None and not isinstance(star, cst.Param):
        return None
    result = []
    unnamed: list[str] = []  # parameters the handed-on ``**`` mapping may fill
    for param in params:
        name = param.name.value
        if name in bound:
            result.append((name, bound[name]))
        elif param.default is None:
            return None
        elif handed_on is not None:
            unnamed.append(name)
            get = cst.Attribute(handed_on, cst.Name("get"))
            key = cst.Arg(cst.SimpleString(f'"{name}"'))
            result.append((name, cst.Call(get, [key, cst.Arg(param.default)])))
        else:
            result.append((name, param.default))
    if isinstance(star, cst.Param):
        rest: list[cst.BaseDictElement] = []
        if handed_on is not None and unnamed:
            # What Python leaves in ``**kwargs`` once the parameters have taken theirs.
            rest = [cst.StarredDictElement(_without_keys(handed_on, unnamed))]
        elif handed_on is not None:
            rest = [cst.StarredDictElement(handed_on)]
        if not extra and len(rest) == 1:
            element = rest[0]
            assert isinstance(element, cst.StarredDictElement)
            result.append((star.name.value, element.value))
        else:
            result.append((star.name.value, cst.Dict([*extra, *rest])))
    return result


def _without_keys(mapping: cst.BaseExpression, keys: Sequence[str]) -> cst.BaseExpression:
    """``{key: value for key, value in MAPPING.items() if key not in ("a", "b")}``."""
    listed = ", ".join(f'"{key}"' for key in keys) + ("," if len(keys) == 1 else "")
    expression = cst.parse_expression(
        f"{{key: value for key, value in MAPPING.items() if key not in ({listed})}}"
    )
    return expression.deep_replace(
        next(node for node in m.findall(expression, m.Name("MAPPING"))), mapping
    )


def _read_later(later: Sequence[cst.BaseStatement]) -> set[str]:
    """The names ``later`` may read before assigning them (``x = f(y)`` reads ``y``; a name
    assigned by a plain assignment is not read by what follows it). A ``for`` reads its
    iterable, and its body what that body reads before assigning it, but its targets; an
    ``if`` its tests and what each branch reads so; other compound statements read every
    name they mention."""
    read: set[str] = set()
    assigned: set[str] = set()
    for statement in later:
        small = (
            statement.body[0]
            if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
            else None
        )
        if isinstance(small, cst.Assign) and all(
            isinstance(target.target, cst.Name) for target in small.targets
        ):
            read |= set(mentioned_names([small.value])) - assigned
            assigned |= {
                target.target.value
                for target in small.targets
                if isinstance(target.target, cst.Name)
            }
        elif isinstance(statement, cst.For) and isinstance(statement.body, cst.IndentedBlock):
            targets = set(mentioned_names([statement.target]))
            inside = _read_later(statement.body.body) - targets
            if statement.orelse is not None:
                inside |= set(mentioned_names([statement.orelse]))
            read |= (set(mentioned_names([statement.iter])) | inside) - assigned
        elif isinstance(statement, cst.If):
            read |= _read_in_branches(statement) - assigned
        else:
            read |= set(mentioned_names([statement])) - assigned
    return read


def _read_in_branches(statement: cst.If) -> set[str]:
    """What an ``if`` may read before assigning it: its tests, and each branch's reads."""
    read = set(mentioned_names([statement.test]))
    for branch in (statement.body, statement.orelse):
        if isinstance(branch, cst.If):
            read |= _read_in_branches(branch)
        elif isinstance(branch, cst.Else) and isinstance(branch.body, cst.IndentedBlock):
            read |= _read_later(branch.body.body)
        elif isinstance(branch, cst.IndentedBlock):
            read |= _read_later(branch.body)
        elif branch is not None:
            read |= set(mentioned_names([branch]))
    return read


class _SelfAsSubmodule(cst.CSTTransformer):
    """``self`` -> ``self.<path>``: a submodule's forward read from its parent."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if updated_node.value != "self":
            return updated_node
        expression: cst.BaseExpression = cst.Name("self")
        for part in self.path.split("."):
            expression = cst.Attribute(value=expression, attr=cst.Name(part))
        return expression


class _Renamed(cst.CSTTransformer):
    """Each name of ``renames`` replaced wherever it is a variable (not an attribute's name
    or a call's keyword): a method's locals, renamed throughout its body."""

    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        fresh = self.renames.get(updated_node.value)
        return updated_node if fresh is None else updated_node.with_changes(value=fresh)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)


class _Substituted(cst.CSTTransformer):
    """Each name of ``values`` replaced by its expression wherever it is a variable (not an
    attribute's name or a call's keyword)."""

    def __init__(self, values: Mapping[str, cst.BaseExpression]) -> None:
        super().__init__()
        self.values = values

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.values.get(updated_node.value, updated_node)

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.Attribute:
        return updated_node.with_changes(attr=original_node.attr)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        return updated_node.with_changes(keyword=original_node.keyword)


def _local_function(
    name: str, earlier: Sequence[cst.BaseStatement]
) -> tuple[cst.FunctionDef, cst.Call] | None:
    """The function ``name`` the forward defines among ``earlier`` (its last binding there),
    when its body is ``return self....(...)`` alone and its parameters are plain with
    literal defaults; else ``None``."""
    for statement in reversed(earlier):
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            returned = one_returned_expression(statement)
            params = statement.params
            plain = (
                not params.posonly_params
                and not isinstance(params.star_arg, cst.Param | cst.ParamStar)
                and all(
                    param.default is None or constant_value(param.default) is not UNKNOWN
                    for param in (*params.params, *params.kwonly_params)
                )
            )
            if isinstance(returned, cst.Call) and self_path(returned.func) and plain:
                return statement, returned
            return None
        gathered = GatherBindingsVisitor()
        statement.visit(gathered)
        if any(bound == name for bound, _ in gathered.bindings):
            return None
    return None


def _spelled_keywords(
    handed: cst.BaseExpression, earlier: Sequence[cst.BaseStatement], forward: cst.FunctionDef
) -> list[cst.Arg] | None:
    """``**NAME`` written as its keywords, ``key=NAME["key"]``, where the forward made
    ``NAME = dict(**kwargs, key=..., ...)`` (or ``{**kwargs, "key": ...}``) from its own
    ``**kwargs``, which hold nothing as the stages run (they pass the example's positional
    inputs only), and has not bound it since; else ``None``."""
    star = forward.params.star_kwarg
    if not isinstance(handed, cst.Name) or not isinstance(star, cst.Param):
        return None
    own = star.name.value
    made: cst.BaseExpression | None = None
    for statement in earlier:
        gathered = GatherBindingsVisitor()
        statement.visit(gathered)
        names = {bound for bound, _ in gathered.bindings}
        if own in names and own != handed.value:
            return None  # the forward's **kwargs no longer hold nothing
        if handed.value in names:
            if made is not None or not (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Assign)
            ):
                return None
            made = statement.body[0].value
    keys: list[str] = []
    if isinstance(made, cst.Call) and m.matches(made.func, m.Name("dict")):
        for arg in made.args:
            if arg.star == "**" and m.matches(arg.value, m.Name(own)):
                continue
            if arg.star or arg.keyword is None:
                return None
            keys.append(arg.keyword.value)
    elif isinstance(made, cst.Dict):
        for element in made.elements:
            if isinstance(element, cst.StarredDictElement) and m.matches(
                element.value, m.Name(own)
            ):
                continue
            key = constant_value(element.key) if isinstance(element, cst.DictElement) else None
            if not isinstance(key, str) or not key.isidentifier():
                return None
            keys.append(key)
    else:
        return None
    return [
        cst.Arg(
            cst.Subscript(handed, [cst.SubscriptElement(cst.Index(cst.SimpleString(f'"{key}"')))]),
            keyword=cst.Name(key),
        )
        for key in keys
    ]


def _through_local_function(
    statement: cst.BaseStatement, earlier: Sequence[cst.BaseStatement], caller: _Caller
) -> cst.BaseStatement | None:
    """``statement`` (``x, y = f(...)`` or ``return f(...)``) with the call of a function
    the forward defines, ``def f(inp, cache=None, **kwargs): return self.layers(inp, ...)``
    (x-transformers' ``_attn_layers_forward``), written as the call it returns, bound to
    the arguments as Python binds them; ``None`` where it is no such call. A closure reads
    the forward's names when it runs, as the call in its place does."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    call = small.value if isinstance(small, cst.Assign | cst.Return) else None
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
        return None
    found = _local_function(call.func.value, earlier)
    if found is None:
        return None
    function, returned = found
    params = function.params
    positional = list(params.params)
    names = [param.name.value for param in (*positional, *params.kwonly_params)]
    bound: dict[str, cst.BaseExpression] = {}
    extra: list[cst.Arg] = []
    for position, arg in enumerate(call.args):
        if arg.star == "*":
            return None
        if arg.star == "**":
            spelled = _spelled_keywords(arg.value, earlier, caller.definition)
            if spelled is None:
                return None
            extra.extend(spelled)
        elif arg.keyword is None:
            if position >= len(positional):
                return None
            bound[positional[position].name.value] = arg.value
        elif arg.keyword.value in names:
            bound[arg.keyword.value] = arg.value
        else:
            extra.append(arg)
    for param in (*positional, *params.kwonly_params):
        if param.name.value not in bound:
            if param.default is None:
                return None
            bound[param.name.value] = param.default
    spread: list[cst.Arg] = []
    for arg in returned.args:
        star = params.star_kwarg
        if (
            arg.star == "**"
            and isinstance(star, cst.Param)
            and m.matches(arg.value, m.Name(star.name.value))
        ):
            spread.extend(extra)  # what the function's **kwargs took
        elif arg.star:
            return None
        else:
            spread.append(arg.with_changes(value=arg.value.visit(_Substituted(bound))))
    if extra and not isinstance(params.star_kwarg, cst.Param):
        return None
    keywords = [arg.keyword.value for arg in spread if arg.keyword is not None]
    if len(keywords) != len(set(keywords)):
        return None  # a keyword given twice: Python would refuse the call
    spread = [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in spread]
    written = returned.with_changes(func=returned.func, args=spread)
    return statement.with_changes(body=[small.with_changes(value=written)])


def _closure_reads(statements: Sequence[cst.BaseStatement]) -> set[str]:
    """The names functions and lambdas made in ``statements`` mention: they read them
    whenever they run, after any call that comes later."""
    nested = [node for statement in statements for node in m.findall(statement, _NESTED)]
    return set(mentioned_names(nested))


def _nested_parameters(body: cst.BaseSuite) -> set[str]:
    """The parameters of the functions and lambdas defined in ``body``."""
    return {
        param.name.value for param in m.findall(body, m.Param()) if isinstance(param, cst.Param)
    }


def _fresh_names(clashing: set[str], prefix: str, taken: set[str]) -> dict[str, str]:
    """A new name for each of ``clashing``, ``<prefix>_<name>`` (a number after it while
    that is ``taken``): what an inlined method's locals become where the forward's own
    names of the same spelling are still needed."""
    renames: dict[str, str] = {}
    for name in sorted(clashing):
        fresh, number = f"{prefix}_{name}", 2
        while fresh in taken:
            fresh, number = f"{prefix}_{name}_{number}", number + 1
        taken.add(fresh)
        renames[name] = fresh
    return renames


@dataclass(frozen=True)
class _Names:
    """The methods a model's classes are read with: ``forward`` built in ``__init__`` for
    torch, ``__call__`` built in ``setup`` for Flax."""

    forward: str = "forward"
    init: str = "__init__"


@dataclass(frozen=True)
class _Stack:
    """A submodule to follow: its class, and the method the call runs; ``sequences`` are
    its attributes that are ``nn.Sequential`` stacks of layers (:func:`_layer_sequences`)."""

    class_name: str
    method: cst.FunctionDef
    sequences: frozenset[str] = frozenset()


def _loops_over_layers(forward: cst.FunctionDef) -> bool:
    """Whether the forward has a top-level loop over a layer container, or one the example's
    run may show runs a layer an iteration (:func:`recordable_loop`: the eager form's
    census reads it once the forward is expanded)."""
    return isinstance(forward.body, cst.IndentedBlock) and any(
        isinstance(statement, cst.For)
        and (
            ((loop := match_container_loop(statement)) is not None and loop.root == "self")
            or recordable_loop(statement)
        )
        for statement in forward.body.body
    )


def _file_method(
    classdef: cst.ClassDef, classes: Mapping[str, cst.ClassDef], name: str
) -> cst.FunctionDef | None:
    """The method ``name`` the class runs: its own, or the first of its bases of the same
    file that defines it (x-transformers' ``Decoder(AttentionLayers)``), following each
    class's first base."""
    seen: set[str] = set()
    current: cst.ClassDef | None = classdef
    while current is not None and current.name.value not in seen:
        seen.add(current.name.value)
        found = method_of(current, name)
        if found is not None:
            return found
        first = current.bases[0].value if current.bases else None
        current = classes.get(first.value) if isinstance(first, cst.Name) else None
    return None


_SEQUENTIAL = m.Name("Sequential") | m.Attribute(attr=m.Name("Sequential"))


def _layer_sequences(classdef: cst.ClassDef, names: _Names) -> frozenset[str]:
    """The attributes ``__init__`` builds as an ``nn.Sequential`` of layers made elsewhere
    (``self.layers = nn.Sequential(layers)``, ``nn.Sequential(*blocks)``: torchvision's ViT
    encoder), not of layers written out in the call (an MLP)."""
    init = method_of(classdef, names.init)
    if init is None:
        return frozenset()
    built = m.Assign(
        targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name()))],
        value=m.Call(func=_SEQUENTIAL),
    )
    found = set()
    for assign in m.findall(init, built):
        assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
        arguments = assign.value.args
        if arguments and all(not isinstance(arg.value, cst.Call) for arg in arguments):
            target = assign.targets[0].target
            assert isinstance(target, cst.Attribute)
            found.add(target.attr.value)
    return frozenset(found)


def _runs_a_sequence(forward: cst.FunctionDef, sequences: frozenset[str]) -> bool:
    """Whether the forward calls one of its class's layer sequences (``self.layers(...)``)."""
    called = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name()))
    return any(
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value in sequences
        for call in m.findall(forward, called)
    )


def _submodule_classes(
    classdef: cst.ClassDef,
    classes: Mapping[str, cst.ClassDef],
    names: _Names,
    prefix: str = "",
    seen: frozenset[str] = frozenset(),
    values: ValueLookup = no_values,
) -> dict[str, _Stack]:
    """``self.NAME = Cls(...)`` in ``__init__`` with ``Cls`` a class of the file whose forward
    loops over a layer container, or runs an ``nn.Sequential`` stack of layers (torchvision's
    ViT encoder), or builds such a submodule itself (Flax GPT-2's ``self.transformer``, whose
    ``self.h`` loops over the blocks): path -> that class and forward, for each such
    submodule at any depth (``transformer``, ``transformer.h``).

    A submodule handed to ``__init__`` (x-transformers' ``self.attn_layers =
    attn_layers``) is of the class the built model holds there (``values`` answers
    :func:`class_key`), when that class is of the file; its forward may be a base's of
    the file (``Decoder(AttentionLayers)``)."""
    init = method_of(classdef, names.init)
    if init is None:
        return {}
    found: dict[str, _Stack] = {}
    assigned = m.Assign(
        targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name()))]
    )
    for assign in m.findall(init, assigned):
        assert isinstance(assign, cst.Assign)
        target = assign.targets[0].target
        assert isinstance(target, cst.Attribute)
        path = f"{prefix}{target.attr.value}"
        func = assign.value.func if isinstance(assign.value, cst.Call) else None
        if isinstance(func, cst.Name) and func.value in classes:
            class_name = func.value
            forward = method_of(classes[class_name], names.forward)
        elif func is None:  # handed in: the class the built model holds
            held = values(class_key(path))
            if not isinstance(held, str) or held not in classes:
                continue
            class_name = held
            forward = _file_method(classes[class_name], classes, names.forward)
        else:
            continue
        other = classes[class_name]
        if other is classdef or class_name in seen:
            continue
        if forward is None or not isinstance(forward.body, cst.IndentedBlock):
            continue
        inner = _submodule_classes(other, classes, names, f"{path}.", seen | {class_name}, values)
        sequences = _layer_sequences(other, names)
        if inner or _loops_over_layers(forward) or _runs_a_sequence(forward, sequences):
            found[path] = _Stack(class_name, forward, sequences)
            found.update(inner)
    return found


#: Statements that end a method early: what a pre-folded method may hold only at its end.
_EARLY_EXIT = m.Return() | m.Yield() | m.Global() | m.Nonlocal()


def _exits_early(method: cst.FunctionDef) -> bool:
    """Whether a top-level ``if`` of the method holds a ``return`` before its last statement
    (Flax GPT-2's ``if not return_dict: return ...``), which only a decided branch removes."""
    assert isinstance(method.body, cst.IndentedBlock)
    return any(
        isinstance(statement, cst.If) and m.findall(statement, m.Return())
        for statement in method.body.body[:-1]
    )


def _given_defaults(
    arguments: Sequence[tuple[str, cst.BaseExpression]],
    caller: dict[str, AssumedDefault],
    known: dict[str, KnownName],
) -> tuple[dict[str, AssumedDefault], dict[str, KnownName]]:
    """What the call binds the method's parameters to, where that is known before the run:
    a constant (its own default, or one the call passes), a parameter of the forward
    handed on that keeps its default or what the example passes (``caller``), or a name the
    forward knows at the call (``known``: Hugging Face's ``return_dict=return_dict``
    after ``return_dict = ... self.config.return_dict``); and, for each parameter bound
    to such a name, what its value rests on."""
    given: dict[str, AssumedDefault] = {}
    basis: dict[str, KnownName] = {}
    for param, expression in arguments:
        if isinstance(expression, cst.Name) and expression.value in caller:
            # The forward's own parameter handed on (`self.model(input_ids, ...)`): what it
            # rests on is that parameter, so the profile checks the example against it.
            given[param] = caller[expression.value]
            continue
        if isinstance(expression, cst.Name) and expression.value in known:
            name = known[expression.value]
            given[param] = AssumedDefault(param, name.value, None)
            basis[param] = name
            continue
        value = constant_value(expression)
        if value is not UNKNOWN:
            given[param] = AssumedDefault(param, value, None)  # type: ignore[arg-type]
    return given, basis


def _resting_on(branch: FoldedBranch, basis: dict[str, KnownName]) -> FoldedBranch:
    """``branch`` (decided inside an inlined method) with what the names it read of the
    forward's rest on: their reads, attributes and defaults."""
    used = [basis[name] for name, _ in branch.reads if name in basis]
    if not used:
        return branch
    return dataclasses.replace(
        branch,
        reads=tuple(
            {**{k: v for name in used for k, v in name.reads}, **dict(branch.reads)}.items()
        ),
        assumed=(
            *(AssumedAttribute(*pair) for name in used for pair in name.assumed),
            *branch.assumed,
        ),
        defaults=(*(default for name in used for default in name.defaults), *branch.defaults),
    )


@dataclass(frozen=True)
class _Expansion:
    """What one inlined call becomes: ``body``, and for each of its statements the index of
    the method's statement it comes from (``-1`` for a bound argument); the call as the
    report names it, the submodule path (``""`` for an own method), the branches decided
    inside it first, and the method's own last index."""

    body: list[cst.BaseStatement]
    indices: list[int]
    description: str
    class_name: str
    method: str
    path: str
    last: int
    branches: tuple[FoldedBranch, ...]
    file: str = ""


@dataclass(frozen=True)
class _Caller:
    """What the forward being expanded offers an inlined call."""

    model: str
    methods: dict[str, cst.FunctionDef]
    stacks: dict[str, _Stack]
    names: set[str]  # its parameters and every name it binds
    defaults: dict[str, AssumedDefault]  # its parameters that keep a constant default
    config: cst.Module
    line_of: Callable[[cst.CSTNode], int]
    forward: str
    owners: dict[str, SourceClass]  # a method's class, where it is not the model's own
    barred: frozenset[str]  # methods kept as one call (their globals differ in the model's file)
    definition: cst.FunctionDef  # the forward itself
    attributes: dict[str, Constant]  # the model's __init__ constants
    values: ValueLookup  # the built model's settings

    def known_before(self, earlier: Sequence[cst.BaseStatement]) -> dict[str, KnownName]:
        """The names the forward knows after ``earlier``, its statements before a call."""
        return known_names(earlier, self.definition, None, self.values, self.attributes)


def _scoped(values: ValueLookup, path: str) -> ValueLookup:
    """``values`` as seen from the submodule at ``path`` (``""``: the model itself)."""
    if not path:
        return values
    return lambda inner: values(f"{path}.{inner}")


def _inline_one(
    statement: cst.BaseStatement,
    earlier: Sequence[cst.BaseStatement],
    later: Sequence[cst.BaseStatement],
    caller: _Caller,
) -> _Expansion | None:
    found = _call_of(statement)
    if found is None:
        through = _through_local_function(statement, earlier, caller)
        found = _call_of(through) if through is not None else None
        if found is None:
            return None
        statement = through  # type: ignore[assignment]
    targets, name, call = found
    config = caller.config
    method = caller.methods.get(name)
    owner = caller.owners.get(name)
    class_name, path = (caller.model if owner is None else owner.name), ""
    file = owner.file.path if owner is not None and not owner.own else ""
    line_of = caller.line_of if not file or owner is None else owner.file.line
    sequences: frozenset[str] = frozenset()
    if name in caller.barred:
        return None
    if name in caller.stacks and name not in caller.methods:
        stack = caller.stacks[name]
        method, class_name, path = stack.method, stack.class_name, name
        sequences = frozenset(f"self.{path}.{attr}" for attr in stack.sequences)
    elif method is None or name == caller.forward:
        return None
    if not _plain_method(method):
        return None
    arguments = _bind_arguments(method, call)
    if arguments is None:
        return None
    assert isinstance(method.body, cst.IndentedBlock)
    last = len(method.body.body) - 1
    own = list(method.body.body)
    indices = list(range(len(own)))
    decided: list[FoldedBranch] = []
    if _exits_early(method):
        # Decide the method's branches with what the call binds first: a return that stays
        # in one means the method cannot be inlined.
        given, basis = _given_defaults(arguments, caller.defaults, caller.known_before(earlier))
        values = _scoped(caller.values, path)
        own, folded, sources = fold_branches(
            own, {}, method, config, line_of, given, values, file_of=lambda _: file
        )
        indices = [indices[source] for source in sources]
        decided.extend(_resting_on(branch, basis) for branch in folded)
        method = method.with_changes(body=method.body.with_changes(body=tuple(own)))
    if path:
        method = method.with_changes(body=method.body.visit(_SelfAsSubmodule(path)))
    assert isinstance(method.body, cst.IndentedBlock)
    bound = _BoundNamesVisitor()
    method.body.visit(bound)
    # A parameter handed the forward's name of the same name (`cache=cache`) binds nothing new.
    assigned = {param for param, value in arguments if not m.matches(value, m.Name(param))}
    # What the forward reads after the call: its later statements, and a function or lambda
    # made before it, which reads its names when it runs.
    read_after = _read_later(later) | _closure_reads(earlier)
    clashing = ((bound.names | assigned) - set(targets or ())) & read_after
    # Python binds every argument before the body runs: a parameter assigned here must not
    # change what another argument reads (T5's decoder takes attention_mask=decoder_mask
    # and encoder_attention_mask=attention_mask, the forward's own).
    clashing |= {
        param
        for param in assigned
        if any(param in mentioned_names([value]) for other, value in arguments if other != param)
    }
    if clashing & _nested_parameters(method.body):
        return None  # a keyword call of a nested function would no longer match its name
    if clashing:
        # The method binds names the forward still reads after the call (T5's decoder
        # rebinds `return_dict`, which the forward tests once it returns): as Python keeps
        # a call's locals apart, the inlined statements use names of their own.
        prefix = path.rsplit(".", 1)[-1] if path else method.name.value.strip("_")
        taken = {*caller.names, *mentioned_names([method.body]), *mentioned_names(later)}
        taken |= {*mentioned_names(earlier), *mentioned_names([statement])}
        taken |= {param for param, _ in arguments}
        renames = _fresh_names(clashing, prefix, taken)
        method = method.with_changes(body=method.body.visit(_Renamed(renames)))
        arguments = [(renames.get(param, param), value) for param, value in arguments]
        bound = _BoundNamesVisitor()
        method.body.visit(bound)
        assigned = {param for param, value in arguments if not m.matches(value, m.Name(param))}
    returned = _returns_only_at_end(method)
    if returned is None:
        return None
    assert isinstance(method.body, cst.IndentedBlock)
    binds = bound.names | assigned
    free = set(mentioned_names(method.body.body)) - binds - {p for p, _ in arguments} - {"self"}
    if free & caller.names:
        return None  # a global the method reads is a local of the forward
    if isinstance(statement, cst.SimpleStatementLine) and statement.trailing_whitespace.comment:
        return None  # a comment on the call line (a sync pin, say) belongs to the call
    body: list[cst.BaseStatement] = []
    for param, expression in arguments:
        if m.matches(expression, m.Name(param)):
            continue
        code = f"{param} = {config.code_for_node(expression)}\n"
        body.append(cst.parse_statement(code, config=config.config_for_parsing))
    origins = [-1] * len(body)
    body.extend(method.body.body[:-1])
    origins.extend(indices[:-1])
    final_statement = method.body.body[-1]
    assert isinstance(final_statement, cst.SimpleStatementLine)
    value = config.code_for_node(returned)
    # `x = x` (the method hands back the names it was given) is left out, unless nothing is left.
    handed_back = targets is not None and _names_of(returned) == targets
    if not (body and handed_back):
        if targets is not None and len(targets) == 1:
            chain = _calls_in_chain(returned, sequences, config, targets[0])
            for step in chain[:-1]:  # `x = self.ln(self.layers(y))`: the layers on their own
                code = f"{targets[0]} = {step}\n"
                body.append(cst.parse_statement(code, config=config.config_for_parsing))
                origins.append(last)
            value = chain[-1] if chain else value
        final = f"{', '.join(targets)} = {value}\n" if targets is not None else f"return {value}\n"
        replacement = cst.parse_statement(final, config=config.config_for_parsing)
        assert isinstance(replacement, cst.SimpleStatementLine)
        body.append(
            replacement.with_changes(trailing_whitespace=final_statement.trailing_whitespace)
        )
        origins.append(last)
    assert isinstance(statement, cst.SimpleStatementLine)
    first = body[0]
    if isinstance(first, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        lines = (*statement.leading_lines, *first.leading_lines)
        body[0] = first.with_changes(leading_lines=lines)
    decorators = _followed_decorators(method) or ()
    left_out = f" (without {', '.join(f'@{d}' for d in decorators)})" if decorators else ""
    if file and owner is not None:
        line = owner.file.line(caller.methods[name])
        left_out += f" ({owner.name}'s, {file}:{line})"
    return _Expansion(
        body=body,
        indices=origins,
        description=f"self.{name}{left_out}",
        class_name=class_name,
        method=method.name.value,
        path=path,
        last=last,
        branches=tuple(decided),
        file=file,
    )


def _calls_in_chain(
    returned: cst.BaseExpression, sequences: frozenset[str], config: cst.Module, name: str
) -> list[str]:
    """A returned chain of one-argument calls that runs a layer sequence, as one call per
    statement, each reading ``name`` (which the one before assigns): ``self.ln(self.layers(
    self.dropout(x)))`` into ``x`` is ``["self.dropout(x)", "self.layers(x)",
    "self.ln(x)"]``; ``[]`` for anything else. So written, the sequence's layers can be
    planned one by one."""
    calls: list[cst.Call] = []
    node: cst.BaseExpression = returned
    while (
        isinstance(node, cst.Call)
        and len(node.args) == 1
        and node.args[0].keyword is None
        and node.args[0].star == ""
    ):
        calls.append(node)
        node = node.args[0].value
    functions = [config.code_for_node(call.func) for call in calls]
    if len(calls) < 2 or not sequences & set(functions):
        return []
    steps = [config.code_for_node(calls[-1])]
    steps.extend(f"{function}({name})" for function in reversed(functions[:-1]))
    return steps


class _OriginalLines:
    """The line of each statement of the expanded forward in the file it comes from: its
    own, or for a statement inlined from a method (and rewritten there: ``self`` read as a
    submodule), that of the method's statement it came from (its :class:`Origin`). That
    file is the user's, or for a method of a base class in another module (``owners``, by
    frame), that module's (:meth:`file`)."""

    def __init__(
        self,
        line_of: Callable[[cst.CSTNode], int],
        statements: Sequence[cst.BaseStatement],
        origins: Sequence[Origin],
        frames: Sequence[Frame],
        classes: Mapping[str, cst.ClassDef],
        owners: Sequence[SourceClass | None] = (),
    ) -> None:
        self.line_of = line_of
        self.inlined: dict[int, int] = {}
        self.files: dict[int, str] = {}
        for statement, origin in zip(statements, origins, strict=True):
            frame, index = origin.steps[-1]
            owner = owners[frame] if frame < len(owners) else None
            if (frame == 0 and owner is None) or index < 0:
                continue
            if owner is not None:
                body = _method_body(owner.classdef, frames[frame].method)
                lines: Callable[[cst.CSTNode], int] = owner.file.line
            else:
                held = classes.get(frames[frame].class_name)
                method = _file_method(held, classes, frames[frame].method) if held else None
                body = (
                    method.body.body
                    if method and isinstance(method.body, cst.IndentedBlock)
                    else ()
                )
                lines = line_of
            if index < len(body):
                self.inlined[id(statement)] = lines(body[index])
                if frames[frame].file:
                    self.files[id(statement)] = frames[frame].file
        self.statements = statements  # keeps the ids above the statements' own

    def __call__(self, node: cst.CSTNode) -> int:
        return self.line_of(node) or self.inlined.get(id(node), 0)

    def file(self, node: cst.CSTNode) -> str:
        """The file ``node`` comes from, ``""`` for the user's."""
        return "" if self.line_of(node) else self.files.get(id(node), "")


def _method_body(classdef: cst.ClassDef | None, name: str) -> Sequence[cst.BaseStatement]:
    if classdef is None:
        return ()
    for member in classdef.body.body:
        if isinstance(member, cst.FunctionDef) and member.name.value == name:
            return member.body.body if isinstance(member.body, cst.IndentedBlock) else ()
    return ()


class SourceLines:
    """The line of each node of a module, read once, when first asked (0 for a node that
    is not in it)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.lines: dict[cst.CSTNode, int] | None = None

    def __call__(self, node: cst.CSTNode) -> int:
        if self.lines is None:
            wrapper = cst.MetadataWrapper(self.module, unsafe_skip_copy=True)
            positions = wrapper.resolve(PositionProvider)
            self.lines = {key: value.start.line for key, value in positions.items()}
        return self.lines.get(node, 0)


@dataclass(frozen=True)
class ModuleClasses:
    """The top-level classes of ``module``, read once per module: where each name is
    defined (``positions``, in ``module.body``; a name defined twice has two) and the
    class each name means (``classes``, the last definition, as Python binds it).

    Expanding every model class of a file asks, for each class, for that class and
    for the file's classes (the submodules it builds): read off ``module.body`` each
    time, that work grew with classes x file. Build it with :meth:`of`; after a class
    is replaced in the module, :meth:`of` the new module again (only the classes
    whose forward changed cost that).
    """

    module: cst.Module
    positions: Mapping[str, tuple[int, ...]]
    classes: Mapping[str, cst.ClassDef]

    def __post_init__(self) -> None:
        for name, where in self.positions.items():
            last = self.module.body[where[-1]] if where else None
            if not isinstance(last, cst.ClassDef) or self.classes.get(name) is not last:
                raise ValueError(
                    f"ModuleClasses does not match its module at class {name}: "
                    "build it with ModuleClasses.of(module)"
                )

    @classmethod
    def of(cls, module: cst.Module) -> ModuleClasses:
        """The classes of ``module``: one pass over its top-level statements."""
        positions: dict[str, list[int]] = {}
        classes: dict[str, cst.ClassDef] = {}
        for index, statement in enumerate(module.body):
            if isinstance(statement, cst.ClassDef):
                positions.setdefault(statement.name.value, []).append(index)
                classes[statement.name.value] = statement
        return cls(
            module,
            MappingProxyType({name: tuple(where) for name, where in positions.items()}),
            MappingProxyType(classes),
        )

    def single(self, name: str) -> tuple[int, cst.ClassDef] | None:
        """The position and the class ``name``, when the module defines it exactly once."""
        where = self.positions.get(name, ())
        return (where[0], self.classes[name]) if len(where) == 1 else None


def _own_methods(classdef: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    """The class's methods by name (the last ``def`` of a name, as Python binds it)."""
    return {
        member.name.value: member
        for member in classdef.body.body
        if isinstance(member, cst.FunctionDef)
    }


#: The compound statements :func:`_may_build_submodule` looks into, and the fields that hold
#: their statements.
_NESTING = (
    cst.IndentedBlock,
    cst.If,
    cst.Else,
    cst.For,
    cst.While,
    cst.With,
    cst.Try,
    cst.TryStar,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
    cst.Finally,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Match,
    cst.MatchCase,
)
_NESTED_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")


def _may_build_submodule(
    init: cst.FunctionDef, roots: set[str], classes: Mapping[str, cst.ClassDef]
) -> bool:
    """Whether ``init`` may assign one of ``self.ROOT`` (``roots``) a new instance of a class
    of the file (``self.transformer = Transformer(...)``), the only way a call of it can be
    a submodule :func:`_submodule_classes` follows. It walks statements only, never
    expressions (where no assignment statement can be), so it costs no libcst visit; a
    statement of a kind it does not know answers yes."""
    built = m.Assign(
        targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name()))],
        value=m.Call(func=m.Name()),
    )
    pending: list[object] = [init.body]
    while pending:
        node = pending.pop()
        if isinstance(node, cst.SimpleStatementLine | cst.SimpleStatementSuite):
            for small in node.body:
                if isinstance(small, cst.Assign) and m.matches(small, built):
                    target, call = small.targets[0].target, small.value
                    assert isinstance(target, cst.Attribute) and isinstance(call, cst.Call)
                    assert isinstance(call.func, cst.Name)
                    if target.attr.value in roots and call.func.value in classes:
                        return True
        elif isinstance(node, _NESTING):
            for field in _NESTED_FIELDS:
                value = getattr(node, field, None)
                if isinstance(value, Sequence):
                    pending.extend(value)
                elif value is not None:
                    pending.append(value)
        else:
            return True
    return False


def _may_expand(
    forward: cst.FunctionDef,
    methods: Mapping[str, cst.FunctionDef],
    classdef: cst.ClassDef,
    classes: Mapping[str, cst.ClassDef],
    names: _Names,
) -> bool:
    """Whether expanding ``forward`` could change it: one of its top-level statements is an
    ``if`` (a branch to decide) or a call statement (:func:`_call_of`) of one of the class's
    own ``methods`` or of a submodule that ``__init__`` builds from a class of the file, or
    a function it defines (which may call one).

    Most classes of a large file are small modules whose forward calls nothing of their
    own; this answers for them from their top-level statements, where the expansion
    itself costs several libcst visits of the class (its ``__init__`` constants, its
    submodules, its branches). It may say yes where nothing changes, never no where
    something would."""
    assert isinstance(forward.body, cst.IndentedBlock)
    roots: set[str] = set()
    for statement in forward.body.body:
        if isinstance(statement, cst.If | cst.FunctionDef):
            return True  # a branch to decide; a local function whose calls may be followed
        found = _call_of(statement)
        if found is None:
            continue
        name = found[1]
        if name in methods:
            return True
        roots.add(name.split(".")[0])
    init = method_of(classdef, names.init)
    return bool(roots) and init is not None and _may_build_submodule(init, roots, classes)


def inline_own_methods(
    module: cst.Module,
    class_name: str,
    lines: SourceLines | None = None,
    *,
    forward_method: str = "forward",
    init_method: str = "__init__",
    values: ValueLookup = no_values,
    ancestry: Ancestry | None = None,
    classes: ModuleClasses | None = None,
    originals: ModuleClasses | None = None,
) -> Inlined:
    """``module`` with ``class_name.forward``'s calls of the class's own methods inlined and
    its decided branches folded. ``lines`` gives the lines of the user's file (``module``'s
    own by default: pass the original's when ``module`` is already expanded elsewhere).
    ``forward_method`` and ``init_method`` name the method that computes a module and the
    one that builds its submodules (``__call__`` and ``setup`` for Flax).

    With ``ancestry`` (the class and its bases, read from source:
    :func:`syncpass.frontend.bases.read_ancestry`) the methods are those the class runs,
    its bases' where it does not override them, the forward among them: the class in the
    returned module defines the expanded forward, and the bases' methods the forward
    still calls (for what a stage holds). A statement from a base's method that reads a
    global the user's module does not bind the same way keeps that method one call;
    when it is the forward's own, :class:`SyncpassError` says which name and where.

    ``classes`` is ``module``'s :class:`ModuleClasses`, when the caller expands several
    classes of one module (read from ``module`` otherwise); ``originals`` are the classes
    as the user wrote them, before any was expanded: a submodule's forward is inlined as
    written, since the expansion of its own class decided its branches with its defaults,
    not with what this call passes."""
    if classes is None:
        classes = ModuleClasses.of(module)
    elif classes.module is not module:
        raise ValueError("inline_own_methods: `classes` must be ModuleClasses.of(module)")
    names = _Names(forward_method, init_method)
    barred: set[str] = set()
    while True:
        result = _inline_once(
            classes, class_name, lines, names, ancestry, barred, values, originals
        )
        if isinstance(result, Inlined):
            return result
        barred.add(result)


def _inline_once(
    index: ModuleClasses,
    class_name: str,
    lines: SourceLines | None,
    names: _Names,
    ancestry: Ancestry | None,
    barred: set[str],
    values: ValueLookup = no_values,
    originals: ModuleClasses | None = None,
) -> Inlined | str:
    """:func:`inline_own_methods` with the methods ``barred`` kept as calls; or the name of
    an inherited method to keep as a call too (its statements read a global that differs)."""
    forward_method = names.forward
    module = index.module
    found = index.single(class_name)
    if found is None:
        return Inlined(module, ())
    at, classdef = found
    methods = _own_methods(classdef)
    classes = index.classes
    if ancestry is None:
        own_forward = methods.get(forward_method)
        if (
            own_forward is None
            or not isinstance(own_forward.body, cst.IndentedBlock)
            or not _may_expand(own_forward, methods, classdef, classes, names)
        ):
            return Inlined(module, ())
    owners: dict[str, SourceClass] = {}
    bases: tuple[cst.ClassDef, ...] = ()
    if ancestry is not None:
        resolved = ancestry.methods()
        methods = {name: function for name, (_, function) in resolved.items()}
        owners = {name: owner for name, (owner, _) in resolved.items()}
        bases = tuple(cls.classdef for cls in ancestry.classes[1:])
    forward = methods.get(forward_method)
    if forward is None or not isinstance(forward.body, cst.IndentedBlock):
        return Inlined(module, ())
    inherited = forward_method not in {
        member.name.value for member in classdef.body.body if isinstance(member, cst.FunctionDef)
    }
    statements = list(forward.body.body)
    forward_owner = owners.get(forward_method)
    forward_file = (
        forward_owner.file.path if forward_owner is not None and not forward_owner.own else ""
    )
    frames = [
        Frame(
            forward_owner.name if forward_owner is not None else class_name,
            forward_method,
            "",
            len(statements) - 1,
            forward_file,
        )
    ]
    frame_owners: list[SourceClass | None] = [forward_owner if inherited else None]
    origins = [Origin(((0, position),)) for position in range(len(statements))]
    inlined: list[str] = []
    folded: list[FoldedBranch] = []
    own_parameters = parameters(forward)
    attributes = init_constants(classdef, names.init, bases)
    line_of = lines if lines is not None else SourceLines(module)
    # The submodules' classes as written (their own expansion assumed their defaults).
    written = (originals or index).classes
    stacks = _submodule_classes(classdef, written, names, values=values)  # the same each round
    for _ in range(MAX_ROUNDS):
        changed = False
        expanded: list[cst.BaseStatement] = []
        expanded_origins: list[Origin] = []
        bound = _BoundNamesVisitor()
        for current in statements:
            current.visit(bound)
        assigned = GatherBindingsVisitor()
        for current in statements:
            current.visit(assigned)
        rebound = {name for name, _ in assigned.bindings}
        caller = _Caller(
            model=class_name,
            methods=methods,
            stacks=stacks,
            names=own_parameters | bound.names,
            defaults={
                name: default
                for name, default in parameter_defaults(forward, values).items()
                if name not in rebound
            },
            config=module,
            line_of=line_of,
            forward=forward_method,
            owners={name: owner for name, owner in owners.items() if owner.name != class_name},
            barred=frozenset(barred),
            definition=forward,
            attributes=attributes,
            values=values,
        )
        for position, current in enumerate(statements):
            later = statements[position + 1 :]
            result = _inline_one(current, statements[:position], later, caller)
            if result is None:
                expanded.append(current)
                expanded_origins.append(origins[position])
                continue
            frame = len(frames)
            frames.append(
                Frame(result.class_name, result.method, result.path, result.last, result.file)
            )
            owner = caller.owners.get(result.method) if not result.path else None
            frame_owners.append(owner)
            expanded.extend(result.body)
            steps = origins[position].steps
            expanded_origins.extend(Origin((*steps, (frame, i))) for i in result.indices)
            inlined.append(result.description)
            folded.extend(result.branches)
            changed = True
        where = _OriginalLines(line_of, expanded, expanded_origins, frames, written, frame_owners)
        statements, decided, sources = fold_branches(
            expanded, attributes, forward, module, where, values=values, file_of=where.file
        )
        origins = [expanded_origins[source] for source in sources]
        folded.extend(decided)
        if not changed and not decided:
            break
    statements, origins = _without_spent_functions(statements, origins, forward)
    if ancestry is not None:
        where = _OriginalLines(line_of, statements, origins, frames, written, frame_owners)
        refused = _foreign_reads(statements, origins, frame_owners, forward, ancestry, where)
        if refused is not None:
            frame, message = refused
            if frame:
                return frames[frame].method
            raise SyncpassError(message, ancestry.model.file.path)
    if not inlined and not folded and not inherited:
        return Inlined(module, ())
    # The stages run the forward's statements without its decorators: so is it profiled
    # (a transparent one only; another keeps the forward as written).
    decorators = forward.decorators if _followed_decorators(forward) is None else ()
    new_forward = forward.with_changes(
        body=forward.body.with_changes(body=tuple(statements)), decorators=decorators
    )
    members = [new_forward if member is forward else member for member in classdef.body.body]
    if inherited:
        members.append(new_forward.with_changes(leading_lines=(cst.EmptyLine(indent=False),)))
        members.extend(_called_methods(statements, methods, owners, class_name))
    new_class = classdef.with_changes(body=classdef.body.with_changes(body=tuple(members)))
    body = [*module.body[:at], new_class, *module.body[at + 1 :]]
    if inherited and forward_owner is not None:
        line = forward_owner.file.line(forward)
        inlined.insert(0, f"{forward_owner.name}.{forward_method} ({forward_file}:{line})")
    where = _OriginalLines(line_of, statements, origins, frames, written, frame_owners)
    return Inlined(
        module.with_changes(body=body),
        tuple(inlined),
        tuple(folded),
        tuple(frames),
        tuple(origins),
        tuple((where.file(statement), where(statement)) for statement in statements),
    )


def _without_spent_functions(
    statements: list[cst.BaseStatement], origins: list[Origin], forward: cst.FunctionDef
) -> tuple[list[cst.BaseStatement], list[Origin]]:
    """``statements`` without the functions the forward defined and called, every call of
    which was followed (:func:`_through_local_function`): nothing reads them any more, and
    a stage that kept one would hold what it closes over (``self.attn_layers``) for
    nothing."""
    assert isinstance(forward.body, cst.IndentedBlock)
    defined = {
        statement.name.value
        for statement in statements
        if isinstance(statement, cst.FunctionDef) and not statement.decorators
    }
    if not defined:
        return statements, origins
    called_before = set(mentioned_names(list(forward.body.body)))
    rest = [s for s in statements if not isinstance(s, cst.FunctionDef)]
    still = set(mentioned_names(rest))
    spent = {name for name in defined if name in called_before and name not in still}
    kept = [
        (statement, origin)
        for statement, origin in zip(statements, origins, strict=True)
        if not (isinstance(statement, cst.FunctionDef) and statement.name.value in spent)
    ]
    return [statement for statement, _ in kept], [origin for _, origin in kept]


def _called_methods(
    statements: Sequence[cst.BaseStatement],
    methods: dict[str, cst.FunctionDef],
    owners: dict[str, SourceClass],
    class_name: str,
) -> list[cst.FunctionDef]:
    """The inherited methods the expanded forward still calls through ``self``, and those
    they call in turn: copied into the expanded class, so that what a stage holds is read
    from them as from the class's own (the stages reach them through their bases)."""
    called = m.Attribute(value=m.Name("self"), attr=m.Name())
    pending: list[cst.CSTNode] = list(statements)
    found: dict[str, cst.FunctionDef] = {}
    while pending:
        node = pending.pop()
        for attribute in m.findall(node, called):
            assert isinstance(attribute, cst.Attribute)
            name = attribute.attr.value
            owner = owners.get(name)
            if owner is None or owner.name == class_name or name in found:
                continue
            found[name] = methods[name]
            pending.append(methods[name])
    return [
        function.with_changes(leading_lines=(cst.EmptyLine(indent=False),))
        for function in found.values()
    ]


def _local_names(forward: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> set[str]:
    """What the expanded forward binds: its parameters, every name its statements bind,
    and the names of their comprehensions and lambdas (local to those)."""
    bound = _BoundNamesVisitor()
    for statement in statements:
        statement.visit(bound)
    names = parameters(forward) | bound.names
    for statement in statements:
        for node in m.findall(statement, m.CompFor() | m.Lambda()):
            assert isinstance(node, cst.CompFor | cst.Lambda)
            holder = node.target if isinstance(node, cst.CompFor) else node.params
            names.update(
                name.value for name in m.findall(holder, m.Name()) if isinstance(name, cst.Name)
            )
    return names


def _mangled(statement: cst.CSTNode) -> str | None:
    """A private name (``self.__cache``) in ``statement``: Python mangles it with the class it
    is written in, which a stage class is not."""
    for node in m.findall(statement, m.Name()):
        assert isinstance(node, cst.Name)
        if node.value.startswith("__") and not node.value.endswith("__"):
            return node.value
    return None


def _foreign_reads(
    statements: Sequence[cst.BaseStatement],
    origins: Sequence[Origin],
    owners: Sequence[SourceClass | None],
    forward: cst.FunctionDef,
    ancestry: Ancestry,
    where: _OriginalLines,
) -> tuple[int, str] | None:
    """The first statement of the expanded forward copied from a base class's method that
    would not run the same in the user's module (:meth:`Ancestry.unsafe_names`, or a name
    Python mangles with that class): its frame and what is wrong. The forward's signature
    counts as its first statement (its annotations are read where the stages are defined)."""
    local = _local_names(forward, statements)
    model = ancestry.model
    checked: list[tuple[int, Sequence[cst.CSTNode]]] = []
    if owners and owners[0] is not None:
        returns = () if forward.returns is None else (forward.returns,)
        checked.append((0, (forward.params, *returns)))
    for statement, origin in zip(statements, origins, strict=True):
        frame, index = origin.steps[-1]
        if index < 0 and len(origin.steps) > 1:
            frame = origin.steps[-2][0]  # an argument: the caller's expression
        checked.append((frame, (statement,)))
    for frame, nodes in checked:
        owner = owners[frame] if frame < len(owners) else None
        if owner is None or owner.name == model.name:
            continue
        names = [name for name in mentioned_names(nodes) if name not in local]
        unsafe = ancestry.unsafe_names(names, owner)
        private = next(filter(None, map(_mangled, nodes)), None)
        if private is not None:
            unsafe[private] = f"Python mangles it with {owner.name}, not the stage class"
        if not unsafe:
            continue
        node = nodes[0]
        line = where(node) if isinstance(node, cst.BaseStatement) else owner.file.line(forward)
        at = f"{owner.file.path}:{line}" if line else owner.file.path
        reasons = "; ".join(f"{name}: {why}" for name, why in unsafe.items())
        return frame, (
            f"{model.name} inherits {forward.name.value} from {owner.name} ({owner.where}), "
            f"whose statement at {at} reads what the stages, written into {model.file.path}, "
            f"would not find the same ({reasons}): import it in {model.file.path} as "
            f"{owner.file.path} does, or define {forward.name.value} in {model.name}"
        )
    return None

"""Build the op graph of a model's ``forward`` from its source.

The analysis is static: it reads the source, never runs it. What it cannot
know from the source alone, the length of each layer container, comes in as
:data:`ContainerSizes` (from the live example model, or from the op ids of a
cost file). Metadata (qualified names, expression contexts, positions) is
computed for the model class and the file's imports only, not the whole file.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import libcst as cst
import libcst.matchers as m
from libcst.metadata import (
    ExpressionContext,
    ExpressionContextProvider,
    MetadataWrapper,
    PositionProvider,
)

from syncpass.contracts.graph import (
    INPUT,
    OUTPUT,
    Cut,
    LoopIteration,
    Op,
    OpGraph,
    Region,
    SourceLocation,
)
from syncpass.core.errors import NoModelError, SyncpassError

#: Length of each layer container of the model, by attribute path ("blocks").
ContainerSizes = Mapping[str, int]

PIN_SYNC = re.compile(r"#\s*syncpass:\s*sync\b")
FORBID_SYNC = re.compile(r"#\s*syncpass:\s*no-sync\b")

_OPERATORS = {
    cst.Add: "add",
    cst.Subtract: "sub",
    cst.Multiply: "mul",
    cst.Divide: "truediv",
    cst.FloorDivide: "floordiv",
    cst.MatrixMultiply: "matmul",
    cst.Power: "pow",
    cst.Modulo: "mod",
    cst.BitAnd: "and",
    cst.BitOr: "or",
    cst.BitXor: "xor",
    cst.LeftShift: "lshift",
    cst.RightShift: "rshift",
}


@dataclass(frozen=True)
class ContainerLoop:
    """``for item in self.<container>[start:stop]`` (optionally enumerated).

    Bounds may be negative (``self.layers[:-1]``), counted from the end as Python
    does. ``parts`` names the pieces of an unpacked item (``for attn, ff in
    self.layers``: each layer is a pair of modules); ``item`` is then ``""``.
    ``runtime_stop`` is the ``self.`` path of a stop bound read when the forward runs
    (``self.layers[: self.config.num_hidden_layers]``, Hugging Face's Llama): the loop is
    planned over the whole container, which the profile checks the bound then covers.
    ``root`` is what the container hangs off: ``self`` (``self.blocks``), or the name of a
    JAX function's weights (``for layer in params["layers"]``: container ``layers``, a list
    of weight dicts); the analysis plans a loop only over a root its backend holds.
    ``view`` is ``values`` or ``items`` for a loop over a ``ModuleDict``'s view
    (``for layer in self.layers.values()``, torchtitan's form; ``for name, layer in
    self.layers.items()``, ``key_name`` then being ``name``), whose keys the profile
    checks are ``"0"``, ``"1"``, ... in order; a split runs over
    ``list(self.layers.values())[a:b]``.
    ``recorded`` marks a loop over anything else (x-transformers' ``for ind, (layer_type,
    ..., (norm, block, residual_fn), ...) in enumerate(zip(*layer_variables))``, a tuple
    built in the forward) whose header carries :data:`RECORDED_LOOP`'s comment: the
    example's run showed its iteration ``i`` calling the modules of ``self.<container>[i]``
    and no other (``syncpass.backends.torch.census``); ``targets`` are the names its
    header binds, and a split runs ``itertools.islice(<iterable>, start, stop)``.
    ``zipped`` holds, for ``for layer, norm in zip(self.layers, self.norms)``, each
    further target and what it runs over: ``(("norm", "norms"),)``, the path of a
    container of the model, or ``None`` for a local sequence (``zip(self.blocks,
    skips)``); every one is sliced as the container is (``zip(self.layers[2:4],
    self.norms[2:4])``), and the profile checks the containers' lengths agree.
    """

    container: str
    start: int | None
    stop: int | None
    item: str
    index_name: str | None = None
    parts: tuple[str, ...] = ()
    runtime_stop: str | None = None
    root: str = "self"
    view: str | None = None
    key_name: str | None = None
    zipped: tuple[tuple[str, str | None], ...] = ()
    recorded: bool = False
    targets: tuple[str, ...] = ()

    @property
    def expression(self) -> str:
        """The container as the source reads it: ``self.blocks``, ``params["layers"]``."""
        if self.view is not None:
            return f"self.{self.container}.{self.view}()"
        if self.root == "self":
            return f"self.{self.container}"
        return self.root + "".join(f'["{key}"]' for key in self.container.split("."))

    def iterations(self, size: int) -> range:
        return range(size)[self.start : self.stop]

    def item_paths(self, item_path: str) -> dict[str, str]:
        """The loop's names -> what they are in one iteration (``<ff>`` -> ``layers.3.1``)."""
        if self.parts:
            return {f"<{part}>": f"{item_path}.{k}" for k, part in enumerate(self.parts)}
        index = item_path.rpartition(".")[2]
        paths = {f"<{name}>": f"{path}.{index}" for name, path in self.zipped if path}
        return {f"<{self.item}>": item_path, **paths}

    @property
    def names(self) -> set[str]:
        """The names the loop binds each iteration."""
        bound = (self.item, *self.parts, *(name for name, _ in self.zipped), *self.targets)
        return {name for name in (*bound, self.index_name, self.key_name) if name}

    @property
    def zipped_containers(self) -> tuple[str, ...]:
        """The model's containers zipped with this one."""
        return tuple(path for _, path in self.zipped if path)


@dataclass(frozen=True)
class ForwardModel:
    """The class and forward method an op graph was built from."""

    class_name: str
    classdef: cst.ClassDef
    forward: cst.FunctionDef


def model_class_names(module: cst.Module, method: str = "forward") -> list[str]:
    """Top-level classes that define a ``forward`` (or ``method``) method, in file order."""
    return [
        statement.name.value
        for statement in module.body
        if isinstance(statement, cst.ClassDef) and method_of(statement, method) is not None
    ]


def method_of(classdef: cst.ClassDef, method: str = "forward") -> cst.FunctionDef | None:
    """The class's own ``def method`` (the first, if it has several), or ``None``."""
    for statement in classdef.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == method:
            return statement
    return None


def find_forward(
    module: cst.Module, class_name: str | None, path: str, method: str = "forward"
) -> ForwardModel:
    """The model class named ``class_name`` (or the only one) and its forward.

    ``method`` names the method that computes the model (``__call__`` for Flax).
    """
    names = model_class_names(module, method)
    if class_name is None:
        if not names:
            raise NoModelError(
                f"no model class: no top-level class defines a {method} method", path
            )
        if len(names) > 1:
            raise SyncpassError(
                f"several model classes ({', '.join(names)}); choose one with --model NAME", path
            )
        class_name = names[0]
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
            forward = method_of(statement, method)
            if forward is None:
                raise SyncpassError(f"class {class_name} has no {method} method", path)
            return ForwardModel(class_name, statement, forward)
    known = f"; model classes here: {', '.join(names)}" if names else ""
    raise SyncpassError(f"no top-level class named {class_name!r}{known}", path)


# --- recognising loops over layer containers ---------------------------------


def self_path(node: cst.BaseExpression) -> str | None:
    """``self.a.b`` -> ``"a.b"``; ``self.a[3]`` -> ``"a.3"``; otherwise ``None``."""
    if isinstance(node, cst.Attribute):
        base = self_path(node.value)
        if base is not None:
            return f"{base}.{node.attr.value}" if base else node.attr.value
        return None
    if isinstance(node, cst.Name):
        return "" if node.value == "self" else None
    if (
        isinstance(node, cst.Subscript)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(node.slice[0].slice.value, cst.Integer)
    ):
        base = self_path(node.value)
        if base:
            return f"{base}.{node.slice[0].slice.value.evaluated_value}"
    return None


def _int_or_none(node: cst.BaseExpression | None) -> tuple[bool, int | None]:
    if node is None:
        return True, None
    if isinstance(node, cst.Integer):
        return True, int(node.evaluated_value)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return True, -int(node.expression.evaluated_value)
    return False, None


def _keyed_path(node: cst.BaseExpression) -> tuple[str, str] | None:
    """``params["decoder"]["layers"]`` -> ``("params", "decoder.layers")``: constant string
    keys off a plain name other than ``self``."""
    keys: list[str] = []
    while (
        isinstance(node, cst.Subscript)
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(node.slice[0].slice.value, cst.SimpleString)
    ):
        key = node.slice[0].slice.value.evaluated_value
        if not isinstance(key, str) or not key or "." in key:
            return None
        keys.insert(0, key)
        node = node.value
    if keys and isinstance(node, cst.Name) and node.value != "self":
        return node.value, ".".join(keys)
    return None


#: The views of a ``ModuleDict`` a layer loop may run over (``self.layers.values()``).
DICT_VIEWS = ("values", "items")


def dict_view(node: cst.BaseExpression) -> cst.Call | None:
    """The ``self.layers.values()`` (or ``.items()``) call ``node`` is, or wraps in
    ``list(...)``."""
    if m.matches(node, m.Call(func=m.Name("list"), args=[m.Arg(keyword=None, star="")])):
        assert isinstance(node, cst.Call)
        node = node.args[0].value
    if m.matches(node, m.Call(func=m.Attribute(attr=m.Name()), args=[])):
        assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
        if node.func.attr.value in DICT_VIEWS and self_path(node.func.value):
            return node
    return None


def _rooted_path(node: cst.BaseExpression) -> tuple[str, str, str | None] | None:
    """``("self", "a.b", None)`` for ``self.a.b``; ``("params", "layers", None)`` for
    ``params["layers"]``; ``("self", "layers", "values")`` for ``self.layers.values()`` (or
    ``list(self.layers.values())``)."""
    view = dict_view(node)
    if view is not None:
        assert isinstance(view.func, cst.Attribute)
        path = self_path(view.func.value)
        assert path is not None
        return "self", path, view.func.attr.value
    path = self_path(node)
    if path:
        return "self", path, None
    keyed = _keyed_path(node)
    return None if keyed is None else (*keyed, None)


def _container_slice(
    node: cst.BaseExpression,
) -> tuple[str, str, int | None, int | None, str | None, str | None] | None:
    """``(root, container, start, stop, runtime_stop, view)`` of
    ``self.<container>[start:stop]`` (or ``params["<container>"][start:stop]``, or
    ``list(self.<container>.values())[start:stop]``)."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        part = node.slice[0].slice
        if isinstance(part, cst.Slice) and part.step is None:
            base = _rooted_path(node.value)
            ok_lower, lower = _int_or_none(part.lower)
            ok_upper, upper = _int_or_none(part.upper)
            runtime = self_path(part.upper) if part.upper is not None and not ok_upper else None
            if base and ok_lower and (ok_upper or runtime):
                return base[0], base[1], lower, upper, runtime, base[2]
            return None
    base = _rooted_path(node)
    return (base[0], base[1], None, None, None, base[2]) if base else None


#: ``zip(a, b, ...)`` (``strict=...`` allowed): what a zipped layer loop runs over.
_ZIP = m.Call(
    func=m.Name("zip"),
    args=[
        m.Arg(keyword=None, star=""),
        m.AtLeastN(m.Arg(keyword=None, star=""), n=1),
        m.ZeroOrOne(m.Arg(keyword=m.Name("strict"))),
    ],
)


#: ``enumerate(zip(a, b, ...))``, counted from 0 or a whole number.
_ENUMERATED_ZIP = m.Call(
    func=m.Name("enumerate"),
    args=[
        m.Arg(value=_ZIP, keyword=None, star=""),
        m.ZeroOrOne(m.Arg(value=m.Integer(), keyword=m.Name("start") | None)),
    ],
)


def _zipped_part(
    node: cst.BaseExpression, start: int | None, stop: int | None, runtime_stop: str | None = None
) -> tuple[bool, str | None]:
    """``(ok, path)`` for one further ``zip`` argument: a container of the model (its path)
    or a plain local name (``None``), sliced exactly as the first argument is (with the
    same stop read when the forward runs, ``self.<runtime_stop>``, where it has one)."""
    base, lower, upper = node, None, None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        part = node.slice[0].slice
        if not isinstance(part, cst.Slice) or part.step is not None:
            return False, None
        ok_lower, lower = _int_or_none(part.lower)
        if runtime_stop is not None:
            if part.upper is None or self_path(part.upper) != runtime_stop:
                return False, None
            ok_upper = True
        else:
            ok_upper, upper = _int_or_none(part.upper)
        if not (ok_lower and ok_upper):
            return False, None
        base = node.value
    elif runtime_stop is not None:
        return False, None
    if (lower, upper) != (start, stop):
        return False, None
    path = self_path(base)
    if path:
        return True, path
    return (True, None) if isinstance(base, cst.Name) and base.value != "self" else (False, None)


def _match_zip_loop(node: cst.For) -> ContainerLoop | None:
    """``for layer, norm in zip(self.layers, self.norms)``, each argument sliced alike."""
    iterable = node.iter
    assert isinstance(iterable, cst.Call)
    args = [arg for arg in iterable.args if arg.keyword is None]
    target = node.target
    if not isinstance(target, cst.Tuple) or len(target.elements) != len(args):
        return None
    names = [element.value for element in target.elements]
    if not all(isinstance(name, cst.Name) for name in names):
        return None
    items = [name.value for name in names if isinstance(name, cst.Name)]
    found = _container_slice(args[0].value)
    if found is None:
        return None
    root, container, start, stop, runtime_stop, view = found
    if root != "self" or view is not None:
        return None
    zipped = []
    for name, arg in zip(items[1:], args[1:], strict=True):
        ok, path = _zipped_part(arg.value, start, stop, runtime_stop)
        if not ok or path == container or (runtime_stop is not None and path is None):
            return None
        zipped.append((name, path))
    if _has_jump(node.body):
        return None
    return ContainerLoop(
        container, start, stop, items[0], zipped=tuple(zipped), runtime_stop=runtime_stop
    )


def _match_enumerated_zip_loop(node: cst.For) -> ContainerLoop | None:
    """``for i, (layer, norm) in enumerate(zip(self.layers, self.norms))``: the zipped loop
    (:func:`_match_zip_loop`) with the index counted from 0 (or the whole number
    ``enumerate`` is given), never from a bound counted from the end."""
    call = node.iter
    assert isinstance(call, cst.Call)
    target = node.target
    if not (
        isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(index := target.elements[0].value, cst.Name)
        and isinstance(inner := target.elements[1].value, cst.Tuple)
    ):
        return None
    zipped = _match_zip_loop(node.with_changes(target=inner, iter=call.args[0].value))
    if zipped is None or any(
        bound is not None and bound < 0 for bound in (zipped.start, zipped.stop)
    ):
        return None
    return replace(zipped, index_name=index.value)


#: The comment on a loop's header that says each iteration runs one layer of a container
#: (``# syncpass: iteration i runs self.layers[i]``): what the eager form's expansion writes
#: where the example's run showed it (:attr:`ContainerLoop.recorded`).
RECORDED_LOOP = re.compile(r"#\s*syncpass:\s*iteration i runs self\.([A-Za-z_][\w.]*)\[i\]")


def recorded_loop_comment(container: str) -> str:
    """The header comment of a loop whose iteration ``i`` runs ``self.<container>[i]``."""
    return f"# syncpass: iteration i runs self.{container}[i]"


def loop_key(statement: int) -> str:
    """The settings key recording which container the loop at top-level statement
    ``statement`` of the expanded forward runs a layer of per iteration (a key no
    attribute path can be)."""
    return f"loop:{statement}"


def _bound_names(target: cst.BaseExpression) -> tuple[str, ...] | None:
    """The names a loop target binds (nested tuples of names), or ``None`` for any other."""
    if isinstance(target, cst.Name):
        return (target.value,)
    if isinstance(target, cst.Tuple | cst.List):
        names: list[str] = []
        for element in target.elements:
            if not isinstance(element, cst.Element):
                return None
            inner = _bound_names(element.value)
            if inner is None:
                return None
            names.extend(inner)
        return tuple(names)
    return None


def recordable_loop(node: cst.For) -> bool:
    """Whether ``node`` may run one layer an iteration over something the source cannot
    size: a plain loop (no ``else``, not async) binding names only, that never ends early
    (a ``continue`` is fine), and no container loop already."""
    return (
        node.orelse is None
        and node.asynchronous is None
        and _bound_names(node.target) is not None
        and not _has_jump(node.body)
        and match_container_loop(node) is None
    )


def _recorded_loop(node: cst.For) -> ContainerLoop | None:
    """``node`` as a loop whose header comment says which container's layer each iteration
    runs (:data:`RECORDED_LOOP`)."""
    body = node.body
    comment = body.header.comment if isinstance(body, cst.IndentedBlock) else None
    found = RECORDED_LOOP.search(comment.value) if comment is not None else None
    targets = _bound_names(node.target)
    if found is None or targets is None or _has_jump(node.body):
        return None
    return ContainerLoop(found.group(1), None, None, "", recorded=True, targets=targets)


def match_container_loop(node: cst.For) -> ContainerLoop | None:
    """The container loop ``node`` is, if it is one the rewrite can split."""
    if node.orelse is not None or node.asynchronous is not None:
        return None
    recorded = _recorded_loop(node)
    if recorded is not None:
        return recorded
    iterable = node.iter
    if m.matches(iterable, _ZIP):
        return _match_zip_loop(node)
    if m.matches(iterable, _ENUMERATED_ZIP):
        return _match_enumerated_zip_loop(node)
    index_name = None
    parts: tuple[str, ...] = ()
    counted_from = m.Arg(value=m.Integer(), keyword=None) | m.Arg(
        value=m.Integer(), keyword=m.Name("start")
    )
    if m.matches(
        iterable,
        m.Call(func=m.Name("enumerate"), args=[m.Arg(keyword=None)])
        | m.Call(func=m.Name("enumerate"), args=[m.Arg(keyword=None), counted_from]),
    ):
        assert isinstance(iterable, cst.Call)
        if not m.matches(node.target, m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name())])):
            return None
        assert isinstance(node.target, cst.Tuple)
        first, second = (element.value for element in node.target.elements)
        assert isinstance(first, cst.Name) and isinstance(second, cst.Name)
        index_name, item = first.value, second.value
        iterable = iterable.args[0].value
    elif isinstance(node.target, cst.Name):
        item = node.target.value
    elif m.matches(node.target, m.Tuple(elements=[m.AtLeastN(m.Element(m.Name()), n=2)])):
        assert isinstance(node.target, cst.Tuple)
        parts = tuple(
            element.value.value
            for element in node.target.elements
            if isinstance(element.value, cst.Name)
        )
        item = ""
    else:
        return None
    found = _container_slice(iterable)
    if found is None:
        return None
    root, container, start, stop, runtime_stop, view = found
    negative = (start is not None and start < 0) or (stop is not None and stop < 0)
    if negative and index_name is not None:
        return None  # the enumerated index would not follow a split over negative bounds
    if _has_jump(node.body):
        return None
    key_name = None
    if view == "items":  # for name, layer in self.layers.items(): a key and its layer
        if index_name is not None or len(parts) != 2:
            return None
        key_name, item, parts = parts[0], parts[1], ()
    return ContainerLoop(
        container, start, stop, item, index_name, parts, runtime_stop, root, view, key_name
    )


def enumerated_index_loop(node: cst.For, taken: Collection[str] = ()) -> cst.For | None:
    """``for i in range(len(self.layers)):`` whose body runs ``self.layers[i]``, as the
    layer loop it is: ``for i, layer in enumerate(self.layers):``, the same iterations
    with the layer each indexes, and the body as written (``self.layers[i](x)``), so the
    loop is planned per layer (:func:`match_container_loop`); ``None`` for any other loop.
    A body that indexes several containers by the loop's name (``self.norms[i]`` beside
    ``self.layers[i]``) runs them zipped: ``for i, (layer, norm) in
    enumerate(zip(self.layers, self.norms)):``, the container whose length bounds the
    range first (else the first indexed), each sliced alike.

    The range is ``range(len(self.X))``, ``range(STOP)`` or ``range(START, STOP)`` with
    whole-number bounds, or ``range(self.<setting>)`` (a stop read when the forward runs,
    checked by the profile as ``self.X[: self.<setting>]`` is), no step; the body indexes
    containers of the model by the loop's name, ``self.X[i]``, and never binds that name.
    The items' names are ones neither the loop nor ``taken`` (the forward's names) holds."""
    if node.orelse is not None or node.asynchronous is not None:
        return None
    if not isinstance(node.target, cst.Name) or not isinstance(node.iter, cst.Call):
        return None
    call = node.iter
    if not m.matches(call.func, m.Name("range")) or not 1 <= len(call.args) <= 2:
        return None
    if any(arg.keyword is not None or arg.star for arg in call.args):
        return None
    index = node.target.value
    by_index = m.Subscript(slice=[m.SubscriptElement(slice=m.Index(value=m.Name(index)))])
    subscripts = [
        found for found in m.findall(node.body, by_index) if isinstance(found, cst.Subscript)
    ]
    if any(not self_path(found.value) for found in subscripts):
        return None  # a local sequence by the index: not a container the stages can slice
    indexed = list(dict.fromkeys(path for found in subscripts if (path := self_path(found.value))))
    bound = _GatherNamesVisitor()
    node.body.visit(bound)
    if not indexed or index in bound.writes or _rebinds(node.body, index):
        return None
    stored = m.AssignTarget(target=by_index) | m.AugAssign(target=by_index) | m.Del(target=by_index)
    if m.findall(node.body, stored):
        return None  # `self.layers[i] = ...` changes the container, not a layer
    start: cst.BaseExpression | None = call.args[0].value if len(call.args) == 2 else None
    stop = call.args[-1].value
    # Whole-number bounds from 0 up: a negative one counts from the end for a slice, not
    # for range().
    if start is not None and not isinstance(start, cst.Integer):
        return None
    if isinstance(stop, cst.UnaryOperation) or (
        start is not None and isinstance(stop, cst.Integer) and int(stop.value) < int(start.value)
    ):
        return None
    whole = m.Call(func=m.Name("len"), args=[m.Arg(value=m.DoNotCare())])
    if m.matches(stop, whole):
        assert isinstance(stop, cst.Call)
        measured = self_path(stop.args[0].value)
        if measured not in indexed:
            return None
        # Zipped first, it bounds the iterations as the range did (zip stops at the
        # shortest; a shorter other container would have failed the indexing).
        upper = ""
        indexed = [measured, *(path for path in indexed if path != measured)]
    elif isinstance(stop, cst.Integer) or self_path(stop):
        upper = cst.Module([]).code_for_node(stop)
    else:
        return None
    lower = cst.Module([]).code_for_node(start) if start is not None else ""
    mentioned = {name.value for name in m.findall(node, m.Name()) if isinstance(name, cst.Name)}
    mentioned |= set(taken)
    items: list[str] = []
    for place, container in enumerate(indexed):
        stem = "layer" if place == 0 else _item_stem(container)
        item = next(
            name
            for name in (stem, *(f"{stem}_{k}" for k in range(2, 1000)))
            if name not in mentioned and name not in items
        )
        items.append(item)
    counted = f", start={lower}" if lower else ""
    if len(indexed) == 1:
        sliced = (
            f"self.{indexed[0]}" if not (lower or upper) else f"self.{indexed[0]}[{lower}:{upper}]"
        )
        header = cst.parse_expression(f"enumerate({sliced}{counted})")
        item_target: cst.BaseExpression = cst.Name(items[0])
    else:
        parts = [
            f"self.{path}" if not (lower or upper) else f"self.{path}[{lower}:{upper}]"
            for path in indexed
        ]
        header = cst.parse_expression(f"enumerate(zip({', '.join(parts)}){counted})")
        item_target = cst.Tuple([cst.Element(cst.Name(item)) for item in items])
    target = cst.Tuple([cst.Element(cst.Name(index)), cst.Element(item_target)], lpar=[], rpar=[])
    written = cst.Module([]).code_for_node(node.iter)
    named = ", ".join(
        f"self.{path}[{index}] as {item}" for path, item in zip(indexed, items, strict=True)
    )
    note = cst.EmptyLine(
        comment=cst.Comment(
            f"# syncpass: `for {index} in {written}:` over the layers it indexes, {named}"
        )
    )
    # Each iteration's layer by name: a stage then holds only the layers its slice runs.
    body = node.body
    for path, item in zip(indexed, items, strict=True):
        replaced = m.replace(body, by_index, _item_of(path, item))
        assert isinstance(replaced, cst.BaseSuite)
        body = replaced
    return node.with_changes(
        target=target, iter=header, body=body, leading_lines=(*node.leading_lines, note)
    )


def _item_stem(container: str) -> str:
    """What one item of ``container`` is called: ``norm`` for ``norms``, ``h`` for ``h``."""
    last = container.rpartition(".")[2].lstrip("_") or "item"
    stem = last[:-1] if last.endswith("s") and len(last) > 2 else last
    return stem if stem.isidentifier() and not keyword.iskeyword(stem) else "item"


def while_index_loop(
    start: cst.BaseStatement,
    node: cst.While,
    after: Sequence[cst.BaseStatement],
    taken: Collection[str] = (),
) -> cst.For | None:
    """``i = 0`` then ``while i < len(self.layers):`` whose body runs ``self.layers[i]``
    and ends in ``i += 1``, as the layer loop it is (:func:`enumerated_index_loop` on
    ``for i in range(len(self.layers)):``, the body without its last line); ``None`` for
    any other loop.

    ``start`` is the statement right before the loop: ``i = K`` with a whole number
    ``K`` from 0. The test is ``i < STOP`` with a stop :func:`enumerated_index_loop`
    takes; the body steps ``i`` by one in its last line only and holds no ``break`` or
    ``continue`` (which would skip the step or end the loop early), and nothing in
    ``after`` (the statements after the loop) reads ``i``, which the ``for`` leaves one
    lower than the ``while`` does."""
    if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
        return None
    if not (
        isinstance(start, cst.SimpleStatementLine)
        and len(start.body) == 1
        and isinstance(assign := start.body[0], cst.Assign)
        and len(assign.targets) == 1
        and isinstance(index := assign.targets[0].target, cst.Name)
        and isinstance(first := assign.value, cst.Integer)
    ):
        return None
    name = index.value
    test = node.test
    if not (
        isinstance(test, cst.Comparison)
        and m.matches(test.left, m.Name(name))
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.LessThan)
    ):
        return None
    *body, last = node.body.body
    step = m.SimpleStatementLine(
        body=[m.AugAssign(target=m.Name(name), operator=m.AddAssign(), value=m.Integer("1"))]
    )
    if not body or not m.matches(last, step):
        return None
    if m.findall(cst.IndentedBlock(body=body), m.Break() | m.Continue()):
        return None
    if any(m.findall(line, m.Name(name)) for line in after):
        return None
    bounds = [cst.Arg(first), cst.Arg(test.comparisons[0].comparator)]
    loop = cst.For(
        target=cst.Name(name),
        iter=cst.Call(func=cst.Name("range"), args=bounds[1:] if first.value == "0" else bounds),
        body=node.body.with_changes(body=body),
        leading_lines=node.leading_lines,
    )
    found = enumerated_index_loop(loop, taken)
    if found is None:
        return None
    written = cst.Module([]).code_for_node(test)
    note = cst.EmptyLine(
        comment=cst.Comment(
            f"# syncpass: `while {written}:` stepping {name} by 1 from {first.value}"
        )
    )
    return found.with_changes(
        leading_lines=(*node.leading_lines, note, *found.leading_lines[len(node.leading_lines) :])
    )


def _rebinds(body: cst.BaseSuite, name: str) -> bool:
    """Whether ``body`` binds ``name`` in a way a plain assignment scan misses: a
    comprehension's target, a walrus, a nested function's or lambda's parameter, ``with``
    or ``except ... as``."""
    binders = (
        m.CompFor(target=m.Name(name))
        | m.CompFor(
            target=m.Tuple(elements=[m.ZeroOrMore(), m.Element(m.Name(name)), m.ZeroOrMore()])
        )
        | m.NamedExpr(target=m.Name(name))
        | m.Param(name=m.Name(name))
        | m.AsName(name=m.Name(name))
    )
    return bool(m.findall(body, binders))


def _item_of(
    container: str, item: str
) -> Callable[[cst.CSTNode, dict[str, cst.CSTNode | Sequence[cst.CSTNode]]], cst.CSTNode]:
    """:func:`_as_item` for ``container``, as ``m.replace`` calls a replacement."""

    def replace(
        found: cst.CSTNode, _: dict[str, cst.CSTNode | Sequence[cst.CSTNode]]
    ) -> cst.CSTNode:
        return _as_item(found, container, item)

    return replace


def _as_item(found: cst.CSTNode, container: str, item: str) -> cst.CSTNode:
    """``self.<container>[i]`` -> the loop's ``item``; another subscript by ``i`` as it is."""
    if isinstance(found, cst.Subscript) and self_path(found.value) == container:
        return cst.Name(item)
    return found


@dataclass(frozen=True)
class SequentialCall:
    """``target = self.<container>[start:stop](argument)``: a call of a sequential container
    that can be split into calls of slices of it (``--depth 2``)."""

    container: str
    start: int | None
    stop: int | None
    target: str
    argument: str

    def iterations(self, size: int) -> range:
        start = 0 if self.start is None else self.start
        stop = size if self.stop is None else min(self.stop, size)
        return range(start, stop)


def match_sequential_call(statement: cst.BaseStatement) -> SequentialCall | None:
    """The sequential-container call ``statement`` is, if the rewrite can split it."""
    if not m.matches(
        statement,
        m.SimpleStatementLine(
            body=[
                m.Assign(
                    targets=[m.AssignTarget(target=m.Name())],
                    value=m.Call(args=[m.Arg(value=m.Name(), keyword=None, star="")]),
                )
            ]
        ),
    ):
        return None
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call)
    found = _container_slice(assign.value.func)
    if found is None:
        return None
    root, container, start, stop, runtime_stop, view = found
    if (
        root != "self"
        or view is not None
        or runtime_stop is not None
        or (start is not None and start < 0)
        or (stop is not None and stop < 0)
    ):
        return None
    target = assign.targets[0].target
    argument = assign.value.args[0].value
    assert isinstance(target, cst.Name) and isinstance(argument, cst.Name)
    return SequentialCall(container, start, stop, target.value, argument.value)


#: How a scan is called: ``jax.lax.scan(...)``, or ``lax.scan(...)`` after ``from jax import lax``.
SCAN_FUNCTIONS = ("jax.lax.scan", "lax.scan")
#: What a split scan runs over: a slice of every leaf of the stacked weights.
STACK_SLICE = "jax.tree.map"


@dataclass(frozen=True)
class ScanCall:
    """``carry, _ = jax.lax.scan(step, init, params["layers"])`` (or ``carry =
    jax.lax.scan(...)[0]``): a scan over layer weights stacked along their first dimension,
    hanging off a JAX function's weights (``root``), each step one layer.

    The rewrite splits it into scans over slices of the stack, the later ones starting
    from the carry: ``jax.lax.scan(step, carry, jax.tree.map(lambda w: w[2:4],
    params["layers"]))``; ``start``/``stop`` are such a slice's bounds. The scan's stacked
    outputs must be thrown away (``_``): a split scan would keep only the last piece's.
    """

    container: str
    root: str
    start: int | None
    stop: int | None
    target: str
    init: str

    def iterations(self, size: int) -> range:
        return range(size)[self.start : self.stop]


def scan_parts(
    call: cst.Call,
) -> tuple[cst.BaseExpression, cst.BaseExpression, int | None, int | None] | None:
    """``(init, stack, start, stop)`` of a ``jax.lax.scan(step, init, xs)`` call whose ``xs``
    is a stack of weights, whole (``params["layers"]``) or sliced by the rewrite
    (``jax.tree.map(lambda w: w[a:b], params["layers"])``); ``stack`` is the weights'
    own expression."""
    if _dotted(call.func) not in SCAN_FUNCTIONS or len(call.args) != 3:
        return None
    if any(arg.keyword is not None or arg.star for arg in call.args):
        return None
    init, xs = call.args[1].value, call.args[2].value
    start = stop = None
    sliced = m.Call(
        args=[
            m.Arg(
                value=m.Lambda(
                    params=m.Parameters(params=[m.Param(name=m.Name())]),
                    body=m.Subscript(value=m.Name(), slice=[m.SubscriptElement(m.Slice())]),
                ),
                keyword=None,
            ),
            m.Arg(keyword=None, star=""),
        ]
    )
    if m.matches(xs, sliced):
        assert isinstance(xs, cst.Call)
        if _dotted(xs.func) != STACK_SLICE:
            return None
        function = xs.args[0].value
        assert isinstance(function, cst.Lambda) and isinstance(function.body, cst.Subscript)
        bounds = function.body.slice[0].slice
        assert isinstance(bounds, cst.Slice)
        parameter = function.params.params[0].name.value
        if not m.matches(function.body.value, m.Name(parameter)) or bounds.step is not None:
            return None
        ok_lower, start = _int_or_none(bounds.lower)
        ok_upper, stop = _int_or_none(bounds.upper)
        if not (ok_lower and ok_upper):
            return None
        xs = xs.args[1].value
    return init, xs, start, stop


def match_scan_call(statement: cst.BaseStatement) -> ScanCall | None:
    """The scan over stacked layer weights ``statement`` is, if the rewrite can split it."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget()])])):
        return None
    assert isinstance(statement, cst.SimpleStatementLine)
    assign = statement.body[0]
    assert isinstance(assign, cst.Assign)
    target = assign.targets[0].target
    value = assign.value
    pair = m.Tuple(elements=[m.Element(m.Name()), m.Element(m.Name("_"))])
    if m.matches(target, pair) and isinstance(value, cst.Call):
        assert isinstance(target, cst.Tuple)
        carry = target.elements[0].value
    elif isinstance(target, cst.Name) and m.matches(
        value, m.Subscript(value=m.Call(), slice=[m.SubscriptElement(m.Index(m.Integer("0")))])
    ):
        assert isinstance(value, cst.Subscript) and isinstance(value.value, cst.Call)
        carry, value = target, value.value
    else:
        return None
    assert isinstance(carry, cst.Name) and isinstance(value, cst.Call)
    parts = scan_parts(value)
    if parts is None:
        return None
    init, stack, start, stop = parts
    keyed = _keyed_path(stack)
    if keyed is None or not isinstance(init, cst.Name):
        return None
    if (start is not None and start < 0) or (stop is not None and stop < 0):
        return None
    return ScanCall(keyed[1], keyed[0], start, stop, carry.value, init.value)


def _has_jump(body: cst.BaseSuite) -> bool:
    """Whether the loop whose body is ``body`` can end early or hand control out: a
    ``break`` of its own, a ``return`` or a ``yield`` (not one of a function defined
    inside). A ``continue`` only ends an iteration, as over a slice of the container
    (OPT's LayerDrop skips a layer so), and a nested loop's ``break`` ends that loop."""
    finder = _JumpFinder()
    body.visit(finder)
    return finder.found


class _JumpFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False
        self.loops = 0  # nested loops entered

    def visit_For(self, node: cst.For) -> None:
        self.loops += 1

    def leave_For(self, original_node: cst.For) -> None:
        self.loops -= 1

    def visit_While(self, node: cst.While) -> None:
        self.loops += 1

    def leave_While(self, original_node: cst.While) -> None:
        self.loops -= 1

    def visit_Break(self, node: cst.Break) -> None:
        self.found = self.found or self.loops == 0

    def visit_Return(self, node: cst.Return) -> None:
        self.found = True

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


# --- facts about each forward statement ----------------------------------------


@dataclass
class _CallFact:
    depth: int
    order: int
    submodule: str | None  # "stem", "blocks.3", or the loop item's name as "<item>"
    function: str | None  # "torch.cat", "operator.add", "view"
    qualify: bool = False  # ``function`` is a dotted name still to resolve


@dataclass
class StatementFacts:
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    calls: list[_CallFact] = field(default_factory=list)


class GatherStatementFactsVisitor(cst.CSTVisitor):
    """Reads, writes and calls of each top-level statement of a forward."""

    METADATA_DEPENDENCIES = (ExpressionContextProvider,)

    def __init__(self, statements: Sequence[cst.BaseStatement]) -> None:
        super().__init__()
        self.index_of = {id(statement): index for index, statement in enumerate(statements)}
        self.facts = [StatementFacts() for _ in statements]
        self.current: list[int] = []
        self.depth = 0
        self.order = 0
        # Names local to a comprehension or lambda being visited: no reads or writes of the
        # forward's (`[1.0 / (1 + i) for i in range(n)]` reads n, not i).
        self.scoped: list[set[str]] = []
        self.scope_nodes: list[int] = []  # id() of the node each scope belongs to
        # A keyword argument's name: libcst's context metadata calls it a load.
        self.keywords: set[int] = set()
        # The forward's own locals (what its statements bind): a module (`torch.cuda.x()`)
        # or a global is no value a method call changes.
        names = _GatherNamesVisitor()
        for statement in statements:
            statement.visit(names)
        self.bound = set(names.writes)

    @staticmethod
    def _own_names(node: cst.CSTNode) -> set[str] | None:
        """The names a comprehension, lambda or nested def binds for itself, or ``None``
        for another node."""
        if isinstance(node, cst.BaseComp | cst.DictComp):
            comp_fors = m.findall(node.for_in, m.CompFor())
            targets = [
                name
                for comp_for in comp_fors
                if isinstance(comp_for, cst.CompFor)
                for name in m.findall(comp_for.target, m.Name())
            ]
        elif isinstance(node, cst.Lambda | cst.FunctionDef):
            params = node.params
            every = [*params.posonly_params, *params.params, *params.kwonly_params]
            every += [
                star for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)
            ]
            targets = [param.name for param in every]
            if isinstance(node, cst.FunctionDef):  # and what its body assigns
                stores = m.findall(node.body, m.AssignTarget() | m.AugAssign() | m.For())
                for store in stores:
                    assert isinstance(store, cst.AssignTarget | cst.AugAssign | cst.For)
                    targets += m.findall(store.target, m.Name())
        else:
            return None
        return {name.value for name in targets if isinstance(name, cst.Name)}

    def on_visit(self, node: cst.CSTNode) -> bool:
        index = self.index_of.get(id(node))
        if index is not None:
            self.current.append(index)
        # A def outside the forward's statements (the forward itself) has no scope here.
        own = self._own_names(node) if self.current else None
        if own is not None:
            self.scoped.append(own)
            self.scope_nodes.append(id(node))
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if self.scope_nodes and self.scope_nodes[-1] == id(original_node):
            self.scope_nodes.pop()
            self.scoped.pop()
        if id(original_node) in self.index_of:
            self.current.pop()

    def _facts(self) -> StatementFacts | None:
        return self.facts[self.current[-1]] if self.current else None

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.keywords.add(id(node.keyword))  # `f(x=y)`: x is no variable

    def visit_Name(self, node: cst.Name) -> None:
        facts = self._facts()
        if facts is None or any(node.value in scope for scope in self.scoped):
            return
        if id(node) in self.keywords:
            return
        context = self.get_metadata(ExpressionContextProvider, node, None)
        if context == ExpressionContext.STORE:
            facts.writes.append(node.value)
        elif context == ExpressionContext.LOAD:
            facts.reads.append(node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        facts = self._facts()
        if facts is not None and isinstance(node.target, cst.Name):
            facts.reads.append(node.target.value)  # x += y reads x too
        self._store_into(node.target)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._store_into(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._store_into(node.target)

    def visit_Expr(self, node: cst.Expr) -> None:
        """``acc.append(h)``, ``x.masked_fill_(m, 0)``: a method called for its effect (its
        result unused) may change the object, so the statement writes it too: a value
        changed so is never taken for what its first statement computed."""
        facts = self._facts()
        if facts is None or not isinstance(node.value, cst.Call):
            return
        base = node.value.func
        if not isinstance(base, cst.Attribute):
            return
        while isinstance(base, cst.Subscript | cst.Attribute):
            base = base.value
        if (
            isinstance(base, cst.Name)
            and base.value != "self"
            and base.value in self.bound
            and not any(base.value in scope for scope in self.scoped)
        ):
            facts.writes.append(base.value)

    def _store_into(self, target: cst.BaseExpression) -> None:
        """``h[0] = y`` and ``state.k = y`` change the local ``h`` or ``state``: a write of
        it (the name itself is read as well), so later readers depend on this statement."""
        facts = self._facts()
        if facts is None:
            return
        for stored in m.findall(target, m.Subscript() | m.Attribute()):
            if self.get_metadata(ExpressionContextProvider, stored, None) != (
                ExpressionContext.STORE
            ):
                continue
            base: cst.BaseExpression = stored  # type: ignore[assignment]
            while isinstance(base, cst.Subscript | cst.Attribute):
                base = base.value
            if (
                isinstance(base, cst.Name)
                and base.value != "self"
                and not any(base.value in scope for scope in self.scoped)
            ):
                facts.writes.append(base.value)

    def visit_Call(self, node: cst.Call) -> None:
        facts = self._facts()
        if facts is not None:
            facts.calls.append(self._describe(node))
            self._advanced(node, facts)
        self.depth += 1

    def _advanced(self, node: cst.Call, facts: StatementFacts) -> None:
        """``next(it)`` or ``next(it, default)``: the iterator ``it`` moves on, so the
        statement writes it (what its first statement made is not what it holds after)."""
        if not (m.matches(node.func, m.Name("next")) and node.args and not node.args[0].keyword):
            return
        target = node.args[0].value
        if (
            isinstance(target, cst.Name)
            and target.value in self.bound
            and not any(target.value in scope for scope in self.scoped)
        ):
            facts.writes.append(target.value)

    def leave_Call(self, original_node: cst.Call) -> None:
        self.depth -= 1

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        facts = self._facts()
        if facts is not None:
            name = _OPERATORS.get(type(node.operator), "binop")
            facts.calls.append(_CallFact(self.depth, self._next(), None, f"operator.{name}"))
        self.depth += 1

    def leave_BinaryOperation(self, original_node: cst.BinaryOperation) -> None:
        self.depth -= 1

    def _next(self) -> int:
        self.order += 1
        return self.order

    def _describe(self, node: cst.Call) -> _CallFact:
        path = self_path(node.func)
        if path:
            return _CallFact(self.depth, self._next(), path, None)
        dotted = _dotted(node.func)
        if dotted is not None:  # qualified once the forward's own names are known
            submodule = f"<{dotted}>" if "." not in dotted else None  # maybe a loop item
            return _CallFact(self.depth, self._next(), submodule, dotted, qualify=True)
        if isinstance(node.func, cst.Attribute):  # a method, e.g. x.view(...)
            return _CallFact(self.depth, self._next(), None, node.func.attr.value)
        built = _dotted(node.func.func) if isinstance(node.func, cst.Call) else None
        if built is not None:  # nn.Dense(4)(h): a submodule built inline, named by its class
            return _CallFact(self.depth, self._next(), None, built, qualify=True)
        return _CallFact(self.depth, self._next(), None, "call")


def _dotted(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of attributes on a name; otherwise ``None``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


@dataclass
class ImportAliases:
    """What each top-level imported name of a file stands for (``F`` -> ``torch.nn.functional``).

    Qualified names of calls come from this table rather than libcst's
    ``QualifiedNameProvider``, whose scope analysis costs more than parsing the
    forward itself; the table covers what a forward calls: imported modules and
    functions, names defined in the file, builtins. Names the forward assigns
    shadow all of them.
    """

    targets: dict[str, str] = field(default_factory=dict)
    local_names: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, module: cst.Module, local_names: set[str]) -> ImportAliases:
        """The table of ``module``'s top-level imports; ``local_names`` shadow them."""
        aliases = cls(local_names=set(local_names))
        for statement in module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                aliases.targets[statement.name.value] = statement.name.value  # not a builtin
                continue
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Import):
                    for alias in small.names:
                        full = _dotted(alias.name) or ""
                        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                            aliases.targets[alias.asname.name.value] = full
                        else:
                            root = full.split(".")[0]
                            aliases.targets[root] = root
                elif isinstance(small, cst.ImportFrom) and not isinstance(
                    small.names, cst.ImportStar
                ):
                    base = _dotted(small.module) if small.module is not None else None
                    if base is None or small.relative:
                        continue
                    for alias in small.names:
                        name = _dotted(alias.name) or ""
                        local = name
                        if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                            local = alias.asname.name.value
                        aliases.targets[local] = f"{base}.{name}"
        return aliases

    def qualify(self, dotted: str) -> str:
        root, _, rest = dotted.partition(".")
        if root in self.local_names:
            return dotted
        if root in self.targets:
            target = self.targets[root]
            return f"{target}.{rest}" if rest else target
        if root in _BUILTINS:
            return f"builtins.{dotted}"
        return dotted


_BUILTINS = frozenset(dir(builtins))


def _reduced_module(
    module: cst.Module, classdef: cst.ClassDef, forward: cst.FunctionDef
) -> cst.Module:
    """The file's imports and the model class holding only its forward: all the
    metadata needs to see (qualified names come from the imports)."""
    imports = [
        statement
        for statement in module.body
        if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
    ]
    reduced_class = classdef.with_changes(body=classdef.body.with_changes(body=[forward]))
    return module.with_changes(body=[*imports, reduced_class])


def _lines_above_member(
    module: cst.Module, classdef: cst.ClassDef, member: cst.CSTNode, text: str | None = None
) -> int:
    """Lines of ``module`` above ``member`` of top-level ``classdef``, up to where the
    member's own code begins.

    With the module's ``text``, the line of the ``class`` keyword is found in it
    (when exactly one top-level line starts the class), which spares printing
    everything above the class.
    """
    members = list(classdef.body.body)
    upto = members[: next(i for i, node in enumerate(members) if node is member) + 1]
    # (An empty body would print as `pass`, so print up to the member and take it off.)
    bare = classdef.with_changes(
        leading_lines=(), decorators=(), body=classdef.body.with_changes(body=upto, footer=())
    )
    from_keyword = module.code_for_node(bare).count("\n") - module.code_for_node(member).count("\n")
    if text is not None:
        pattern = re.compile(rf"^class\s+{re.escape(classdef.name.value)}\b", re.MULTILINE)
        starts = [found.start() for found in pattern.finditer(text)]
        if len(starts) == 1:
            return text.count("\n", 0, starts[0]) + from_keyword
    above_keyword = module.code_for_node(classdef.with_changes(body=bare.body)).count(
        "\n"
    ) - module.code_for_node(bare).count("\n")
    return _lines_before(module, classdef) + above_keyword + from_keyword


# --- the op graph ------------------------------------------------------------------

#: Whether a forward statement (with its facts) is a sync point the user wrote by hand.
SyncPointTest = Callable[[cst.BaseStatement, "StatementFacts"], bool]
#: The id base of a plain statement, when a backend names ops its own way (else ``None``).
StatementLabel = Callable[[cst.BaseStatement], "str | None"]


def target_names(target: cst.CSTNode) -> tuple[list[cst.Name], list[cst.Name]]:
    """What an assignment target binds, as Python binds it: the names (``x``, ``x, (y,
    *z)``), and the names of the objects a store into a subscript or attribute changes
    (``h`` of ``h[i] = y``, ``state`` of ``state.k = y``), which it binds nothing of."""
    if isinstance(target, cst.Name):
        return [target], []
    if isinstance(target, cst.Tuple | cst.List):
        names: list[cst.Name] = []
        changed: list[cst.Name] = []
        for element in target.elements:
            more, more_changed = target_names(element.value)
            names += more
            changed += more_changed
        return names, changed
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    base = target
    while isinstance(base, cst.Subscript | cst.Attribute):
        base = base.value
    return [], [base] if isinstance(base, cst.Name) else []


class _GatherNamesVisitor(cst.CSTVisitor):
    """Names a statement reads and binds, told apart by syntax (no metadata needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.bound: set[int] = set()
        self.reads: list[str] = []
        self.writes: list[str] = []

    def _bind(self, target: cst.CSTNode) -> None:
        names, changed = target_names(target)
        for name in names:
            self.bound.add(id(name))
            self.writes.append(name.value)
        for base in changed:
            # `kept[i] = y`, `state.k = y`: the object the base names changes, so the
            # statement reads it and writes it; the index (`i`) is only read.
            if base.value != "self":
                self.writes.append(base.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.target, cst.Name):
            self.reads.append(node.target.value)
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.bound.add(id(node.attr))  # `x.attr`: attr is no variable

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self.bound.add(id(node.keyword))  # `f(x=y)`: x is no variable

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self.bound:
            self.reads.append(node.value)


def _exposed_reads(body: cst.BaseSuite) -> list[str]:
    """Names a block reads before it binds them itself, in order."""
    statements: Sequence[cst.CSTNode] = body.body if isinstance(body, cst.IndentedBlock) else [body]
    exposed: list[str] = []
    written: set[str] = set()
    for statement in statements:
        names = _GatherNamesVisitor()
        statement.visit(names)
        exposed.extend(name for name in names.reads if name not in written)
        written.update(names.writes)
    return exposed


def _comment_of(statement: cst.BaseStatement) -> str:
    if isinstance(statement, cst.SimpleStatementLine):
        comment = statement.trailing_whitespace.comment
    elif isinstance(body := getattr(statement, "body", None), cst.IndentedBlock):
        comment = body.header.comment  # a compound statement's (a match has cases, no body)
    else:
        comment = None
    return comment.value if comment is not None else ""


def _is_trivial(statement: cst.BaseStatement) -> bool:
    """Docstrings, ``pass`` and the like: no op."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    return all(
        isinstance(small, cst.Pass)
        or (
            isinstance(small, cst.Expr)
            and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
        )
        for small in statement.body
    )


def _names_only(node: cst.BaseExpression) -> bool:
    """A name, or a tuple or list of names (starred too), or a dict of names under string
    keys (``**`` too): an expression that computes nothing."""
    if isinstance(node, cst.Name):
        return True
    if isinstance(node, cst.Tuple | cst.List):
        return all(
            _names_only(element.value)
            for element in node.elements
            if isinstance(element, cst.Element | cst.StarredElement)
        )
    if isinstance(node, cst.Dict):  # {"position_ids": position_ids, **kwargs}; not {}
        return (
            bool(node.elements)
            and all(
                isinstance(element, cst.StarredDictElement)
                or (
                    isinstance(element, cst.DictElement)
                    and isinstance(element.key, cst.SimpleString)
                )
                for element in node.elements
            )
            and all(_names_only(element.value) for element in node.elements)
        )
    return False


def _is_alias(statement: cst.BaseStatement) -> bool:
    """``skip = x``, ``a, b = pair``, ``pair = (x, y)``, ``kw = {"k": x, **kw}``,
    ``f = lambda t: t + x`` or a nested ``def``: a statement that only names values (see
    ``Op.alias``)."""
    if isinstance(statement, cst.FunctionDef):
        return True
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Assign):
        targets = all(_names_only(target.target) for target in small.targets)
        return targets and (_names_only(small.value) or isinstance(small.value, cst.Lambda))
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        value = small.value
        return _names_only(small.target) and (_names_only(value) or isinstance(value, cst.Lambda))
    return False


def _is_pipe_split(statement: cst.BaseStatement, facts: StatementFacts) -> bool:
    """A bare ``pipe_split()`` statement."""
    return (
        m.matches(statement, m.SimpleStatementLine(body=[m.Expr(m.Call(args=[]))]))
        and len(facts.calls) == 1
        and (facts.calls[0].function or "").rsplit(".", 1)[-1] == "pipe_split"
    )


def _is_return(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and any(
        isinstance(small, cst.Return) for small in statement.body
    )


_REGION_REASONS = {
    cst.If: "an if statement: which branch runs can depend on the data",
    cst.While: "a while loop: its trip count can depend on the data",
    cst.With: "a with block: a sync point inside would cross its context",
    cst.Try: "a try statement",
    cst.TryStar: "a try statement",
    cst.Match: "a match statement: which case runs can depend on the data",
    cst.For: "a loop over something other than a layer container of known length",
    cst.FunctionDef: "a nested function definition",
    cst.ClassDef: "a nested class definition",
}


def _unique(base: str, line: int, column: int, taken: set[str]) -> str:
    candidates = [base, f"{base}@L{line}", f"{base}@L{line}:{column}"]
    count = 2
    while candidates[-1] in taken:  # several ops from one statement
        candidates.append(f"{base}@L{line}:{column}#{count}")
        count += 1
    candidate = next(c for c in candidates if c not in taken)
    taken.add(candidate)
    return candidate


def _statement_id(facts: StatementFacts, line: int, loop_item: dict[str, str]) -> str:
    submodules = [
        call
        for call in facts.calls
        if call.submodule is not None
        and (not call.submodule.startswith("<") or call.submodule in loop_item)
    ]
    if submodules:
        outermost = min(submodules, key=lambda call: (call.depth, call.order))
        assert outermost.submodule is not None
        return loop_item.get(outermost.submodule, outermost.submodule)
    functions = [call for call in facts.calls if call.function is not None]
    if functions:
        outermost = min(functions, key=lambda call: (call.depth, call.order))
        return f"{outermost.function}@L{line}"
    return f"stmt@L{line}"


def _calls(facts: StatementFacts, loop_item: dict[str, str]) -> tuple[str, ...]:
    names = []
    for call in sorted(facts.calls, key=lambda call: call.order):
        if call.submodule is not None and not call.submodule.startswith("<"):
            names.append(f"self.{call.submodule}")
        elif call.submodule is not None and call.submodule in loop_item:
            names.append(f"self.{loop_item[call.submodule]}")
        elif call.function is not None:
            names.append(call.function)
    return tuple(dict.fromkeys(names))


def analyse_method(
    module: cst.Module,
    path: str,
    class_name: str | None = None,
    sizes: ContainerSizes | None = None,
    text: str | None = None,
    expand: ContainerSizes | None = None,
    method: str = "forward",
    sync_point: SyncPointTest | None = None,
) -> OpGraph:
    """The op graph of the method ``method`` of ``class_name`` (``forward`` by default).

    ``sync_point`` recognises a hand-written sync point of the backend
    (default: a bare ``pipe_split()``).
    """
    model = find_forward(module, class_name, path, method)
    forward = model.forward
    if not isinstance(forward.body, cst.IndentedBlock):
        raise SyncpassError(
            f"{method} is written on one line; nothing can be placed inside it",
            f"{path}:{_line(module, forward)}",
        )
    reduced = _reduced_module(module, model.classdef, forward)
    reduced_class = reduced.body[-1]
    assert isinstance(reduced_class, cst.ClassDef)
    # Positions are of the reduced module; shift them back to the file's lines.
    offset = _lines_above_member(module, model.classdef, forward, text) - _lines_above_member(
        reduced, reduced_class, forward
    )
    return build_op_graph(
        FunctionSite(
            module=module,
            path=path,
            name=model.class_name,
            function=forward,
            reduced=reduced,
            offset=offset,
            hidden=frozenset({"self"}),
            sync_point=sync_point or _is_pipe_split,
        ),
        sizes,
        expand,
    )


@dataclass(frozen=True)
class FunctionSite:
    """A function whose body the op graph describes, and what the analysis needs around it.

    ``reduced`` is a module that holds ``function`` (the same node) and the
    file's imports: all the metadata needs to see. ``offset`` shifts its lines
    back to the file's. ``hidden`` are parameters that are no values of the
    data flow (``self``; a JAX function's parameters, which each stage holds
    itself). ``label`` names plain statements where the backend has a better
    name than the outermost call.
    """

    module: cst.Module
    path: str
    name: str
    function: cst.FunctionDef
    reduced: cst.Module
    offset: int
    hidden: frozenset[str] = frozenset()
    sync_point: SyncPointTest | None = None
    label: StatementLabel | None = None

    @property
    def title(self) -> str:
        """``Net.forward`` for a method, ``forward`` for a function."""
        own = self.function.name.value
        return own if self.name == own else f"{self.name}.{own}"


def build_op_graph(
    site: FunctionSite,
    sizes: ContainerSizes | None = None,
    expand: ContainerSizes | None = None,
) -> OpGraph:
    """The op graph of the body of ``site.function`` (see :mod:`syncpass.contracts.graph`)."""
    sizes = sizes or {}
    expand = expand or {}
    module, path, forward, offset = site.module, site.path, site.function, site.offset
    is_sync_point = site.sync_point or _is_pipe_split
    assert isinstance(forward.body, cst.IndentedBlock)
    statements = list(forward.body.body)
    wrapper = MetadataWrapper(site.reduced, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    visitor = GatherStatementFactsVisitor(statements)
    wrapper.visit(visitor)

    params = [p.name.value for p in (*forward.params.posonly_params, *forward.params.params)]
    params += [p.name.value for p in forward.params.kwonly_params]
    for star in (forward.params.star_arg, forward.params.star_kwarg):
        if isinstance(star, cst.Param):
            params.append(star.name.value)
    inputs = tuple(name for name in params if name not in site.hidden)
    local_names = set(inputs)
    for facts in visitor.facts:
        local_names.update(facts.writes)
    imports = ImportAliases.of(module, local_names | site.hidden)
    for facts in visitor.facts:
        for call in facts.calls:
            if call.qualify and call.function is not None:
                call.function = imports.qualify(call.function)

    ops: list[Op] = []
    regions: list[Region] = []
    pinned: set[str] = set()
    forbidden: set[str] = set()
    written: set[str] = set()
    sink_reads: list[str] = []
    taken: set[str] = set()
    for index, statement in enumerate(statements):
        facts = visitor.facts[index]
        start = positions[statement].start
        line = start.line + offset
        location = SourceLocation(path, line, start.column)
        reads = tuple(dict.fromkeys(name for name in facts.reads if name in local_names))
        writes = tuple(dict.fromkeys(name for name in facts.writes if name in local_names))
        comment = _comment_of(statement)
        if _is_trivial(statement):
            continue
        if _is_return(statement) and not facts.calls:  # `return x`: nothing to run
            sink_reads.extend(reads)
            continue
        scan = match_scan_call(statement)
        if scan is not None and scan.root in site.hidden and scan.container in sizes:
            # One op per layer of the stack; each later one starts from the carry.
            rest = tuple(name for name in reads if name != scan.init)
            layers = scan.iterations(sizes[scan.container])
            chain = _Chain(scan.container, line, start.column, index, location, comment)
            chain.add(
                layers,
                [_calls(facts, {})] * len(layers),
                (reads, tuple(dict.fromkeys((scan.target, *rest)))),
                writes,
                _Sinks(ops, taken, forbidden, pinned),
            )
            continue
        sequential = match_sequential_call(statement)
        if sequential is not None and sequential.container in expand:
            container = sequential.container
            children = sequential.iterations(expand[container])
            chain = _Chain(container, line, start.column, index, location, comment)
            items = nested_items(container, children, expand)
            chain.add(
                range(len(items)),
                [(f"self.{item.container}.{item.index}",) for item in items],
                ((sequential.argument,), (sequential.target,)),
                (sequential.target,),
                _Sinks(ops, taken, forbidden, pinned),
                items,
            )
            continue
        if is_sync_point(statement, facts):
            # A sync point the user wrote by hand: a pinned cut after the op before it.
            if ops:
                pinned.add(ops[-1].id)
                written.add(ops[-1].id)
            continue
        if isinstance(statement, cst.SimpleStatementLine):
            label = site.label(statement) if site.label is not None else None
            base = label if label is not None else _statement_id(facts, line, {})
            op_id = _unique(base, line, start.column, taken)
            alias = _is_alias(statement)
            ops.append(Op(op_id, _calls(facts, {}), reads, writes, location, index, alias=alias))
            if PIN_SYNC.search(comment):
                pinned.add(op_id)
            if FORBID_SYNC.search(comment):
                forbidden.add(op_id)
            continue
        loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
        if loop is not None and loop.root not in site.hidden:
            loop = None  # a loop over a local list: one region
        if loop is not None and loop.container in sizes:
            iterations = loop.iterations(sizes[loop.container])
            internal = loop.names
            # What one iteration needs from before it: names read before the body writes them.
            assert isinstance(statement, cst.For)
            # A local sequence zipped with the layers is read by every iteration, too.
            iterated = [
                name.value
                for name in m.findall(statement.iter, m.Name())
                if isinstance(name, cst.Name)
            ]
            exposed = [*iterated, *_exposed_reads(statement.body)]
            body_reads = tuple(
                dict.fromkeys(
                    name for name in exposed if name in local_names and name not in internal
                )
            )
            body_writes = tuple(name for name in writes if name not in internal)
            # After the loop its names hold the last iteration's binding (a later
            # `if (layer_idx + 1) in repr_layers:` reads it): the last iteration writes them.
            last_writes = (*body_writes, *(name for name in writes if name in internal))
            for position, iteration in enumerate(iterations):
                item_path = f"{loop.container}.{iteration}"
                op_id = _unique(item_path, line, start.column, taken)
                ops.append(
                    Op(
                        op_id,
                        _calls(facts, loop.item_paths(item_path)),
                        body_reads,
                        last_writes if position == len(iterations) - 1 else body_writes,
                        location,
                        index,
                        loop=LoopIteration(loop.container, iteration, loop.zipped_containers),
                    )
                )
                last_iteration = position == len(iterations) - 1
                if FORBID_SYNC.search(comment) and not last_iteration:
                    forbidden.add(op_id)
                if PIN_SYNC.search(comment) and last_iteration:
                    pinned.add(op_id)  # on a loop header: a sync point after the loop
            continue
        reason = _REGION_REASONS.get(type(statement), "a statement the analysis cannot see into")
        if loop is not None:
            reason = (
                f"the length of {loop.expression} is unknown (give --example, or a cost "
                "file that lists its iterations)"
            )
        elif isinstance(statement, cst.For) and _has_jump(statement.body):
            reason = "a loop with break, continue or return"
        keyword = (
            type(statement)
            .__name__.lower()
            .replace("functiondef", "def")
            .replace("classdef", "class")
        )
        op_id = _unique(f"{keyword}@L{line}", line, start.column, taken)
        end = positions[statement].end.line + offset
        alias = _is_alias(statement)
        ops.append(
            Op(op_id, _calls(facts, {}), reads, writes, location, index, region=reason, alias=alias)
        )
        regions.append(Region(location, end, reason))
        if FORBID_SYNC.search(comment):
            forbidden.add(op_id)

    if not ops:
        raise SyncpassError(
            f"{site.title} has no ops to plan",
            f"{path}:{positions[forward].start.line + offset}",
        )
    edges, live = _dataflow(ops, inputs, sink_reads)
    # No cut after an alias of its own accord: the cut before it sends the same values
    # under fewer names, and to torch's tracer a stage of aliases alone is no stage.
    cuts = tuple(
        Cut(after=op.id, live=live[position], pinned=op.id in pinned)
        for position, op in enumerate(ops[:-1])
        if op.id not in forbidden and (not op.alias or op.id in pinned)
    )
    return OpGraph(
        path=path,
        model_class=site.name,
        forward=SourceLocation(
            path, positions[forward].start.line + offset, positions[forward].start.column
        ),
        inputs=inputs,
        ops=tuple(ops),
        edges=edges,
        cuts=cuts,
        regions=tuple(regions),
        forbidden=tuple(sorted(forbidden)),
        written=tuple(op.id for op in ops if op.id in written),
        containers=tuple(sorted({**sizes, **expand}.items())),
    )


def nested_items(container: str, children: range, expand: ContainerSizes) -> list[LoopIteration]:
    """The ops of a sequential call of ``container`` over ``children``, in order: one per
    child, except that a child ``expand`` sizes too (``blocks.1``: a nested
    ``nn.Sequential``) stands for its own children, and so on down (``blocks.1.0``, with
    ``outer`` ``(1,)``)."""
    items: list[LoopIteration] = []

    def walk(path: str, indices: range, outer: tuple[int, ...]) -> None:
        for child in indices:
            inner = f"{path}.{child}"
            if inner in expand:
                walk(inner, range(expand[inner]), (*outer, child))
            else:
                items.append(LoopIteration(path, child, outer=outer))

    walk(container, children, ())
    return items


@dataclass(frozen=True)
class _Sinks:
    """Where the op graph's builder collects ops, the ids taken, and the cuts the comments
    forbid or pin."""

    ops: list[Op]
    taken: set[str]
    forbidden: set[str]
    pinned: set[str]


@dataclass(frozen=True)
class _Chain:
    """One statement planned as a chain of ops, one per item of ``container``: a sequential
    call expanded into its children, a scan into its layers."""

    container: str
    line: int
    column: int
    statement: int
    location: SourceLocation
    comment: str

    def add(
        self,
        items: range,
        calls: Sequence[tuple[str, ...]],
        reads: tuple[tuple[str, ...], tuple[str, ...]],
        writes: tuple[str, ...],
        sinks: _Sinks,
        nested: Sequence[LoopIteration] | None = None,
    ) -> None:
        """An op per item, running ``calls[position]``: the first reads ``reads[0]``, each
        later one ``reads[1]``; ``nested`` gives each item's place when children of nested
        containers stand for some (:func:`nested_items`). A
        ``no-sync`` comment forbids the cuts inside the chain; a ``sync`` pin goes after it."""
        for position, item in enumerate(items):
            loop = LoopIteration(self.container, item) if nested is None else nested[position]
            op_id = _unique(f"{loop.container}.{loop.index}", self.line, self.column, sinks.taken)
            sinks.ops.append(
                Op(
                    op_id,
                    calls[position],
                    reads[0] if position == 0 else reads[1],
                    writes,
                    self.location,
                    self.statement,
                    loop=loop,
                )
            )
            last = position == len(items) - 1
            if FORBID_SYNC.search(self.comment) and not last:
                sinks.forbidden.add(op_id)
            if PIN_SYNC.search(self.comment) and last:
                sinks.pinned.add(op_id)


def _line(module: cst.Module, node: cst.CSTNode) -> int:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return wrapper.resolve(PositionProvider)[node].start.line


def _lines_before(module: cst.Module, statement: cst.BaseStatement) -> int:
    """Lines of ``module`` above top-level ``statement`` (its own leading lines included)."""
    lines = len(module.header)
    for other in module.body:
        if other is statement:
            return lines
        lines += module.code_for_node(other).count("\n")
    raise ValueError("statement is not at the top level of module")


def _dataflow(
    ops: Sequence[Op], inputs: Sequence[str], sink_reads: Sequence[str]
) -> tuple[tuple[tuple[str, str], ...], list[tuple[str, ...]]]:
    """Def-use edges between ops, and the live names after each op.

    An edge joins the op that made a value to each op that uses it, however many names
    it went by in between: an alias op (``skip = x``) hands on its reads' producers
    rather than being one itself, as a traced graph sees it.

    An alias whose names are never read again still reads its values: the eager stages
    run every statement verbatim and need them. torch's tracer drops such a statement,
    so the traced form is charged a little more than it sends there (and a value read
    only by it counts as used); for every other statement the live sets are what the
    tracer sends (``tests/backends/torch/test_live_sets.py``).
    """
    producers: dict[str, tuple[str, ...]] = {name: (INPUT,) for name in inputs}
    edges: dict[tuple[str, str], None] = {}
    for op in ops:
        made: dict[str, None] = {}
        for name in op.reads:
            for source in producers.get(name, ()):
                if source != op.id:
                    edges[(source, op.id)] = None
                made[source] = None
        for name in op.writes:
            producers[name] = tuple(made) if op.alias and made else (op.id,)
    for name in sink_reads:
        for source in producers.get(name, ()):
            edges[(source, OUTPUT)] = None
    # Live after op j: defined at or before j (or an input) and read after j before
    # being overwritten. A region may or may not run its assignments, so only
    # plain statements and loop iterations kill the names they write.
    live_after: list[set[str]] = [set() for _ in ops]
    live: set[str] = set(sink_reads)
    for position in range(len(ops) - 1, -1, -1):
        op = ops[position]
        live_after[position] = set(live)
        if op.region is None:
            live -= set(op.writes)
        live |= set(op.reads)
    live_lists: list[tuple[str, ...]] = []
    defined: dict[str, None] = dict.fromkeys(inputs)
    for position, op in enumerate(ops):
        defined.update(dict.fromkeys(op.writes))
        live_lists.append(tuple(name for name in defined if name in live_after[position]))
    return tuple(edges), live_lists

"""``nn.Sequential``, ``nn.ModuleList`` and ``nn.ModuleDict``: building them, indexing them
and the list and dict methods a constructor calls on them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import libcst as cst

from syncpass.backends.torch.estimate.values import (
    MODULES,
    Container,
    Opaque,
    Unsized,
    as_int,
    describe,
    unfollowed_method,
)

#: The container classes of ``torch.nn``.
CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})
#: The interpreter's iteration: the items of a value, or unsized (the node is for reasons).
Iterate = Callable[[object, cst.CSTNode], list[object]]


def construct_container(
    kind: str,
    args: list[object],
    kwargs: Mapping[str, object],
    text: str,
    iterate: Iterate,
    node: cst.CSTNode,
) -> Container:
    """The container ``nn.<kind>(*args, **kwargs)``, written ``text`` in the source."""
    if kind == "Sequential":
        if len(args) == 1 and isinstance(args[0], dict):
            items = list(args[0].items())
            return _container(kind, [value for _, value in items], text, None)
        return _container(kind, args, text, None)
    source = args[0] if args else kwargs.get("modules", [])
    if kind == "ModuleDict":
        if isinstance(source, dict):
            pairs = list(source.items())
        else:
            pairs = [_pair(item) for item in iterate(source, node)]
        return _container(kind, [value for _, value in pairs], text, [str(key) for key, _ in pairs])
    return _container(kind, iterate(source, node), text, None)


def index_container(value: Container, index: object) -> object:
    """``value[index]``: a ModuleDict by key, the others by position or by slice."""
    if value.keys is not None:
        if index not in value.keys:
            raise Unsized(f"{value.text} has no entry {index!r}")
        return value.children[value.keys.index(str(index))]
    if isinstance(index, slice):
        return Container(value.kind, value.children[index], None, value.text)
    try:
        return value.children[as_int(index, "an index")]
    except IndexError:
        raise Unsized(f"index {index} is out of range of {value.text}") from None


def call_container_method(
    target: Container, name: str, args: list[object], iterate: Iterate, node: cst.CSTNode
) -> object:
    """``target.<name>(*args)``: ``append``, ``extend``, ``items()`` and the like."""
    if name in ("append", "add_module") and target.keys is None:
        target.children.append(_container("", [args[-1]], "", None).children[0])
        return None
    if name == "extend":
        target.children.extend(_container("", iterate(args[0], node), "", None).children)
        return None
    if name in ("items", "keys", "values") and target.keys is not None:
        pairs = list(zip(target.keys, target.children, strict=True))
        if name == "items":
            return pairs
        return [pair[0 if name == "keys" else 1] for pair in pairs]
    if name in ("children", "modules"):
        return list(target.children)
    raise unfollowed_method(target, name)


def _container(kind: str, children: list[object], text: str, keys: list[str] | None) -> Container:
    for child in children:
        if isinstance(child, Opaque):
            raise Unsized(child.reason)
        if not isinstance(child, MODULES):
            raise Unsized(f"{text} holds {describe(child)}, not a module")
    return Container(kind, list(children), keys, text)


def _pair(item: object) -> tuple[object, object]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise Unsized(f"needs (name, module) pairs, got {describe(item)}")

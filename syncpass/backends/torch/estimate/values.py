"""The values the estimate's interpreter computes with, and the exceptions that steer it.

A value is a plain Python value (numbers, strings, lists, tuples, dicts, ranges,
``None``) or one of the classes below: a tensor known by its shape, a standard
layer or container, an instance of one of the file's classes, a name from
outside the file, or an unknown value that carries the reason it is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst

# --- values -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor known by its shape and kind; identity tells aliases apart."""

    shape: tuple[int, ...]
    kind: str = "float"  # "float", "int" or "bool"
    parameter: bool = False  # an nn.Parameter attribute of a module


@dataclass(frozen=True, eq=False)
class Opaque:
    """A value the interpreter does not know; using it makes the op unsized."""

    reason: str


@dataclass(frozen=True)
class Library:
    """A name from outside the file: ``torch.nn.Linear``, ``builtins.max``."""

    name: str


@dataclass(eq=False)
class Layer:
    """A standard layer with its bound constructor arguments."""

    kind: str
    args: dict[str, object]
    text: str


@dataclass(eq=False)
class Container:
    """``nn.Sequential``, ``nn.ModuleList`` (children by position) or ``nn.ModuleDict``."""

    kind: str
    children: list[object] = field(default_factory=list)
    keys: list[str] | None = None  # ModuleDict only
    text: str = ""


@dataclass(eq=False)
class Instance:
    """An instance of one of the file's own classes."""

    classdef: cst.ClassDef
    attrs: dict[str, object]
    text: str


@dataclass(frozen=True)
class Function:
    """One of the file's functions, or a method bound to an instance."""

    node: cst.FunctionDef
    owner: Instance | None = None
    cls: cst.ClassDef | None = None  # the class that defines it, for super()


@dataclass(frozen=True)
class ClassRef:
    """One of the file's classes; calling it builds an :class:`Instance`."""

    node: cst.ClassDef


@dataclass(frozen=True)
class Super:
    """``super()`` in a method of ``cls``, bound to ``instance``."""

    instance: Instance
    cls: cst.ClassDef


@dataclass(frozen=True)
class Method:
    """A method of a value the interpreter models (``x.view``, ``layers.append``)."""

    target: object
    name: str


#: The values that are modules: what a container holds and a call runs.
MODULES = (Layer, Container, Instance)


# --- control flow -----------------------------------------------------------------------


class Unsized(Exception):
    """The interpreter cannot follow the source here; ``reason`` says why."""

    def __init__(self, reason: str, located: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.located = located


class Return(Exception):
    """A ``return`` statement, carrying its value to the call."""

    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


class Break(Exception):
    """A ``break`` statement, ending the loop that runs it."""


class Continue(Exception):
    """A ``continue`` statement, going on with the loop's next item."""


# --- reading values ---------------------------------------------------------------------


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def as_int(value: object, what: str) -> int:
    """``value`` as a whole number; ``what`` names it in the reason when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, Opaque):
            raise Unsized(value.reason)
        raise Unsized(f"needs a whole number for {what}, got {describe(value)}")
    return value


def as_tensor(value: object, what: str) -> Tensor:
    """``value`` as a tensor; ``what`` names it in the reason when it is not one."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Opaque):
        raise Unsized(value.reason)
    raise Unsized(f"needs a tensor for {what}, got {describe(value)}")


def describe(value: object) -> str:
    """A value as a reason shows it: the source that built it, a shape, a short repr."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {shape_text(value.shape)}"
    if isinstance(value, (Layer, Container, Instance)):
        return value.text or type(value).__name__
    if isinstance(value, Opaque):
        return f"an unknown value ({value.reason})"
    if isinstance(value, Library):
        return value.name
    return repr(value) if len(repr(value)) < 40 else type(value).__name__


def as_dim(index: object, rank: int, what: str = "a dimension") -> int:
    """A dimension of a tensor of ``rank``, counted from 0 (``-1`` is the last)."""
    value = as_int(index, what)
    if not -max(rank, 1) <= value < max(rank, 1):
        raise Unsized(f"dimension {value} is out of range for a tensor of rank {rank}")
    return value % max(rank, 1)


def as_ints(value: object, count: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as ``count`` ints (a kernel size, a stride)."""
    if isinstance(value, (tuple, list)):
        items = tuple(as_int(item, what) for item in value)
        if len(items) != count:
            raise Unsized(f"{what} has {len(items)} entries for {count} dimension(s)")
        return items
    return (as_int(value, what),) * count


def as_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, Opaque):
            raise Unsized(value.reason)
        raise Unsized(f"needs a number, got {describe(value)}")
    return value


def argument(
    args: Sequence[object], kwargs: Mapping[str, object], position: int, name: str, default: object
) -> object:
    """A call's argument by position, else by keyword, else ``default``."""
    if position < len(args):
        return args[position]
    return kwargs.get(name, default)


def unfollowed_method(target: object, name: str) -> Unsized:
    """The reason for a call of a method of ``target`` that the estimate does not model."""
    return Unsized(f"calls .{name}() of {describe(target)}, which syncpass cannot follow")

"""A model class's bases, read from their source: where an inherited ``forward`` comes from.

timm's DeiT, ``class VisionTransformerDistilled(VisionTransformer)`` in ``deit.py``,
overrides ``_pos_embed`` and ``forward_head`` and inherits ``forward`` and
``forward_features`` from ``timm.models.vision_transformer``, which ``deit.py``
imports. To plan it, the eager form needs the base's ``forward`` as source: the
stages (subclasses of the user's class, written into the user's file) run its
statements, and ``self.method`` in them resolves as Python resolves it at run time.

:func:`read_ancestry` finds the classes of the model's method resolution order
from the source alone, without importing anything: a base named in the class
statement is a class of the same file, or one the file imports (``from M import
C``, ``import M`` then ``M.C``, relative imports too), found as ``M``'s ``.py``
file under the model file's folder or a ``sys.path`` entry (the caller's
``roots``), following a name the module imports in turn (a package's
``__init__`` re-exporting it). ``torch.nn.Module`` and ``object`` end the
order. A base whose source is not found (a compiled module, a call such as
``Generic[T]``) ends what is known: its methods and what follows it are not
followed. With several bases anywhere in the hierarchy the order is Python's
(C3), and every class in it must be found; otherwise the model is refused,
naming the class statement.

Statements copied from a base's method run in the user's module: what they read
from their own module's globals must mean the same there (:meth:`Ancestry.unsafe_names`).

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
import libcst.matchers as m
from libcst.metadata import PositionProvider

from syncpass.core.errors import SyncpassError
from syncpass.frontend.source import decode_source, parse_source

#: Bases that end the order: nothing of theirs is followed.
TERMINAL_BASES = frozenset(
    {"torch.nn.Module", "torch.nn.modules.module.Module", "object", "builtins.object"}
)

#: Built-in names an inherited statement may read: the same object in every module.
BUILTIN_NAMES = frozenset(
    name for name in dir(builtins) if not name.startswith("__") or name == "__debug__"
)

#: Names that mean the class a method is written in: wrong in a stage class.
CLASS_BOUND_NAMES = frozenset({"super", "__class__"})

#: How many imports deep a name is followed (a package re-exporting a re-export).
MAX_HOPS = 6


@dataclass(frozen=True)
class Binding:
    """What a module-level name is bound to: ``key``, a dotted name that is the same
    for the same object (``torch.nn.functional`` for ``import torch.nn.functional as F``
    and for ``from torch.nn import functional as F``; ``pkg.mod.f`` for a ``def f`` of
    ``pkg.mod``), or ``""`` when the module binds it in more than one way; ``statement``,
    an import that binds it so."""

    key: str
    statement: str


@dataclass(frozen=True)
class SourceFile:
    """A module read for its classes: ``path`` as reports show it (relative to the model
    file's folder when inside it), its dotted ``name`` and ``package`` (for its relative
    imports), its tree, and its module-level names (:class:`Binding`); ``star`` when it
    imports ``*`` (its names are then not all known)."""

    path: str
    name: str
    package: str
    module: cst.Module
    bindings: dict[str, Binding] = field(compare=False, hash=False)
    star: bool = False
    lines: dict[cst.CSTNode, int] = field(default_factory=dict, compare=False, hash=False)

    def line(self, node: cst.CSTNode) -> int:
        """The line of ``node`` (a node of this module's tree), 0 if it is not in it."""
        if not self.lines:  # read once, when first asked
            wrapper = cst.MetadataWrapper(self.module, unsafe_skip_copy=True)
            positions = wrapper.resolve(PositionProvider)
            self.lines.update((key, where.start.line) for key, where in positions.items())
        return self.lines.get(node, 0)


@dataclass(frozen=True)
class SourceClass:
    """A class of the model's ancestry: its ``def`` and the file it is in (``own``: the
    model's file)."""

    name: str
    classdef: cst.ClassDef
    file: SourceFile
    own: bool

    @property
    def where(self) -> str:
        """``file:line`` of the class statement."""
        return f"{self.file.path}:{self.file.line(self.classdef)}"


@dataclass(frozen=True)
class Ancestry:
    """The model class and the classes after it in its method resolution order, as far as
    their source was found. ``unknown`` says where that stops before ``nn.Module`` (a base
    not found: its methods are not known), ``""`` when the order is complete."""

    classes: tuple[SourceClass, ...]
    unknown: str = ""

    @property
    def model(self) -> SourceClass:
        return self.classes[0]

    def method(self, name: str) -> tuple[SourceClass, cst.FunctionDef] | str:
        """The class whose ``def name`` the model runs, and that ``def``; or why it is not
        known (a class binds the name otherwise, or the order stops first)."""
        for cls in self.classes:
            for member in cls.classdef.body.body:
                if isinstance(member, cst.FunctionDef) and member.name.value == name:
                    return cls, member
            if name in _class_level_names(cls.classdef):
                return f"{cls.name} ({cls.where}) binds {name} other than with a def"
        if self.unknown:
            return f"{name} is not found before {self.unknown}"
        return f"no class of its bases defines {name}"

    def methods(self) -> dict[str, tuple[SourceClass, cst.FunctionDef]]:
        """Every ``def`` the model runs by name (the first in the order: an override
        wins), skipping names some class binds otherwise first."""
        found: dict[str, tuple[SourceClass, cst.FunctionDef]] = {}
        shadowed: set[str] = set()
        for cls in self.classes:
            for member in cls.classdef.body.body:
                name = member.name.value if isinstance(member, cst.FunctionDef) else None
                if name is not None and name not in found and name not in shadowed:
                    assert isinstance(member, cst.FunctionDef)
                    found[name] = (cls, member)
            shadowed |= _class_level_names(cls.classdef) - set(found)
        return found

    def unsafe_names(self, names: Sequence[str], owner: SourceClass) -> dict[str, str]:
        """Of ``names``, the globals a statement of ``owner``'s methods reads, those that
        would not mean the same in the model's module, each with why (and how to fix it):
        a name ``owner``'s module binds that the model's module does not bind to the same
        (the same import, or an import of it from that module), a built-in the model's
        module binds to something else, a name ``owner``'s module does not bind (a ``*``
        import may), and ``super``/``__class__`` (they mean the class the method is in)."""
        user = self.model.file
        unsafe: dict[str, str] = {}
        for name in names:
            if name in CLASS_BOUND_NAMES:
                unsafe[name] = f"{name} means {owner.name} there, not the stage class"
                continue
            if owner.file is user:
                continue
            theirs = owner.file.bindings.get(name)
            ours = user.bindings.get(name)
            if theirs is None:
                if owner.file.star or name not in BUILTIN_NAMES:
                    unsafe[name] = f"{owner.file.path} does not bind it by name"
                elif ours is not None or user.star:
                    unsafe[name] = f"{user.path} binds the built-in {name} to something else"
                continue
            if theirs.key and ours is not None and self._same(ours.key, theirs.key):
                continue
            how = f" ({theirs.statement})" if theirs.statement else ""
            unsafe[name] = f"{user.path} does not bind it as {owner.file.path} does{how}"
        return unsafe

    def _same(self, ours: str, theirs: str) -> bool:
        return bool(ours) and _canonical(ours, self.classes) == _canonical(theirs, self.classes)


def _canonical(key: str, classes: Sequence[SourceClass]) -> str:
    """``key`` with a name imported from a module read here replaced by what that module
    binds it to (``timm.models.vision_transformer.trunc_normal_`` -> ``timm.layers...``)."""
    files = {cls.file.name: cls.file for cls in classes if cls.file.name}
    for _ in range(MAX_HOPS):
        module, _, name = key.rpartition(".")
        found = files.get(module)
        binding = found.bindings.get(name) if found is not None else None
        if binding is None or not binding.key or binding.key == key:
            return key
        key = binding.key
    return key


def _class_level_names(classdef: cst.ClassDef) -> set[str]:
    """Names a class body binds other than with a ``def`` (``forward = _impl``)."""
    names: set[str] = set()
    for statement in classdef.body.body:
        if isinstance(statement, cst.ClassDef):
            names.add(statement.name.value)
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            targets: list[cst.BaseExpression] = []
            if isinstance(small, cst.Assign):
                targets = [target.target for target in small.targets]
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                targets = [small.target]
            names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names


# --- module-level names ----------------------------------------------------------------


def _dotted(node: cst.BaseExpression | None) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def absolute_module(package: str, level: int, name: str) -> str:
    """The module ``from <level dots><name> import`` names, in ``package``; ``""`` when it
    climbs above it."""
    if not level:
        return name
    parts = package.split(".") if package else []
    if level > 1:
        if level - 1 > len(parts):
            return ""
        parts = parts[: len(parts) - (level - 1)]
    if level and not parts and not name:
        return ""
    return ".".join([*parts, *([name] if name else [])])


class _GatherGlobalsVisitor(cst.CSTVisitor):
    """The names a module binds at its top level (in ``if``/``try``/``with`` blocks too)."""

    def __init__(self, module: cst.Module, name: str, package: str) -> None:
        super().__init__()
        self.module = module
        self.name = name
        self.package = package
        self.found: dict[str, list[Binding]] = {}
        self.star = False

    def _add(self, name: str, key: str, statement: str = "") -> None:
        self.found.setdefault(name, []).append(Binding(key, statement))

    def _local(self, target: cst.CSTNode) -> None:
        for node in m.findall(target, m.Name()):
            assert isinstance(node, cst.Name)
            self._add(node.value, f"{self.name}.{node.value}" if self.name else "")

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._add(node.name.value, f"{self.name}.{node.name.value}" if self.name else "")
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._add(node.name.value, f"{self.name}.{node.name.value}" if self.name else "")
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            dotted = _dotted(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                as_name = alias.asname.name.value
                self._add(as_name, dotted, f"import {dotted} as {as_name}")
            else:
                head = dotted.split(".")[0]
                self._add(head, head, f"import {dotted}")
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        level = len(node.relative)
        source = absolute_module(self.package, level, _dotted(node.module))
        if isinstance(node.names, cst.ImportStar):
            self.star = True
            return False
        for alias in node.names:
            name = _dotted(alias.name)
            as_name = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                as_name = alias.asname.name.value
            rename = f" as {as_name}" if as_name != name else ""
            key = f"{source}.{name}" if source else ""
            self._add(as_name, key, f"from {source} import {name}{rename}" if source else "")
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._local(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._local(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._local(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._local(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._local(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._local(node.target)

    def visit_ListComp(self, node: cst.ListComp) -> bool:
        return False

    def visit_SetComp(self, node: cst.SetComp) -> bool:
        return False

    def visit_DictComp(self, node: cst.DictComp) -> bool:
        return False

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        return False


def read_file(module: cst.Module, path: str, name: str, package: str) -> SourceFile:
    """``module`` (the tree of the file at ``path``, dotted ``name`` in ``package``) with its
    module-level names."""
    visitor = _GatherGlobalsVisitor(module, name, package)
    module.visit(visitor)
    bindings = {}
    for bound, found in visitor.found.items():
        keys = {binding.key for binding in found}
        bindings[bound] = found[0] if len(keys) == 1 else Binding("", "")
    return SourceFile(path, name, package, module, bindings, visitor.star)


# --- finding the bases -----------------------------------------------------------------


@dataclass(frozen=True)
class _Unknown:
    """A base whose source was not found, and why."""

    reason: str


class _Reader:
    """Reads modules by dotted name under ``roots``, each once."""

    def __init__(self, model_file: Path, roots: Sequence[Path]) -> None:
        self.folder = model_file.parent
        self.roots = [self.folder, *(root for root in roots if root != self.folder)]
        self.files: dict[str, SourceFile | None] = {}

    def find(self, dotted: str) -> SourceFile | None:
        if dotted in self.files:
            return self.files[dotted]
        found = None
        parts = dotted.split(".")
        for root in self.roots:
            package = root.joinpath(*parts, "__init__.py")
            plain = root.joinpath(*parts[:-1], parts[-1] + ".py")
            for candidate, is_package in ((plain, False), (package, True)):
                if candidate.is_file():
                    shown = self.shown(candidate)
                    text = decode_source(candidate.read_bytes(), shown)
                    tree = parse_source(text, shown)
                    inside = dotted if is_package else dotted.rpartition(".")[0]
                    found = read_file(tree, shown, dotted, inside)
                    break
            if found is not None:
                break
        self.files[dotted] = found
        return found

    def shown(self, path: Path) -> str:
        """``path`` relative to the model file's folder when inside it, else absolute."""
        absolute = Path(path).absolute()
        try:
            return str(absolute.relative_to(self.folder.absolute()))
        except ValueError:
            return str(absolute)

    def resolve(self, key: str, hops: int = 0) -> SourceClass | _Unknown | None:
        """The class a dotted ``key`` names (``pkg.mod.Cls``); ``None`` for an order's end."""
        if key in TERMINAL_BASES:
            return None
        if hops > MAX_HOPS or "." not in key:
            return _Unknown(f"{key} is not a class syncpass can find the source of")
        module_name, _, name = key.rpartition(".")
        file = self.find(module_name)
        if file is None:
            return _Unknown(f"no source of module {module_name} under {self.folder} or sys.path")
        for statement in file.module.body:
            if isinstance(statement, cst.ClassDef) and statement.name.value == name:
                return SourceClass(name, statement, file, own=False)
        binding = file.bindings.get(name)
        if binding is None or not binding.key or binding.key == key:
            return _Unknown(f"{file.path} defines no class {name} syncpass can read")
        return self.resolve(binding.key, hops + 1)

    def base(
        self, expression: cst.BaseExpression, cls: SourceClass
    ) -> SourceClass | _Unknown | None:
        """The class a base expression of ``cls``'s statement names."""
        dotted = _dotted(expression)
        if not dotted:
            code = cls.file.module.code_for_node(expression)
            return _Unknown(f"{code} is not a plain class name")
        head, _, rest = dotted.partition(".")
        if not rest:
            for statement in cls.file.module.body:
                if isinstance(statement, cst.ClassDef) and statement.name.value == head:
                    return SourceClass(head, statement, cls.file, own=cls.own)
        if dotted in ("object", "builtins.object"):
            return None
        binding = cls.file.bindings.get(head)
        if binding is None or not binding.key:
            return _Unknown(f"{cls.file.path} does not import {head} plainly")
        return self.resolve(f"{binding.key}.{rest}" if rest else binding.key)


def _key(cls: SourceClass) -> tuple[str, str]:
    return (cls.file.path, cls.name)


def read_ancestry(
    module: cst.Module, class_name: str, path: str, roots: Sequence[Path]
) -> Ancestry:
    """The model class ``class_name`` of ``module`` (the file at ``path``) and its bases in
    Python's order, read from source under the file's folder and ``roots``
    (:mod:`this module <syncpass.frontend.bases>`). Raises :class:`SyncpassError` when
    several bases meet a class whose source is not found."""
    model_path = Path(path)
    reader = _Reader(model_path, roots)
    user = read_file(module, model_path.name, model_path.stem, "")
    classdef = next(
        (s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == class_name),
        None,
    )
    if classdef is None:
        raise SyncpassError(f"no top-level class named {class_name!r}", path)
    model = SourceClass(class_name, classdef, user, own=True)
    parents: dict[tuple[str, str], list[SourceClass]] = {}
    unknown: dict[tuple[str, str], str] = {}
    by_key: dict[tuple[str, str], SourceClass] = {}
    pending = [model]
    while pending:
        cls = pending.pop()
        if _key(cls) in by_key:
            continue
        by_key[_key(cls)] = cls
        found: list[SourceClass] = []
        for arg in cls.classdef.bases:
            if arg.keyword is not None or arg.star:
                continue  # metaclass=..., **kwargs: not a base
            base = reader.base(arg.value, cls)
            if isinstance(base, _Unknown):
                unknown[_key(cls)] = f"{cls.name}'s base at {cls.where}: {base.reason}"
                if len(cls.classdef.bases) > 1:
                    break
            elif base is not None:
                found.append(base)
        parents[_key(cls)] = found
        pending.extend(found)
    several = any(len(by_key[key].classdef.bases) > 1 for key in by_key)
    if several and unknown:
        first = next(iter(unknown.values()))
        raise SyncpassError(
            f"{class_name} inherits from several classes, and the order Python runs their "
            f"methods in cannot be read from source: {first}; define forward in {class_name}",
            model.where,
        )
    if not several:
        chain = [model]
        while parents[_key(chain[-1])]:
            chain.append(parents[_key(chain[-1])][0])
        return Ancestry(tuple(chain), unknown.get(_key(chain[-1]), ""))
    order = _c3(model, parents)
    if order is None:
        raise SyncpassError(
            f"{class_name}'s bases have no consistent method resolution order", model.where
        )
    return Ancestry(tuple(order))


def _c3(
    cls: SourceClass, parents: dict[tuple[str, str], list[SourceClass]]
) -> list[SourceClass] | None:
    """Python's method resolution order (C3) of ``cls``, ``nn.Module`` and ``object`` left
    out; ``None`` when there is none."""
    bases = parents[_key(cls)]
    sequences: list[list[SourceClass]] = []
    for base in bases:
        order = _c3(base, parents)
        if order is None:
            return None
        sequences.append(order)
    sequences.append(list(bases))
    result = [cls]
    while any(sequences):
        for sequence in sequences:
            if not sequence:
                continue
            head = sequence[0]
            if not any(_key(head) in {_key(c) for c in s[1:]} for s in sequences):
                break
        else:
            return None
        result.append(head)
        sequences = [s[1:] if s and _key(s[0]) == _key(head) else s for s in sequences]
    return result

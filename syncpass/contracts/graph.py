"""The op graph of a model's forward: the contract between analysis, profiling and rewriting.

An **op** is one unit of planning granularity in the forward method:

* one simple statement (``x = self.stem(x)``, ``h = torch.cat([a, b], 1)``);
* one iteration of a loop over a layer container (``for block in self.blocks``),
  the whole loop body counting as one op per iteration;
* one compound statement the analysis cannot see into (``if``, ``while``,
  ``with``, a loop over anything else): a **region** no sync point may enter.

A sync point can follow an op only where a statement can be inserted: after a
top-level statement of ``forward``, or between two iterations of a container
loop (the rewrite then splits the loop over slices of the container).

Op ids are stable: they come from the source (the submodule a statement
calls, else its outermost function, plus ``@L<line>`` where needed), never
from object identity, so plans serialise and compare across runs.

This module imports neither libcst nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Pseudo op ids in def-use edges: the forward's arguments, and what it returns.
INPUT = "<input>"
OUTPUT = "<output>"


@dataclass(frozen=True)
class SourceLocation:
    """A place in the user's source (1-based line, 0-based column, as libcst counts)."""

    path: str
    line: int
    column: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class LoopIteration:
    """The op is iteration ``index`` of the loop over ``self.<container>``."""

    container: str  # attribute path inside the model, e.g. "blocks" or "encoder.layers"
    index: int  # absolute index into the container
    # Containers zipped with it, whose item ``index`` the iteration runs too
    # (``for layer, norm in zip(self.layers, self.norms)``: ``("norms",)``).
    zipped: tuple[str, ...] = ()
    # For a child of a nested ``nn.Sequential`` (``blocks.1.0`` of ``x = self.blocks(x)``,
    # ``container`` ``"blocks.1"``): the indices that lead from the statement's container
    # down to ``container`` (``(1,)``). Empty for an item of the statement's own container.
    outer: tuple[int, ...] = ()

    @property
    def path(self) -> tuple[int, ...]:
        """Where the item is below the statement's container: ``(1, 0)`` for ``blocks.1.0``."""
        return (*self.outer, self.index)

    @property
    def top(self) -> str:
        """The statement's container: ``"blocks"`` for ``blocks.1.0``."""
        parts = self.container.split(".")
        return ".".join(parts[: len(parts) - len(self.outer)])

    def groups(self) -> tuple[str, ...]:
        """The nested groups the item lies in, outermost first: ``("blocks.1",)`` for
        ``blocks.1.0``, ``("blocks.1", "blocks.1.0")`` for ``blocks.1.0.2``."""
        top = self.top
        return tuple(
            ".".join([top, *(str(index) for index in self.outer[: depth + 1])])
            for depth in range(len(self.outer))
        )


@dataclass(frozen=True)
class Op:
    """One op of the forward, in execution order."""

    id: str
    calls: tuple[str, ...]  # what it runs: "self.stem", "torch.cat", "operator.add", ...
    reads: tuple[str, ...]  # local names it uses
    writes: tuple[str, ...]  # local names it defines
    location: SourceLocation
    statement: int  # index of the top-level forward statement it belongs to
    loop: LoopIteration | None = None
    region: str | None = None  # why no sync point may go inside it, when it is a region
    # It computes nothing: what it writes holds what it reads (``skip = x``, a tuple packed
    # or unpacked, a lambda or a nested def that captures them). A traced graph has no
    # node for it, so a value it names is still the value of the op that made it.
    alias: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("an op needs a non-empty id")


@dataclass(frozen=True)
class Replayable:
    """A value sent across a cut that the stage after could compute again instead.

    ``ops`` are the ops whose statements compute it (its own first), run again
    at the start of the stage; ``needs`` what they read that the stage must then
    receive (a size, a tensor sent anyway). Whether it is sent or computed again
    is the plan's choice, by cost (:meth:`syncpass.contracts.costs.Costs.crossing`).
    """

    name: str
    ops: tuple[str, ...]
    needs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cut:
    """An admissible sync point after op ``after``; ``live`` crosses it.

    ``sent`` is what the backend's stages send across it when that is less than
    ``live`` (the rest each later stage declares or computes again itself);
    ``None``: all of ``live``. The profile measures the bytes and kinds of
    ``sent``. ``replayable`` are values of ``sent`` the stage after could
    compute again instead of receiving them (:class:`Replayable`).
    """

    after: str
    live: tuple[str, ...]
    pinned: bool = False  # the user wrote "# syncpass: sync" there
    sent: tuple[str, ...] | None = None
    replayable: tuple[Replayable, ...] = ()

    @property
    def crossing(self) -> tuple[str, ...]:
        """What is sent across the cut."""
        return self.live if self.sent is None else self.sent


@dataclass(frozen=True)
class Region:
    """Source that no sync point may enter, and why."""

    location: SourceLocation
    end_line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.location.path}:{self.location.line}-{self.end_line}: {self.reason}"


@dataclass(frozen=True)
class OpGraph:
    """Ops of one model's forward with their def-use edges and admissible cuts."""

    path: str
    model_class: str
    forward: SourceLocation
    inputs: tuple[str, ...]  # forward's parameters, without self
    ops: tuple[Op, ...]
    edges: tuple[tuple[str, str], ...]  # (producer, consumer): op ids, INPUT or OUTPUT
    cuts: tuple[Cut, ...]
    regions: tuple[Region, ...] = ()
    forbidden: tuple[str, ...] = ()  # op ids the user marked "# syncpass: no-sync"
    written: tuple[str, ...] = ()  # op ids a hand-written pipe_split() already follows
    # The length of each layer container a loop was planned over: what op ids cannot
    # say when a loop runs over part of it (self.layers[:-1]).
    containers: tuple[tuple[str, int], ...] = ()
    # Calls the analysis planned inside (a method of the model, a submodule's forward).
    inlined: tuple[str, ...] = ()
    # `if` statements planned as the branch they take, each described with its file:line.
    branches: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ids = [op.id for op in self.ops]
        if len(set(ids)) != len(ids):
            duplicate = next(op_id for op_id in ids if ids.count(op_id) > 1)
            raise ValueError(f"op id {duplicate!r} appears twice in the graph")
        known = set(ids)
        for cut in self.cuts:
            if cut.after not in known:
                raise ValueError(f"cut after unknown op {cut.after!r}")

    def nested_groups(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each nested ``nn.Sequential`` child planned per child (``blocks.1`` of ``x =
        self.blocks(x)``) with its ops in order, outermost groups first where they start
        together: what the planner may plan as one op again (:class:`LoopIteration.outer`)."""
        found: dict[str, list[str]] = {}
        for op in self.ops:
            if op.loop is not None:
                for group in op.loop.groups():
                    found.setdefault(group, []).append(op.id)
        return tuple((group, tuple(ops)) for group, ops in found.items())

    def op(self, op_id: str) -> Op:
        for op in self.ops:
            if op.id == op_id:
                return op
        raise KeyError(op_id)

"""Write activation checkpointing into a model's statements, whatever wraps the calls.

``rewrite --recompute`` recomputes some ops in the backward. Each such op is a call in the
model's code; a backend says how its framework wraps one (:class:`CheckpointForm`:
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`` for torch's eager
stages, ``nn.remat(lambda block, x: block(x))(block, x)`` or ``jax.checkpoint(f)(p, x)`` for
JAX), and this module finds the calls and writes the lines, one comment each that says
why (``# syncpass recompute: ...``: what it frees, what it costs). A loop over a layer
container of which only some blocks recompute is split into sub-slices, each either
checkpointed or not, with the machinery that splits loops at sync points
(:func:`~syncpass.transformers.common.slice_loop`)::

    for block in self.blocks[1:3]:
        # syncpass recompute: blocks.1, blocks.2; frees 1.89 MiB, costs 7.93 ms/step
        x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    for block in self.blocks[3:5]:
        x = block(x)

Sub-slices, not a condition per iteration (``if i in (1, 2): ...``): each line then says
what it runs, and the reader sees which blocks recompute from the slices alone.

Transformers carry out a plan; they never decide: a planned op that is not a call this
module can wrap is refused (:class:`CheckpointRefused`, its message says why), and
nothing changes. Nothing here imports torch or jax.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncpass.core.units import num_bytes, seconds
from syncpass.frontend.analysis import match_container_loop, match_scan_call, target_names
from syncpass.transformers.common import (
    LINE_WIDTH,
    CheckpointSite,
    scan_call_of,
    slice_loop,
)

#: Every checkpointed line syncpass writes carries a comment with this prefix.
RECOMPUTE_COMMENT_PREFIX = "# syncpass recompute"


#: The widest list of op names a comment spells out; a longer one says first .. last (count).
NAMES_WIDTH = 48


class CheckpointRefused(Exception):
    """A planned op the code cannot checkpoint; the message says why."""


#: ``(statement, sites by iteration, container sizes, module, column)`` -> the statement
#: split into pieces, the recomputing ones checkpointed (``None``: not such a statement).
SplitOther = Callable[
    [cst.BaseStatement, Mapping[int | None, CheckpointSite], Mapping[str, int], cst.Module, int],
    list[cst.BaseStatement] | None,
]


@dataclass(frozen=True)
class CheckpointForm:
    """How a backend checkpoints a call: ``wrap(call, exploded, rebound)`` is the call
    recomputing in the backward (``exploded``: one argument a line, for a call too wide for
    one; ``rebound``: the names the loop the call is in binds on each iteration, which a
    function made there must take as arguments rather than close over), and
    ``wraps_statement(func)`` whether a statement's call of ``func`` is the op's (a
    submodule's call, ``self.mlp(x)``), which ``statement_call`` says in words. ``who``
    begins the refusals (``"the stages checkpoint"``: what follows says what)."""

    who: str
    wrap: Callable[[cst.Call, bool, frozenset[str]], cst.Call]
    wraps_statement: Callable[[cst.BaseExpression], bool]
    statement_call: str = "one submodule (self.name(...))"
    #: A statement of the backend's own that runs several layers (JAX's scan over stacked
    #: weights), split into pieces that recompute or not; ``None`` for any other statement.
    split_other: SplitOther | None = None


def recompute_comment(sites: Sequence[CheckpointSite]) -> str:
    """``# syncpass recompute: blocks.1, blocks.2; frees 1.89 MiB, costs 7.93 ms/step``: the
    ops one checkpointed line recomputes (keeping only their inputs), what that frees on
    their stage (for every micro-batch in flight) and what it costs a step."""
    names = [site.op for site in sites]
    named = ", ".join(names)
    if len(names) > 3 or (len(names) > 1 and len(named) > NAMES_WIDTH):
        named = f"{names[0]} .. {names[-1]} ({len(names)})"
    frees = sum(site.frees_bytes for site in sites)
    cost = sum(site.cost_s for site in sites)
    return (
        f"{RECOMPUTE_COMMENT_PREFIX}: {named}; frees {num_bytes(frees)}, costs {seconds(cost)}/step"
    )


def is_recompute_comment(text: str) -> bool:
    """Whether a comment is one syncpass wrote on a checkpointed line."""
    return text.startswith(RECOMPUTE_COMMENT_PREFIX)


def is_self_path(func: cst.BaseExpression) -> bool:
    """``self.mlp``, ``self.blocks[0]``: a submodule of the model's own."""
    while isinstance(func, cst.Attribute | cst.Subscript):
        func = func.value
    return m.matches(func, m.Name("self"))


def checkpoint_piece(
    piece: Sequence[cst.BaseStatement],
    statements: Sequence[cst.BaseStatement],
    sites: Sequence[CheckpointSite],
    sizes: Mapping[str, int],
    module: cst.Module,
    column: int,
    form: CheckpointForm,
) -> list[cst.BaseStatement]:
    """Statements ``piece`` with the ops of ``sites`` checkpointed in ``form``.

    ``statements`` are the function's top-level statements the sites index (``piece`` is
    some of them, loops among them perhaps sliced at sync points); ``sizes`` the layer
    containers' lengths; ``column`` where the piece's statements start (for the line
    width). Raises :class:`CheckpointRefused` for a site it cannot write."""
    by_statement: dict[int, dict[int | None, CheckpointSite]] = {}
    for site in sites:
        by_statement.setdefault(site.statement, {})[site.iteration] = site
    written: set[int] = set()
    out: list[cst.BaseStatement] = []
    for statement in piece:
        index = _origin(statement, statements, by_statement)
        if index is None:
            out.append(statement)
            continue
        here = by_statement[index]
        if None in here:
            out.append(_wrapped_statement(statement, here[None], module, column, form))
            written.add(index)
            continue
        split = None
        if form.split_other is not None:
            split = form.split_other(statement, here, sizes, module, column)
        if split is None:
            split = _split_loop(statement, here, sizes, module, column, form)
        out.extend(split)
        written.add(index)
    missing = [site.op for site in sites if site.statement not in written]
    if missing:
        raise CheckpointRefused(f"no statement written runs {', '.join(missing)}")
    return out


def _origin(
    statement: cst.BaseStatement,
    statements: Sequence[cst.BaseStatement],
    wanted: Mapping[int, object],
) -> int | None:
    """Which of the function's statements (among ``wanted``) ``statement`` is, or is a slice
    of (a loop or a scan the sync points split runs over a slice of the same container)."""
    for index in wanted:
        original = statements[index]
        if statement is original or statement.deep_equals(original):
            return index
        scan, whole = match_scan_call(statement), match_scan_call(original)
        if (
            scan is not None
            and whole is not None
            and (scan.root, scan.container) == (whole.root, whole.container)
            and scan_call_of(statement)
            .args[0]
            .value.deep_equals(scan_call_of(original).args[0].value)
        ):
            return index
        if isinstance(statement, cst.For) and isinstance(original, cst.For):
            one, two = match_container_loop(statement), match_container_loop(original)
            if (
                one is not None
                and two is not None
                and one.expression == two.expression
                and statement.target.deep_equals(original.target)
                and statement.body.deep_equals(original.body)
            ):
                return index
    return None


def checkpoint_runs(
    iterations: Sequence[int],
    sites: Mapping[int | None, CheckpointSite],
    start: int | None,
    stop: int | None,
) -> list[tuple[bool, list[int], int | None, int | None]]:
    """The iterations of a loop or scan over ``[start:stop]`` of a container in runs that
    checkpoint (an iteration in ``sites``) or not: ``(checkpointed, iterations, start,
    stop)``, the first run starting and the last ending where the statement did."""
    runs = [
        (checkpointed, list(group))
        for checkpointed, group in itertools.groupby(iterations, key=lambda i: i in sites)
    ]
    return [
        (
            checkpointed,
            items,
            start if position == 0 else items[0],
            stop if position == len(runs) - 1 else items[-1] + 1,
        )
        for position, (checkpointed, items) in enumerate(runs)
    ]


def _split_loop(
    statement: cst.BaseStatement,
    sites: Mapping[int | None, CheckpointSite],
    sizes: Mapping[str, int],
    module: cst.Module,
    column: int,
    form: CheckpointForm,
) -> list[cst.BaseStatement]:
    """The loop as sub-slices, each checkpointing its calls of the layer or not."""
    loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
    first = next(iter(sites.values()))
    if loop is None or not isinstance(statement, cst.For):
        raise CheckpointRefused(
            f"{first.op} is an item of a layer container the statement does not loop over "
            f"(a call of a sequential container): {form.who} the items of loops only"
        )
    if not loop.item:
        raise CheckpointRefused(
            f"{first.op}: the loop unpacks each layer ({', '.join(loop.parts)}); {form.who} "
            "a loop whose item is one module"
        )
    size = sizes.get(loop.container)
    if size is None:
        raise CheckpointRefused(f"{first.op}: the length of {loop.container} is not known")
    iterations = range(size)[loop.start : loop.stop]
    runs = checkpoint_runs(iterations, sites, loop.start, loop.stop)
    out: list[cst.BaseStatement] = []
    piece_start = iterations[0] if iterations else 0
    for position, (checkpointed, items, start, stop) in enumerate(runs):
        # Later sub-slices count an enumerated index on from where the piece starts.
        sliced_as = loop if position == 0 else dataclasses.replace(loop, start=piece_start)
        piece = statement if len(runs) == 1 else slice_loop(statement, sliced_as, start, stop)
        if position:
            piece = piece.with_changes(leading_lines=())
        if checkpointed:
            assert isinstance(piece.body, cst.IndentedBlock)
            inner = column + len(piece.body.indent or module.default_indent)
            rebound = loop_bound_names(piece)
            body = _wrapped_body(
                piece.body.body, loop.item, [sites[i] for i in items], module, inner, form, rebound
            )
            piece = piece.with_changes(body=piece.body.with_changes(body=body))
        out.append(piece)
    return out


def _wrapped_body(
    body: Sequence[cst.BaseStatement],
    item: str,
    sites: Sequence[CheckpointSite],
    module: cst.Module,
    column: int,
    form: CheckpointForm,
    rebound: frozenset[str],
) -> list[cst.BaseStatement]:
    """A loop's body with its one call of the layer ``item`` checkpointed (``rebound``: the
    names the loop binds)."""
    out: list[cst.BaseStatement] = []
    found = 0
    for statement in body:
        changed, count = _wrap(
            statement, lambda func: m.matches(func, m.Name(item)), module, column, form, rebound
        )
        found += count
        out.append(
            commented(changed, recompute_comment(sites), module, column) if count else changed
        )
    if found != 1:
        raise CheckpointRefused(
            f"{sites[0].op}: the loop's body calls its layer {item} {found} times; {form.who} "
            "a body that calls it once"
        )
    return out


def _wrapped_statement(
    statement: cst.BaseStatement,
    site: CheckpointSite,
    module: cst.Module,
    column: int,
    form: CheckpointForm,
) -> cst.BaseStatement:
    """A statement with its one call of a submodule (``self.mlp(x)``) checkpointed."""
    changed, count = _wrap(statement, form.wraps_statement, module, column, form, frozenset())
    if not isinstance(changed, cst.SimpleStatementLine) or count != 1:
        raise CheckpointRefused(
            f"{site.op}: {form.who} a statement that calls "
            f"{form.statement_call}, and this one calls {count}"
        )
    return commented(changed, recompute_comment([site]), module, column)


def _wrap(
    statement: cst.BaseStatement,
    matches: Callable[[cst.BaseExpression], bool],
    module: cst.Module,
    column: int,
    form: CheckpointForm,
    rebound: frozenset[str],
) -> tuple[cst.BaseStatement, int]:
    """``statement`` with its calls that ``matches`` checkpointed, on one line where that
    fits in :data:`LINE_WIDTH` columns from ``column``, and how many there were."""
    wrapper = _WrapCalls(matches, form, rebound)
    changed = statement.visit(wrapper)
    assert isinstance(changed, cst.BaseStatement)
    if not wrapper.count or not isinstance(changed, cst.SimpleStatementLine):
        return changed, wrapper.count
    code = module.code_for_node(changed.with_changes(leading_lines=())).rstrip("\n")
    if "\n" in code or column + len(code) <= LINE_WIDTH:
        return changed, wrapper.count
    wrapper = _WrapCalls(matches, form, rebound, exploded=True)
    changed = statement.visit(wrapper)
    assert isinstance(changed, cst.BaseStatement)
    return changed, wrapper.count


class _WrapCalls(cst.CSTTransformer):
    """Each call whose function ``matches`` wrapped by ``form``; ``count`` says how many."""

    def __init__(
        self,
        matches: Callable[[cst.BaseExpression], bool],
        form: CheckpointForm,
        rebound: frozenset[str],
        exploded: bool = False,
    ) -> None:
        super().__init__()
        self.matches = matches
        self.form = form
        self.rebound = rebound
        self.exploded = exploded
        self.count = 0

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.matches(original_node.func):
            return updated_node
        self.count += 1
        return self.form.wrap(updated_node, self.exploded, self.rebound)


def loop_bound_names(loop: cst.For) -> frozenset[str]:
    """The names ``loop`` binds on each iteration: its target's and its body's."""
    targets: list[cst.CSTNode] = [loop.target]
    for store in m.findall(loop.body, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For()):
        assert isinstance(store, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For)
        targets.append(store.target)
    return frozenset(name.value for target in targets for name in target_names(target)[0])


def commented(
    statement: cst.BaseStatement, comment: str, module: cst.Module, column: int
) -> cst.BaseStatement:
    """``statement  # comment``, or the comment on its own line above where the line would
    be wider than :data:`LINE_WIDTH` (or the statement spans lines)."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return statement
    code = module.code_for_node(statement.with_changes(leading_lines=())).rstrip("\n")
    if (
        statement.trailing_whitespace.comment is None
        and "\n" not in code
        and column + len(code) + 2 + len(comment) <= LINE_WIDTH
    ):
        return statement.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment)
            )
        )
    above = cst.EmptyLine(indent=True, comment=cst.Comment(comment))
    return statement.with_changes(leading_lines=(*statement.leading_lines, above))

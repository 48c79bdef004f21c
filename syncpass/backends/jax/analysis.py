"""Build the op graph of a JAX model from its source: a function of parameters, or a Flax module.

Two forms of model are read, both statically (nothing runs):

* a **JAX function** at the top level of the file, ``def forward(params, x)``,
  whose first parameter holds the weights (any pytree) and whose other
  parameters are the inputs. Each statement of its body is one op. An op is
  named after the first weight it reads with a constant key
  (``h = jax.nn.gelu(x @ params["w1"] + params["b1"])`` is op ``w1``), else
  after its outermost call, as for torch (``jax.numpy.tanh@L42``). The weights
  are no value of the data flow: each stage holds its own, so they never
  cross a sync point.
* a **Flax module** (``flax.linen``) whose ``__call__`` computes the model,
  with its submodules built in ``setup``. It is read exactly as a torch
  ``forward``: ``x = self.embed(x)`` is op ``embed``, and a loop over a list of
  submodules (``for block in self.blocks``) is planned per iteration. A
  ``@nn.compact`` ``__call__`` is read too; its inline submodules
  (``nn.Dense(64)(x)``) are named by their call (``flax.linen.Dense@L30``).

The op graph is :class:`syncpass.contracts.graph.OpGraph`, with the same ids, edges and
cuts as for torch, so cost files, plan files, strategies and the optimiser
work unchanged. A hand-written ``x = jax.device_put(x, device)`` statement in
the body (a device given: a second argument or ``device=``) is a sync point the
user placed (pinned), as ``pipe_split()`` is for torch.

Only arrays cross a sync point. A value the trace keeps as a Python value (a
size such as ``b, t, d = x.shape``, a ``train: bool`` argument, a submodule
built inline, a function; see :mod:`syncpass.frontend.numbers`) is left out
of the cuts' live values: moved with ``jax.device_put`` it would become an
array and break the trace. A cut across which no array is live is no sync
point (its transfer would have nothing to move), unless the user pinned it.

The example convention of the JAX commands (``syncpass profile/rewrite/run
--backend jax``): ``--example`` names a zero-argument function returning
``(model, params, args)`` or ``(model, params, args, target, loss_fn)``, where
``model`` is the JAX function (called ``model(params, *args)``) or a Flax module
instance (called ``model.apply(params, *args)``), ``params`` its weights (for
Flax, the variables of ``model.init``), ``args`` a tuple of inputs for one batch
whose first dimension is the batch, and ``loss_fn(output, target)`` a scalar.
Without a loss, the loss is the mean of the squared outputs.

This module imports libcst, never jax.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from syncpass.contracts.graph import OpGraph
from syncpass.core.errors import NoModelError, SyncpassError
from syncpass.frontend.analysis import (
    ContainerSizes,
    FunctionSite,
    StatementFacts,
    StatementLabel,
    _line,
    _lines_before,
    analyse_method,
    build_op_graph,
    find_forward,
    match_container_loop,
    match_scan_call,
    method_of,
)
from syncpass.frontend.inline import Frame, Inlined, SourceLines, inline_own_methods
from syncpass.frontend.match import pick_model, sizes_from_ids
from syncpass.frontend.numbers import (
    JAX_RULES,
    GatherBindingsVisitor,
    host_values,
    module_numbers,
    parameters,
)
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.checkpoints import RECOMPUTE_COMMENT_PREFIX
from syncpass.transformers.common import SYNC_COMMENT_PREFIX, CheckpointSite, SyncSite
from syncpass.transformers.jax_checkpoints import remove_remat
from syncpass.transformers.jax_transfer import names_a_device, remove_device_puts

#: The method of a Flax module that computes the model.
FLAX_METHOD = "__call__"
#: The method of a Flax module that builds its submodules.
FLAX_SETUP = "setup"
#: The function a JAX model file is looked up by when no name is given.
DEFAULT_FUNCTION = "forward"
DEVICE_PUT = "jax.device_put"


def _functions(module: cst.Module) -> dict[str, cst.FunctionDef]:
    return {
        statement.name.value: statement
        for statement in module.body
        if isinstance(statement, cst.FunctionDef)
    }


def flax_class_names(module: cst.Module) -> list[str]:
    """Top-level classes that define ``__call__``, in file order."""
    return [
        statement.name.value
        for statement in module.body
        if isinstance(statement, cst.ClassDef)
        and any(
            isinstance(member, cst.FunctionDef) and member.name.value == FLAX_METHOD
            for member in statement.body.body
        )
    ]


def jax_model_names(module: cst.Module) -> list[str]:
    """What ``--model`` may name: a top-level ``forward`` function, then Flax module classes."""
    names = [DEFAULT_FUNCTION] if DEFAULT_FUNCTION in _functions(module) else []
    return names + flax_class_names(module)


def resolve_jax_model(module: cst.Module, name: str | None, path: str) -> tuple[str, bool]:
    """The model's name and whether it is a plain function (else a Flax module class).

    Without ``name``: the top-level function ``forward`` if there is one, else
    the only class with a ``__call__``.
    """
    functions = _functions(module)
    classes = flax_class_names(module)
    if name is None:
        if DEFAULT_FUNCTION in functions:
            return DEFAULT_FUNCTION, True
        if len(classes) == 1:
            return classes[0], False
        if not classes:
            raise NoModelError(
                "no JAX model: no top-level function forward(params, ...) and no class with "
                "a __call__ method",
                path,
            )
        raise SyncpassError(
            f"several Flax module classes ({', '.join(classes)}); choose one with --model NAME",
            path,
        )
    if name in classes:
        return name, False
    if name in functions:
        return name, True
    known = jax_model_names(module)
    hint = f"; models here: {', '.join(known)}" if known else ""
    raise SyncpassError(
        f"no top-level function or Flax module class named {name!r}{hint}",
        path,
    )


def _reduced_function_module(module: cst.Module, function: cst.FunctionDef) -> cst.Module:
    imports = [
        statement
        for statement in module.body
        if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))
    ]
    return module.with_changes(body=[*imports, function])


def _weights_key(params: str) -> StatementLabel:
    """A labeller: the first constant key a statement reads from ``params``."""

    def label(statement: cst.BaseStatement) -> str | None:
        found = m.findall(
            statement,
            m.Subscript(
                value=m.Name(params),
                slice=[m.SubscriptElement(slice=m.Index(value=m.SimpleString()))],
            ),
        )
        for node in found:
            assert isinstance(node, cst.Subscript)
            index = node.slice[0].slice
            assert isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)
            key = index.value.evaluated_value
            if isinstance(key, str) and key:
                return key
        return None

    return label


def is_device_put_sync(statement: cst.BaseStatement, facts: StatementFacts) -> bool:
    """A statement ``names = jax.device_put(values, device)`` (or a bare call): a hand-written
    sync point. Without a device (``jax.device_put(x)``) it moves nothing between stages."""
    if not m.matches(
        statement,
        m.SimpleStatementLine(body=[m.Assign(value=m.Call()) | m.Expr(value=m.Call())]),
    ):
        return False
    outermost = [call for call in facts.calls if call.depth == 0]
    if len(outermost) != 1 or outermost[0].function != DEVICE_PUT:
        return False
    assert isinstance(statement, cst.SimpleStatementLine)
    small = statement.body[0]
    assert isinstance(small, (cst.Assign, cst.Expr)) and isinstance(small.value, cst.Call)
    return names_a_device(small.value)


def _array_cuts(graph: OpGraph, host: frozenset[str]) -> OpGraph:
    """``graph`` with host values out of the cuts' live values, and without the cuts across
    which no array is live (a pinned one stays)."""
    cuts = []
    for cut in graph.cuts:
        live = tuple(name for name in cut.live if name not in host)
        if live or cut.pinned:
            cuts.append(dataclasses.replace(cut, live=live))
    return dataclasses.replace(graph, cuts=tuple(cuts))


def host_names(module: cst.Module, function: cst.FunctionDef) -> frozenset[str]:
    """The names of ``function`` that hold Python values in a trace, never arrays."""
    return host_values(function, module, module_numbers(module), rules=JAX_RULES).names


@dataclass(frozen=True)
class JaxModel:
    """A JAX model as the analysis read it: the function or Flax module class ``name``, its
    op graph, and for a Flax module whose ``__call__`` was expanded (its submodules'
    ``__call__`` inlined, :mod:`syncpass.frontend.inline`) where each statement of the
    expanded ``__call__`` is in the user's file (``expansion``), and the names each inlined
    function has of its own (``frame_names``, by frame)."""

    name: str
    is_function: bool
    graph: OpGraph
    expansion: Inlined | None = None
    frame_names: tuple[frozenset[str], ...] = ()

    def homes(self, sites: Sequence[SyncSite]) -> list[tuple[Frame, list[SyncSite]]]:
        """``sites`` (statements of the expanded ``__call__``) by the function of the user's
        file they go in, each renumbered to that function's statements, its values those
        of that function (a value of the functions calling it moves with the stages' inputs;
        the pipeline moves every value a later stage reads)."""
        expansion = self.expansion
        if expansion is None:
            whole = Frame(self.name, DEFAULT_FUNCTION if self.is_function else FLAX_METHOD, "", 0)
            return [(whole, list(sites))] if sites else []
        placed: dict[int, list[SyncSite]] = {}
        for site in sites:
            where = (
                expansion.home(site.statement)
                if site.split_after is None
                else _loop_home(expansion, site.statement)
            )
            if where is None and site.written:
                continue  # the user's own transfer is in the file already
            if where is None:
                at = next(
                    (op.location for op in self.graph.ops if op.statement == site.statement),
                    None,
                )
                raise SyncpassError(
                    "a sync point pinned here falls inside a statement of a submodule's "
                    "call (or inside a class whose call is followed twice), where the file has "
                    "no place for it: move the pin to a statement of its own",
                    str(at) if at is not None else self.graph.path,
                )
            frame, index = where
            values = site.values
            if frame:
                values = tuple(value for value in values if value in self.frame_names[frame])
            placed.setdefault(frame, []).append(
                dataclasses.replace(site, statement=index, values=values)
            )
        return [(expansion.frames[frame], placed[frame]) for frame in sorted(placed)]

    def checkpoint_homes(
        self, sites: Sequence[CheckpointSite]
    ) -> list[tuple[Frame, list[CheckpointSite], dict[str, int]]]:
        """``sites`` (ops of the expanded ``__call__`` that recompute) by the function of the
        user's file whose statement runs them, each renumbered to that function's
        statements, with the lengths of that function's layer containers (its own paths:
        ``layers`` in a submodule's ``__call__`` the model reaches at ``encoder``)."""
        sizes = dict(self.graph.containers)
        expansion = self.expansion
        if expansion is None:
            whole = Frame(self.name, DEFAULT_FUNCTION if self.is_function else FLAX_METHOD, "", 0)
            return [(whole, list(sites), sizes)] if sites else []
        placed: dict[int, list[CheckpointSite]] = {}
        for site in sites:
            frame, index = expansion.origins[site.statement].steps[-1]
            if index < 0 or not expansion.single(frame):
                at = next((op.location for op in self.graph.ops if op.id == site.op), None)
                raise SyncpassError(
                    f"the plan recomputes {site.op}, whose call is in a function the model "
                    "calls more than once (or among a call's arguments), where the file has "
                    "no line of its own for it",
                    str(at) if at is not None else self.graph.path,
                )
            placed.setdefault(frame, []).append(dataclasses.replace(site, statement=index))
        homes = []
        for frame in sorted(placed):
            prefix = expansion.frames[frame].path
            own = {
                path.removeprefix(f"{prefix}."): size
                for path, size in sizes.items()
                if not prefix or path.startswith(f"{prefix}.")
            }
            homes.append((expansion.frames[frame], placed[frame], own))
        return homes


def _loop_home(expansion: Inlined, statement: int) -> tuple[int, int] | None:
    """The loop statement a split of the expanded statement ``statement`` goes in."""
    frame, index = expansion.origins[statement].steps[-1]
    return (frame, index) if index >= 0 and expansion.single(frame) else None


def analyse_jax_model(
    module: cst.Module,
    path: str,
    name: str | None = None,
    sizes: ContainerSizes | None = None,
    text: str | None = None,
) -> OpGraph:
    """The op graph of the JAX function or Flax module ``name`` (see :func:`analyse_jax`)."""
    return analyse_jax(module, path, name, sizes, text).graph


def analyse_jax(
    module: cst.Module,
    path: str,
    name: str | None = None,
    sizes: ContainerSizes | None = None,
    text: str | None = None,
) -> JaxModel:
    """The JAX function or Flax module ``name`` and its op graph (see the module docstring).

    ``sizes`` gives the length of each list of submodules a Flax ``__call__``
    loops over (``{"blocks": 4}``, ``{"transformer.h.blocks": 12}``). The graph's
    ``model_class`` is the function's or the class's name.
    """
    name, is_function = resolve_jax_model(module, name, path)
    if not is_function:
        return _analyse_flax(module, path, name, sizes, text)
    function = _functions(module)[name]
    parameters = [*function.params.posonly_params, *function.params.params]
    if len(parameters) < 2:
        raise SyncpassError(
            f"{name} must take the weights first and then the inputs: def {name}(params, x)",
            f"{path}:{_line(module, function)}",
        )
    if not isinstance(function.body, cst.IndentedBlock):
        raise SyncpassError(
            f"{name} is written on one line; nothing can be placed inside it",
            f"{path}:{_line(module, function)}",
        )
    weights = parameters[0].name.value
    reduced = _reduced_function_module(module, function)
    site = FunctionSite(
        module=module,
        path=path,
        name=name,
        function=function,
        reduced=reduced,
        offset=_lines_before(module, function) - _lines_before(reduced, function),
        hidden=frozenset({weights}),
        sync_point=is_device_put_sync,
        label=_weights_key(weights),
    )
    graph = _array_cuts(build_op_graph(site, sizes), host_names(module, function))
    return JaxModel(name, True, graph)


def expand_flax(module: cst.Module, name: str) -> Inlined | None:
    """``name.__call__`` with the calls of the submodules that hold its layer stack (and of
    its own methods) inlined, and its decided branches folded; ``None`` if nothing changed."""
    expansion = inline_own_methods(module, name, forward_method=FLAX_METHOD, init_method=FLAX_SETUP)
    return expansion if expansion.origins else None


def _analyse_flax(
    module: cst.Module,
    path: str,
    name: str,
    sizes: ContainerSizes | None,
    text: str | None,
) -> JaxModel:
    expansion = expand_flax(module, name)
    expanded = module if expansion is None else expansion.module
    graph = analyse_method(
        expanded, path, name, sizes, text, method=FLAX_METHOD, sync_point=is_device_put_sync
    )
    call = find_forward(expanded, name, path, FLAX_METHOD).forward
    graph = _array_cuts(graph, host_names(expanded, call))
    if expansion is None:
        return JaxModel(name, False, graph)
    functions = [_frame_function(module, frame) for frame in expansion.frames]
    frame_names = tuple(_own_names(function) for function in functions)
    graph = _placed_cuts(graph, expansion, frame_names)
    graph = _file_lines(graph, expansion, call, functions, SourceLines(module))
    return JaxModel(name, False, graph, expansion, frame_names)


def _frame_function(module: cst.Module, frame: Frame) -> cst.FunctionDef:
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == frame.class_name:
            found = method_of(statement, frame.method)
            if found is not None:
                return found
    raise AssertionError(f"no {frame.class_name}.{frame.method}")


def _own_names(function: cst.FunctionDef) -> frozenset[str]:
    """A function's parameters and the names it binds."""
    bound = GatherBindingsVisitor()
    function.body.visit(bound)
    return frozenset(parameters(function) | {name for name, _ in bound.bindings})


def _placed_cuts(
    graph: OpGraph, expansion: Inlined, frame_names: tuple[frozenset[str], ...]
) -> OpGraph:
    """``graph`` without the cuts that have no place in the user's file: inside a statement
    of an inlined function, or where none of the arrays live is that function's own."""
    position = {op.id: index for index, op in enumerate(graph.ops)}
    last_iteration: dict[int, int] = {}
    for op in graph.ops:
        if op.loop is not None:
            last_iteration[op.statement] = op.loop.index
    cuts = []
    for cut in graph.cuts:
        op = graph.ops[position[cut.after]]
        inside = op.loop is not None and op.loop.index != last_iteration[op.statement]
        where = _loop_home(expansion, op.statement) if inside else expansion.home(op.statement)
        if where is None:
            continue
        frame = where[0]
        if frame and not cut.pinned and not set(cut.live) & frame_names[frame]:
            continue
        cuts.append(cut)
    return dataclasses.replace(graph, cuts=tuple(cuts))


_LINE_ID = re.compile(r"^(.*@L)(\d+)((?::\d+)?)$")


def _file_lines(
    graph: OpGraph,
    expansion: Inlined,
    call: cst.FunctionDef,
    functions: Sequence[cst.FunctionDef],
    line_of: SourceLines,
) -> OpGraph:
    """``graph`` (of the expanded ``__call__``) with the lines of the user's file: in each
    op's location and in op ids that carry a line."""
    assert isinstance(call.body, cst.IndentedBlock)
    expanded_lines = SourceLines(expansion.module)
    starts = [expanded_lines(statement) for statement in call.body.body]

    def file_line(statement: int, line: int) -> int:
        steps = expansion.origins[statement].steps
        frame, index = steps[-1]
        if index < 0 and len(steps) > 1:
            frame, index = steps[-2]
        body = functions[frame].body
        assert isinstance(body, cst.IndentedBlock)
        node = body.body[index]
        planned = call.body.body[statement]
        shift = line - starts[statement] if type(node) is type(planned) else 0
        return line_of(node) + max(0, shift)

    def statement_at(line: int) -> int | None:
        found = [index for index, start in enumerate(starts) if 0 < start <= line]
        return found[-1] if found else None

    renamed: dict[str, str] = {}
    ops = []
    for op in graph.ops:
        line = file_line(op.statement, op.location.line)
        ops.append(dataclasses.replace(op, location=dataclasses.replace(op.location, line=line)))
        found = _LINE_ID.match(op.id)
        if found is not None:
            renamed[op.id] = f"{found.group(1)}{line}{found.group(3)}"
    if len(set(renamed.values())) != len(renamed) or set(renamed.values()) & (
        {op.id for op in graph.ops} - set(renamed)
    ):
        renamed = {}  # two ops would share an id: keep the expanded lines in the ids

    def new_id(op_id: str) -> str:
        return renamed.get(op_id, op_id)

    regions = []
    for region in graph.regions:
        statement = statement_at(region.location.line)
        if statement is None:
            regions.append(region)
            continue
        line = file_line(statement, region.location.line)
        regions.append(
            dataclasses.replace(
                region,
                location=dataclasses.replace(region.location, line=line),
                end_line=line + region.end_line - region.location.line,
            )
        )
    return dataclasses.replace(
        graph,
        ops=tuple(dataclasses.replace(op, id=new_id(op.id)) for op in ops),
        edges=tuple((new_id(a), new_id(b)) for a, b in graph.edges),
        cuts=tuple(dataclasses.replace(cut, after=new_id(cut.after)) for cut in graph.cuts),
        regions=tuple(regions),
        forbidden=tuple(new_id(op_id) for op_id in graph.forbidden),
        written=tuple(new_id(op_id) for op_id in graph.written),
        inlined=expansion.methods,
        branches=tuple(branch.describe(graph.path) for branch in expansion.branches),
    )


def jax_loop_containers(module: cst.Module, name: str | None, path: str) -> tuple[str, ...]:
    """Lists a model loops over, per item: of submodules in a Flax ``__call__`` (``blocks`` for
    ``for block in self.blocks``; ``transformer.h.blocks`` for a loop of a submodule's
    ``__call__`` that the expansion inlines), of weight dicts in a JAX function (``layers``
    for ``for layer in params["layers"]``; ``decoder.layers`` for
    ``params["decoder"]["layers"]``)."""
    name, is_function = resolve_jax_model(module, name, path)
    if is_function:
        function = _functions(module)[name]
        parameters = [*function.params.posonly_params, *function.params.params]
        root = parameters[0].name.value if parameters else None
    else:
        expansion = expand_flax(module, name)
        expanded = module if expansion is None else expansion.module
        function = find_forward(expanded, name, path, FLAX_METHOD).forward
        root = "self"
    if not isinstance(function.body, cst.IndentedBlock):
        return ()
    names = []
    for statement in function.body.body:
        if isinstance(statement, cst.For):
            loop = match_container_loop(statement)
            if loop is not None and loop.root == root:
                names.append(loop.container)
        scan = match_scan_call(statement) if is_function else None
        if scan is not None and scan.root == root:
            names.append(scan.container)
    return tuple(dict.fromkeys(names))


def analyse(text: str, path: str, known: KnownOps, name: str | None) -> ModelSource:
    """The JAX model of ``text`` (a function, or a Flax module's ``__call__``) and its op graph.

    ``name`` is the function or Flax module class (default: the one ``known``
    names when the file has it, else :func:`resolve_jax_model`'s choice).
    """
    module = parse_source(text, path)
    model, _ = resolve_jax_model(
        module, pick_model(jax_model_names(module), known.model, name), path
    )
    base = text
    if SYNC_COMMENT_PREFIX in text or RECOMPUTE_COMMENT_PREFIX in text:
        module = remove_device_puts(remove_remat(module), path)
        base = module.code
    sizes = sizes_from_ids(known.ids, jax_loop_containers(module, model, path))
    found = analyse_jax(module, path, model, sizes, base)
    return ModelSource(text=text, base=base, module=module, graph=found.graph, handle=found)

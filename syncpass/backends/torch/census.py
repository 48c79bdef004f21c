"""Which layer each iteration of a loop runs, read off the example's run.

Most layer loops say in their header what they run (``for layer in self.layers``,
:func:`syncpass.frontend.analysis.match_container_loop`). Some run a tuple the forward
builds first: x-transformers' ``AttentionLayers`` zips five per-layer lists, reordered
by an execution order, and unpacks each item::

    layer_variables = (self.layer_types, self.skip_combines, self.layers, ...)
    ...
    layer_variables = tuple(tuple(v[i] for i in layers_execute_order) for v in layer_variables)
    for ind, (layer_type, skip_combine, (norm, block, residual_fn), ...) in enumerate(
        zip(*layer_variables)
    ):

No reading of the source says which modules iteration ``i`` calls. The example's run
does: the forward runs once (no gradients, the random state put back after), a line at
the top of each such loop's body marking where each iteration starts and a forward
pre-hook on every module of the model naming the modules each calls. A loop is one
layer an iteration when some container ``C`` of the model has as many items as the
loop ran iterations, and every module iteration ``i`` called lies inside ``C[i]``,
at least one each: nothing shared between iterations, nothing outside the
container. The eager form then plans it per layer like a container loop (its header
gets the comment :func:`~syncpass.frontend.analysis.recorded_loop_comment`; the
settings record ``loop:K``), and a stage runs its iterations ``[a:b]``. Any other
loop, or a run that fails, stays one region as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import libcst as cst
import torch

from syncpass.frontend.analysis import find_forward, recordable_loop

#: The name the census lines call in the rewritten forward.
CENSUS = "__syncpass_census__"


class _Census:
    """What the census lines and the module hooks record: the modules each iteration of
    each loop (by statement) called, by path."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.paths = paths
        self.current: set[str] | None = None
        self.iterations: dict[int, list[set[str]]] = {}

    def start(self, statement: int) -> None:
        self.current = set()
        self.iterations.setdefault(statement, []).append(self.current)

    def stop(self) -> None:
        self.current = None

    def called(self, module: torch.nn.Module, args: Any) -> None:
        if self.current is not None:
            path = self.paths.get(id(module))
            if path is not None:
                self.current.add(path)


def candidate_loops(module: cst.Module, class_name: str, path: str) -> tuple[int, ...]:
    """The top-level statements of ``class_name``'s forward that are loops the census may
    read (:func:`~syncpass.frontend.analysis.recordable_loop`)."""
    forward = find_forward(module, class_name, path).forward
    if not isinstance(forward.body, cst.IndentedBlock):
        return ()
    return tuple(
        index
        for index, statement in enumerate(forward.body.body)
        if isinstance(statement, cst.For) and recordable_loop(statement)
    )


def _census_source(module: cst.Module, class_name: str, loops: Sequence[int]) -> str:
    """``module``'s code with the census lines in ``class_name``'s forward: a start at the
    top of each loop's body, a stop after the loop."""
    start = "{census}.start({index})\n"
    parse = cst.parse_statement

    class Marked(cst.CSTTransformer):
        def __init__(self) -> None:
            super().__init__()
            self.depth = 0  # 1 inside the class's own body, not in what it nests

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            self.depth += 1
            return self.depth == 1 and node.name.value == class_name

        def leave_ClassDef(
            self, original_node: cst.ClassDef, updated_node: cst.ClassDef
        ) -> cst.ClassDef:
            self.depth -= 1
            return updated_node

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False  # the forward's statements are read in leave_FunctionDef

        def leave_FunctionDef(
            self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
        ) -> cst.FunctionDef:
            if (
                self.depth != 1
                or updated_node.name.value != "forward"
                or not isinstance(updated_node.body, cst.IndentedBlock)
            ):
                return updated_node
            body: list[cst.BaseStatement] = []
            for index, statement in enumerate(updated_node.body.body):
                if index in loops and isinstance(statement, cst.For):
                    marker = parse(start.format(census=CENSUS, index=index))
                    inner = statement.body
                    assert isinstance(inner, cst.IndentedBlock)
                    statement = statement.with_changes(
                        body=inner.with_changes(body=[marker, *inner.body])
                    )
                    body.extend([statement, parse(f"{CENSUS}.stop()\n")])
                else:
                    body.append(statement)
            return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    return module.visit(Marked()).code


def _container_of(iterations: Sequence[set[str]], model: torch.nn.Module) -> str | None:
    """The container whose item ``i`` holds every module iteration ``i`` called, or
    ``None``."""
    if len(iterations) < 2 or not all(iterations):
        return None
    common: set[str] | None = None
    for position, called in enumerate(iterations):
        for path in called:
            parts = path.split(".")
            here = {
                ".".join(parts[:place])
                for place in range(1, len(parts))
                if parts[place] == str(position)
            }
            common = here if common is None else common & here
    for container in sorted(common or (), key=len):
        try:
            value = model.get_submodule(container)
        except AttributeError:
            continue
        if isinstance(value, torch.nn.ModuleList | torch.nn.Sequential) and len(value) == len(
            iterations
        ):
            return container
    return None


def census_loops(
    module: cst.Module,
    class_name: str,
    model: torch.nn.Module,
    args: Sequence[Any],
    path: str,
) -> dict[int, str]:
    """Each loop of ``class_name``'s forward in ``module`` (the expanded source) that runs
    one layer of a container an iteration: its statement -> the container (see the module
    docstring). Empty when there is none, or the run fails."""
    from syncpass.backends.torch.measure import compiled_forward

    loops = candidate_loops(module, class_name, path)
    if not loops:
        return {}
    paths: dict[int, str] = {}
    for name, submodule in model.named_modules():
        if name:
            paths.setdefault(id(submodule), name)
    census = _Census(paths)
    try:
        forward = compiled_forward(
            _census_source(module, class_name, loops),
            model,
            class_name,
            {CENSUS: census},
            f"<syncpass census: {path}>",
            path,
        )
    except Exception:  # a forward that cannot be compiled so: its loops stay regions
        return {}
    hook = torch.nn.modules.module.register_module_forward_pre_hook(census.called)
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            forward(model, *args)
    except Exception:  # the census is the analysis's help, never its failure
        return {}
    finally:
        hook.remove()
        census.stop()
    found = {}
    for statement, iterations in census.iterations.items():
        container = _container_of(iterations, model)
        if container is not None:
            found[statement] = container
    return found

"""The torch backend's analysis: the op graph of an ``nn.Module``'s ``forward``.

The machinery is the frontend's (:mod:`syncpass.frontend.analysis`: statements,
def-use edges, loops over layer containers); what is torch's is the method
(``forward``), the calls of ``nn.Sequential`` submodules that ``--depth 2`` plans
child by child, and the :func:`analyse` hook, which reads a file as the rewrite
needs it: without the sync points an earlier run wrote, so that a rewritten
file plans exactly like the original.

Nothing here imports torch or runs the user's code.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import PositionProvider

from syncpass.contracts.graph import OpGraph
from syncpass.frontend.analysis import (
    ContainerLoop,
    ContainerSizes,
    analyse_method,
    find_forward,
    match_container_loop,
    match_sequential_call,
    model_class_names,
)
from syncpass.frontend.match import pick_model, sequential_sizes_from_ids, sizes_from_ids
from syncpass.frontend.source import parse_source
from syncpass.rewrite.source import KnownOps, ModelSource
from syncpass.transformers.torch_pipeline import SYNC_COMMENT_PREFIX, remove_pipe_splits


def analyse_model(
    module: cst.Module,
    path: str,
    class_name: str | None = None,
    sizes: ContainerSizes | None = None,
    text: str | None = None,
    expand: ContainerSizes | None = None,
) -> OpGraph:
    """The op graph of ``class_name``'s forward (see :mod:`syncpass.contracts.graph`).

    ``expand`` gives the length of sequential containers whose calls
    (``h = self.layer1(x)``) are planned per child (``--depth 2``).

    ``text``, the module's source when at hand, saves printing the module to
    find the forward's lines.
    """
    return analyse_method(module, path, class_name, sizes, text, expand)


def sequential_calls(module: cst.Module, class_name: str | None, path: str) -> tuple[str, ...]:
    """Containers the forward calls whole (``"layer1"`` for ``h = self.layer1(x)``): the
    candidates for ``--depth 2``, if they are sequential."""
    forward = find_forward(module, class_name, path).forward
    if not isinstance(forward.body, cst.IndentedBlock):
        return ()
    calls = (match_sequential_call(statement) for statement in forward.body.body)
    return tuple(dict.fromkeys(call.container for call in calls if call is not None))


def loop_containers(module: cst.Module, class_name: str | None, path: str) -> tuple[str, ...]:
    """Layer containers the forward loops over (``"blocks"`` for ``for b in self.blocks``)."""
    forward = find_forward(module, class_name, path).forward
    if not isinstance(forward.body, cst.IndentedBlock):
        return ()
    names = []
    for statement in forward.body.body:
        if isinstance(statement, cst.For):
            loop = match_container_loop(statement)
            if loop is not None and loop.root == "self":
                names.append(loop.container)
    return tuple(dict.fromkeys(names))


def checked_loops(
    module: cst.Module, class_name: str | None, path: str
) -> tuple[tuple[ContainerLoop, int], ...]:
    """The forward's layer loops the profile checks on the built model, with their lines: a
    stop bound read when the forward runs, a ``ModuleDict`` view, containers zipped."""
    forward = find_forward(module, class_name, path).forward
    if not isinstance(forward.body, cst.IndentedBlock):
        return ()
    positions = cst.MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    found = []
    for statement in forward.body.body:
        loop = match_container_loop(statement) if isinstance(statement, cst.For) else None
        if loop is not None and (
            loop.runtime_stop is not None or loop.view is not None or loop.zipped_containers
        ):
            found.append((loop, positions[statement].start.line))
    return tuple(found)


def analyse(
    text: str,
    path: str,
    known: KnownOps,
    class_name: str | None,
    parsed: cst.Module | None = None,
) -> ModelSource:
    """The model of ``text`` and its op graph, loops sized by the op ids ``known`` lists.

    Calls of ``nn.Sequential`` submodules count as one op each unless ``known``
    lists their children (a profile made with ``--depth 2``), and so does each child
    unless ``known`` lists its own (``blocks.1.0``: a nested ``nn.Sequential``, which the
    eager form's profile plans per child).

    ``parsed`` is ``text`` parsed already (:func:`parse_source`), where the caller has
    it: parsing a large file again costs as much as the rest of the analysis.
    """
    module = parse_source(text, path) if parsed is None else parsed
    base = text
    if SYNC_COMMENT_PREFIX in text:
        module = remove_pipe_splits(module, None, path, text)
        base = module.code
    name = pick_model(model_class_names(module), known.model, class_name)
    containers = loop_containers(module, name, path)
    sizes = sizes_from_ids(known.ids, containers)
    sizes.update((container, size) for container, size in known.sizes if container in containers)
    expand = sequential_sizes_from_ids(known.ids, sequential_calls(module, name, path))
    graph = analyse_model(module, path, name, sizes, base, expand)
    return ModelSource(text=text, base=base, module=module, graph=graph)

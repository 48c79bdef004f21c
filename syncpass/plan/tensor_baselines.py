"""The placements people write by hand, scored on the same costs as the optimiser's.

* **Megatron-LM** (Shoeybi et al., 2019): in each block the linear that reads the
  block's input is split by columns and the linear that reads what those made (through
  point-wise ops and attention) by rows, one all-reduce after each pair; the embedding
  is split by vocabulary, the head by columns with a vocabulary-parallel loss. This is
  what torchtitan's hand-written ``ColwiseParallel`` / ``RowwiseParallel`` plans do.
* **replicated**: every op whole on every device (no tensor parallelism).

This module imports neither libcst nor torch.
"""

from __future__ import annotations

from functools import cache

from syncpass.contracts.tensor import TensorGraph

#: Whose layouts ``rewrite --strategy tensor --tp-placement`` writes: the optimiser's, or
#: Megatron-LM's hand placement written the same way (to measure one against the other).
PLACEMENTS = ("syncpass", "megatron")

#: Ops that carry a split from a column-split linear to a row-split one.
_THROUGH = frozenset({"elementwise", "reshape", "attention"})


def megatron_layouts(graph: TensorGraph) -> dict[str, str]:
    """Megatron-LM's layout of each op (op id -> layout); ops not named run replicated.

    Read from the graph's structure, not from names: a linear is ``row`` when what it
    reads was made by a linear through point-wise ops, reshapes and attention only;
    ``column`` when what it makes reaches a ``row`` linear that way; the ops between run
    ``split`` (attention by ``heads``). A linear read by a loss is the head: ``column``,
    and the loss ``vocab``-parallel; embeddings are split by ``vocab``.
    """
    ops = {op.id: op for op in graph.ops}
    consumers = graph.consumers

    @cache
    def made_by_linear(name: str) -> bool:
        op = ops[name]
        if op.kind == "linear":
            return True
        return op.kind in _THROUGH and any(made_by_linear(source) for source in op.inputs)

    row = {op.id for op in graph.ops if op.kind == "linear" and made_by_linear(op.inputs[0])}

    @cache
    def reaches_row(name: str) -> bool:
        for reader in consumers[name]:
            if reader in row:
                return True
            if ops[reader].kind in _THROUGH and reaches_row(reader):
                return True
        return False

    chosen: dict[str, str] = {}
    for op in graph.ops:
        if op.kind == "embedding":
            chosen[op.id] = "vocab"
        elif op.kind == "linear" and op.id in row:
            chosen[op.id] = "row"
        elif op.kind == "linear" and reaches_row(op.id):
            chosen[op.id] = "column"
        elif op.kind in _THROUGH and made_by_linear(op.id) and reaches_row(op.id):
            chosen[op.id] = "heads" if op.kind == "attention" else "split"
    for op in graph.ops:
        if op.kind == "loss" and ops[op.inputs[0]].kind == "linear" and op.inputs[0] not in row:
            chosen[op.inputs[0]] = "column"
            chosen[op.id] = "vocab"
    return chosen

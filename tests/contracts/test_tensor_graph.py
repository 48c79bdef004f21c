"""The tensor graph contract: validation, and its place in the cost file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncpass.contracts.costs import Costs, Hardware, OpCost, costs_to_json, parse_costs
from syncpass.contracts.tensor import (
    TensorGraph,
    TensorGraphBuilder,
    TensorOp,
    TransformerShape,
    transformer_graph,
)
from syncpass.core.errors import SyncpassError


def _costs(graph: TensorGraph | None) -> Costs:
    return Costs(
        batch_size=1,
        training=True,
        memory_multiplier=4,
        hardware=Hardware(1e-5, 1e11),
        ops=(OpCost("block", 1e-3),),
        cuts=(),
        tensor=graph,
    )


def test_a_cost_file_carries_its_tensor_graph_through_json() -> None:
    graph = transformer_graph(TransformerShape(layers=1, width=64, heads=4, sequence=8, vocab=96))
    data = json.loads(json.dumps(costs_to_json(_costs(graph))))
    assert parse_costs(data).tensor == graph


def test_a_cost_file_without_one_loads_as_before(example_costs_path: Path) -> None:
    data = json.loads(example_costs_path.read_text())
    assert "tensor" not in data
    costs = parse_costs(data)
    assert costs.tensor is None
    assert "tensor" not in costs_to_json(costs)


def test_errors_name_the_json_path() -> None:
    graph = TensorGraph((TensorOp("x", "input"),), ("x",))
    data = costs_to_json(_costs(graph))
    data["tensor"]["ops"].append({"id": "fc", "kind": "linear", "inputs": ["x"]})
    with pytest.raises(SyncpassError, match=r"\$\.tensor\.ops\[1\]: .*needs in_features"):
        parse_costs(data, "m.costs.json")
    data["tensor"]["ops"][1] = {
        "id": "fc",
        "kind": "linear",
        "inputs": ["y"],
        "in_features": 2,
        "out_features": 2,
    }
    with pytest.raises(SyncpassError, match=r"\$\.tensor: .*reads 'y', which is no earlier op"):
        parse_costs(data, "m.costs.json")
    data["tensor"]["ops"].pop()
    data["tensor"]["batch_size"] = 2
    with pytest.raises(SyncpassError, match=r"\$\.tensor\.batch_size: is 2"):
        parse_costs(data, "m.costs.json")


def test_ops_check_their_shape_and_arity() -> None:
    with pytest.raises(ValueError, match="kind 'matmul' is not one of"):
        TensorOp("m", "matmul")
    with pytest.raises(ValueError, match="a norm op reads 1 input"):
        TensorOp("n", "norm", ("a", "b"))
    with pytest.raises(ValueError, match="32 query heads do not share 6"):
        TensorOp("a", "attention", ("q",), heads=32, kv_heads=6)


def test_the_builder_sizes_follow_the_shapes() -> None:
    builder = TensorGraphBuilder(tokens=10, element_bytes=2, flops_per_s=1e12)
    x = builder.input("x", 8, grad=True)
    fc = builder.linear("fc", x, 16)
    graph = builder.build((fc,))
    op = graph.op("fc")
    assert (op.in_features, op.out_features) == (8, 16)
    assert op.out_bytes == 10 * 16 * 2
    assert op.param_bytes == (8 * 16 + 16) * 2
    assert op.compute_s >= 2 * 10 * 8 * 16 / 1e12
    assert graph.consumers["x"] == ("fc",)

"""The dtensor form's collectives: each ``ColwiseParallel`` layer all-reduces the gradient
of its input itself, so the plan it carries counts one all-reduce per column-split reader
where the eager form sums the readers' gradients first (one)."""

from __future__ import annotations

import copy

import pytest

from syncpass.backends.torch.tensor_rewrite import dtensor_collectives
from syncpass.contracts.hardware import load_profile
from syncpass.contracts.tensor import TransformerShape, transformer_graph
from syncpass.plan.tensor_planner import TensorRequest, link_for, plan_tensor

NVLINK = load_profile("nvlink-8xh100").hardware


@pytest.mark.parametrize("tp", [2, 4])
def test_each_column_split_reader_all_reduces_its_gradient_itself(tp: int) -> None:
    assert NVLINK.flops_per_s is not None
    shape = TransformerShape(layers=2, width=4096, heads=32, sequence=2048, batch_size=1)
    graph = transformer_graph(shape, flops_per_s=NVLINK.flops_per_s)
    request = TensorRequest(tp, sequence_parallel=False, explain=False, baselines=False)
    plan = plan_tensor(graph, link_for(NVLINK), request)
    written = dtensor_collectives(graph, plan)

    layout = {item.op: item.layout for item in plan.layouts}
    extra = 0
    extra_s = 0.0
    for item in plan.collectives:
        if item.direction != "backward" or item.kind != "all-reduce":
            continue
        columns = [
            reader
            for reader in graph.consumers[item.value]
            if graph.op(reader).kind == "linear" and layout[reader] == "column"
        ]
        found = [
            c
            for c in written.collectives
            if c.value == item.value and c.direction == "backward" and c.kind == "all-reduce"
        ]
        assert len(found) == max(1, len(columns))
        if len(columns) > 1:
            assert sorted(r for c in found for r in c.readers) == sorted(columns)
        extra += max(0, len(columns) - 1)
        extra_s += max(0, len(columns) - 1) * item.time_s
    assert extra > 0  # q, k, v read one normalised value in every layer
    assert written.cost.backward_collectives == plan.cost.backward_collectives + extra
    assert written.cost.step_s == pytest.approx(plan.cost.step_s + extra_s)
    assert any("3 ColwiseParallel layers" in note for note in written.notes)
    forward = [c for c in plan.collectives if c.direction == "forward"]
    assert [c for c in written.collectives if c.direction == "forward"] == forward


def test_a_long_runtime_import_is_laid_out_as_a_formatter_lays_it_out() -> None:
    from syncpass.transformers.common import imports_laid_out

    module = "syncpass.backends.torch.tensor_parallel"
    names = ["copy_to_tensor_parallel_region", "reduce_from_tensor_parallel_region", "tp_size"]
    code = f"import torch\nfrom {module} import {', '.join(names)}\nx = 1\n"
    laid = imports_laid_out(code, [module])
    assert laid == (
        f"import torch\nfrom {module} import (\n"
        + "".join(f"    {name},\n" for name in names)
        + ")\nx = 1\n"
    )
    short = f"from {module} import tp_size\n"
    assert imports_laid_out(short, [module]) == short


def test_the_recorder_says_which_sizes_a_view_infers_and_what_an_operand_broadcasts() -> None:
    import torch

    from syncpass.backends.torch.tensor_record import _broadcast, _inferred

    x = torch.zeros(2, 3, 8)
    assert _inferred("view", (x, 2, 3, -1, 2), {}) == (2,)
    assert _inferred("reshape", (x, (2, 3, 4, -1)), {}) == (3,)
    assert _inferred("view", (x, torch.Size([2, 24])), {}) == ()
    assert _inferred("view", (x, torch.float32), {}) == ()  # a dtype view has no sizes
    assert _inferred("transpose", (x, 0, 1), {}) == ()

    heads = torch.zeros(2, 4, 3, 8)  # (batch, heads, sequence, head width)
    table = torch.zeros(3, 8)
    out = heads * table
    made = {id(heads): "q"}
    found = dict(_broadcast(made, (heads, table), {}, out))
    assert found == {"q": (), "": (0, 1)}  # the table is broadcast over batch and heads


def _conv1d(inputs: int, outputs: int) -> object:
    import torch
    from torch import nn

    class Conv1D(nn.Module):
        """``y = x @ W + b`` with ``W`` of ``(in, out)``, reshaped by ``nf``."""

        def __init__(self) -> None:
            super().__init__()
            self.nf = outputs
            self.weight = nn.Parameter(torch.randn(inputs, outputs))
            self.bias = nn.Parameter(torch.randn(outputs))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
            return out.view(*x.shape[:-1], self.nf)

    return Conv1D()


def test_a_weight_stored_in_out_is_sliced_on_its_other_dimension() -> None:
    import torch
    from torch import nn

    from syncpass.backends.torch.tensor_parallel import shard_module, split_parameters

    model = nn.ModuleDict({"up": _conv1d(8, 12), "down": _conv1d(12, 8)})  # type: ignore[dict-item]
    layouts = {"up": "column transposed", "down": "row transposed"}
    assert split_parameters(layouts, model) == {
        "up.weight": ("column", 1, 1),
        "up.bias": ("column", 0, 1),
        "down.weight": ("row", 0, 1),
        "down.bias": ("row", -1, 1),
    }
    x = torch.randn(3, 8)
    whole = model["down"](model["up"](x))
    parts = []
    for rank in range(2):
        local = shard_module(copy.deepcopy(model), layouts, rank, 2)
        assert local["up"].nf == 6  # the forward reshapes with it
        hidden = local["up"](x)
        assert hidden.shape == (3, 6)
        # The row-split layer's own forward, which adds its bias whatever it is: rank 0's
        # is the bias, trained; the other ranks' zeros, not a parameter.
        parts.append(local["down"](hidden))
        trained = {name for name, _ in local["down"].named_parameters()}
        assert trained == ({"weight", "bias"} if rank == 0 else {"weight"})
    torch.testing.assert_close(parts[0] + parts[1], whole)


def test_modules_that_share_a_weight_are_found() -> None:
    from torch import nn

    from syncpass.backends.torch.tensor_rewrite import _tied_modules

    model = nn.ModuleDict(
        {"embed": nn.Embedding(10, 4), "head": nn.Linear(4, 10), "mid": nn.Linear(4, 4)}
    )
    model["head"].weight = model["embed"].weight
    assert _tied_modules(model) == {"embed", "head"}


def test_a_fused_weight_of_unequal_chunks_is_sliced_chunk_by_chunk_and_gathered_back() -> None:
    import torch

    from syncpass.backends.torch.tensor_parallel import _slice, parse_layout

    assert parse_layout("column:32+16+16") == ("column", (32, 16, 16), False)
    assert parse_layout("column:3 transposed") == ("column", 3, True)
    with pytest.raises(ValueError, match="unknown tensor-parallel layout"):
        parse_layout("column:4+0")
    weight = torch.arange(8.0)[:, None].expand(8, 2)  # rows q0..q3, k0, k1, v0, v1
    parts = [_slice(weight, 0, (4, 2, 2), rank, 2)[:, 0].tolist() for rank in range(2)]
    assert parts == [[0.0, 1.0, 4.0, 6.0], [2.0, 3.0, 5.0, 7.0]]


def test_the_recorder_says_which_dimension_a_join_joins_on() -> None:
    import torch

    from syncpass.backends.torch.tensor_record import _joined_dim

    a = torch.zeros(2, 4, 3, 8)
    out = torch.cat((a, a), dim=-1)
    assert _joined_dim("cat", ((a, a),), {"dim": -1}, out) == 3
    assert _joined_dim("cat", ((a, a), 1), {}, torch.cat((a, a), 1)) == 1
    assert _joined_dim("mul", (a, a), {}, a) is None

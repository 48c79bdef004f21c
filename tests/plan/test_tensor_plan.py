"""What the tensor-parallel plan finds on GPT blocks, at typical and at small sizes.

The costs are first-principles estimates (:func:`transformer_graph`: FLOPs at the device's
rate, bytes from the shapes) on the shipped hardware profiles, so the tests say what the
optimiser does with realistic figures; none of them names the answer to the optimiser.
"""

from __future__ import annotations

import re

import pytest

from syncpass.contracts.hardware import load_profile
from syncpass.contracts.tensor import TensorGraph, TransformerShape, transformer_graph
from syncpass.core.errors import SyncpassError
from syncpass.plan.collectives import ALL_REDUCE
from syncpass.plan.tensor_baselines import megatron_layouts
from syncpass.plan.tensor_optimizer import Link
from syncpass.plan.tensor_plan import TensorPlan, tensor_plan_to_json
from syncpass.plan.tensor_planner import TensorRequest, link_for, plan_tensor
from syncpass.plan.tensor_report import render_tensor_plan

NVLINK = load_profile("nvlink-8xh100").hardware
PCIE = load_profile("pcie4-gpus").hardware
GPT = TransformerShape(layers=2, width=4096, heads=32, sequence=2048, batch_size=1)


def _gpt(shape: TransformerShape = GPT) -> TensorGraph:
    assert NVLINK.flops_per_s is not None
    return transformer_graph(shape, flops_per_s=NVLINK.flops_per_s)


def _plan(graph: TensorGraph, tp: int, link: Link, **request: bool) -> TensorPlan:
    return plan_tensor(graph, link, TensorRequest(tp, explain=False, **request))


def _between_ops(plan: TensorPlan, direction: str) -> list[tuple[str, str]]:
    return [
        (item.kind, item.value)
        for item in plan.collectives
        if item.direction == direction and item.within is None
    ]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_gpt_block_gets_megatrons_placement(tp: int) -> None:
    plan = _plan(_gpt(), tp, link_for(NVLINK), sequence_parallel=False)
    layout = {item.op: item.layout for item in plan.layouts}
    for layer in range(GPT.layers):
        p = f"h.{layer}"
        assert [layout[f"{p}.attn.{name}"] for name in ("q_proj", "k_proj", "v_proj")] == [
            "column"
        ] * 3
        assert layout[f"{p}.attn.sdpa"] == "heads"
        assert layout[f"{p}.attn.c_proj"] == "row"
        assert layout[f"{p}.mlp.c_fc"] == "column"
        assert layout[f"{p}.mlp.gelu"] == "split"
        assert layout[f"{p}.mlp.c_proj"] == "row"
    # Exactly two forward all-reduces per layer, after the row-split linears; any other
    # forward collective is at the embedding or the head.
    forward = _between_ops(plan, "forward")
    in_layers = [item for item in forward if item[1].startswith("h.")]
    expected = [
        (ALL_REDUCE, f"h.{layer}.{block}.c_proj")
        for layer in range(GPT.layers)
        for block in ("attn", "mlp")
    ]
    assert in_layers == expected
    assert all(value in ("wte", "ln_f", "lm_head", "loss") for _, value in forward[4:])
    # ... and two backward all-reduces per layer, where the column-split linears' inputs'
    # gradients are summed (Megatron's f operator).
    backward = [item for item in _between_ops(plan, "backward") if item[1].startswith("h.")]
    assert backward == [
        (ALL_REDUCE, f"h.{layer}.{norm}")
        for layer in range(GPT.layers)
        for norm in ("ln_1", "ln_2")
    ]
    # The optimiser's layers are Megatron's; it can only do better around them.
    megatron = megatron_layouts(_gpt())
    for op, wanted in megatron.items():
        if op.startswith("h."):
            assert layout[op] == wanted
    costs = {cost.name: cost for cost in plan.baselines}
    assert plan.cost.step_s <= costs["megatron"].step_s * (1 + 1e-12)
    assert plan.cost.step_s < costs["replicated"].step_s


def test_megatrons_hand_placement_is_read_from_the_structure() -> None:
    layouts = megatron_layouts(_gpt())
    assert layouts["wte"] == "vocab"
    assert layouts["h.1.attn.q_proj"] == "column"
    assert layouts["h.1.attn.sdpa"] == "heads"
    assert layouts["h.1.attn.c_proj"] == "row"
    assert layouts["h.1.mlp.c_fc"] == "column"
    assert layouts["h.1.mlp.gelu"] == "split"
    assert layouts["h.1.mlp.c_proj"] == "row"
    assert layouts["lm_head"] == "column"
    assert layouts["loss"] == "vocab"
    assert "h.1.ln_1" not in layouts and "h.1.add_2" not in layouts


def test_sequence_parallelism_where_the_link_pays_for_it() -> None:
    graph = _gpt(TransformerShape(layers=1, width=4096, heads=32, sequence=2048))
    fast = _plan(graph, 4, link_for(NVLINK))
    without = _plan(graph, 4, link_for(NVLINK), sequence_parallel=False)
    assert fast.uses_sequence_parallel
    assert fast.cost.step_s < without.cost.step_s
    layout = {item.op: item.layout for item in fast.layouts}
    assert layout["h.0.ln_1"] == layout["h.0.ln_2"] == layout["h.0.add_2"] == "sequence"
    # Megatron-LM's sequence parallelism: all-gather before the column-split linears,
    # reduce-scatter after the row-split ones; still no all-reduce inside the layer.
    forward = [item for item in _between_ops(fast, "forward") if item[1].startswith("h.")]
    assert forward == [
        ("all-gather", "h.0.ln_1"),
        ("reduce-scatter", "h.0.attn.c_proj"),
        ("all-gather", "h.0.ln_2"),
        ("reduce-scatter", "h.0.mlp.c_proj"),
    ]
    # Over PCIe the extra collectives at the embedding and the head cost more than the
    # norms and sums it would split save: the same request keeps the layer's values whole.
    slow = _plan(graph, 4, link_for(PCIE))
    assert not slow.uses_sequence_parallel
    assert any("not chosen" in note for note in slow.notes)


def test_small_layers_stay_replicated() -> None:
    small = transformer_graph(
        TransformerShape(layers=2, width=64, heads=4, sequence=16, vocab=256),
        flops_per_s=4e14,
    )
    plan = _plan(small, 4, link_for(NVLINK))
    assert all(item.layout == "replicated" for item in plan.layouts)
    assert plan.collectives == ()
    replicated = next(cost for cost in plan.baselines if cost.name == "replicated")
    megatron = next(cost for cost in plan.baselines if cost.name == "megatron")
    assert plan.cost.step_s == pytest.approx(replicated.step_s)
    assert megatron.step_s > replicated.step_s  # splitting would cost more than it saves
    assert "every op runs replicated" in render_tensor_plan(plan)


def test_a_slow_link_splits_only_what_pays() -> None:
    slow = load_profile("ib-100g-h100").hardware
    plan = _plan(_gpt(), 4, link_for(slow))
    split = {item.op for item in plan.layouts if item.layout != "replicated"}
    # Across 100 Gb/s InfiniBand a layer's split does not pay; the 50k-wide head does.
    assert split == {"lm_head", "loss"}
    assert plan.cost.step_s < min(cost.step_s for cost in plan.baselines)


def test_grouped_query_attention_keeps_key_value_heads_whole_where_they_do_not_divide() -> None:
    graph = _gpt(TransformerShape(layers=1, width=4096, heads=32, kv_heads=8, sequence=2048))
    plan = _plan(graph, 16, link_for(NVLINK), sequence_parallel=False)
    layout = {item.op: item.layout for item in plan.layouts}
    assert layout["h.0.attn.sdpa"] == "query-heads"
    assert layout["h.0.attn.q_proj"] == "column"
    assert layout["h.0.attn.k_proj"] == layout["h.0.attn.v_proj"] == "replicated"
    at_eight = _plan(graph, 8, link_for(NVLINK), sequence_parallel=False)
    assert at_eight.layout_of("h.0.attn.sdpa").layout == "heads"


def test_a_tp_that_does_not_divide_the_heads_is_refused() -> None:
    with pytest.raises(SyncpassError, match=r"--tp 3 does not divide the 32 heads of h\.0"):
        _plan(_gpt(), 3, link_for(NVLINK))
    with pytest.raises(SyncpassError, match="--tp must be a whole number"):
        _plan(_gpt(), 0, link_for(NVLINK))


def test_the_report_says_where_what_how_long_and_why() -> None:
    graph = _gpt(TransformerShape(layers=1, width=4096, heads=32, sequence=2048))
    plan = plan_tensor(graph, link_for(NVLINK), TensorRequest(4, sequence_parallel=False))
    text = render_tensor_plan(plan)
    line = next(line for line in text.splitlines() if "all-reduce of h.0.attn.c_proj" in line)
    assert re.search(r"forward all-reduce of h\.0\.attn\.c_proj .*P -> R, 16 MiB, \d", line)
    why = text.splitlines()[text.splitlines().index(line) + 1]
    assert "why: h.0.attn.c_proj makes it partial sum" in why
    assert "row: input features split (best step with it replicated +" in why
    for name in ("syncpass", "megatron", "replicated"):
        assert re.search(rf"^  {name} +\d", text, re.MULTILINE)
    data = tensor_plan_to_json(plan)
    assert data["kind"] == "tensor" and data["tp"] == 4
    collective = next(
        item
        for item in data["collectives"]
        if item["value"] == "h.0.attn.c_proj" and item["direction"] == "forward"
    )
    assert collective["kind"] == "all-reduce"
    assert collective["bytes"] == 2048 * 4096 * 2
    assert collective["time_s"] > 0 and collective["why"]
    assert collective["readers"] == ["h.0.attn.dropout"]

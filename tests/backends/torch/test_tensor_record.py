"""Recording the tensor graph of a built torch model: what the planner sees of it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import torch

from syncpass.backends.torch.tensor_record import record_tensor_graph
from syncpass.contracts.tensor import TensorGraph, parse_tensor_graph, tensor_graph_to_json
from syncpass.plan.tensor_optimizer import Link
from syncpass.plan.tensor_planner import TensorRequest, plan_tensor

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "transformer_lm.py"


def _lm() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transformer_lm_for_record", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record() -> TensorGraph:
    lm = _lm()
    torch.manual_seed(0)
    model = lm.TransformerLM(layers=2)
    idx = torch.randint(0, lm.VOCAB, (2, lm.SEQ))
    targets = torch.randint(0, lm.VOCAB, (2, lm.SEQ))
    return record_tensor_graph(model, (idx,), loss=lm.lm_loss, targets=targets, flops_per_s=1e12)


def test_the_recorded_graph_has_the_models_linear_ops_shapes_and_data_flow() -> None:
    graph = _record()
    op = graph.op
    assert op("wte").kind == "embedding"
    assert (op("wte").in_features, op("wte").out_features) == (256, 64)
    assert (op("blocks.0.attn.qkv").in_features, op("blocks.0.attn.qkv").out_features) == (64, 192)
    assert op("blocks.1.mlp.proj").kind == "linear"
    assert op("blocks.1.mlp.proj").param_bytes == (256 * 64 + 64) * 4
    assert op("blocks.0.ln_1").kind == "norm"
    assert op("blocks.0.mlp.act").kind == "elementwise"
    attention = op("blocks.0.attn.scaled_dot_product_attention")
    assert attention.kind == "attention" and attention.heads == attention.kv_heads == 4
    assert attention.source is not None and attention.source.endswith("transformer_lm.py:44")
    # By tensor identity: the block's residual sum reads the stream and the projection.
    assert op("blocks.0.add").inputs == ("add", "blocks.0.attn.proj")
    assert op("blocks.0.attn.proj").inputs == ("blocks.0.attn.reshape",)
    assert op("blocks.0.mlp.fc").inputs == ("blocks.0.ln_2",)
    # The positions are made inside forward (torch.arange): a constant input of wpe.
    assert op("wpe").inputs == ("wpe:in0",) and op("wpe:in0").kind == "input"
    loss = op("cross_entropy")
    assert loss.kind == "loss" and loss.in_features == 256
    assert graph.outputs == ("cross_entropy",)
    assert graph.batch_size == 2
    assert parse_tensor_graph(json.loads(json.dumps(tensor_graph_to_json(graph))), "$") == graph


def test_the_recorded_model_plans_as_megatron_on_a_fast_link() -> None:
    graph = _record()
    plan = plan_tensor(
        graph, Link(1e-9, 1e15), TensorRequest(4, sequence_parallel=False, explain=False)
    )
    layout = {item.op: item.layout for item in plan.layouts}
    for layer in (0, 1):
        p = f"blocks.{layer}"
        assert layout[f"{p}.attn.qkv"] == "column"
        assert layout[f"{p}.attn.scaled_dot_product_attention"] == "heads"
        assert layout[f"{p}.attn.proj"] == "row"
        assert layout[f"{p}.mlp.fc"] == "column"
        assert layout[f"{p}.mlp.proj"] == "row"
    in_layers = [
        (item.kind, item.value)
        for item in plan.collectives
        if item.direction == "forward" and item.value.startswith("blocks.")
    ]
    assert in_layers == [
        ("all-reduce", f"blocks.{layer}.{block}.proj")
        for layer in (0, 1)
        for block in ("attn", "mlp")
    ]

"""`syncpass plan --strategy tensor --tp N` as a user runs it: report, JSON, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from syncpass.cli import main

REPO = Path(__file__).resolve().parents[2]
TENSOR_COSTS = REPO / "examples" / "costs" / "gpt_tp_4096.costs.json"


def _plan(*flags: str) -> list[str]:
    return ["plan", "--costs", str(TENSOR_COSTS), "--strategy", "tensor", *flags]


def test_the_report_lists_each_collective_and_the_hand_placements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_plan("--tp", "4", "--no-sequence-parallel")) == 0
    out = capsys.readouterr().out
    assert "syncpass tensor plan: gpt-4x4096 (tp 4, batch 1, training" in out
    assert "collectives: 11 forward, 9 backward" in out  # 2 per layer each way, head's
    assert "forward all-reduce of h.3.mlp.c_proj (after h.3.mlp.c_proj): P -> R, 16 MiB" in out
    for placement in ("syncpass", "megatron", "replicated"):
        assert f"\n  {placement} " in out


def test_json_goes_to_stdout_and_to_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tp.plan.json"
    assert main(_plan("--tp", "2", "--no-sequence-parallel", "--json", "-o", str(target))) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads(target.read_text()) == printed
    assert printed["kind"] == "tensor" and printed["tp"] == 2
    assert printed["sequence_parallel"] == {"allowed": False, "used": False}
    assert {cost["name"] for cost in printed["baselines"]} == {"megatron", "replicated"}
    first = printed["collectives"][0]
    assert set(first) >= {"kind", "direction", "value", "bytes", "time_s", "where", "why"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tp", "0"), "--tp must be a whole number of devices >= 1, got 0"),
        (("--tp", "3"), "--tp 3 does not divide the 32 heads of h.0.attn.sdpa"),
        (("--tp", "16"), "--tp 16 needs 16 devices and the hardware has 8"),
        ((), "--strategy tensor needs --tp N"),
        (("--tp", "2", "--threshold", "0.2"), "--threshold is a pipeline setting"),
        (("--tp", "2", "--stages", "auto"), "--strategy tensor --stages S needs a number"),
    ],
)
def test_a_bad_request_is_a_clear_error(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_plan(*flags)) == 2
    assert message in capsys.readouterr().err


def test_tp_without_the_tensor_strategy_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--costs", str(TENSOR_COSTS), "--tp", "2"]) == 2
    assert "add --strategy tensor" in capsys.readouterr().err


def test_a_cost_file_without_a_tensor_graph_says_so(
    example_costs_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["plan", "--costs", str(example_costs_path), "--strategy", "tensor", "--tp", "2"]) == 2
    )
    assert "has no tensor graph ($.tensor)" in capsys.readouterr().err


def test_rewrite_strategy_tensor_needs_the_example_and_writes_nothing_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m.py"
    model.write_text("x = 1\n")
    out = tmp_path / "m_tp.py"
    argv = ["rewrite", str(model), "--costs", str(TENSOR_COSTS), "--strategy", "tensor"]
    assert main([*argv, "--tp", "2", "-o", str(out)]) == 2
    assert "give the model file and --example SPEC" in capsys.readouterr().err
    assert not out.exists()
    assert main(argv) == 2
    assert "--strategy tensor needs --tp N" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"), [("--tp-style", "dtensor"), ("--tp-placement", "megatron")]
)
def test_a_tensor_writing_flag_without_the_tensor_strategy_is_an_error(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = REPO / "examples" / "transformer_lm.py"
    out = tmp_path / "lm.py"
    argv = ["rewrite", str(model), "--costs", str(TENSOR_COSTS), flag, value]
    assert main([*argv, "-o", str(out)]) == 2
    assert f"{flag} writes a tensor-parallel plan: add --strategy tensor" in (
        capsys.readouterr().err
    )
    assert not out.exists()


def test_tp_auto_with_stages_weighs_pipelines_of_tensor_parallel_stages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ("--tp", "auto", "--stages", "2", "--schedule", "gpipe", "--json")
    assert main(_plan(*flags)) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    chosen = document["tensor"]["tp"]
    assert len(document["pipeline"]["stages"]) == 2
    assert "pipelines of 2 stages of tp ranks each" in captured.err
    units = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    rows = {}  # tp -> (replicas, step in seconds, sequences a second)
    for line in captured.err.splitlines():
        parts = line.replace("<- chosen", "").split()
        if len(parts) == 7 and parts[0].isdigit():
            step = float(parts[2]) * units[parts[3]]
            rows[int(parts[0])] = (int(parts[1]), step, float(parts[6]))
    assert set(rows) == {1, 2, 4}  # the degrees that divide 8 devices / 2 stages
    for tp, (replicas, _, _) in rows.items():
        assert replicas == 8 // (2 * tp)
    # Each stage's ops computed as one of its ranks does: the step falls as tp grows.
    assert rows[1][1] > rows[2][1] > rows[4][1]
    assert chosen == max(rows, key=lambda tp: rows[tp][2])
    assert f"--tp auto: tp {chosen} trains the most sequences a second" in captured.err


@pytest.mark.slow  # plans four degrees twice, with their explanations: ~8 s
def test_tp_auto_chooses_the_degree_that_trains_the_most_sequences_a_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from syncpass.contracts.costs import load_costs
    from syncpass.plan.collectives import ALL_REDUCE, collective_s
    from syncpass.plan.tensor_planner import TensorRequest, link_for, plan_tensor, tensor_graph_of

    assert main(_plan("--tp", "auto", "--json")) == 0
    captured = capsys.readouterr()
    chosen = json.loads(captured.out)["tp"]
    assert f"--tp auto: tp {chosen} trains the most sequences a second" in captured.err
    # Each degree planned on its own, its throughput as data-parallel groups of it.
    costs = load_costs(TENSOR_COSTS)
    graph = tensor_graph_of(costs, costs)
    link = link_for(costs.hardware)
    devices = costs.hardware.devices
    assert devices is not None
    rates = {}
    for tp in (1, 2, 4, 8):
        plan = plan_tensor(graph, link, TensorRequest(tp, explain=False))
        weights = sum(layout.param_bytes for layout in plan.layouts)
        reduce_s = collective_s(
            ALL_REDUCE, weights, devices // tp, link.alpha_s, link.beta_bytes_per_s
        )
        rates[tp] = devices // tp * plan.batch_size / (plan.cost.step_s + reduce_s)
    assert chosen == max(rates, key=lambda tp: (rates[tp], -tp))


def test_tp_auto_leaves_out_the_degrees_no_layout_fits() -> None:
    from syncpass.contracts.hardware import load_profile
    from syncpass.contracts.tensor import TransformerShape, transformer_graph
    from syncpass.plan.tensor_planner import TensorRequest, choose_tp, link_for

    pcie = load_profile("pcie4-gpus").hardware  # 8 devices of 24 GB
    assert pcie.flops_per_s is not None and pcie.devices == 8
    shape = TransformerShape(layers=8, width=4096, heads=32, sequence=2048)
    graph = transformer_graph(shape, flops_per_s=pcie.flops_per_s)
    request = TensorRequest(1, explain=False, baselines=False, sequence_parallel=False)
    plan, options = choose_tp(graph, link_for(pcie), 8, request, memory_multiplier=16.0)
    refused = {option.tp for option in options if option.refused}
    assert 1 in refused  # the whole model's weights and optimizer state do not fit
    assert plan.tp not in refused and plan.tp > 1
    best = max((o for o in options if not o.refused), key=lambda o: o.sequences_per_s)
    assert plan.tp == best.tp


def test_rewrite_with_tp_auto_says_to_plan_first(capsys: pytest.CaptureFixture[str]) -> None:
    model = REPO / "examples" / "transformer_lm.py"
    argv = ["rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor"]
    assert main([*argv, "--tp", "auto"]) == 2
    assert "--tp auto is a plan's choice" in capsys.readouterr().err


def test_tensor_and_stages_in_one_rewrite_need_the_example_in_the_file_and_an_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "transformer_lm.py"
    model.write_text((REPO / "examples" / "transformer_lm.py").read_text())
    argv = ["rewrite", str(model), "--strategy", "tensor", "--tp", "2", "--stages", "2"]
    assert main([*argv, "--example", f"{model}:example"]) == 2  # no -o
    assert "needs --example SPEC and -o OUT" in capsys.readouterr().err
    other = REPO / "examples" / "transformer_lm.py"
    out = tmp_path / "out.py"
    assert main([*argv, "--example", f"{other}:example", "-o", str(out)]) == 2
    assert "needs the example in the model file" in capsys.readouterr().err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [model.name]

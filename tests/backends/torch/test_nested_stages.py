"""Eager stages inside nested ``nn.Sequential`` children (``tests/data/nested_sequential.py``):
the heavy group is planned child by child, the stages run nested slices and keep only the
children they run. Nothing here runs torch; the slow test at the end does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO
from costbuilder import cost_dict

from syncpass.backends.registry import load_backend
from syncpass.cli import main
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.plan.planner import PlanRequest
from syncpass.plan.report import render_plan
from syncpass.rewrite.driver import rewrite_text
from syncpass.rewrite.source import KnownOps

STAGES = load_backend("torch_stages")
MODEL = REPO / "tests" / "data" / "nested_sequential.py"
TEXT = MODEL.read_text()
IDS = (
    *("stem", "blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1", "blocks.1.2.0"),
    *("blocks.1.2.1", "blocks.2.0", "blocks.2.1", "blocks.3", "head"),
)


def nested_costs() -> Costs:
    """What the profile records for the model: every nested child an op, the heavy group's
    4 ms each against the rest's 0.5 ms, and the groups."""
    graph = STAGES.analyse(TEXT, "nested_sequential.py", KnownOps("NestedTrunk", IDS), None).graph
    assert [op.id for op in graph.ops] == list(IDS)
    compute = [4e-3 if op.id.startswith("blocks.1.") else 5e-4 for op in graph.ops]
    data = cost_dict(compute, [1024.0] * (len(IDS) - 1), beta=1e9, alpha=1e-5)
    for op, entry in zip(graph.ops, data["ops"], strict=True):
        entry["id"] = op.id
    data["cuts"] = [{"after": cut.after, "live_bytes": 1024.0} for cut in graph.cuts]
    data["edges"] = [list(edge) for edge in graph.edges]
    data["groups"] = [{"id": group, "ops": list(ops)} for group, ops in graph.nested_groups()]
    data["containers"] = dict(graph.containers)
    data["model"] = "NestedTrunk"
    return parse_costs(data)


def rewrite(text: str, stages: int):  # type: ignore[no-untyped-def]
    request = PlanRequest(stages=stages, config=SyncConfig(communication_cost_threshold=100.0))
    return rewrite_text(text, "nested_sequential.py", STAGES, request, nested_costs())


def stage_lines(code: str) -> list[str]:
    start = code.index("class NestedTrunkStage0")
    return [
        line.strip()
        for line in code[start:].splitlines()
        if "self.blocks" in line or line.strip().startswith("keeps =")
    ]


def test_the_profile_records_each_nested_group() -> None:
    groups = {group.id: group.ops for group in nested_costs().groups}
    assert groups == {
        "blocks.0": ("blocks.0.0", "blocks.0.1"),
        "blocks.1": ("blocks.1.0", "blocks.1.1", "blocks.1.2.0", "blocks.1.2.1"),
        "blocks.1.2": ("blocks.1.2.0", "blocks.1.2.1"),
        "blocks.2": ("blocks.2.0", "blocks.2.1"),
    }


def test_the_heavy_group_is_planned_child_by_child_and_run_as_nested_slices() -> None:
    result = rewrite(TEXT, 4)
    plan = result.plan
    assert [expansion.op for expansion in plan.expanded] == ["blocks.1", "blocks.1.2"]
    ops = [op for stage in plan.stages for op in stage.ops]
    # The light groups stay one op each, under their module path.
    assert ops == [
        *("stem", "blocks.0", "blocks.1.0", "blocks.1.1", "blocks.1.2.0", "blocks.1.2.1"),
        *("blocks.2", "blocks.3", "head"),
    ]
    assert "blocks.1 expanded: 16 ms > ideal stage 4.88 ms" in render_plan(plan)
    assert stage_lines(result.rewritten) == [
        'keeps = ("blocks.0", "blocks.1.0", "stem")',
        "x = self.blocks[:1](x)  # the trunk: groups of blocks",
        "x = self.blocks[1][:1](x)  # the trunk: groups of blocks",
        'keeps = ("blocks.1.1",)',
        "x = self.blocks[1][1:2](x)  # the trunk: groups of blocks",
        'keeps = ("blocks.1.2.0",)',
        "x = self.blocks[1][2][:1](x)  # the trunk: groups of blocks",
        'keeps = ("blocks.1.2.1", "blocks.2", "blocks.3", "head")',
        "x = self.blocks[1][2][1:](x)  # the trunk: groups of blocks",
        "x = self.blocks[2:](x)  # the trunk: groups of blocks",
    ]


def test_at_two_stages_the_nested_group_stays_whole() -> None:
    result = rewrite(TEXT, 2)
    assert [expansion.op for expansion in result.plan.expanded] == ["blocks.1"]
    assert "blocks.1.2" in [op for stage in result.plan.stages for op in stage.ops]


def test_a_second_rewrite_changes_nothing_and_stripping_gives_the_input_back() -> None:
    for stages in (2, 4):
        result = rewrite(TEXT, stages)
        assert rewrite(result.rewritten, stages).rewritten == result.rewritten
        assert STAGES.strip(result.rewritten, "nested_sequential.py", "NestedTrunk") == TEXT


def test_a_saved_plan_rewrites_alike(tmp_path: Path) -> None:
    from syncpass.plan.planfile import dumps_plan, load_plan

    result = rewrite(TEXT, 4)
    saved = tmp_path / "plan.json"
    saved.write_text(dumps_plan(result.plan))
    again = rewrite_text(TEXT, "nested_sequential.py", STAGES, None, plan=load_plan(saved))
    assert again.rewritten == result.rewritten


@pytest.mark.slow
def test_nested_slices_split_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / MODEL.name
    shutil.copy(MODEL, source)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "-o", str(costs)]
    assert main([*argv, "--backend", "torch_stages"]) == 0
    # Hand-weighted as nested_costs(), so that the plan's shape does not hang on timings.
    measured = json.loads(costs.read_text())
    assert [group["id"] for group in measured["groups"]] == [
        *("blocks.0", "blocks.1", "blocks.1.2", "blocks.2")
    ]
    plan = tmp_path / "plan.json"
    (tmp_path / "weighted.json").write_text(json.dumps(_weighted(measured)))
    argv = ["plan", "--costs", str(tmp_path / "weighted.json"), "--stages", "4"]
    assert main([*argv, "--backend", "torch_stages", "-o", str(plan)]) == 0
    assert [e["op"] for e in json.loads(plan.read_text())["expanded"]] == ["blocks.1", "blocks.1.2"]
    out = tmp_path / "nested_sync.py"
    argv = ["rewrite", str(source), "--plan", str(plan), "--backend", "torch_stages"]
    assert main([*argv, "-o", str(out)]) == 0
    assert "self.blocks[1][2][:1](x)" in out.read_text()
    report = tmp_path / "run.json"
    argv = ["run", str(out), "--stages", "4", "--verify", "--steps", "1"]
    assert main([*argv, "--json-report", str(report)]) == 0
    capsys.readouterr()
    verify = json.loads(report.read_text())["verify"]
    assert verify["ok"] is True and verify["parameters_compared"] == verify["model_parameters"]
    # Each stage holds only the children it runs, under the model's own names.
    held = {entry["name"]: entry["stage"] for entry in verify["parameters"]}
    assert held["blocks.1.2.0.up.weight"] == 2 and held["blocks.1.2.1.up.weight"] == 3


def _weighted(costs: dict) -> dict:  # type: ignore[type-arg]
    for op in costs["ops"]:
        heavy = op["id"].startswith("blocks.1.")
        op.update(compute_s=4e-3 if heavy else 5e-4, backward_s=0.0, fixed_s=0.0)
        op.update(backward_fixed_s=0.0, backward_input_s=None)
    # The shipped CPU profile's meeting posts' stall would trade the balanced split for another.
    costs["hardware"].pop("meet_stall_s", None)
    costs["hardware"].pop("meet_window_s", None)
    return costs


CONTAINERS = '''\
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


class ConvStem(nn.Sequential):
    """Built from sizes, as torchvision's Conv2dNormActivation is: a slice cannot be built."""

    def __init__(self, width: int) -> None:
        super().__init__(nn.Linear(4, width), nn.ReLU())


class Scaled(nn.Sequential):
    """Runs its children, then scales: not what nn.Sequential runs."""

    def forward(self, x):
        return 2 * super().forward(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = ConvStem(8)
        self.trunk = nn.Sequential(
            nn.Sequential(OrderedDict(first=nn.Linear(8, 8), second=nn.Linear(8, 8))),
            Scaled(nn.Linear(8, 8), nn.Linear(8, 8)),
        )
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.stem(x)
        x = self.trunk(x)
        return self.head(x)


def example():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 4),), torch.randint(0, 2, (8,)), F.cross_entropy
'''


def test_only_containers_that_run_and_slice_as_nn_sequential_are_planned_per_child(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stem's class builds itself from sizes, so `self.stem[:1]` cannot be built: one op.
    # A nested child with names is found by its place (trunk.0.1), and one whose forward
    # does more than run its children (Scaled) is one op.
    source = tmp_path / "containers.py"
    source.write_text(CONTAINERS)
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", f"{source}:example", "--backend"]
    assert main([*argv, "torch_stages", "--repeats", "1", "--warmup", "0", "-o", str(costs)]) == 0
    capsys.readouterr()
    document = json.loads(costs.read_text())
    assert [op["id"] for op in document["ops"]] == [
        "stem",
        "trunk.0.0",
        "trunk.0.1",
        "trunk.1",
        "head",
    ]
    assert document["groups"] == [{"id": "trunk.0", "ops": ["trunk.0.0", "trunk.0.1"]}]

"""The eager stage form (``--backend torch_stages``): what each stage's code holds, and the
rewrite's guarantees on every golden model. Nothing here runs torch; test_stages_run.py does."""

from __future__ import annotations

import ast
import dataclasses
import json
import textwrap

import libcst as cst
import pytest
from costbuilder import cost_dict
from golden_cases import Case, cases

from syncpass.backends.registry import load_backend
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, costs_to_json, load_costs, parse_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planfile import dumps_plan, parse_plan
from syncpass.plan.planner import PlanRequest, make_plan
from syncpass.rewrite.driver import rewrite_text
from syncpass.rewrite.source import KnownOps

STAGES = load_backend("torch_stages")
TRACED = load_backend("torch")
GOLDEN = cases()

MASKED = textwrap.dedent(
    """\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(8, 4)
            self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])
            self.head = nn.Linear(4, 8)

        def embed(self, idx):
            return self.wte(idx)

        def forward(self, idx, flag: bool = False, **kwargs):
            # one mask for every block
            mask = torch.ones(idx.shape[1], idx.shape[1]).tril()
            extra = () if flag else None
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x) @ mask
            x = x if extra is None else x + 1
            return self.head(x)


    def example():
        return Net(), (torch.zeros(2, 3, dtype=torch.long),)
    """
)


def costs_for(text: str, layers: int, live: float = 64.0, backend=STAGES) -> Costs:  # type: ignore[no-untyped-def]
    """Equal ops and equal cuts for the model in ``text`` (its blocks sized ``layers``), as
    ``backend`` reads it."""
    known = KnownOps(None, tuple(f"blocks.{index}" for index in range(layers)))
    graph = backend.analyse(text, "net.py", known, None).graph
    data = cost_dict([1e-3] * len(graph.ops), [live] * (len(graph.ops) - 1), beta=1e9)
    for op, entry in zip(graph.ops, data["ops"], strict=True):
        entry["id"] = op.id
    data["cuts"] = [
        {"after": op.id, "live_bytes": live} for op in graph.ops[:-1] if op.region is None
    ]
    data["edges"] = [list(edge) for edge in graph.edges]
    return parse_costs(data)


def rewrite(text: str, stages: int, backend=STAGES, layers: int = 4):  # type: ignore[no-untyped-def]
    costs = costs_for(text, layers, backend=backend)
    request = PlanRequest(stages=stages, config=SyncConfig(communication_cost_threshold=100.0))
    return rewrite_text(text, "net.py", backend, request, costs)


def classes(code: str) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(code).body if isinstance(node, ast.ClassDef)}


def attribute(classdef: ast.ClassDef, name: str) -> object:
    for node in classdef.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    return None


def forward_source(code: str, classdef: ast.ClassDef) -> str:
    method = next(n for n in classdef.body if isinstance(n, ast.FunctionDef))
    return ast.get_source_segment(code, method) or ""


def test_the_users_class_stays_byte_identical_and_stages_follow_it() -> None:
    result = rewrite(MASKED, 3)
    assert result.rewritten.startswith(MASKED.split("\n\ndef example")[0])
    assert result.rewritten.endswith(MASKED[MASKED.index("def example") :])
    found = classes(result.rewritten)
    assert [name for name in found if name.startswith("NetStage")] == [
        "NetStage",
        "NetStage0",
        "NetStage1",
        "NetStage2",
    ]
    assert "# syncpass stages: Net.forward in 3 PipelineStage modules" in result.rewritten


def test_a_value_every_block_needs_is_carried_by_each_stage_between() -> None:
    result = rewrite(MASKED, 3)
    found = classes(result.rewritten)
    first, middle = found["NetStage0"], found["NetStage1"]
    assert "mask" in attribute(first, "sends")  # type: ignore[operator]
    assert "mask" in attribute(middle, "sends") or "NetStage2" not in found
    middle_code = forward_source(result.rewritten, middle)
    assert middle_code.startswith("def forward(self, mask, x")
    assert "return mask, x  # syncpass sync 2/2: sends mask, x;" in result.rewritten


def test_the_traced_form_refuses_what_the_eager_form_plans() -> None:
    with pytest.raises(SyncpassError, match="stage"):
        rewrite(MASKED, 4, backend=TRACED)
    result = rewrite(MASKED, 4)
    assert len(result.plan.stages) == 4


def test_constant_defaults_are_declared_again_and_their_locals_computed_again() -> None:
    result = rewrite(MASKED, 3)
    last = forward_source(result.rewritten, classes(result.rewritten)["NetStage2"])
    # `extra` comes from the flag alone: the last stage computes it again, nothing sends it.
    assert "*, flag: bool = False" in last
    assert "extra = () if flag else None" in last
    for name in ("NetStage0", "NetStage1"):
        assert "extra" not in attribute(classes(result.rewritten)[name], "sends")  # type: ignore[operator]


def test_a_stage_keeps_only_what_its_slice_reaches() -> None:
    result = rewrite(MASKED, 3)
    found = classes(result.rewritten)
    keeps = [attribute(found[f"NetStage{index}"], "keeps") for index in range(3)]
    assert "wte" in keeps[0]  # type: ignore[operator]  # reached through self.embed()
    assert "head" in keeps[2] and "wte" not in keeps[2]  # type: ignore[operator]
    layers = [
        {path for path in kept if path.startswith("blocks.")}  # type: ignore[union-attr]
        for kept in keeps
    ]
    assert set().union(*layers) == {f"blocks.{index}" for index in range(4)}
    assert sum(len(part) for part in layers) == 4  # each layer on exactly one stage


def test_a_second_rewrite_changes_nothing_and_stripping_gives_the_input_back() -> None:
    result = rewrite(MASKED, 3)
    assert rewrite(result.rewritten, 3).rewritten == result.rewritten
    assert STAGES.strip(result.rewritten, "net.py", None) == MASKED


def test_one_stage_leaves_the_file_byte_identical() -> None:
    assert rewrite(MASKED, 1).rewritten == MASKED


@pytest.mark.parametrize("case", GOLDEN, ids=[case.name for case in GOLDEN])
def test_every_golden_model_gets_readable_reversible_stages(case: Case) -> None:
    costs = load_costs(case.costs_path)
    request = PlanRequest(stages=case.stages, config=costs.config)
    result = rewrite_text(case.source, f"{case.name}.py", STAGES, request, costs)
    ast.parse(result.rewritten)
    assert STAGES.strip(result.rewritten, case.name, None) == case.source
    again = rewrite_text(result.rewritten, f"{case.name}.py", STAGES, request, costs)
    assert again.rewritten == result.rewritten
    stage_classes = [name for name in classes(result.rewritten) if "Stage" in name]
    expected = len(result.plan.stages) + 1 if len(result.plan.stages) > 1 else 0
    assert len(stage_classes) == expected
    assert result.rewritten.count("# syncpass sync ") == len(result.plan.sync_points)


def test_planning_for_eager_stages_lets_values_reach_any_later_stage() -> None:
    data = cost_dict([1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    data["edges"] = [
        ["<input>", "op0"],
        ["op0", "op1"],
        ["op0", "op3"],
        ["op1", "op2"],
        ["op2", "op3"],
        ["op3", "<output>"],
    ]
    costs = parse_costs(data)
    config = SyncConfig(communication_cost_threshold=100.0)
    with pytest.raises(SyncpassError):
        make_plan(costs, PlanRequest(stages=4, config=config))
    plan = make_plan(costs, PlanRequest(stages=4, config=config, carries_values=True))
    assert [len(stage.ops) for stage in plan.stages] == [1, 1, 1, 1]


def test_what_the_profile_saw_decides_how_a_value_crosses() -> None:
    text = MASKED.replace(
        "        return self.head(x)\n", "        return self.head(x)[:, :width, :cut]\n"
    )
    text = text.replace(
        "        x = self.embed(idx)\n",
        "        width = idx.shape[1]\n        cut = None if width else idx\n        x = self.embed(idx)\n",
    )
    costs = costs_for(text, 4)
    kinds = {"width": "int", "cut": "none"}
    cuts = tuple(dataclasses.replace(cut, kinds=tuple(sorted(kinds.items()))) for cut in costs.cuts)
    costs = dataclasses.replace(costs, cuts=cuts)
    request = PlanRequest(stages=2, config=SyncConfig(communication_cost_threshold=100.0))
    result = rewrite_text(text, "net.py", STAGES, request, costs)
    written = result.rewritten
    assert "torch.as_tensor(width, device=" in written
    assert "        width = int(width)  # the stage before sends it as a tensor\n" in written
    assert "        cut = None  # None when profiled: nothing to send\n" in written
    assert STAGES.strip(written, "net.py", None) == text

    # Where a value that is no tensor, number or shape would cross, the plan puts no sync point.
    chosen = result.plan.sync_points[0].after
    other = dataclasses.replace(
        costs,
        cuts=tuple(
            dataclasses.replace(cut, kinds=(("width", "other"),)) if cut.after == chosen else cut
            for cut in costs.cuts
        ),
    )
    elsewhere = rewrite_text(text, "net.py", STAGES, request, other)
    assert elsewhere.plan.sync_points[0].after != chosen
    nowhere = dataclasses.replace(
        costs,
        cuts=tuple(dataclasses.replace(cut, kinds=(("width", "other"),)) for cut in costs.cuts),
    )
    with pytest.raises(SyncpassError) as refused:
        rewrite_text(text, "net.py", STAGES, request, nowhere)
    assert "width would cross them" in str(refused.value)


def test_cut_kinds_survive_the_cost_and_plan_files() -> None:
    data = cost_dict([1.0, 1.0], [8.0])
    data["cuts"][0]["kinds"] = {"mask": "none", "n": "int"}
    costs = parse_costs(data)
    assert costs.cuts[0].kinds == (("mask", "none"), ("n", "int"))
    assert costs_to_json(costs)["cuts"][0]["kinds"] == {"mask": "none", "n": "int"}
    plan = make_plan(costs, PlanRequest(stages=2, config=SyncConfig()))
    assert plan.sync_points[0].kinds == (("mask", "none"), ("n", "int"))
    assert (
        parse_plan(json.loads(dumps_plan(plan))).sync_points[0].kinds == plan.sync_points[0].kinds
    )
    data["cuts"][0]["kinds"] = {"mask": "tensor"}
    with pytest.raises(SyncpassError, match="kinds"):
        parse_costs(data)


def test_a_property_read_follows_its_getter_not_its_setter() -> None:
    text = MASKED.replace(
        "    def embed(self, idx):",
        "    @property\n"
        "    def scale(self):\n"
        "        return self._scale\n\n"
        "    @scale.setter\n"
        "    def scale(self, value):\n"
        "        self._scale = value\n"
        "        self.head.reset_parameters()\n\n"
        "    def embed(self, idx):",
    ).replace("            x = block(x) @ mask\n", "            x = block(x) @ mask * self.scale\n")
    assert "@scale.setter" in text and "* self.scale" in text
    result = rewrite(text, 2)
    first = attribute(classes(result.rewritten)["NetStage0"], "keeps")
    assert "head" not in first  # type: ignore[operator]
    assert "_scale" in first  # type: ignore[operator]


def test_kwargs_read_by_a_later_stage_are_declared_as_kwargs() -> None:
    text = MASKED.replace(
        "        return self.head(x)\n", "        return self.head(x) * kwargs.get('scale', 1)\n"
    )
    result = rewrite(text, 2)
    last = result.rewritten[result.rewritten.index("class NetStage1") :]
    signature = last[last.index("def forward") : last.index(":\n", last.index("def forward"))]
    assert signature.endswith(", **kwargs)")  # not `*, kwargs`, which would be required
    compile(result.rewritten, "net.py", "exec")


def test_the_forwards_docstring_stays_with_the_model_not_the_first_stage() -> None:
    text = MASKED.replace(
        "    def forward(self, idx, flag: bool = False, **kwargs):\n",
        '    def forward(self, idx, flag: bool = False, **kwargs):\n        """Logits."""\n',
    )
    assert '"""Logits."""' in text
    result = rewrite(text, 2)
    assert result.rewritten.count('"""Logits."""') == 1
    assert STAGES.strip(result.rewritten, "net.py", None) == text


def test_a_file_with_its_own_model_stage_class_gets_another_base_name() -> None:
    # timm's convnext.py defines ConvNeXtStage: the base stage class must not replace it.
    own = MASKED.replace(
        "class Net(nn.Module):", "class NetStage(nn.Module):\n    pass\n\n\nclass Net(nn.Module):"
    )
    result = rewrite(own, 3)
    found = classes(result.rewritten)
    assert [name for name in found if name.startswith("NetStage")] == [
        "NetStage",
        "NetStageBase",
        "NetStage0",
        "NetStage1",
        "NetStage2",
    ]
    assert all(found[f"NetStage{k}"].bases[0].id == "NetStageBase" for k in range(3))  # type: ignore[attr-defined]
    assert ast.unparse(found["NetStage"]) == "class NetStage(nn.Module):\n    pass"
    assert rewrite(result.rewritten, 3).rewritten == result.rewritten
    assert STAGES.strip(result.rewritten, "net.py", None) == own
    imported = own.replace(
        "import torch\n", "import torch\nfrom blocks import NetStage, NetStageBase\n"
    )
    names = classes(rewrite(imported, 3).rewritten)
    assert "NetStagePipelineStageBase" not in names and "NetPipelineStageBase" in names


def test_removing_the_stages_gives_the_input_back_with_or_without_printing() -> None:
    """The pre-write check knows the input's own tree with stage classes added strips back
    to ``source.base`` without printing it (:func:`stages._same_nodes`), and prints
    anything else: a changed statement of the model shows in what it returns."""
    from syncpass.backends.torch import stages

    written = cst.parse_module(rewrite(MASKED, 2).rewritten)
    added = [s for s in written.body if isinstance(s, cst.ClassDef) and s.name.value != "Net"]
    source = STAGES.analyse(MASKED, "net.py", KnownOps("Net", ()), "Net")
    body = list(source.module.body)
    at = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)) + 1
    with_stages = source.module.with_changes(body=[*body[:at], *added, *body[at:]])
    assert len(added) == 3  # the stages' base class, and one class per stage
    assert stages._same_nodes(stages.remove_stages(with_stages), source.module)
    assert stages.remove(with_stages, source, "net.py") == source.base == MASKED

    model = body[at - 1]
    assert isinstance(model, cst.ClassDef)
    renamed = with_stages.deep_replace(model.name, model.name.with_changes(value="Other"))
    assert not stages._same_nodes(stages.remove_stages(renamed), source.module)
    assert stages.remove(renamed, source, "net.py") == MASKED.replace("class Net(", "class Other(")


def test_a_rewritten_file_reads_as_the_file_it_was_written_from() -> None:
    again = STAGES.analyse(rewrite(MASKED, 2).rewritten, "net.py", KnownOps("Net", ()), "Net")
    first = STAGES.analyse(MASKED, "net.py", KnownOps("Net", ()), "Net")
    assert again.base == first.base == MASKED and again.module.code == MASKED
    assert again.graph == first.graph


def test_a_forward_wrapped_in_an_unknown_decorator_is_refused_at_the_decorator() -> None:
    # Hugging Face's @filter_output_hidden_states sets a flag before the call and filters
    # the output after: a stage running a slice of the body would do neither.
    wrapped = MASKED.replace(
        "    def forward(self, idx", "    @filter_output_hidden_states\n    def forward(self, idx"
    )
    with pytest.raises(SyncpassError, match="wrapped in @filter_output_hidden_states") as raised:
        rewrite(wrapped, 2)
    line = wrapped.splitlines().index("    @filter_output_hidden_states") + 1
    assert raised.value.location == f"net.py:{line}"
    # A decorator known to compute nothing the loss reads is left out, as before.
    known = MASKED.replace(
        "    def forward(self, idx", "    @can_return_tuple\n    def forward(self, idx"
    )
    assert "class NetStage1" in rewrite(known, 2).rewritten


def test_ops_and_regions_of_an_expanded_forward_are_at_the_lines_the_user_wrote() -> None:
    # The expansion inlines a method into the forward and a class above the model grows
    # with its own expansion: what the notes name must still be the file's lines.
    from syncpass.backends.torch.stages import analyse

    code = textwrap.dedent(
        """
        import torch
        from torch import nn


        class Helper(nn.Module):
            def forward(self, x):
                x = self.prepare(x)
                return x

            def prepare(self, x):
                y = x * 2
                z = y + 1
                return z


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                x = self.a(x)
                x = self.mix(x)
                return self.b(x)

            def mix(self, x):
                if x.sum() > 0:
                    x = x * 2
                return torch.relu(x)
        """
    )
    source = analyse(code, "m.py", KnownOps("Net", ()), "Net")
    graph = source.graph
    lines = code.splitlines()
    (region,) = graph.regions
    assert lines[region.location.line - 1].strip() == "if x.sum() > 0:"
    assert region.end_line == region.location.line + 1
    for op in graph.ops:
        assert op.location.path == "m.py"
    written = {lines[op.location.line - 1].strip() for op in graph.ops}
    assert {"x = self.a(x)", "return torch.relu(x)", "return self.b(x)"} <= written

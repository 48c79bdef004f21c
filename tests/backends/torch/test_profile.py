"""`syncpass profile`: measured costs that match the op graph, real torch, no mocks."""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from conftest import REPO

from syncpass.backends.torch.backend import BACKEND as TORCH
from syncpass.backends.torch.example import load_example
from syncpass.backends.torch.measure import (
    MAX_TEMPLATE_LEAVES,
    _backward_spans,
    _forward_spans,
    _measured_on,
    build_graph,
    fixed_part,
    profile_costs,
    same_tensors,
    tensor_bytes,
    value_kind,
)
from syncpass.cli import main
from syncpass.commands.profile import register
from syncpass.contracts.costs import Costs, OpCost, costs_to_json, load_costs, parse_costs
from syncpass.contracts.graph import OpGraph
from syncpass.contracts.hardware import cpu_devices, load_profile
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import rewrite_text
from syncpass.transformers.probes import PROBE, ProbeSite, probed_forward_source

BATCH, IN, WIDTH, OUT = 4, 8, 16, 3
SEQ, HEADS = 6, 2

MODELS = f"""\
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

BATCH, IN, WIDTH, OUT = {BATCH}, {IN}, {WIDTH}, {OUT}
SEQ, HEADS = {SEQ}, {HEADS}


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(IN, WIDTH)
        self.blocks = nn.ModuleList([Block(WIDTH) for _ in range(3)])
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x):
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class Attention(nn.Module):
    def forward(self, x):
        batch, seq, width = x.shape
        q = x.view(batch, seq, HEADS, width // HEADS).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, q, q)
        return y.transpose(1, 2).reshape(batch, seq, width)


class Skip(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.attn = Attention()
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x):
        h = self.stem(x)
        skip = self.proj(h)
        h = self.attn(h)
        h = self.mid(h)
        h += skip
        h = self.mid(h)
        return self.head(h)


class Sliced(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(WIDTH) for _ in range(4)])

    def forward(self, x):
        for i, block in enumerate(self.blocks[1:]):
            x = block(x) * (i + 1)
        for block in self.blocks[:2]: x = block(x)
        if x.sum() > 0:
            x = x * 2
        return x


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(IN, WIDTH)
        self.head = nn.Linear(OUT, OUT)

    def forward(self, x):
        h = self.stem(x)
        return self.head(h)


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.proj = nn.Parameter(torch.randn(WIDTH, WIDTH))
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, idx):
        h = self.embed(idx)
        h = torch.relu(self.fc(h))
        h = h @ self.proj
        h = h * 2
        return self.head(h)


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(IN, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, OUT)

    def forward(self, x):
        h = self.stem(x)
        h = checkpoint(self.mid, h, use_reentrant=True)
        return self.head(h)


class Doubled(Tiny):
    def forward(self, x):
        y = super().forward(x)
        return y * 2


def example():
    return Tiny(), (torch.randn(BATCH, IN),)


def doubled_example():
    return Doubled(), (torch.randn(BATCH, IN),)


def skip_example():
    return Skip(), (torch.randn(BATCH, SEQ, WIDTH),)


def sliced_example():
    return Sliced(), (torch.randn(BATCH, WIDTH),)


def tokens_example():
    return Tokens(), (torch.randint(0, 10, (BATCH, SEQ)),)


def checkpointed_example():
    return Checkpointed(), (torch.randn(BATCH, IN),)


def broken_example():
    return Broken(), (torch.randn(BATCH, IN),)


def raising_example():
    raise RuntimeError("no data here")
"""

FLOAT = 4  # bytes of a float32


def loss(output: Any) -> torch.Tensor:
    result: torch.Tensor = output.float().pow(2).mean()
    return result


@dataclass(frozen=True)
class Profiled:
    model: Any  # the example's nn.Module, whose submodules the tests reach by name
    args: tuple[Any, ...]
    graph: OpGraph
    costs: Costs

    def op(self, op_id: str) -> OpCost:
        return next(op for op in self.costs.ops if op.id == op_id)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "models.py"
    path.write_text(MODELS)
    return path


@pytest.fixture(scope="module")
def models(model_file: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("_syncpass_test_profile_models", model_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def profiled(models: ModuleType, model_file: Path) -> Callable[[str], Profiled]:
    """Profiles each example once per module: ``profiled("skip_example")``."""
    cache: dict[str, Profiled] = {}

    def get(factory: str) -> Profiled:
        if factory not in cache:
            torch.manual_seed(0)
            model, args = getattr(models, factory)()
            text = model_file.read_text()
            costs = profile_costs(text, str(model_file), model, args, loss, repeats=2, warmup=1)
            graph = build_graph(text, str(model_file), model)
            cache[factory] = Profiled(model, args, graph, costs)
        return cache[factory]

    return get


def module_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def line_of(path: Path, text: str, after: str = "") -> int:
    """Line of the first ``text`` at or below the first line holding ``after``."""
    lines = path.read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if after in line)
    return next(n for n, line in enumerate(lines[start:], start + 1) if text in line)


# --- the cost file ------------------------------------------------------------------------


@pytest.mark.parametrize("factory", ["example", "skip_example", "sliced_example"])
def test_cost_file_parses_and_its_ops_and_cuts_are_the_graphs(
    profiled: Callable[[str], Profiled], factory: str
) -> None:
    result = profiled(factory)
    parsed = parse_costs(json.loads(json.dumps(costs_to_json(result.costs))), "profiled")
    assert parsed == result.costs
    assert [op.id for op in parsed.ops] == [op.id for op in result.graph.ops]
    assert [cut.after for cut in parsed.cuts] == [cut.after for cut in result.graph.cuts]
    assert [op.source for op in parsed.ops] == [str(op.location) for op in result.graph.ops]
    assert parsed.batch_size == BATCH
    assert parsed.training is True
    assert parsed.memory_multiplier == 4
    assert parsed.model == type(result.model).__name__
    link = load_profile("cpu-gloo-loopback").hardware  # until calibrated
    assert (parsed.hardware.alpha_s, parsed.hardware.beta_bytes_per_s) == (
        link.alpha_s,
        link.beta_bytes_per_s,
    )
    assert parsed.hardware.flops_per_s is not None and parsed.hardware.flops_per_s > 0
    assert parsed.hardware.name == link.name  # says where the link figures come from
    assert parsed.hardware.devices == cpu_devices(1)  # the stages this CPU runs at once
    assert all(op.compute_s > 0 for op in parsed.ops)


def test_ops_with_parameters_have_backward_time(profiled: Callable[[str], Profiled]) -> None:
    tiny = profiled("example")
    for op_id in ("stem", "blocks.0", "blocks.1", "blocks.2", "head"):
        assert tiny.op(op_id).backward_s > 0, op_id


# --- the inputs' part of the backward (torch's I) ------------------------------------------


@pytest.mark.parametrize("factory", ["example", "skip_example", "tokens_example"])
def test_the_inputs_part_of_each_backward_is_within_the_backward(
    profiled: Callable[[str], Profiled], factory: str
) -> None:
    for op in profiled(factory).costs.ops:
        assert op.backward_input_s is not None, op.id
        assert 0 <= op.backward_input_s <= op.backward_s, op.id


def test_an_op_without_weights_computes_only_its_inputs_gradients(
    profiled: Callable[[str], Profiled],
) -> None:
    skip = profiled("skip_example")
    added = next(op.id for op in skip.costs.ops if op.id.startswith("stmt@"))
    for op_id in ("attn", added):  # attention without projections; h += skip
        op = skip.op(op_id)
        assert op.param_bytes == 0
        assert op.backward_input_s == op.backward_s, op_id
    tokens = profiled("tokens_example")
    doubled = next(op for op in tokens.costs.ops if op.id.startswith("operator.mul"))
    assert doubled.backward_input_s == doubled.backward_s


def test_an_op_whose_inputs_need_no_gradient_has_no_inputs_part(
    profiled: Callable[[str], Profiled],
) -> None:
    # Token ids into an embedding, float data into a linear layer: all weights.
    assert profiled("tokens_example").op("embed").backward_input_s == 0
    assert profiled("example").op("stem").backward_input_s == 0


def test_where_the_inputs_part_cannot_be_timed_it_is_left_to_half(
    profiled: Callable[[str], Profiled],
) -> None:
    # Reentrant checkpointing refuses autograd.grad: the cost file says so, and only the
    # ops whose structure settles the split get one.
    checkpointed = profiled("checkpointed_example")
    assert any("inputs' part of each backward not measured" in n for n in checkpointed.costs.notes)
    assert checkpointed.op("stem").backward_input_s == 0  # float data: no gradient wanted
    assert checkpointed.op("head").backward_input_s is None
    # It hides its weights from autograd's graph, so it is not taken as having none.
    middle = next(op for op in checkpointed.costs.ops if "checkpoint" in op.id)
    assert middle.backward_input_s is None


def test_linear_flops_are_two_batch_in_out(profiled: Callable[[str], Profiled]) -> None:
    tiny = profiled("example")
    assert tiny.op("stem").flops == 2 * BATCH * IN * WIDTH
    for index in range(3):
        assert tiny.op(f"blocks.{index}").flops == 2 * BATCH * WIDTH * WIDTH
    assert tiny.op("head").flops == 2 * BATCH * WIDTH * OUT


def test_attention_flops_are_counted_on_cpu(profiled: Callable[[str], Profiled]) -> None:
    skip = profiled("skip_example")
    head_dim = WIDTH // HEADS
    # Two batched matmuls: scores = q @ k^T and scores @ v.
    assert skip.op("attn").flops == 4 * BATCH * HEADS * SEQ * SEQ * head_dim
    assert skip.op("stem").flops == 2 * BATCH * SEQ * WIDTH * WIDTH


def test_live_bytes_are_the_bytes_of_the_live_tensors(
    profiled: Callable[[str], Profiled],
) -> None:
    tiny = profiled("example")
    for cut, graph_cut in zip(tiny.costs.cuts, tiny.graph.cuts, strict=True):
        assert graph_cut.live == ("h",)
        assert cut.live_bytes == BATCH * WIDTH * FLOAT
    skip = profiled("skip_example")
    activation = BATCH * SEQ * WIDTH * FLOAT  # h and skip are (batch, seq, width) float32
    live = {cut.after: set(cut.live) for cut in skip.graph.cuts}
    assert live["stem"] == {"h"}
    assert live["proj"] == live["attn"] == live["mid"] == {"h", "skip"}
    for cut in skip.costs.cuts:
        assert cut.live_bytes == len(live[cut.after]) * activation, cut.after


def test_parameter_bytes_count_each_parameter_once(profiled: Callable[[str], Profiled]) -> None:
    tiny = profiled("example")
    model = tiny.model
    assert tiny.op("stem").param_bytes == module_bytes(model.stem) == (IN * WIDTH + WIDTH) * FLOAT
    for index in range(3):
        assert tiny.op(f"blocks.{index}").param_bytes == module_bytes(model.blocks[index])
    assert tiny.op("head").param_bytes == module_bytes(model.head)
    skip = profiled("skip_example")
    second_mid = next(op for op in skip.costs.ops if op.id.startswith("mid@"))
    assert skip.op("mid").param_bytes == module_bytes(skip.model.mid)
    assert second_mid.param_bytes == 0
    assert skip.op("attn").param_bytes == 0


def test_out_bytes_are_the_bytes_each_op_writes(profiled: Callable[[str], Profiled]) -> None:
    tiny = profiled("example")
    assert tiny.op("stem").out_bytes == BATCH * WIDTH * FLOAT
    assert tiny.op("blocks.1").out_bytes == BATCH * WIDTH * FLOAT


def test_container_loops_over_slices_attribute_each_iteration(
    profiled: Callable[[str], Profiled], model_file: Path
) -> None:
    sliced = profiled("sliced_example")
    one_line = line_of(model_file, "for block in self.blocks[:2]: x = block(x)")
    ids = [op.id for op in sliced.costs.ops]
    assert ids[:5] == [
        "blocks.1",
        "blocks.2",
        "blocks.3",
        "blocks.0",
        f"blocks.1@L{one_line}",
    ]
    for op in sliced.costs.ops[:5]:
        assert op.flops == 2 * BATCH * WIDTH * WIDTH, op.id
    # blocks.1 runs in both loops: its parameters count at its first use only.
    assert sliced.costs.ops[4].param_bytes == 0
    assert sliced.costs.ops[3].param_bytes == module_bytes(sliced.model.blocks[0])


def test_rewrite_accepts_the_profiled_costs(
    profiled: Callable[[str], Profiled], model_file: Path
) -> None:
    text = model_file.read_text()
    for factory in ("example", "skip_example", "sliced_example"):
        costs = profiled(factory).costs
        result = rewrite_text(
            text, str(model_file), TORCH, PlanRequest(stages=2, config=costs.config), costs
        )
        assert len(result.plan.sync_points) == 1
        assert "pipe_split()" in result.rewritten


def test_profiling_leaves_the_model_and_the_file_as_they_were(
    models: ModuleType, model_file: Path
) -> None:
    text = model_file.read_text()
    torch.manual_seed(0)
    model, args = models.example()
    before = model(*args).detach()
    threads = torch.get_num_threads()
    profile_costs(text, str(model_file), model, args, loss, repeats=1, warmup=0, threads=2)
    assert model_file.read_text() == text
    assert "forward" not in vars(model)
    assert all(parameter.grad is None for parameter in model.parameters())
    assert torch.get_num_threads() == threads
    assert torch.equal(model(*args), before)


def test_zero_argument_super_in_forward_finds_the_users_class(
    profiled: Callable[[str], Profiled],
) -> None:
    doubled = profiled("doubled_example")
    assert doubled.costs.ops[0].flops == 2 * BATCH * WIDTH * (IN + 3 * WIDTH + OUT)


# --- errors -------------------------------------------------------------------------------


def test_a_class_that_is_not_in_the_file_is_an_error(models: ModuleType, model_file: Path) -> None:
    model, args = models.example()
    with pytest.raises(SyncpassError, match="no top-level class named 'Nope'"):
        profile_costs(model_file.read_text(), str(model_file), model, args, loss, "Nope")


def test_a_model_of_another_class_is_an_error(models: ModuleType, model_file: Path) -> None:
    model, args = models.example()
    with pytest.raises(SyncpassError, match="model is a Tiny, not a Skip"):
        profile_costs(model_file.read_text(), str(model_file), model, args, loss, "Skip")


def test_a_failing_forward_names_the_op_and_its_line(models: ModuleType, model_file: Path) -> None:
    model, args = models.broken_example()
    with pytest.raises(SyncpassError) as caught:
        profile_costs(model_file.read_text(), str(model_file), model, args, loss)
    assert "Broken.forward failed in op head" in caught.value.message
    assert (
        caught.value.location
        == f"{model_file}:{line_of(model_file, 'return self.head(h)', 'class Broken')}"
    )


def test_a_failing_loss_is_an_error(models: ModuleType, model_file: Path) -> None:
    model, args = models.example()

    def bad_loss(output: Any) -> torch.Tensor:
        raise ValueError("no target")

    with pytest.raises(SyncpassError, match="the loss function failed: ValueError: no target"):
        profile_costs(model_file.read_text(), str(model_file), model, args, bad_loss)


# --- sizes and attribution rules ----------------------------------------------------------


def test_tensor_bytes_count_each_storage_once() -> None:
    a = torch.zeros(8, 33)
    b = torch.zeros(4, dtype=torch.float64)
    assert tensor_bytes([a, a]) == a.nbytes
    assert tensor_bytes([a, a.t(), a.view(-1)]) == a.nbytes
    assert tensor_bytes([a[:, :-1]]) == 8 * 32 * FLOAT  # a slice: its own elements only
    assert tensor_bytes([a[:, ::2]]) == 8 * 17 * FLOAT
    assert tensor_bytes([(a, [b, {"k": b}]), 3, "text"]) == a.nbytes + b.nbytes
    q, k, v = torch.zeros(2, 15).chunk(3, dim=1)
    assert tensor_bytes([q, k, v]) == 2 * 15 * FLOAT
    assert tensor_bytes([]) == 0


def test_forward_spans_give_the_rest_to_the_op_that_did_not_finish() -> None:
    marks = [(1.0, 1.5), (3.0, 3.5), None, None]
    assert _forward_spans(marks, 0.0, 10.0) == [1.0, 1.5, 6.5, 0.0]
    assert _forward_spans([(1.0, 1.0), (3.0, 3.0)], 0.0, 4.0) == [1.0, 3.0]


def test_backward_spans_follow_the_boundaries_in_reverse() -> None:
    forward = [1.0, 1.0, 1.0]
    # Backward runs from 10 (start) to 20 (end); op 2 first, op 0 last.
    assert _backward_spans([16.0, 12.0, None], 10.0, 20.0, forward) == [4.0, 4.0, 2.0]
    # No gradient passed the boundary after op 0: op 0 has no backward.
    assert _backward_spans([None, 12.0, None], 10.0, 20.0, forward) == [0.0, 8.0, 2.0]
    # A boundary between two passed ones was missed: its ops share by forward time.
    spans = _backward_spans([16.0, None, 12.0, None], 10.0, 20.0, [1.0, 3.0, 1.0, 1.0])
    assert spans == [4.0, 3.0, 1.0, 2.0]


# --- the probe transformer ----------------------------------------------------------------


def test_probes_go_after_statements_and_inside_loops(model_file: Path) -> None:
    from syncpass.frontend import parse_source

    module = parse_source(model_file.read_text(), str(model_file))
    sites = [ProbeSite(0, loop=True, rebind=("x",)), ProbeSite(1, loop=True), ProbeSite(2)]
    source, warnings = probed_forward_source(module, "Sliced", sites, str(model_file))
    assert warnings == ()
    code = textwrap.dedent(source)
    assert code.startswith("class Sliced:\n    def forward(self, x):\n")
    assert f"{PROBE}.begin()" in code
    assert "in enumerate(enumerate(self.blocks[1:])):" in code
    assert f"{PROBE}.boundary(0, __syncpass_iteration__ + 1, locals())" in code
    assert f"{PROBE}.boundary(1, __syncpass_iteration__, locals())" in code
    assert f"{PROBE}.boundary(2, None, locals())" in code
    assert "if 'x' in __syncpass_live__: x = __syncpass_live__['x']" in code
    compile(code, "probed", "exec")


def test_a_probe_site_that_does_not_fit_is_a_warning(model_file: Path) -> None:
    from syncpass.frontend import parse_source

    module = parse_source(model_file.read_text(), str(model_file))
    source, warnings = probed_forward_source(
        module, "Sliced", [ProbeSite(2, loop=True)], str(model_file)
    )
    assert source == ""
    assert warnings and "not a loop over a layer container" in warnings[0]


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def _restore_imports(monkeypatch: pytest.MonkeyPatch, model_file: Path) -> Iterator[None]:
    # Loading an example puts its folder on sys.path and the file in sys.modules.
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(model_file.parent)):
            del sys.modules[name]


def run_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="syncpass")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        status: int = args.handler(args)
    except SyncpassError as error:
        print(f"syncpass: error: {error}", file=sys.stderr)
        return 2
    return status


@pytest.mark.usefixtures("_restore_imports")
def test_command_writes_a_cost_file_that_rewrite_accepts(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "skip.costs.json"
    argv = ["profile", str(model_file), "--example", "skip_example", "-o", str(output)]
    assert run_command([*argv, "--repeats", "1", "--warmup", "0"]) == 0
    assert f"wrote {output}" in capsys.readouterr().err
    costs = load_costs(output)
    assert costs.model == "Skip"
    # The command also times an eighth of the batch: on ops this small, a call's fixed
    # cost is most of its time, so some op must show one.
    assert any(op.fixed_s > 0 for op in costs.ops)
    assert all(op.fixed_s <= op.compute_s for op in costs.ops)
    # The inputs' part of the backward comes back from the file as measured.
    assert all(
        op.backward_input_s is not None and op.backward_input_s <= op.backward_s for op in costs.ops
    )
    assert load_costs(output).ops == costs.ops == parse_costs(costs_to_json(costs)).ops
    rewrite = subprocess.run(
        [
            *(sys.executable, "-m", "syncpass", "rewrite", str(model_file)),
            *("--model", "Skip", "--costs", str(output), "--stages", "2"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert rewrite.returncode == 0, rewrite.stderr
    assert "# syncpass sync 1/1: sends " in rewrite.stdout  # the eager stages


@pytest.mark.usefixtures("_restore_imports")
def test_counted_on_fake_tensors_the_inputs_part_is_half_of_an_op_with_weights(
    model_file: Path, tmp_path: Path
) -> None:
    output = tmp_path / "tokens.meta.json"
    argv = ["profile", str(model_file), "--example", "tokens_example", "-o", str(output)]
    assert run_command([*argv, "--meta", "--hardware", "nvlink-8xh100"]) == 0
    ops = {op.id.split("@")[0]: op for op in load_costs(output).ops}
    assert ops["embed"].backward_input_s == 0  # token ids need no gradient
    for op_id in ("fc", "head", "operator.matmul"):  # h @ self.proj: a weight, no call
        assert ops[op_id].backward_s > 0
        assert ops[op_id].backward_input_s == ops[op_id].backward_s / 2, op_id
    assert ops["operator.mul"].backward_input_s == ops["operator.mul"].backward_s


@pytest.mark.usefixtures("_restore_imports")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--example", "nothing_here"], "no function 'nothing_here'"),
        (["--example", "raising_example"], "raising_example() raised: RuntimeError: no data here"),
        (["--model", "Skip"], "model is a Tiny, not a Skip"),
    ],
)
def test_command_errors_exit_2_and_write_nothing(
    model_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    output = tmp_path / "out.costs.json"
    assert run_command(["profile", str(model_file), "-o", str(output), *extra]) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer_lm", "resnet", "unet", "uneven_mlp"])
def test_bundled_examples_profile_and_rewrite(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = REPO / "examples" / f"{name}.py"
    if not source.exists():
        pytest.skip(f"{source} is not there")
    monkeypatch.setattr(sys, "path", list(sys.path))
    output = tmp_path / f"{name}.costs.json"
    argv = ["profile", str(source), "-o", str(output), "--repeats", "1", "--warmup", "0"]
    try:
        assert run_command(argv) == 0
        model = load_example(f"{source}:example").model
    finally:
        for module_name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == str(source.resolve()):
                del sys.modules[module_name]
    costs = load_costs(output)
    assert all(op.compute_s > 0 for op in costs.ops)
    assert sum(op.flops or 0 for op in costs.ops) > 0
    # resnet's and unet's examples give no loss: the cost file says what the default took.
    defaults = [note for note in costs.notes if note.startswith("the example gives no loss")]
    assert defaults == (
        ["the example gives no loss: the default loss is the mean square of output"]
        if name in ("resnet", "unet")
        else []
    )
    # Every parameter of these models belongs to a submodule the forward calls.
    assert sum(op.param_bytes for op in costs.ops) == module_bytes(model)
    result = rewrite_text(
        source.read_text(), str(source), TORCH, PlanRequest(stages=2, config=costs.config), costs
    )
    assert "pipe_split()" in result.rewritten


def test_command_rejects_counts_out_of_range(model_file: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        run_command(["profile", str(model_file), "-o", "x.json", "--repeats", "0"])
    assert caught.value.code == 2


def test_fixed_part_is_the_intercept_of_the_line_through_both_batches() -> None:
    # t(b) = 2 + 0.5 b: 6 at batch 8, 3 at batch 2.
    assert fixed_part(6.0, 3.0, 8, 2) == pytest.approx(2.0)
    # Noise that puts the intercept below 0 or above the smaller time is clamped.
    assert fixed_part(8.0, 1.0, 8, 2) == 0.0
    assert fixed_part(3.0, 3.5, 8, 2) == 3.0
    with pytest.raises(ValueError):
        fixed_part(1.0, 1.0, 2, 2)


#: A two-layer net whose forward runs ``{middle}`` between its layers, and an example of
#: ``{batch}`` samples.
_SMALL_NET = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        x = self.a(x)
        x = {middle}
        x = self.b(x)
        return x


def example():
    return Net(), (torch.randn({batch}, 8),)
"""


def _profiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, middle: str, batch: int) -> Path:
    """The cost file ``syncpass profile`` writes for :data:`_SMALL_NET`."""
    model = tmp_path / "small_net.py"
    model.write_text(_SMALL_NET.format(middle=middle, batch=batch))
    monkeypatch.setattr(sys, "path", list(sys.path))
    output = tmp_path / "small_net.costs.json"
    argv = ["profile", str(model), "-o", str(output), "--repeats", "1", "--warmup", "0"]
    try:
        assert run_command(argv) == 0
    finally:
        sys.modules.pop("small_net", None)
    return output


def test_a_small_batch_that_fails_costs_only_the_fixed_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A forward that hard-codes its batch: the eighth of the batch fails, the profile not.
    costs = load_costs(_profiled(tmp_path, monkeypatch, "x.reshape(16, 8)", 16))
    assert "per-call fixed times not measured" in capsys.readouterr().err
    assert all(op.fixed_s == 0 for op in costs.ops)
    assert any("eighth of the batch failed" in note for note in costs.notes)


def test_the_small_batch_is_one_the_batch_norms_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # BatchNorm1d trains on no fewer than 2 samples: the small batch of a batch of 6 is 2
    # (the smallest micro-batch a plan runs), not the eighth's 1, which would fail.
    costs = load_costs(_profiled(tmp_path, monkeypatch, "self.bn(x)", 6))
    assert "per-call fixed times not measured" not in capsys.readouterr().err
    assert not any("fixed times not measured" in note for note in costs.notes)
    assert costs.min_microbatch_size == 2


#: A net whose last weight writes, as each backward reaches it, whether a gradient was
#: already there to add to (a line of a file beside it: the example may run in a process
#: of its own).
_ADDING_NET = """\
from pathlib import Path

import torch
from torch import nn

SEEN = Path(__file__).with_suffix(".seen")


def record(weight):
    with SEEN.open("a") as lines:
        lines.write(f"{weight.grad is not None}\\n")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)
        weight = self.b.weight
        weight.register_hook(lambda grad: record(weight))

    def forward(self, x):
        x = self.a(x)
        x = self.b(x)
        return x


def example():
    return Net(), (torch.randn(16, 8),)
"""


def test_the_backward_is_timed_adding_to_the_gradients_as_a_pipeline_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pipeline's micro-batches after the first add to the weights' gradients: the timed
    # steps' backwards find a gradient there, and the model's own is back afterwards.
    model = tmp_path / "adding_net.py"
    model.write_text(_ADDING_NET)
    monkeypatch.setattr(sys, "path", list(sys.path))
    output = tmp_path / "adding.costs.json"
    argv = ["profile", str(model), "-o", str(output), "--repeats", "3", "--warmup", "1"]
    assert run_command(argv) == 0
    seen = [line == "True" for line in model.with_suffix(".seen").read_text().splitlines()]
    assert seen[0] is False  # the first step of a fresh model
    assert seen[-3:] == [True, True, True]


@dataclass
class Pair:
    first: torch.Tensor
    second: torch.Tensor | None


def test_what_a_cut_sends_that_is_no_tensor_is_recorded_by_kind() -> None:
    assert value_kind(None) == "none" and value_kind(3) == "int" and value_kind(True) == "bool"
    assert value_kind(torch.Size([2, 3])) == "size"
    assert value_kind((-1, 16, 32)) == "ints"
    assert value_kind((torch.zeros(2), torch.ones(2))) == "tensors:2"
    # A dict of identifier keys to tensors or None crosses as its tensors (Qwen2's masks).
    mapping = {"full_attention": None, "sliding": torch.zeros(1)}
    assert value_kind(mapping) == "mapping:full_attention=none,sliding=tensor"
    # Entries that are tuples of tensors (Gemma 3's rotary tables by layer type) too.
    tables = {"local": (torch.zeros(1), torch.ones(1)), "none": None, "t": torch.zeros(1)}
    assert value_kind(tables) == "mapping:local=tensors:2,none=none,t=tensor"
    # Any other nesting of plain tuples, lists and dicts of tensors and constants crosses as
    # its tensors, the rest written into the stage after (Hugging Face's head_mask, esm2's
    # representations by layer, an accumulator that starts empty).
    assert value_kind({"a b": torch.zeros(1)}) == "pytree:{'a b': T}"
    assert value_kind({"a": 3}) == "pytree:{'a': I}"  # a number is sent: it may be a size
    assert value_kind({"a": {"b": torch.zeros(1)}}) == "pytree:{'a': {'b': T}}"
    assert value_kind({"a": ()}) == "pytree:{'a': ()}"
    assert value_kind({}) == "pytree:{}"
    assert value_kind((torch.zeros(1), 3.5, "x", True)) == "pytree:(T, F, 'x', True)"
    assert value_kind(()) == "pytree:()"
    assert value_kind([None] * 3) == "pytree:[None, None, None]"
    assert value_kind({1: torch.zeros(1), 3: (torch.zeros(1),)}) == "pytree:{1: T, 3: (T,)}"
    # A dataclass of the model's module, by the name the module gives it (a ModelOutput);
    # a set of constants (esm2's set(repr_layers)).
    names = {Pair: "Pair"}
    assert value_kind(Pair(torch.zeros(1), None), names) == "pytree:Pair(first=T, second=None)"
    assert value_kind(Pair(torch.zeros(1), None)) == "other"  # no name in the module
    assert value_kind({3, 1}) == "pytree:{1, 3}" and value_kind(set()) == "pytree:set()"
    assert value_kind({torch.zeros(1)}) == "other"
    assert value_kind({True: torch.zeros(1)}) == "other"  # a key no subscript spells as it is
    assert value_kind({-1: torch.zeros(1)}) == "pytree:{-1: T}"
    # More than its items, or too many of them: not sent.
    assert value_kind(collections.OrderedDict(a=torch.zeros(1))) == "other"  # not a plain dict
    assert value_kind((torch.zeros(1), object())) == "other"
    assert value_kind({(1, 2): torch.zeros(1)}) == "other"  # a key no subscript spells plainly
    assert value_kind([float("nan")]) == "other"
    assert value_kind([0] * (MAX_TEMPLATE_LEAVES + 1)) == "other"


def test_a_tensor_that_another_live_value_holds_is_recorded_as_that_values() -> None:
    h, mask, other = torch.zeros(2), torch.ones(2), torch.ones(3)
    values = {
        "outputs": Pair(h, None),
        "masks": {"full": None, "local": (other, mask)},
        "states": h,  # T5's encoder_hidden_states = encoder_outputs.last_hidden_state
        "gate": mask,
        "again": other,
        "x": torch.zeros(2),
        "y": None,
    }
    values["y"] = values["x"]  # a tensor under a name before it
    kinds = {
        name: value_kind(value, {Pair: "Pair"})
        for name, value in values.items()
        if not isinstance(value, torch.Tensor)
    }
    assert kinds["outputs"] == "pytree:Pair(first=T, second=None)"
    assert kinds["masks"] == "mapping:full=none,local=tensors:2"
    assert same_tensors(list(values), values, kinds) == {
        "states": "same:outputs.first",
        "gate": 'same:masks["local"][1]',
        "again": 'same:masks["local"][0]',
        "y": "same:x",
    }
    # An equal tensor is not the same one; a value missing (unbound) names nothing.
    assert same_tensors(["a", "b", "c"], {"a": torch.zeros(2), "b": torch.zeros(2)}, {}) == {}


def test_profile_says_which_cuts_the_backend_takes_no_sync_point_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "carried.py"
    model.write_text(
        textwrap.dedent(
            """
            import types
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a = nn.Linear(4, 4)
                    self.b = nn.Linear(4, 4)
                    self.c = nn.Linear(4, 4)

                def forward(self, x):
                    state = types.SimpleNamespace(rows=x.shape[0])
                    x = self.a(x)
                    x = self.b(x) * state.rows
                    return self.c(x)


            def example():
                return Net(), (torch.randn(4, 4),)
            """
        )
    )
    argv = ["profile", str(model), "--example", f"{model}:example", "--backend", "torch_stages"]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "-o", str(tmp_path / "c.json")]) == 0
    err = capsys.readouterr().err
    # After `state = ...` the stage after makes it again from the x it receives; once x
    # is overwritten, nothing can make it again, and nothing can send it.
    assert "1 of the 3 admissible sync point(s) are refused by this backend" in err
    assert "(state at 1)" in err


CONFIG_BOUND = """
import torch
from torch import nn


class Config:
    depth = {depth}


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.config = Config()
        self.blocks = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])

    def forward(self, x):
        for block in self.blocks[: self.config.depth]:
            x = block(x)
        return x


def example():
    return Stack(), (torch.randn(4, 8),)
"""


@pytest.mark.parametrize("depth", [4, 3])
def test_a_loop_bound_read_from_the_config_must_cover_the_container(
    depth: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "stack.py"
    source.write_text(CONFIG_BOUND.format(depth=depth))
    out = tmp_path / "costs.json"
    status = main(["profile", str(source), "--repeats", "1", "--warmup", "0", "-o", str(out)])
    err = capsys.readouterr().err
    if depth == 4:  # all four layers: planned per layer, the bound checked on the model
        assert status == 0, err
        assert [op.id for op in load_costs(out).ops] == [f"blocks.{k}" for k in range(4)]
    else:
        line = CONFIG_BOUND.splitlines().index(
            "        for block in self.blocks[: self.config.depth]:"
        )
        assert status == 2 and not out.exists()
        assert f"{source}:{line + 1}: the loop over self.blocks stops at self.config.depth" in err
        assert "which is 3 for a container of 4" in err


def test_a_module_dict_must_be_keyed_by_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "named.py"
    text = (REPO / "tests" / "data" / "module_dict_layers.py").read_text()
    source.write_text(text.replace("self.layers[str(layer_id)]", 'self.layers[f"block{layer_id}"]'))
    out = tmp_path / "costs.json"
    status = main(["profile", str(source), "--repeats", "1", "--warmup", "0", "-o", str(out)])
    err = capsys.readouterr().err
    line = text.splitlines().index("        for layer in self.layers.values():") + 1
    assert status == 2 and not out.exists()
    assert f"{source}:{line}: the loop runs over self.layers.values(), whose keys are" in err
    assert "'block0', 'block1'" in err


def test_a_cost_file_measured_on_a_gpu_pays_no_gloo_stall() -> None:
    # The placeholder profile is gloo's on this CPU, whose posts stall when they meet;
    # stages on GPUs talk over NCCL, whose posts do not.
    on_cpu, on_gpu = _measured_on(1e9, 1, on_gpu=False), _measured_on(1e9, 1, on_gpu=True)
    assert on_cpu.meet_stall_s > 0 and on_cpu.meet_window_s > 0
    assert (on_gpu.meet_stall_s, on_gpu.meet_window_s) == (0.0, 0.0)
    assert on_gpu.flops_per_s == on_cpu.flops_per_s == 1e9

"""Cost files estimated from source alone: the same ops as a profile, sizes as torch has them.

The estimate never needs torch; only the tests that compare with torch import it, and they
skip where torch is not installed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import textwrap
from functools import cache

import pytest
from conftest import REPO

from syncpass.backends.torch.backend import BACKEND as TORCH
from syncpass.backends.torch.estimate import (
    DEFAULT_FLOPS_PER_S,
    StaticEstimate,
    estimate_costs,
    parse_input_shapes,
)
from syncpass.backends.torch.example import Example, load_example
from syncpass.contracts.config import default_sync_config
from syncpass.contracts.costs import Costs, Hardware, costs_to_json, parse_costs
from syncpass.contracts.graph import OpGraph
from syncpass.contracts.hardware import load_profile
from syncpass.core.errors import SyncpassError
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import rewrite_text

HARDWARE = load_profile("cpu-gloo-loopback").hardware
EXAMPLES = REPO / "examples"
#: (file, model class, input shapes of its example(), depth)
CASES = [
    ("transformer_lm.py", "TransformerLM", [(8, 32)], 1),
    ("resnet.py", "ResNet", [(8, 3, 32, 32)], 1),
    ("resnet.py", "ResNet", [(8, 3, 32, 32)], 2),
    ("unet.py", "UNet", [(8, 3, 32, 32)], 1),
]
CASE_IDS = [f"{name.removesuffix('.py')}-depth{depth}" for name, _, _, depth in CASES]


@cache
def example(name: str) -> Example:
    return load_example(f"{EXAMPLES / name}:example")


def estimate_example(name: str, model: str, shapes: list[tuple[int, ...]], depth: int) -> Costs:
    path = EXAMPLES / name
    estimate = estimate_costs(path.read_text(), str(path), model, shapes, HARDWARE, depth=depth)
    assert estimate.unsized == ()
    return estimate.costs


def estimate_with(
    source: str, shapes: list[tuple[int, ...]], hardware: Hardware, **options: object
) -> StaticEstimate:
    return estimate_costs(textwrap.dedent(source), "m.py", None, shapes, hardware, **options)  # type: ignore[arg-type]


# --- the bundled examples, against torch ------------------------------------------------


@pytest.mark.parametrize(("name", "model", "shapes", "depth"), CASES, ids=CASE_IDS)
def test_example_shapes_are_what_example_gives(
    name: str, model: str, shapes: list[tuple[int, ...]], depth: int
) -> None:
    pytest.importorskip("torch")
    assert [tuple(arg.shape) for arg in example(name).args] == shapes


@pytest.mark.parametrize(("name", "model", "shapes", "depth"), CASES, ids=CASE_IDS)
def test_op_ids_and_edges_are_those_a_profile_uses(
    name: str, model: str, shapes: list[tuple[int, ...]], depth: int
) -> None:
    pytest.importorskip("torch")
    from syncpass.backends.torch.measure import build_graph

    costs = estimate_example(name, model, shapes, depth)
    path = EXAMPLES / name
    graph: OpGraph = build_graph(path.read_text(), str(path), example(name).model, model, depth)
    assert [op.id for op in costs.ops] == [op.id for op in graph.ops]
    assert [cut.after for cut in costs.cuts] == [cut.after for cut in graph.cuts]
    assert costs.edges == graph.edges
    assert [op.source for op in costs.ops] == [str(op.location) for op in graph.ops]
    assert costs.model == model
    assert costs.batch_size == shapes[0][0]
    assert costs.hardware == HARDWARE


@pytest.mark.parametrize(("name", "model", "shapes", "depth"), CASES, ids=CASE_IDS)
def test_parameter_bytes_are_the_models_own(
    name: str, model: str, shapes: list[tuple[int, ...]], depth: int
) -> None:
    pytest.importorskip("torch")
    from syncpass.backends.torch.measure import build_graph, parameter_bytes

    costs = estimate_example(name, model, shapes, depth)
    torch_model = example(name).model
    true_bytes = sum(p.numel() * p.element_size() for p in torch_model.parameters())
    assert sum(op.param_bytes for op in costs.ops) == true_bytes
    path = EXAMPLES / name
    graph = build_graph(path.read_text(), str(path), torch_model, model, depth)
    assert [op.param_bytes for op in costs.ops] == parameter_bytes(torch_model, graph)


@pytest.mark.parametrize(
    ("name", "model", "shapes", "depth"), CASES[:2] + CASES[3:], ids=CASE_IDS[:2] + CASE_IDS[3:]
)
def test_sizes_and_matrix_flops_agree_with_a_profile(
    name: str, model: str, shapes: list[tuple[int, ...]], depth: int
) -> None:
    pytest.importorskip("torch")
    from syncpass.backends.torch.measure import profile_costs

    estimated = estimate_example(name, model, shapes, depth)
    path = EXAMPLES / name
    loaded = example(name)
    measured = profile_costs(
        path.read_text(),
        str(path),
        loaded.model,
        loaded.args,
        lambda output: output.float().mean(),
        model,
        repeats=1,
        warmup=0,
        depth=depth,
    )
    # Output and live bytes are exact: shapes follow the source as torch runs it.
    assert [op.out_bytes for op in estimated.ops] == [op.out_bytes for op in measured.ops]
    assert [cut.live_bytes for cut in estimated.cuts] == [cut.live_bytes for cut in measured.cuts]
    # torch counts matrix products, convolutions and attention only; the estimate adds
    # the elementwise work around them (norms, activations, pooling), a few percent.
    for mine, theirs in zip(estimated.ops, measured.ops, strict=True):
        assert mine.flops is not None and theirs.flops is not None
        if theirs.flops > 0:
            assert theirs.flops <= mine.flops <= 1.15 * theirs.flops, mine.id
    total_mine = sum(op.flops or 0 for op in estimated.ops)
    total_theirs = sum(op.flops or 0 for op in measured.ops)
    assert total_theirs <= total_mine <= 1.05 * total_theirs


def test_the_estimate_round_trips_and_rewrites_the_source() -> None:
    path = EXAMPLES / "transformer_lm.py"
    costs = estimate_example("transformer_lm.py", "TransformerLM", [(8, 32)], 1)
    assert parse_costs(costs_to_json(costs)) == costs
    request = PlanRequest(stages=2, config=default_sync_config())
    result = rewrite_text(path.read_text(), str(path), TORCH, request, costs)
    assert result.rewritten.count("pipe_split()  # syncpass sync") == 1
    assert len(result.plan.stages) == 2
    assert costs.memory_multiplier == 4
    assert any("static estimate from source" in note for note in costs.notes)
    assert any("0 ops unsized" in note for note in costs.notes)


# --- exact counts on a hand-written model ------------------------------------------------

TWO_LINEAR = """
    import torch.nn as nn

    IN, HIDDEN = 16, 32


    class TwoLinear(nn.Module):
        def __init__(self, out: int = 8) -> None:
            super().__init__()
            self.fc1 = nn.Linear(IN, HIDDEN)
            self.fc2 = nn.Linear(HIDDEN, out, bias=False)

        def forward(self, x):
            h = self.fc1(x)
            y = self.fc2(h)
            return y
"""


def test_flops_compute_and_bytes_of_two_linear_layers() -> None:
    hardware = Hardware(alpha_s=1e-5, beta_bytes_per_s=1e9, flops_per_s=1e9)
    text = textwrap.dedent(TWO_LINEAR)
    estimate = estimate_costs(text, "m.py", None, [(4, 16)], hardware, dtype_bytes=2)
    first, second = estimate.costs.ops
    assert (first.id, second.id) == ("fc1", "fc2")
    assert first.flops == 2 * 4 * 16 * 32  # 2 x multiply-adds; the bias is not counted
    assert second.flops == 2 * 4 * 32 * 8
    assert first.compute_s == pytest.approx(first.flops / 1e9)
    assert first.backward_s == pytest.approx(2 * first.flops / 1e9)
    assert first.param_bytes == (16 * 32 + 32) * 2
    assert second.param_bytes == 32 * 8 * 2
    assert first.out_bytes == 4 * 32 * 2
    assert [(cut.after, cut.live_bytes) for cut in estimate.costs.cuts] == [("fc1", 4 * 32 * 2)]
    assert estimate.costs.hardware == hardware
    assert estimate.costs.batch_size == 4


ATTENTION = """
    import torch.nn as nn

    WIDTH = 8


    class Scores(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(WIDTH, WIDTH)
            self.query = nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            h = self.stem(x)
            q = self.query(h)
            scores = q @ h.transpose(-1, -2)
            return scores.relu()
"""


def test_the_inputs_part_of_the_backward_leaves_out_the_weights_half() -> None:
    hardware = Hardware(alpha_s=1e-5, beta_bytes_per_s=1e9, flops_per_s=1e9)
    text = textwrap.dedent(ATTENTION)
    estimate = estimate_costs(text, "m.py", None, [(2, 4, 8)], hardware)
    stem, query, scores, relu = estimate.costs.ops
    assert stem.backward_input_s == 0  # its input is data: only the weight's gradient
    assert query.backward_input_s == pytest.approx(query.backward_s / 2)
    assert scores.backward_input_s == scores.backward_s > 0  # two activations, no weight
    assert relu.backward_input_s == relu.backward_s > 0


def test_without_a_hardware_flop_rate_the_default_is_used_and_recorded() -> None:
    hardware = Hardware(alpha_s=1e-5, beta_bytes_per_s=1e9)
    estimate = estimate_with(TWO_LINEAR, [(4, 16)], hardware)
    first = estimate.costs.ops[0]
    assert first.compute_s == pytest.approx(2 * 4 * 16 * 32 / DEFAULT_FLOPS_PER_S)
    assert estimate.costs.hardware.flops_per_s == DEFAULT_FLOPS_PER_S
    assert "default" in estimate.costs.notes[0]


def test_inference_keeps_memory_at_one_byte_per_parameter_byte() -> None:
    estimate = estimate_with(TWO_LINEAR, [(4, 16)], HARDWARE, training=False)
    assert not estimate.costs.training
    assert estimate.costs.memory_multiplier == 1


def test_token_ids_are_int64_unless_told_otherwise() -> None:
    source = """
        from torch import nn

        class Tokens(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(100, 8)
                self.head = nn.Linear(8, 100)

            def forward(self, ids, scale):
                s = scale * 2
                h = self.embed(ids) * s
                return self.head(h)
    """
    estimate = estimate_with(source, [(2, 5), (2, 5, 8)], HARDWARE)
    # After the first op: ids (int64, first used by an nn.Embedding) and s (float32).
    assert estimate.costs.cuts[0].live_bytes == 2 * 5 * 8 + 2 * 5 * 8 * 4
    as_floats = estimate_with(
        source, [(2, 5), (2, 5, 8)], HARDWARE, input_dtypes=["float", "float"]
    )
    assert as_floats.costs.cuts[0].live_bytes == 2 * 5 * 4 + 2 * 5 * 8 * 4
    with pytest.raises(SyncpassError, match="'float' or 'int'"):
        estimate_with(source, [(2, 5), (2, 5, 8)], HARDWARE, input_dtypes=["int", "half"])


# --- what cannot be sized ------------------------------------------------------------------

UNSIZED = """
    import torch
    from torch import nn


    class Mixer(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            y = torch.einsum("btc,bsc->bts", x, x)
            return self.proj(y)


    class Net(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.inp = nn.Linear(8, dim)
            self.mix = Mixer(dim)
            self.rnn = nn.LSTM(dim, dim)
            self.out = nn.Linear(dim, 2)

        def forward(self, x):
            x = self.inp(x)
            x = self.mix(x)
            x, state = self.rnn(x)
            return self.out(x)
"""


def test_an_unsized_op_is_reported_with_its_line_and_gets_the_fallback() -> None:
    estimate = estimate_with(UNSIZED, [(4, 10, 8)], HARDWARE)
    by_id = {op.op_id: op for op in estimate.unsized}
    assert set(by_id) == {"mix", "rnn"}
    assert by_id["mix"].location == "m.py:26"
    assert "self.mix is Mixer(dim)" in by_id["mix"].reason
    assert "torch.einsum" in by_id["mix"].reason and "m.py:12" in by_id["mix"].reason
    assert by_id["rnn"].location == "m.py:27"
    assert "nn.LSTM" in by_id["rnn"].reason and "m.py:21" in by_id["rnn"].reason
    ops = {op.id: op for op in estimate.costs.ops}
    sized = [ops["inp"], ops["out"]]
    median = statistics.median(op.flops or 0 for op in sized)
    assert ops["mix"].flops == ops["rnn"].flops == median
    assert ops["mix"].compute_s == pytest.approx(median / HARDWARE.flops_per_s)  # type: ignore[operator]
    # Parameters still count where the constructor resolves (Mixer), not where it does not.
    assert ops["mix"].param_bytes == (16 * 16 + 16) * 4
    assert ops["rnn"].param_bytes == 0
    # Outputs take the input's shape: (4, 10, 16); x and state are one tensor, counted once.
    assert ops["mix"].out_bytes == ops["rnn"].out_bytes == 4 * 10 * 16 * 4
    assert "2 op(s) unsized (mix, rnn)" in estimate.costs.notes[0]
    assert str(estimate.unsized[0]).startswith("m.py:26: mix: ")


def test_a_branch_on_a_tensor_is_unsized_and_one_on_a_setting_is_followed() -> None:
    source = """
        from torch import nn

        class Net(nn.Module):
            def __init__(self, wide=True):
                super().__init__()
                if wide:
                    self.fc = nn.Linear(4, 64)
                else:
                    self.fc = nn.Linear(4, 8)

            def forward(self, x):
                x = self.fc(x)
                if x.sum() > 0:
                    x = x * 2
                return x
    """
    estimate = estimate_with(source, [(2, 4)], HARDWARE)
    assert estimate.costs.ops[0].flops == 2 * 2 * 4 * 64
    assert [(op.op_id, op.location) for op in estimate.unsized] == [("if@L14", "m.py:14")]
    assert "tensor's value" in estimate.unsized[0].reason


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("8x128", ((8, 128),)),
        ("8x3x64x64,8x64", ((8, 3, 64, 64), (8, 64))),
        (" 8 x 128 ", ((8, 128),)),
        ("16", ((16,),)),
        ("4X4", ((4, 4),)),
    ],
)
def test_input_shapes_parse(spec: str, expected: tuple[tuple[int, ...], ...]) -> None:
    assert parse_input_shapes(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("8x", "'nothing' where a size should be"),
        ("8xx128", "where a size should be"),
        ("8x-1", "'-1' where a size should be"),
        ("8x0", "at least 1"),
        ("8x128,", "shape 2 is empty"),
        ("eight", "'eight'"),
        ("8*128", "joined by 'x'"),
        ("8x1.5", "'1.5'"),
    ],
)
def test_bad_input_shapes_are_refused(spec: str, message: str) -> None:
    with pytest.raises(SyncpassError, match=message) as error:
        parse_input_shapes(spec)
    assert "8x128" in str(error.value)  # says what a good one looks like


def test_input_shapes_must_fit_the_forward() -> None:
    with pytest.raises(
        SyncpassError, match=r"2 input shape\(s\) for a forward that takes 1"
    ) as error:
        estimate_with(TWO_LINEAR, [(4, 16), (4, 16)], HARDWARE)
    assert error.value.location == "m.py:13"
    with pytest.raises(SyncpassError, match="at least one"):
        estimate_with(TWO_LINEAR, [], HARDWARE)
    with pytest.raises(SyncpassError, match="whole sizes"):
        estimate_with(TWO_LINEAR, [(4, 0)], HARDWARE)


def test_a_file_without_a_model_or_with_bad_syntax_is_an_error() -> None:
    with pytest.raises(SyncpassError, match="no model class"):
        estimate_with("x = 1\n", [(1,)], HARDWARE)
    with pytest.raises(SyncpassError, match="syntax error") as error:
        estimate_with("class M:\n    def forward(self x):\n        pass\n", [(1,)], HARDWARE)
    assert error.value.location == "m.py:2"


def test_the_model_class_defaults_to_the_one_no_other_class_builds() -> None:
    path = EXAMPLES / "transformer_lm.py"
    estimate = estimate_costs(path.read_text(), str(path), None, [(8, 32)], HARDWARE)
    assert estimate.costs.model == "TransformerLM"
    two_roots = textwrap.dedent(TWO_LINEAR) + textwrap.dedent(
        """
        class Other(nn.Module):
            def forward(self, x):
                return x
        """
    )
    with pytest.raises(SyncpassError, match="several model classes"):
        estimate_costs(two_roots, "m.py", None, [(4, 16)], HARDWARE)


def test_importing_the_estimate_does_not_import_torch() -> None:
    code = "import syncpass.backends.torch.estimate, sys; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_estimating_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from syncpass.backends.torch.estimate import estimate_costs\n"
        "from syncpass.contracts.hardware import load_profile\n"
        f"path = {str(EXAMPLES / 'unet.py')!r}\n"
        "hardware = load_profile('cpu-gloo-loopback').hardware\n"
        "estimate_costs(open(path).read(), path, 'UNet', [(8, 3, 32, 32)], hardware)\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_torch_is_only_the_tests_concern() -> None:
    # The estimate never needs torch (tests above); no module of it imports torch.
    package = sorted((REPO / "syncpass" / "backends" / "torch" / "estimate").glob("*.py"))
    assert package, "the estimate package has no modules"
    assert [path.name for path in package if "import torch" in path.read_text()] == []


def test_functional_max_pool_takes_ceil_mode_before_return_indices() -> None:
    torch = pytest.importorskip("torch")
    source = """
        import torch.nn as nn
        import torch.nn.functional as F


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3, padding=1)
                self.head = nn.Conv2d(4, 4, 1)

            def forward(self, x):
                h = self.conv(x)
                h = F.max_pool2d(h, 2, 2, 0, 1, True)
                return self.head(h)
        """
    estimate = estimate_with(source, [(2, 3, 5, 5)], HARDWARE)
    assert not estimate.unsized
    by_id = {op.id: op for op in estimate.costs.ops}
    # ceil_mode: a 5x5 map pooled by 2 gives 3x3, as torch computes it.
    expected = torch.nn.functional.max_pool2d(torch.zeros(2, 4, 5, 5), 2, 2, 0, 1, True)
    assert by_id["torch.nn.functional.max_pool2d@L14"].out_bytes == expected.numel() * 4


def test_a_keyword_only_default_it_cannot_evaluate_is_unknown_not_a_crash() -> None:
    source = """
        import enum
        import torch.nn as nn


        class Mode(enum.Enum):
            FAST = 1


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)
                self.fc2 = nn.Linear(8, 8)

            def forward(self, x, *, mode=Mode.FAST):
                h = self.fc(x)
                return self.fc2(h)
        """
    estimate = estimate_with(source, [(4, 8)], HARDWARE)
    assert [op.id for op in estimate.costs.ops] == ["fc", "fc2"]
    assert not estimate.unsized

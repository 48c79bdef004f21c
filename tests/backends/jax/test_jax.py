"""The JAX backend: analysis, rewrite (golden files), and real runs over several JAX devices."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from conftest import REPO

from syncpass.backends.jax.analysis import analyse_jax_model, jax_loop_containers
from syncpass.backends.jax.backend import BACKEND as JAX
from syncpass.backends.jax.example import line_map
from syncpass.backends.jax.rewrite import strip_jax_sync_points
from syncpass.cli import main
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, parse_costs
from syncpass.contracts.graph import OpGraph
from syncpass.contracts.hardware import cpu_devices
from syncpass.core.errors import SyncpassError
from syncpass.frontend.numbers import JAX_RULES, host_values
from syncpass.frontend.source import parse_source
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import rewrite_text
from syncpass.runtime.contracts import RunRequest
from syncpass.settings.formatting import formatter_line_length
from syncpass.transformers.jax_transfer import retarget_device_puts

ROOT = REPO
EXAMPLES = ROOT / "examples"
GOLDEN = REPO / "tests" / "golden" / "jax"
DATA = REPO / "tests" / "data"
MARKER = "# output:\n"
SIZES = {"TransformerLM": {"blocks": 4}, "Net": {"blocks": 4}}


def estimated_costs(text: str, path: str, name: str | None) -> Costs:
    """Deterministic costs from the source alone, as the torch golden cases make them."""
    module = parse_source(text, path)
    graph = analyse_jax_model(module, path, name, SIZES.get(name or "", {}), text)
    data = {
        "version": 1,
        "model": graph.model_class,
        "batch_size": 8,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": [
            {"id": op.id, "compute_s": 0.001 * (1 + index % 3), "backward_s": 0.002}
            for index, op in enumerate(graph.ops)
        ],
        "cuts": [{"after": cut.after, "live_bytes": 65536 * len(cut.live)} for cut in graph.cuts],
    }
    return parse_costs(data)


def rewrite(text: str, path: str, name: str | None, stages: int) -> str:
    costs = estimated_costs(strip_jax_sync_points(text, path, name), path, name)
    request = PlanRequest(
        stages=stages, config=SyncConfig().replace(communication_cost_threshold=float("inf"))
    )
    return rewrite_text(text, path, JAX, request, costs, class_name=name).rewritten


CASES = [
    ("jax_mlp.py", None, "forward"),
    ("flax_lm.py", "TransformerLM", "TransformerLM"),
]


def test_mlp_ops_are_named_by_their_weights() -> None:
    text = (EXAMPLES / "jax_mlp.py").read_text()
    graph = analyse_jax_model(parse_source(text, "m.py"), "m.py", text=text)
    assert [op.id for op in graph.ops] == ["w1", "w2", "w3", "w4", "w5"]
    assert graph.inputs == ("x",)  # the weights never cross a sync point
    assert all(cut.live == ("h",) for cut in graph.cuts)
    assert (
        graph.ops[0].location.line
        == text.splitlines().index(
            '    h = jax.nn.gelu(x @ params["w1"] + params["b1"])  # (batch, 256)'
        )
        + 1
    )


def test_flax_call_is_read_like_a_torch_forward() -> None:
    text = (EXAMPLES / "flax_lm.py").read_text()
    graph = analyse_jax_model(
        parse_source(text, "lm.py"), "lm.py", "TransformerLM", {"blocks": 4}, text
    )
    ids = [op.id for op in graph.ops]
    assert ids[1:] == ["wte", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "head"]
    assert graph.inputs == ("tokens",)


def test_a_loop_over_a_list_of_weight_dicts_is_planned_per_layer() -> None:
    text = (DATA / "jax_layer_list.py").read_text()
    module = parse_source(text, "m.py")
    assert jax_loop_containers(module, None, "m.py") == ("layers",)
    graph = analyse_jax_model(module, "m.py", sizes={"layers": 6}, text=text)
    ids = [op.id for op in graph.ops]
    assert ids[1:] == ["embed", *(f"layers.{k}" for k in range(6)), "head"]
    # The mask every layer reads crosses every cut inside the loop; the weights never do.
    inside = [cut for cut in graph.cuts if cut.after.startswith("layers.")]
    assert all(set(cut.live) == {"mask", "x"} for cut in inside[:-1])
    # Unsized (no example, no cost file listing the layers), the loop is one region.
    unsized = analyse_jax_model(module, "m.py", text=text)
    assert any('params["layers"]' in region.reason for region in unsized.regions)


def test_a_loop_over_a_local_list_stays_one_region() -> None:
    text = """
import jax

def forward(params, x):
    steps = [params["a"], params["b"]]
    for w in steps:
        x = x @ w
    return x
"""
    module = parse_source(text, "m.py")
    assert jax_loop_containers(module, None, "m.py") == ()
    graph = analyse_jax_model(module, "m.py", sizes={"steps": 2}, text=text)
    assert [op.region is not None for op in graph.ops] == [False, True]


#: The end-to-end runs split into 4 stages: a first, a middle and a last stage. Two-device
#: runs are the GPipe and scan-slice tests' (every model at 2 and 4 took a third of the
#: suite's JAX time for no path the 4-stage run does not take).
RUN_STAGES = [4]


def rewrite_run_verify(
    data_file: str, stages: int, tmp_path: Path, options: tuple[str, ...] = ()
) -> str:
    """``rewrite --example`` of a file of tests/data into ``stages`` stages, planned for
    balance alone (``--threshold inf``: the model is small beside this machine's link) with
    ``options``, then ``run --verify``, checked; the rewritten text."""
    model = tmp_path / data_file
    original = (DATA / data_file).read_text()
    model.write_text(original)
    out = tmp_path / "model_sync.py"
    figures = tmp_path / "run.json"
    syncpass = [sys.executable, "-m", "syncpass"]
    for args in (
        ["rewrite", "--backend", "jax", str(model), "--example", f"{model}:example",
         "--stages", str(stages), "--threshold", "inf", *options, "-o", str(out)],
        ["run", "--backend", "jax", "--stages", str(stages), "--verify", str(out),
         "--steps", "1", "--json-report", str(figures)],
    ):  # fmt: skip
        done = subprocess.run([*syncpass, *args], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    written = out.read_text()
    assert written.count("# syncpass sync ") == stages - 1
    assert JAX.strip(written, str(out), None) == original
    document = json.loads(figures.read_text())
    assert document["verify"]["ok"]
    assert document["verify"]["parameters_compared"] == document["verify"]["model_parameters"]
    assert len(document["stage_reports"]) == stages
    return written


@pytest.mark.slow
@pytest.mark.parametrize("stages", RUN_STAGES)
def test_a_layer_list_model_splits_per_layer_and_verifies(stages: int, tmp_path: Path) -> None:
    written = rewrite_run_verify("jax_layer_list.py", stages, tmp_path)
    assert 'for layer in params["layers"][' in written  # the loop is split between layers


@pytest.mark.parametrize(("file", "name", "model"), CASES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_rewrite_guarantees(file: str, name: str | None, model: str, stages: int) -> None:
    text = (EXAMPLES / file).read_text()
    out = rewrite(text, file, name, stages)
    if stages == 1:
        assert out == text
        return
    assert out.count("# syncpass sync") == stages - 1
    assert out.count("jax.device_put(") == stages - 1
    assert rewrite(out, file, name, stages) == out  # idempotent
    assert strip_jax_sync_points(out, file, name) == text  # strips back to the input
    kept = [line for line in out.splitlines() if "# syncpass sync" not in line]
    assert set(text.splitlines()) >= {line for line in kept if "self.blocks[" not in line}


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("*.py")), ids=lambda path: path.stem)
def test_golden(golden: Path) -> None:
    source, _, expected = golden.read_text().partition(MARKER)
    first = source.splitlines()[0]
    stages = int(first.split("--stages")[1].split()[0])
    name = first.split("--model")[1].split()[0] if "--model" in first else None
    assert rewrite(source, golden.name, name, stages) == expected


def test_adds_import_jax_when_missing_and_removes_it_again() -> None:
    text = (
        "from jax import numpy as jnp\n\n\n"
        "def forward(params, x):\n"
        '    h = jnp.tanh(x @ params["a"])\n'
        '    return h @ params["b"]\n'
    )
    out = rewrite(text, "f.py", None, 2)
    assert "import jax  # syncpass sync: imported for the transfers\n" in out
    assert "    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/1:" in out
    assert strip_jax_sync_points(out, "f.py") == text
    by_hand = "".join(line for line in out.splitlines(True) if "# syncpass sync" not in line)
    assert by_hand == text  # deleting every "# syncpass sync" line gives the input back


def test_strip_keeps_the_users_own_import_jax() -> None:
    """A file that imports jax but uses it for nothing else keeps its import when stripped."""
    text = (
        "import jax\n"
        "from jax import numpy as jnp\n\n\n"
        "def forward(params, x):\n"
        '    h = jnp.tanh(x @ params["a"])\n'
        '    return h @ params["b"]\n'
    )
    out = rewrite(text, "f.py", None, 2)
    assert out.count("import jax") == 1  # the user's, unmarked; nothing added
    assert "    h = jax.device_put(h, jax.devices()[1])  # syncpass sync 1/1:" in out
    assert strip_jax_sync_points(out, "f.py") == text
    assert rewrite(out, "f.py", None, 2) == out


def test_strip_keeps_an_import_jax_only_hand_written_transfers_use() -> None:
    text = (
        "import jax\n\n\n"
        "def forward(params, x):\n"
        '    h = x @ params["a"]\n'
        "    h = jax.device_put(h, jax.devices()[1])  # mine\n"
        '    h = h @ params["b"]\n'
        '    return h @ params["c"]\n'
    )
    out = rewrite(text, "f.py", None, 3)
    assert "# mine" in out and out.count("# syncpass sync") == 1
    assert strip_jax_sync_points(out, "f.py") == text
    stripped_by_hand = "".join(
        line for line in out.splitlines(keepends=True) if "# syncpass sync" not in line
    )
    assert stripped_by_hand == text


def test_cli_rewrite_backend_jax_check(tmp_path: Path) -> None:
    from syncpass.cli import main
    from syncpass.contracts.costs import costs_to_json

    model = tmp_path / "mlp.py"
    model.write_text((EXAMPLES / "jax_mlp.py").read_text())
    costs = tmp_path / "mlp.costs.json"
    costs.write_text(json.dumps(costs_to_json(estimated_costs(model.read_text(), "m", None))))
    args = ["rewrite", str(model), "--backend", "jax", "--costs", str(costs), "--stages", "2"]
    assert main([*args, "--check"]) == 1
    assert main([*args, "--in-place"]) == 0
    assert main([*args, "--check"]) == 0
    assert "jax.device_put" in model.read_text()


def test_a_piece_keeps_its_residuals_for_the_backward_but_not_its_weights() -> None:
    import jax.numpy as jnp

    from syncpass.backends.jax.measure import _kept_for_backward

    weight, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    saved, read = _kept_for_backward(
        lambda w, v: jnp.tanh(v @ w) @ w, ["w", "x"], [weight, x], {"w"}
    )
    assert read == x.nbytes  # the input, not the weight
    # x (for the weight's gradient), tanh's output and what its derivative needs: 4 x 8 each
    assert saved >= 2 * x.nbytes and saved % x.nbytes == 0
    assert saved < weight.nbytes + 4 * x.nbytes


def test_importing_syncpass_does_not_import_jax() -> None:
    code = (
        "import sys, syncpass, syncpass.cli, syncpass.backends.jax.rewrite, syncpass.backends.jax.analysis\n"
        "syncpass.cli.build_parser()\n"
        "assert 'jax' not in sys.modules, 'jax imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("file", ["jax_mlp.py", "flax_lm.py"])
@pytest.mark.parametrize("stages", RUN_STAGES)
def test_end_to_end_profile_rewrite_run_verify(file: str, stages: int, tmp_path: Path) -> None:
    """profile -> rewrite -> run --verify, on `stages` CPU devices (the Flax LM's blocks
    rematerialised too)."""
    model = tmp_path / file
    model.write_text((EXAMPLES / file).read_text())
    costs = tmp_path / "model.costs.json"
    syncpass = [sys.executable, "-m", "syncpass"]

    def run(*args: str) -> str:
        done = subprocess.run(
            [*syncpass, *args], capture_output=True, text=True, cwd=tmp_path, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("profile", "--backend", "jax", str(model), "-o", str(costs), "--repeats", "2")
    # What each op keeps for its backward (its pull-back's residuals, weights left out) and
    # reads: the figures --recompute plans with.
    measured = json.loads(costs.read_text())["ops"]
    assert any(op["saved_bytes"] > op["input_bytes"] > 0 for op in measured)
    planned = run("plan", "--costs", str(costs), "--stages", "2", "--recompute", "all")
    assert "recompute every block" in planned
    out = tmp_path / "model_sync.py"
    # The Flax LM's blocks are rematerialised as well (Flax's remat): the run checks that
    # the gradients are the unsplit model's all the same.
    recompute = ["--recompute", "all"] if file == "flax_lm.py" else []
    run(
        "rewrite", "--backend", "jax", str(model), "--costs", str(costs),
        "--stages", str(stages), "--threshold", "inf", *recompute, "-o", str(out),
    )  # fmt: skip
    written = out.read_text()
    assert written.count("# syncpass sync") == stages - 1
    if recompute:
        remat = "x = nn.remat(lambda block, x: block(x))(block, x)"
        assert 0 < written.count(remat) == written.count("# syncpass recompute: blocks.")
        assert sum(f"blocks.{i}" in written for i in range(4)) == 4
    figures = tmp_path / "run.json"
    report = run(
        "run", "--backend", "jax", "--stages", str(stages), "--verify", str(out),
        "--microbatches", "2", "--steps", "1", "--json-report", str(figures),
    )  # fmt: skip
    assert "verify: ok" in report
    assert "2 of 2 micro-batch loss(es) match" in report
    for stage in range(stages):
        assert f"cpu:{stage}" in report
    document = json.loads(figures.read_text())
    assert (document["backend"], document["microbatches"]) == ("jax", 2)
    assert [row["stage"] for row in document["stage_reports"]] == list(range(stages))
    for row in document["stage_reports"]:
        # Compute is timed on separate, waited-for steps: on a busy machine it may exceed the
        # overlapped step, so only the signs are certain.
        assert row["compute_s"] > 0 and row["step_s"] > 0 and row["comm_wait_s"] >= 0
    # A stage may hold no weights (a plan may give one stage only the position ids), but every
    # weight of the model is placed on exactly one stage: none shared, none lost.
    placed = [row["parameter_tensors"] for row in document["stage_reports"]]
    assert sum(placed) == document["verify"]["model_parameters"] and max(placed) > 0
    assert document["verify"]["ok"] and len(document["verify"]["losses"]) == 2


def test_compact_flax_call_names_inline_submodules_by_their_class() -> None:
    text = (DATA / "flax_compact.py").read_text()
    graph = analyse_jax_model(parse_source(text, "c.py"), "c.py", text=text)
    assert [op.id for op in graph.ops] == [
        "flax.linen.gelu@L22",
        "flax.linen.LayerNorm@L23",
        "jax.numpy.tanh@L24",
        "flax.linen.Dense@L25",
    ]
    assert all(cut.live == ("h",) for cut in graph.cuts)


@pytest.mark.slow
def test_compact_flax_profile_rewrite_run_verify(tmp_path: Path) -> None:
    """An @nn.compact model: profile -> rewrite (3 stages) -> run --verify, 2 micro-batches."""
    model = tmp_path / "compact.py"
    model.write_text((DATA / "flax_compact.py").read_text())
    costs, out = tmp_path / "compact.costs.json", tmp_path / "compact_sync.py"
    for args in (
        ["profile", "--backend", "jax", str(model), "-o", str(costs), "--repeats", "1"],
        ["rewrite", "--backend", "jax", str(model), "--costs", str(costs), "--stages", "3",
         "--threshold", "inf", "-o", str(out)],
    ):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "syncpass", *args], capture_output=True,
                              text=True, cwd=tmp_path, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
    costs_data = json.loads(costs.read_text())
    assert costs_data["ops"][-1]["id"] == "flax.linen.Dense@L25"
    # One line each, or one argument a line where the comment makes the line too long.
    assert len(re.findall(r"jax\.device_put\(\s*h,", out.read_text())) == 2
    done = subprocess.run(
        [sys.executable, "-m", "syncpass", "run", "--backend", "jax", "--stages", "3",
         "--verify", "--microbatches", "2", "--steps", "1", str(out)],
        capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "verify: ok: 8 of 8 parameter(s) compared with the unsplit model" in done.stdout


GPIPE_CHECK = """
import jax, jax.numpy as jnp
from syncpass.backends.jax import pipeline as jax_pipeline
from syncpass.backends.jax.pipeline import GPipe, pipeline

def forward(params, x, ids):
    h = jnp.tanh(x @ params["w1"])                       # stage 0
    h, ids = jax.device_put((h, ids), jax.devices()[1])  # an integer value crosses too
    skip = h
    h = jnp.tanh(h @ params["w2"] + params["w1"].sum())  # w1 read again on stage 1
    h, skip, ids = jax.device_put((h, skip, ids), jax.devices()[2])
    return (h + skip) @ params["w3"] + ids[:, None]

def loss_fn(out, target):
    return jnp.mean((out - target) ** 2)

keys = jax.random.split(jax.random.key(0), 5)
params = {"w1": jax.random.normal(keys[0], (8, 16)), "w2": jax.random.normal(keys[1], (16, 16)),
          "w3": jax.random.normal(keys[2], (16, 4))}
x = jax.random.normal(keys[3], (12, 8))
ids = jnp.arange(12, dtype=jnp.int32)
y = jax.random.normal(keys[4], (12, 4))
M = 3
batches = [((x[i::M], ids[i::M]), y[i::M]) for i in range(M)]
staged = pipeline(forward, params, *batches[0][0])
assert [str(s.device) for s in staged.stages] == ["cpu:0", "cpu:1", "cpu:2"]
for stage in staged.stages:  # each stage's weights were placed on its device when built
    assert all(w.devices() == {stage.device} for w in stage.placed_weights)
assert [len(s.placed_weights) for s in staged.stages] == [1, 2, 1]
result = GPipe(staged, loss_fn)(batches)
timed = GPipe(staged, loss_fn)(batches, timed=True)
assert len(timed.stage_compute_s) == 3 and all(t > 0 for t in timed.stage_compute_s)
whole = jax.jit(jax.value_and_grad(lambda p, a, t: loss_fn(forward(p, *a), t)))
total = None
for (args, target), loss in zip(batches, result.losses):
    want, grads = whole(params, args, target)
    assert abs(float(loss) - float(want)) <= 1e-6 + 1e-5 * abs(float(want)), (loss, want)
    total = grads if total is None else jax.tree_util.tree_map(jnp.add, total, grads)
for key in params:
    got = jax.device_put(result.grads[key], jax.devices()[0])
    assert jnp.allclose(got, total[key] / M, rtol=1e-5, atol=1e-6), key
assert result.grads["w2"].devices() == {jax.devices()[1]}
# w1, read by stages 0 and 1, has its gradient where staged.params has it: on its owner.
for key, weight in staged.params.items():
    assert result.grads[key].devices() == weight.devices(), key
assert result.grads["w1"].devices() == {jax.devices()[0]}
updated = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, staged.params, result.grads)
# Called with the weights it was built with, the staged function moves no weight.
moved = []
original = jax_pipeline.jax.device_put
def counting(value, device=None, *rest, **named):
    moved.append(value)
    return original(value, device, *rest, **named)
jax_pipeline.jax.device_put = counting
out = staged(params, *batches[0][0])
jax_pipeline.jax.device_put = original
assert not any(any(value is w for w in params.values()) for value in moved), "a weight moved"
eager = jax.device_put(forward(params, *batches[0][0]), jax.devices()[0])
assert jnp.allclose(jax.device_put(out, jax.devices()[0]), eager)
print("ok")
"""


@pytest.mark.slow
def test_gpipe_matches_the_unsplit_model_on_three_devices() -> None:
    """Micro-batches through three jitted stages: losses and accumulated gradients as unsplit."""
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=3", JAX_PLATFORMS="cpu"
    )
    done = subprocess.run(
        [sys.executable, "-c", GPIPE_CHECK], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ("--schedule 1f1b", "--schedule 1f1b: the JAX run has the gpipe schedule only"),
        ("--device cuda", "--device cuda: the JAX run puts its stages on N host (CPU) devices"),
        ("--threads 2", "--threads 2: the JAX run's one process holds every stage"),
        ("--timeline TIMELINE", "--timeline: the timeline profiles torch pipelines only"),
    ],
)
def test_run_refuses_a_flag_it_cannot_honour(
    flags: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each flag the JAX run does not honour is refused before anything starts, with why."""
    from syncpass.cli import main as cli_main

    model = tmp_path / "model.py"
    model.write_text("def forward(params, x):\n    return x\n")
    costs = tmp_path / "model.costs.json"
    costs.write_text((ROOT / "examples" / "costs" / "gpt_24x1024.costs.json").read_text())
    flags = flags.replace("TIMELINE", str(tmp_path / "t")).replace("COSTS", str(costs))
    argv = ["run", str(model), "--backend", "jax", "--stages", "2", *flags.split()]
    assert cli_main(argv) == 2
    assert f"--backend jax cannot honour {reason}" in capsys.readouterr().err


def test_run_refuses_costs_as_the_backend_has_no_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--costs needs the backend's predict hook; the JAX spec has none, so nothing starts."""
    from syncpass.cli import main as cli_main

    model = tmp_path / "model.py"
    model.write_text("def forward(params, x):\n    return x\n")
    costs = ROOT / "examples" / "costs" / "gpt_24x1024.costs.json"
    argv = ["run", str(model), "--backend", "jax", "--stages", "2", "--costs", str(costs)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "the jax backend has no prediction of a run" in err
    assert "drop --costs" in err


@pytest.mark.parametrize("flags", ["", "--schedule gpipe", "--device cpu", "--threads 1"])
def test_run_honours_the_defaults_and_what_it_runs(flags: str, tmp_path: Path) -> None:
    """gpipe (its default), the CPU and the default thread count pass the refusals."""
    from syncpass.backends.jax.run import refusals
    from syncpass.cli import build_parser
    from syncpass.commands.run import request_from_args

    model = tmp_path / "model.py"
    model.write_text("def forward(params, x):\n    return x\n")
    argv = ["run", str(model), "--backend", "jax", "--stages", "2", *flags.split()]
    args = build_parser().parse_args(argv)
    request = request_from_args(args, JAX.schedules[0])
    assert request.schedule == "gpipe"
    assert refusals(request) == []


# --- host values, hand-written transfers, errors -------------------------------------------

SHAPES = """\
import jax
import jax.numpy as jnp


def forward(params, x):
    b, t, d = x.shape
    h = jnp.tanh(x @ params["w1"])
    h = jnp.tanh(h @ params["w2"])
    h = h.reshape(b, t * d)
    return h @ params["w3"]


def example():
    ks = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(ks[0], (8, 8)), "w2": jax.random.normal(ks[1], (8, 8)),
              "w3": jax.random.normal(ks[2], (32, 4))}
    return forward, params, (jax.random.normal(ks[3], (8, 4, 8)),)
"""

FLAX_OBJECTS = """\
import jax
import flax.linen as nn


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False, mode="sum"):
        act = nn.relu
        drop = nn.Dropout(0.5, deterministic=not train)
        h = nn.Dense(16)(x)
        h = act(h)
        h = drop(h)
        h = nn.Dense(16)(h)
        return nn.Dense(4)(h)


def example():
    model = Net()
    x = jax.random.normal(jax.random.key(1), (8, 8))
    return model, model.init(jax.random.key(0), x), (x,)
"""

PINNED = """\
import jax
import jax.numpy as jnp


def forward(params, x):
    h = jnp.tanh(x @ params["w1"])
    h = jnp.tanh(h @ params["w2"])
    h = jax.device_put(h, jax.devices()[1])
    h = jnp.tanh(h @ params["w3"])
    return h @ params["w4"]


def example():
    ks = jax.random.split(jax.random.key(0), 5)
    params = {f"w{i}": jax.random.normal(ks[i - 1], (8, 8)) for i in range(1, 5)}
    return forward, params, (jax.random.normal(ks[4], (8, 8)),)
"""

TRACE_ERROR = """\
import jax.numpy as jnp
from jax import random


def forward(params, x):
    h = jnp.tanh(x @ params["w1"])
    if h.sum() > 0:  # a traced value as a Python bool
        h = h * 2
    return h @ params["w2"]


def example():
    ks = random.split(random.key(0), 3)
    params = {"w1": random.normal(ks[0], (8, 8)), "w2": random.normal(ks[1], (8, 4))}
    return forward, params, (random.normal(ks[2], (8, 8)),)
"""


def graph_of(text: str, name: str | None = None) -> OpGraph:
    return analyse_jax_model(parse_source(text, "m.py"), "m.py", name, text=text)


def test_sizes_never_cross_a_sync_point() -> None:
    graph = graph_of(SHAPES)
    assert [(cut.after, cut.live) for cut in graph.cuts] == [
        ("stmt@L6", ("x",)),  # b, t, d are Python ints in the trace
        ("w1", ("h",)),
        ("w2", ("h",)),
        ("h.reshape@L9", ("h",)),
    ]


def test_flax_settings_submodules_and_functions_never_cross_a_sync_point() -> None:
    graph = graph_of(FLAX_OBJECTS)
    assert graph.inputs == ("x", "train", "mode")
    assert {cut.live for cut in graph.cuts} == {("x",), ("h",)}


def test_a_cut_with_only_host_values_live_is_no_sync_point() -> None:
    text = (
        "import jax.numpy as jnp\n\n\n"
        "def forward(params, x):\n"
        "    n = x.shape[0]\n"
        "    k = n * 2\n"
        '    h = jnp.ones((k, 4)) @ params["w"]\n'
        '    return h @ params["v"]\n'
    )
    graph = graph_of(text)
    assert [op.id for op in graph.ops] == ["stmt@L5", "operator.mul@L6", "w", "v"]
    assert [(cut.after, cut.live) for cut in graph.cuts] == [("w", ("h",))]


def test_the_rewrite_moves_only_arrays() -> None:
    text = SHAPES.replace("b, t, d = x.shape", "b, t, d = x.shape  # syncpass: sync")
    out = rewrite(text, "m.py", None, 2)
    assert (
        "    b, t, d = x.shape  # syncpass: sync\n"
        "    x = jax.device_put(x, jax.devices()[1])  # syncpass sync 1/1:"
    ) in out
    assert strip_jax_sync_points(out, "m.py") == text


def test_host_value_rules() -> None:
    function = cst.ensure_type(
        cst.parse_statement(
            "def f(x, n: int, name: str, scale=2.0, label='a', mask=None):\n"
            "    b, t = x.shape\n"
            "    size = len(x) + x.ndim\n"
            "    layer = nn.Dense(4)\n"
            "    key = jax.random.PRNGKey(0)\n"
            "    act = jax.nn.gelu\n"
            "    square = lambda z: z * z\n"
            "    part = functools.partial(act, approximate=True)\n"
            "    h = layer(x)\n"
            "    m = b\n"
            "    m = h\n"
            "    def helper(z):\n"
            "        return z\n"
        ),
        cst.FunctionDef,
    )
    module = parse_source("import functools\nimport jax\nimport flax.linen as nn\n", "m.py")
    jax_names = host_values(function, module, rules=JAX_RULES).names
    expected = {"n", "name", "scale", "label", "b", "t", "size", "layer", "act", "square"}
    assert jax_names == expected | {"part", "helper"}
    numbers = host_values(function, module).names  # the lint's rules: numbers only
    assert numbers == {"n", "scale", "b", "t", "size"}


def test_device_put_without_a_device_is_no_sync_point() -> None:
    def graph_with(line: str) -> OpGraph:
        return graph_of(
            "import jax\n\n\n"
            "def forward(params, x):\n"
            '    h = x @ params["a"]\n'
            f"    {line}\n"
            '    return h @ params["b"]\n'
        )

    for line in ("h = jax.device_put(h)", "h = jax.device_put(h, device=None)"):
        graph = graph_with(line)
        assert [op.id for op in graph.ops] == ["a", "jax.device_put@L6", "b"], line
        assert not graph.written and not any(cut.pinned for cut in graph.cuts), line
    for line in (
        "h = jax.device_put(h, jax.devices()[1])",
        "h = jax.device_put(h, device=jax.devices()[1])",
    ):
        graph = graph_with(line)
        assert [op.id for op in graph.ops] == ["a", "b"], line
        assert graph.written == ("a",) and graph.cuts[0].pinned, line


@pytest.mark.slow
def test_the_pipeline_splits_only_at_a_device_put_to_a_device() -> None:
    import jax
    import jax.numpy as jnp

    from syncpass.backends.jax.pipeline import pipeline

    def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        h = jax.device_put(x @ params["a"])  # no device: no stage boundary
        h = jax.device_put(h, device=None)
        h = jax.device_put(jnp.tanh(h), jax.devices()[0])  # a stage boundary
        return h @ params["b"]

    params = {"a": jnp.ones((4, 4)), "b": jnp.ones((4, 2))}
    assert len(pipeline(forward, params, jnp.ones((2, 4))).stages) == 2


def test_retarget_points_every_transfer_at_one_device() -> None:
    before = (
        "from jax import device_put, devices\n\n\n"
        "def forward(params, x):\n"
        '    h = x @ params["a"]\n'
        "    h = device_put(h, devices()[2])  # mine\n"
        "    h = device_put(h, device=devices()[1])\n"
        "    h = device_put(h)\n"
        '    return h @ params["b"]\n'
    )
    after = (
        "from jax import device_put, devices\n"
        "import jax\n\n\n"
        "def forward(params, x):\n"
        '    h = x @ params["a"]\n'
        "    h = device_put(h, jax.devices()[0])  # mine\n"
        "    h = device_put(h, device=jax.devices()[0])\n"
        "    h = device_put(h)\n"
        '    return h @ params["b"]\n'
    )
    module = parse_source(before, "m.py")
    assert retarget_device_puts(module, 0, "m.py").code == after


def test_line_map_reads_a_probed_copy_back_to_the_file() -> None:
    original = "a\nfor b in s:\n    h = b(h)\nreturn h\n"
    copy = "a\nfor b in s[:2]:\n    h = b(h)\nprobe\nfor b in s[2:]:\n    h = b(h)\nreturn h\n"
    assert line_map(copy, original) == {1: 1, 2: 2, 3: 3, 4: 2, 5: 2, 6: 3, 7: 4}


def profile(tmp_path: Path, text: str) -> Costs:
    from syncpass.backends.jax.profile import measure_jax_file

    model = tmp_path / "model.py"
    model.write_text(text)
    return measure_jax_file(model, text, "example", None, repeats=1, warmup=0)


@pytest.mark.slow
@pytest.mark.parametrize("text", [SHAPES, FLAX_OBJECTS], ids=["shapes", "flax"])
def test_profile_probes_only_arrays(text: str, tmp_path: Path) -> None:
    costs = profile(tmp_path, text)
    graph = graph_of(text)
    assert [op.id for op in costs.ops] == [op.id for op in graph.ops]
    assert [cut.after for cut in costs.cuts] == [cut.after for cut in graph.cuts]
    assert all(cut.live_bytes > 0 for cut in costs.cuts)
    assert costs.hardware.devices == cpu_devices()  # the host devices share these cores


@pytest.mark.slow
def test_profile_a_model_with_a_hand_written_transfer_on_one_device(tmp_path: Path) -> None:
    costs = profile(tmp_path, PINNED)
    assert [op.id for op in costs.ops] == ["w1", "w2", "w3", "w4"]
    assert [(cut.after, cut.live_bytes, cut.pinned) for cut in costs.cuts] == [
        ("w1", 256, False),
        ("w2", 256, True),  # what the user's transfer moves
        ("w3", 256, False),
    ]


@pytest.mark.slow
def test_profile_reports_a_model_error_at_the_files_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncpass.cli import main

    model = tmp_path / "model.py"
    model.write_text(TRACE_ERROR)  # no `import jax`: the probed copy gets one, lines shift
    status = main(["profile", "--backend", "jax", str(model), "-o", str(tmp_path / "c.json")])
    assert status == 2
    error = capsys.readouterr().err
    assert f"{model}:7: tracing the model failed: TracerBoolConversionError" in error


def test_run_child_refuses_a_file_with_more_stages_before_tracing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from syncpass.backends.jax import run as jax_run

    model = tmp_path / "model.py"
    model.write_text(PINNED.replace("jax.devices()[1])", "jax.devices()[1])\n    h = h * 1\n"
                                    "    h = jax.device_put(h, jax.devices()[2])"))  # fmt: skip
    status = jax_run.main([str(model), f"{model}:example", "2", "1", "0", "1e-5", "1e-6", "0"])
    assert status == 2
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report == {
        "error": "the file has 2 sync point(s), so 3 stage(s), not 2; rewrite it with "
        "--stages 2, or run it with --stages 3",
        "location": str(model),
    }


@pytest.mark.slow
def test_run_reports_a_model_error_at_the_files_line(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text(TRACE_ERROR)
    request = RunRequest(str(model), f"{model}:example", 1, schedule="gpipe", steps=1)
    with pytest.raises(SyncpassError) as raised:
        JAX.need("run", "run it")(request)
    assert raised.value.location == f"{model}:7"
    assert raised.value.message.startswith(
        "the JAX run failed: TracerBoolConversionError: Attempted boolean conversion"
    )


@pytest.mark.slow
def test_host_values_stay_out_of_a_three_stage_run(tmp_path: Path) -> None:
    """Sizes unpacked before a sync point, a Flax `train` flag, submodules and functions built
    in `__call__`: rewritten for 3 stages, run and verified against the unsplit model."""
    from syncpass.contracts.costs import costs_to_json

    pinned = SHAPES.replace("b, t, d = x.shape", "b, t, d = x.shape  # syncpass: sync")
    for name, text in (("shapes.py", pinned), ("flax_objects.py", FLAX_OBJECTS)):
        model, costs, out = tmp_path / name, tmp_path / f"{name}.json", tmp_path / f"s_{name}"
        model.write_text(text)
        costs.write_text(json.dumps(costs_to_json(estimated_costs(text, name, None))))
        for args in (
            ["rewrite", "--backend", "jax", str(model), "--costs", str(costs), "--stages", "3",
             "--threshold", "inf", "-o", str(out)],
            ["run", "--backend", "jax", "--stages", "3", "--verify", "--microbatches", "2",
             "--steps", "1", str(out), "--example", f"{model}:example"],
        ):  # fmt: skip
            done = subprocess.run([sys.executable, "-m", "syncpass", *args], capture_output=True,
                                  text=True, cwd=tmp_path, check=False)  # fmt: skip
            assert done.returncode == 0, done.stderr
        assert "verify: ok" in done.stdout
    written = (tmp_path / "s_shapes.py").read_text()
    assert re.search(r"\n    x = jax\.device_put\(\s*x,\s*jax\.devices\(\)\[1\],?\s*\)", written)


NESTED_SIZES = {"body.stack.blocks": 6}


def test_a_flax_layer_stack_two_submodules_deep_is_planned_per_block() -> None:
    """Hugging Face's Flax layout: the model calls a body, which calls the block loop."""
    text = (DATA / "flax_nested.py").read_text()
    module = parse_source(text, "flax_nested.py")
    graph = analyse_jax_model(module, "flax_nested.py", "LanguageModel", NESTED_SIZES, text)
    ids = [op.id for op in graph.ops]
    assert [op_id for op_id in ids if op_id.startswith("body.stack.blocks.")] == [
        f"body.stack.blocks.{index}" for index in range(6)
    ]
    assert graph.inlined == ("self.body", "self.body.stack")
    assert jax_loop_containers(module, "LanguageModel", "flax_nested.py") == ("body.stack.blocks",)
    lines = text.splitlines()
    # Each op is at its line of the file, in the class it is written in.
    embed = graph.op("body.embed")
    assert lines[embed.location.line - 1].strip() == "hidden = self.embed(tokens)"
    block = graph.op("body.stack.blocks.3")
    assert lines[block.location.line - 1].strip() == "for block in self.blocks:"
    # The mask every block reads crosses the cuts between blocks; `every`, a Python value
    # (None), never does; no cut falls between `return_dict = True` (bound) and Body.
    live = {cut.after: cut.live for cut in graph.cuts}
    assert live["body.stack.blocks.2"] == ("mask", "hidden")
    assert (
        ids[0]
        == f"stmt@L{lines.index('        outputs = self.body(tokens, keep_all=keep_all)') + 1}"
    )
    assert ids[0] not in {cut.after for cut in graph.cuts}


def test_a_sync_point_inside_a_submodule_call_is_written_in_that_call(tmp_path: Path) -> None:
    text = (DATA / "flax_nested.py").read_text()
    path = "flax_nested.py"
    module = parse_source(text, path)
    graph = analyse_jax_model(module, path, "LanguageModel", NESTED_SIZES, text)
    data = {
        "version": 1,
        "model": "LanguageModel",
        "batch_size": 8,
        "hardware": {"alpha_s": 1e-6, "beta_bytes_per_s": 1e12},
        "ops": [
            {"id": op.id, "compute_s": 0.004 if ".blocks." in op.id else 1e-5, "backward_s": 0.0}
            for op in graph.ops
        ],
        "cuts": [{"after": cut.after, "live_bytes": 1024} for cut in graph.cuts],
    }
    request = PlanRequest(stages=3, config=SyncConfig())
    result = rewrite_text(text, path, JAX, request, parse_costs(data), class_name="LanguageModel")
    out = result.rewritten
    assert out.count("# syncpass sync ") == 2
    stack = out[out.index("class Stack") : out.index("class Body")]
    # Six equal blocks over three stages: two per stage, split in Stack's own loop, each
    # transfer moving Stack's own values.
    assert "for block in self.blocks[:2]:" in stack and "for block in self.blocks[4:]:" in stack
    # One argument a line: the line would not fit in the project formatter's 100 columns.
    assert stack.count("mask, hidden = jax.device_put(\n") == 2
    assert stack.count("(mask, hidden),\n") == 2
    assert strip_jax_sync_points(out, path, "LanguageModel") == text
    again = rewrite_text(out, path, JAX, request, parse_costs(data), class_name="LanguageModel")
    assert again.rewritten == out


@pytest.mark.slow
@pytest.mark.parametrize("stages", RUN_STAGES)
def test_a_nested_flax_model_splits_inside_its_submodules_and_verifies(
    stages: int, tmp_path: Path
) -> None:
    written = rewrite_run_verify("flax_nested.py", stages, tmp_path)
    assert "for block in self.blocks[" in written  # a sync point went inside Stack's loop


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--meta", "--hardware", "pcie4-gpus"], "--meta builds a torch model"),
        (["--depth", "2"], "--depth 2 plans the children of nn.Sequential calls"),
        (["--threads", "2"], "cannot set the CPU threads of a JAX process"),
    ],
)
def test_profile_refuses_a_torch_flag_instead_of_ignoring_it(
    flags: list[str], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "jax_mlp.py"
    model.write_text((EXAMPLES / "jax_mlp.py").read_text())
    out = tmp_path / "costs.json"
    status = main(["profile", "--backend", "jax", str(model), *flags, "-o", str(out)])
    assert status == 2
    assert reason in capsys.readouterr().err
    assert not out.exists()


SCAN = (DATA / "jax_scan_layers.py").read_text()


def test_a_scan_over_stacked_layer_weights_is_planned_per_layer() -> None:
    module = parse_source(SCAN, "scan.py")
    assert jax_loop_containers(module, None, "scan.py") == ("layers",)
    graph = analyse_jax_model(module, "scan.py", None, {"layers": 6}, SCAN)
    ids = [op.id for op in graph.ops]
    assert ids[-7:-1] == [f"layers.{index}" for index in range(6)]
    live = {cut.after: cut.live for cut in graph.cuts}
    assert live["layers.2"] == ("mask", "x")  # each step reads the mask, and the carry
    # Without its size, the scan is one op.
    whole = analyse_jax_model(module, "scan.py", None, None, SCAN)
    assert not any(op.id.startswith("layers.") for op in whole.ops)


SCAN_LINE = '    x, _ = jax.lax.scan(functools.partial(block, mask=mask), x, params["layers"])'


@pytest.mark.parametrize("form", ["pair", "first", "short", "wrapped"])
def test_a_split_scan_runs_over_slices_of_the_stack_and_strips_back(form: str) -> None:
    text = SCAN
    if form == "first":
        text = text.replace(
            SCAN_LINE,
            '    x = jax.lax.scan(functools.partial(block, mask=mask), x, params["layers"])[0]',
        )
        assert "[0]" in text
    if form == "short":  # a scan whose slices fit on one line
        text = text.replace(
            SCAN_LINE,
            '    step = functools.partial(block, mask=mask)\n    x, _ = jax.lax.scan(step, x, params["layers"])',
        )
        assert "    step = " in text
    if form == "wrapped":  # the user's own layout over several lines: every piece keeps it
        text = text.replace(
            SCAN_LINE,
            '    x, _ = jax.lax.scan(\n        functools.partial(block, mask=mask), x, params["layers"]\n    )',
        )
        assert "scan(\n" in text
    module = parse_source(text, "scan.py")
    graph = analyse_jax_model(module, "scan.py", None, {"layers": 6}, text)
    data = {
        "version": 1,
        "batch_size": 8,
        "hardware": {"alpha_s": 1e-6, "beta_bytes_per_s": 1e12},
        "ops": [
            {"id": op.id, "compute_s": 0.004 if op.id.startswith("layers.") else 1e-5}
            for op in graph.ops
        ],
        "cuts": [{"after": cut.after, "live_bytes": 1024} for cut in graph.cuts],
    }
    request = PlanRequest(stages=3, config=SyncConfig())
    out = rewrite_text(text, "scan.py", JAX, request, parse_costs(data)).rewritten
    assert 'jax.tree.map(lambda w: w[:2], params["layers"])' in out
    assert 'jax.tree.map(lambda w: w[2:4], params["layers"])' in out
    assert 'jax.tree.map(lambda w: w[4:], params["layers"])' in out
    # The later pieces start from the carry. A piece too wide for one line is laid out one
    # argument a line, its slice named in a comment; the whole scan's one line comes back.
    if form == "short":
        assert out.count("    x, _ = jax.lax.scan(step, x, jax.tree.map(lambda w: w[") == 3
    elif form == "wrapped":
        assert (
            out.count("scan(\n        functools.partial(block, mask=mask), x, jax.tree.map(") == 3
        )
        assert "# syncpass slice" not in out
    else:
        assert out.count("jax.lax.scan(  # syncpass slice [") == 3
        laid_out = (
            "\n        functools.partial(block, mask=mask),\n        x,\n        jax.tree.map("
        )
        assert out.count(laid_out) == 3
    if form in ("pair", "first"):
        assert "jax.lax.scan(  # syncpass slice [2:4] of the stacked layers" in out
    if form != "wrapped":  # every line syncpass wrote fits the formatter's line length
        width = formatter_line_length("scan.py")
        assert [
            line for line in set(out.splitlines()) - set(text.splitlines()) if len(line) > width
        ] == []
    sent = "x, jax.devices()[" if form == "short" else "(mask, x),\n        jax.devices()["
    assert out.count(sent) == 2  # the short form's step holds the mask: only x crosses
    assert strip_jax_sync_points(out, "scan.py") == text
    again = rewrite_text(out, "scan.py", JAX, request, parse_costs(data)).rewritten
    assert again == out


@pytest.mark.slow
@pytest.mark.parametrize("stages", RUN_STAGES)
def test_a_scan_model_splits_between_layers_and_verifies(stages: int, tmp_path: Path) -> None:
    # Every layer recomputes as well: each piece's step goes through jax.checkpoint.
    options = ("--recompute", "all")
    written = rewrite_run_verify("jax_scan_layers.py", stages, tmp_path, options)
    assert "jax.tree.map(lambda w: w[" in written  # the scan was split between layers
    step = "jax.checkpoint(functools.partial(block, mask=mask))"
    assert written.count(step) == written.count("jax.lax.scan(") >= 2


SCAN_SLICES_CHECK = """
import functools, sys
import jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
from jax_scan_layers import LAYERS, block, example, loss_fn
from syncpass.backends.jax.pipeline import GPipe, pipeline

def forward(params, tokens):  # the scan split as `syncpass rewrite` splits it: 2 + 4 layers
    mask = jnp.tril(jnp.ones((8, 8)))
    x = params["embed"][tokens]
    step = functools.partial(block, mask=mask)
    x, _ = jax.lax.scan(step, x, jax.tree.map(lambda w: w[:2], params["layers"]))
    mask, x = jax.device_put((mask, x), jax.devices()[1])
    x, _ = jax.lax.scan(step, x, jax.tree.map(lambda w: w[2:], params["layers"]))
    return x @ params["head"]

_, params, (tokens,), target, _ = example()
staged = pipeline(forward, params, tokens[:4])
# Each stage holds only the rows of the stacked weights its scan runs.
rows = [sorted(w.shape[0] for w in s.placed_weights if w.ndim == 3) for s in staged.stages]
assert rows == [[2, 2], [4, 4]], rows
batches = [((tokens[i::2],), target[i::2]) for i in range(2)]
result = GPipe(staged, loss_fn)(batches)
whole = jax.jit(jax.grad(lambda p, a, t: loss_fn(forward(p, *a), t)))
grads = [whole(params, args, t) for args, t in batches]
mean = jax.tree_util.tree_map(lambda *g: sum(g) / 2, *grads)
for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(result.grads),
                             jax.tree_util.tree_leaves(mean)):
    got = jax.device_put(got, jax.devices()[0])
    assert got.shape == want.shape and jnp.allclose(got, want, rtol=1e-5, atol=1e-6), path
print("ok")
"""


@pytest.mark.slow
def test_a_split_scan_places_only_its_rows_of_the_stacked_weights_on_each_stage() -> None:
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"
    )
    done = subprocess.run(
        [sys.executable, "-c", SCAN_SLICES_CHECK, str(DATA)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_verify_fails_a_gradient_off_by_more_than_the_tolerance() -> None:
    import numpy as np

    from syncpass.backends.jax.run import _compare

    want = np.array([[1.0, 2.0], [0.0, -4.0]], dtype=np.float32)
    close = _compare("w", want * np.float32(1 + 1e-7), want, 1e-5, 1e-6)
    assert close["ok"] and close["numel"] == 4
    off = _compare("w", want + np.float32(1e-3), want, 1e-5, 1e-6)
    assert not off["ok"]
    assert off["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert off["max_rel"] == pytest.approx(1e-3, rel=1e-3)  # where the reference is 1, not 0

"""Tensor parallelism end to end: rewrite a model for N ranks, run it on N gloo processes,
and compare its loss and every gradient with the unsplit model; count the collectives.

Each (model, tp) pair is rewritten and run once in the whole run (whichever worker comes
first), and the assertions read that one run."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
from conftest import syncpass_process
from once import load_process, save_process, shared

ROOT = Path(__file__).resolve().parents[3]
LM = ROOT / "examples" / "transformer_lm.py"
GATED = ROOT / "tests" / "data" / "gated_mlp.py"
LLAMA = ROOT / "tests" / "data" / "llama_block.py"
#: Planned for a device slow beside its link, the plan splits every layer it can: on a real
#: profile of these small models, splitting the attention or not is within the noise.
FAST_LINK = ROOT / "tests" / "data" / "fast_link.toml"

pytestmark = pytest.mark.slow


def _rewrite(
    model: Path, tp: int, out: Path, style: str = "eager"
) -> subprocess.CompletedProcess[str]:
    return syncpass_process(
        "rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor",
        "--tp", str(tp), "--hardware", str(FAST_LINK), "--tp-style", style, "-o", str(out),
    )  # fmt: skip


def _run(file: Path, tp: int) -> subprocess.CompletedProcess[str]:
    return syncpass_process(
        "run", str(file), "--example", f"{file}:example", "--tp", str(tp), "--verify"
    )


Case = tuple[Path, str, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]


def made(
    model: Path, tp: int, tmp_path_factory: pytest.TempPathFactory, style: str = "eager"
) -> Case:
    """``model`` rewritten for ``tp`` ranks in ``style`` and run, once in the whole run: the
    rewritten file, the original text, and the two commands' results."""
    name = f"{model.stem}_tp{tp}_{style}"

    def make(folder: Path) -> None:
        rewritten = _rewrite(model, tp, folder / f"{name}.py", style)
        save_process(folder / "rewrite.json", rewritten)
        assert rewritten.returncode == 0, rewritten.stderr
        save_process(folder / "run.json", _run(folder / f"{name}.py", tp))

    folder = shared(tmp_path_factory, f"tensor-run-{name}", make)
    rewritten, ran = load_process(folder / "rewrite.json"), load_process(folder / "run.json")
    return folder / f"{name}.py", model.read_text(), rewritten, ran


#: The transformer at 4 ranks (heads divided, a fused qkv), the gated MLP at 2; and the
#: Llama-shaped decoder at 2 in the dtensor form (torch's parallel styles).
@pytest.fixture(
    scope="module",
    params=[(LM, 4, "eager"), (GATED, 2, "eager"), (LLAMA, 2, "dtensor")],
    ids=["lm-4", "gated-2", "llama-2-dtensor"],
)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    model, tp, style = request.param
    return made(model, tp, tmp_path_factory, style)


def _footer(text: str) -> dict[str, object]:
    """The names the rewrite defined after the model."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    namespace: dict[str, object] = {
        "ColwiseParallel": ColwiseParallel,
        "RowwiseParallel": RowwiseParallel,
        "Replicate": Replicate,
    }
    first = min(
        text.index(f"{name} = {{")
        for name in ("TENSOR_PARALLEL_LAYOUT", "TENSOR_PARALLEL_PLAN")
        if f"{name} = {{" in text
    )
    exec(text[first:], namespace)
    return namespace


def test_the_case_is_written_runs_split_and_verifies(case: Case) -> None:
    """Every check of one case in one test: the case's rewrite and run are made once, and
    tests of one case on several workers would wait idle for them."""
    out = case[0]
    _the_rewritten_model_equals_the_unsplit_one(case)
    _each_rank_ran_the_plans_collectives_and_some_weights_are_split(case)
    _the_users_lines_stay_as_they_were_where_nothing_changes(case)
    if "transformer_lm" in out.name:
        _the_transformer_gets_its_heads_divided_and_a_fused_qkv(case)
    if "dtensor" in out.name:
        _the_dtensor_form_is_torchtitans_plan_with_no_collective_in_the_source(case)


def _the_rewritten_model_equals_the_unsplit_one(case: Case) -> None:
    _, _, _, ran = case
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "verify: ok:" in ran.stdout
    assert "collectives: match" in ran.stdout


def _each_rank_ran_the_plans_collectives_and_some_weights_are_split(case: Case) -> None:
    out, _, _, ran = case
    namespace = _footer(out.read_text())
    counts = namespace["TENSOR_PARALLEL_COLLECTIVES"]
    assert isinstance(counts, dict) and counts
    rank_lines = [line for line in ran.stdout.splitlines() if line.startswith("  rank ")]
    for line in rank_lines:
        for kind, count in counts.items():
            assert f"{count} {kind}" in line
        assert "(median of 3)" in line  # run's default --steps, after the checked step
    assert namespace.get("TENSOR_PARALLEL_LAYOUT") or namespace.get("TENSOR_PARALLEL_PLAN")
    assert all(" 0 split weight" not in line for line in rank_lines)


def _the_users_lines_stay_as_they_were_where_nothing_changes(case: Case) -> None:
    out, original, _, _ = case
    rewritten = out.read_text()
    kept = [line for line in original.splitlines() if line in rewritten.splitlines()]
    changed = len(original.splitlines()) - len(kept)
    # Only lines with a size divided by tp_size() change; every added line is a sync call
    # after its comment, the import, or the layout after the model.
    assert changed <= 6
    lines = rewritten.splitlines()
    for before, line in itertools.pairwise(lines):
        if "_tensor_parallel_region(" in line:
            assert before.strip().startswith("# syncpass tensor:"), line


def _the_transformer_gets_its_heads_divided_and_a_fused_qkv(case: Case) -> None:
    out, _, _, _ = case
    text = out.read_text()
    assert "self.heads // tp_size()" in text
    assert '"blocks.*.attn.qkv": "column:3"' in text


def _the_dtensor_form_is_torchtitans_plan_with_no_collective_in_the_source(case: Case) -> None:
    out, _, rewritten, _ = case
    text = out.read_text()
    assert "_tensor_parallel_region(" not in text
    assert "self.heads // tp_size()" in text
    styles = {
        name: type(style).__name__
        for name, style in _footer(text)["TENSOR_PARALLEL_PLAN"].items()  # type: ignore[attr-defined]
    }
    for name in ("q", "k", "v"):
        assert styles[f"blocks.*.attention.{name}"] == "ColwiseParallel"
    assert styles["blocks.*.attention.o"] == "RowwiseParallel"
    assert styles["blocks.*.gate"] == styles["blocks.*.up"] == "ColwiseParallel"
    assert styles["blocks.*.down"] == "RowwiseParallel"
    # Each ColwiseParallel layer all-reduces its input's gradient itself: the plan counts
    # one per q, k, v and per gate, up, and says so.
    assert "each of the 3 ColwiseParallel layers that read it" in rewritten.stderr
    assert "each of the 2 ColwiseParallel layers that read it" in rewritten.stderr


def test_the_dtensor_form_keeps_a_fused_qkv_whole_and_says_why(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    def make(folder: Path) -> None:
        save_process(folder / "rewrite.json", _rewrite(LM, 2, folder / "lm.py", "dtensor"))

    folder = shared(tmp_path_factory, "tensor-lm-dtensor", make)
    rewritten = load_process(folder / "rewrite.json")
    assert rewritten.returncode == 0, rewritten.stderr
    assert "blocks.*.attn.qkv not column: its weight holds 3 fused chunks" in rewritten.stderr
    text = (folder / "lm.py").read_text()
    assert '"blocks.*.mlp.fc": ColwiseParallel(),' in text
    assert '"blocks.*.mlp.proj": RowwiseParallel(),' in text
    assert "blocks.*.attn.qkv" not in text


def test_a_missing_gradient_all_reduce_is_caught(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    written, _, _, _ = made(GATED, 2, tmp_path_factory)
    # The MLP returns its down projection as it makes it: the all-reduce wraps the value.
    assert "return reduce_from_tensor_parallel_region(self.down(m))" in written.read_text()
    lines = written.read_text().splitlines(keepends=True)
    broken = [line for line in lines if "= copy_to_tensor_parallel_region(" not in line]
    assert len(broken) < len(lines)
    out = tmp_path / written.name
    out.write_text("".join(broken))
    ran = _run(out, 2)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "MISMATCH" in ran.stdout


def test_megatrons_placement_is_written_the_same_way_and_measured_besidesyncpass_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``--tp-placement megatron`` writes Megatron-LM's hand placement: each attention's
    fused qkv and each MLP's first linear by columns, their second linear by rows, two
    forward all-reduces a layer; ``run --alongside`` verifies it beside syncpass's plan,
    takes the two files' timed steps in turn and, with ``--costs``, predicts each file's
    step from the layouts it carries."""

    def make(folder: Path) -> None:
        save_process(folder / "syncpass.json", _rewrite(LM, 2, folder / "lm_syncpass.py"))
        megatron = syncpass_process(
            "rewrite", str(LM), "--example", f"{LM}:example", "--strategy", "tensor",
            "--tp", "2", "--tp-placement", "megatron", "-o", str(folder / "lm_megatron.py"),
        )  # fmt: skip
        save_process(folder / "megatron.json", megatron)
        profiled = syncpass_process(
            "profile", str(LM), "--example", f"{LM}:example", "--repeats", "1",
            "--warmup", "0", "-o", str(folder / "lm.costs.json"),
        )  # fmt: skip
        assert profiled.returncode == 0, profiled.stderr
        ran = syncpass_process(
            "run", str(folder / "lm_syncpass.py"), "--tp", "2", "--verify", "--steps", "2",
            "--alongside", str(folder / "lm_megatron.py"),
            "--costs", str(folder / "lm.costs.json"),
            "--json-report", str(folder / "report.json"),
        )  # fmt: skip
        save_process(folder / "run.json", ran)

    folder = shared(tmp_path_factory, "tensor-run-megatron-alongside", make)
    for name in ("syncpass", "megatron"):
        made_file = load_process(folder / f"{name}.json")
        assert made_file.returncode == 0, made_file.stderr
    assert "Megatron-LM's placement" in load_process(folder / "megatron.json").stderr
    namespace = _footer((folder / "lm_megatron.py").read_text())
    layout = namespace["TENSOR_PARALLEL_LAYOUT"]
    assert layout == {
        "blocks.*.attn.qkv": "column:3",
        "blocks.*.attn.proj": "row",
        "blocks.*.mlp.fc": "column",
        "blocks.*.mlp.proj": "row",
    }
    layers = len(_blocks_of_the_example())
    counts = namespace["TENSOR_PARALLEL_COLLECTIVES"]
    assert isinstance(counts, dict) and counts["forward all-reduce"] == 2 * layers
    ran = load_process(folder / "run.json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.count("verify: ok:") == 2 and ran.stdout.count("collectives: match") == 2
    assert "(steps taken in turn with the others)" in ran.stdout
    report = json.loads((folder / "report.json").read_text())
    (other,) = report["alongside"]
    assert other["request"]["file"].endswith("lm_megatron.py")
    for document in (report, other):
        assert all(rank["timed_steps"] == 2 and rank["step_s"] > 0 for rank in document["ranks"])
        assert all(len(rank["speed_probes_s"]) == 2 for rank in document["ranks"])
        # With --costs, each file's layouts planned on the profile's tensor graph.
        prediction = document["prediction"]
        assert prediction["predicted_step_s"] > 0
        assert prediction["measured_step_s"] == max(rank["step_s"] for rank in document["ranks"])
        assert prediction["speed_factor"] > 0  # the probes' median over the profile's
    # Megatron's layouts read back from the file: its two all-reduces a layer each way.
    assert f"{2 * layers} forward, {2 * layers} backward), measured" in ran.stdout
    assert other["prediction"]["split_ops"] > 0 and report["prediction"]["split_ops"] > 0


def _blocks_of_the_example() -> list[object]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bundled_transformer_lm", LM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.example()[0].blocks)

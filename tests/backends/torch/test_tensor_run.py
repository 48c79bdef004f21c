"""Tensor parallelism end to end: rewrite a model for N ranks, run it on N gloo processes,
and compare its loss and every gradient with the unsplit model; count the collectives.

Each (model, tp) pair is rewritten and run once in the whole run (whichever worker comes
first), and the assertions read that one run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from once import load_process, save_process, shared

ROOT = Path(__file__).resolve().parents[3]
LM = ROOT / "examples" / "transformer_lm.py"
GATED = ROOT / "tests" / "data" / "gated_mlp.py"
#: Planned for a device slow beside its link, the plan splits every layer it can: on a real
#: profile of these small models, splitting the attention or not is within the noise.
FAST_LINK = ROOT / "tests" / "data" / "fast_link.toml"

pytestmark = pytest.mark.slow


def _syncpass(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncpass", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def _rewrite(model: Path, tp: int, out: Path) -> subprocess.CompletedProcess[str]:
    return _syncpass(
        "rewrite", str(model), "--example", f"{model}:example", "--strategy", "tensor",
        "--tp", str(tp), "--hardware", str(FAST_LINK), "-o", str(out),
    )  # fmt: skip


def _run(file: Path, tp: int) -> subprocess.CompletedProcess[str]:
    return _syncpass("run", str(file), "--example", f"{file}:example", "--tp", str(tp), "--verify")


Case = tuple[Path, str, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]


def made(model: Path, tp: int, tmp_path_factory: pytest.TempPathFactory) -> Case:
    """``model`` rewritten for ``tp`` ranks and run, once in the whole run: the rewritten
    file, the original text, and the two commands' results."""
    name = f"{model.stem}_tp{tp}"

    def make(folder: Path) -> None:
        rewritten = _rewrite(model, tp, folder / f"{name}.py")
        save_process(folder / "rewrite.json", rewritten)
        assert rewritten.returncode == 0, rewritten.stderr
        save_process(folder / "run.json", _run(folder / f"{name}.py", tp))

    folder = shared(tmp_path_factory, f"tensor-run-{name}", make)
    rewritten, ran = load_process(folder / "rewrite.json"), load_process(folder / "run.json")
    return folder / f"{name}.py", model.read_text(), rewritten, ran


#: The transformer at 4 ranks (heads divided, a fused qkv), the gated MLP at 2.
@pytest.fixture(scope="module", params=[(LM, 4), (GATED, 2)], ids=["lm-4", "gated-2"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    return made(*request.param, tmp_path_factory)


def test_the_rewritten_model_equals_the_unsplit_one(case: tuple) -> None:
    _, _, _, ran = case
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "verify: ok:" in ran.stdout
    assert "collectives: match" in ran.stdout


def test_each_rank_ran_the_plans_collectives_and_some_weights_are_split(case: tuple) -> None:
    out, _, _, ran = case
    namespace: dict[str, object] = {}
    text = out.read_text()
    footer = text[text.index("TENSOR_PARALLEL_LAYOUT = {") :]
    exec(footer, namespace)
    counts = namespace["TENSOR_PARALLEL_COLLECTIVES"]
    assert isinstance(counts, dict) and counts
    rank_lines = [line for line in ran.stdout.splitlines() if line.startswith("  rank ")]
    for line in rank_lines:
        for kind, count in counts.items():
            assert f"{count} {kind}" in line
    assert namespace["TENSOR_PARALLEL_LAYOUT"]


def test_the_users_lines_stay_as_they_were_where_nothing_changes(case: tuple) -> None:
    out, original, _, _ = case
    rewritten = out.read_text()
    kept = [line for line in original.splitlines() if line in rewritten.splitlines()]
    changed = len(original.splitlines()) - len(kept)
    # Only lines with a size divided by tp_size() change; every added line is a sync call
    # with its comment, the import, or the layout after the model.
    assert changed <= 6
    for line in rewritten.splitlines():
        if "_tensor_parallel_region(" in line:
            assert "# syncpass tensor:" in line


def test_the_transformer_gets_its_heads_divided_and_a_fused_qkv(case: tuple) -> None:
    out, _, _, _ = case
    if "transformer_lm" not in out.name:
        pytest.skip("the transformer's attention")
    text = out.read_text()
    assert "self.heads // tp_size()" in text
    assert '"blocks.*.attn.qkv": "column:3"' in text


def test_a_missing_gradient_all_reduce_is_caught(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    written, _, _, _ = made(GATED, 2, tmp_path_factory)
    lines = written.read_text().splitlines(keepends=True)
    broken = [line for line in lines if "= copy_to_tensor_parallel_region(" not in line]
    assert len(broken) < len(lines)
    out = tmp_path / written.name
    out.write_text("".join(broken))
    ran = _run(out, 2)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "MISMATCH" in ran.stdout

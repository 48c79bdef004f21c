"""Counting on the meta device against estimating from the source: the corpus table.

Each model of the corpus (``bench/bench_corpus.py``: the same pinned packages, the same
project with its ``example()`` appended) is profiled twice without being run for real,
both with the default backend (``torch_stages``):

* ``--meta --hardware pcie4-gpus``: the example built on torch's meta device, each op's
  FLOPs counted by torch's ``FlopCounterMode``;
* ``--static --input-shape S [--input-dtype K] --hardware pcie4-gpus``: the source read by
  syncpass's interpreter alone, for the shape of the example's input (``--model`` names the
  example's class, as the file holds several).

It prints, per model and method: the ops in the cost file, how many got nonzero FLOPs, the
total forward FLOPs and parameter bytes over the ops, the wall time of the profile command
(a fresh process, imports included), how many ops ``--static`` could not size (they get the
median op's cost), the ratio of static to meta total FLOPs, and ``ok`` or the first line of
the error. Below the table, each op ``--static`` could not size, with the reason it gives.

    python bench/bench_meta_static.py [--models vit,simple_vit,litgpt,hf_gpt2,hf_llama]

Nothing is timed but the commands themselves: the FLOPs and bytes are counts, the same on
any machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

HARDWARE = "pcie4-gpus"
FALLBACK = "(estimated by the fallback)"


def _corpus() -> ModuleType:
    """``bench/bench_corpus.py``, imported from beside this file."""
    path = Path(__file__).resolve().parent / "bench_corpus.py"
    spec = importlib.util.spec_from_file_location("bench_corpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_corpus"] = module
    spec.loader.exec_module(module)
    return module


CORPUS = _corpus()


@dataclass(frozen=True)
class StaticInput:
    """What ``--static`` is told of a corpus example: its model class and its input."""

    model: str  # the class the example builds
    shape: str  # the forward's input, as --input-shape takes it
    dtype: str | None  # --input-dtype (None: syncpass's default)


#: Read off the examples in bench_corpus.py: the ViTs take ``torch.randn(8, 3, 32, 32)``;
#: the language models ``tokens[:, :-1]`` of ``torch.randint(0, 64, (8, 17))``, int64 ids
#: (``--input-dtype`` takes ``int``, not a torch dtype name).
STATIC_INPUTS = {
    "vit": StaticInput("ViT", "8x3x32x32", "float"),
    "simple_vit": StaticInput("SimpleViT", "8x3x32x32", "float"),
    "litgpt": StaticInput("GPT", "8x16", "int"),
    "hf_gpt2": StaticInput("GPT2LMHeadModel", "8x16", "int"),
    "hf_llama": StaticInput("LlamaForCausalLM", "8x16", "int"),
}


@dataclass
class Result:
    """One profile command's cost file, summed, or why there is none."""

    wall_s: float
    error: str = ""
    ops: int = 0
    nonzero: int = 0
    flops: float = 0.0
    param_bytes: int = 0
    unsized: list[str] = field(default_factory=list)


def _profile(argv: list[str], out: Path) -> Result:
    """``syncpass profile`` run in a fresh process, its output and stderr captured (paths in
    its messages shortened to the project's folder)."""
    command = [sys.executable, "-m", "syncpass", "profile", *argv, "-o", str(out)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    lines = done.stderr.replace(f"{out.parent}/", "").splitlines()
    unsized = [line.removeprefix("syncpass: warning: ") for line in lines if FALLBACK in line]
    if done.returncode != 0 or not out.exists():
        errors = [line for line in lines if "error" in line.lower()] or lines or [""]
        return Result(wall, error=f"exit {done.returncode}: {errors[0]}", unsized=unsized)
    ops = json.loads(out.read_text())["ops"]
    return Result(
        wall,
        ops=len(ops),
        nonzero=sum(1 for op in ops if op.get("flops", 0) > 0),
        flops=float(sum(op.get("flops", 0) for op in ops)),
        param_bytes=int(sum(op.get("param_bytes", 0) for op in ops)),
        unsized=unsized,
    )


def _meta(source: Path, folder: Path) -> Result:
    argv = [str(source), "--example", f"{source}:example", "--meta", "--hardware", HARDWARE]
    return _profile(argv, folder / "meta.costs.json")


def _static(source: Path, given: StaticInput, folder: Path) -> Result:
    argv = [str(source), "--static", "--model", given.model, "--input-shape", given.shape]
    if given.dtype is not None:
        argv += ["--input-dtype", given.dtype]
    return _profile([*argv, "--hardware", HARDWARE], folder / "static.costs.json")


def _row(name: str, method: str, result: Result, ratio: str) -> str:
    status = result.error or "ok"
    unsized = "-" if method == "meta" or result.error else str(len(result.unsized))
    if result.error:
        return (
            f"{name:<11} {method:<7} {'-':>5} {'-':>8} {'-':>10} {'-':>12} "
            f"{result.wall_s:>7.1f}s {unsized:>7} {ratio:>12}  {status}"
        )
    return (
        f"{name:<11} {method:<7} {result.ops:>5} {result.nonzero:>8} {result.flops:>10.3g} "
        f"{result.param_bytes:>12,} {result.wall_s:>7.1f}s {unsized:>7} {ratio:>12}  {status}"
    )


def bench(models: list[Any]) -> None:
    """Print the table for ``models`` (bench_corpus's CorpusModel entries)."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        header = (
            f"{'model':<11} {'method':<7} {'ops':>5} {'nonzero':>8} {'FLOPs':>10} "
            f"{'param bytes':>12} {'wall':>8} {'unsized':>7} {'static/meta':>12}  status"
        )
        print(header)
        unsized: dict[str, list[str]] = {}
        for model in models:
            folder = root / model.name
            folder.mkdir()
            source = CORPUS.prepared(model, root, folder)
            meta = _meta(source, folder)
            static = _static(source, STATIC_INPUTS[model.name], folder)
            ratio = (
                f"{static.flops / meta.flops:.3g}"
                if not meta.error and not static.error and meta.flops > 0
                else "-"
            )
            print(_row(model.name, "meta", meta, ""), flush=True)
            print(_row(model.name, "static", static, ratio), flush=True)
            unsized[model.name] = static.unsized
        for name, lines in unsized.items():
            if lines:
                print(f"\n{name}: ops --static could not size ({len(lines)})")
                for line in lines:
                    print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(model.name for model in CORPUS.MODELS))
    args = parser.parse_args()
    wanted = args.models.split(",")
    bench([model for model in CORPUS.MODELS if model.name in wanted])


if __name__ == "__main__":
    main()

"""A 70B-class Llama planned for 8 and 64 GPUs with and without activation recomputation:
each stage's predicted time and memory under ``--recompute auto`` (the fewest blocks that
fit, exactly), beside "recompute every block" (the common default: torchtitan's full
activation checkpointing, Megatron's ``--recompute-granularity full``) and "recompute
nothing", and the predicted step of each.

The cost file is estimated from the model's shapes, as ``examples/make_example_costs.py``
estimates its GPTs (nothing runs on a GPU; every step is the simulator's):

* Llama-3-70B's shapes: 80 blocks of width 8192, 64 query and 8 key/value heads, a SwiGLU
  MLP of 28672, a vocabulary of 128256; sequences of 4096 tokens, one a micro-batch;
* each block's forward is its FLOPs (``2 * tokens * parameters`` plus the attention's
  ``4 * s^2 * h``) at the profile's ``flops_per_s``; the backward twice that, half of it
  the inputs' gradients;
* bf16 weights trained with Adam in mixed precision: 2 bytes a parameter, and a memory
  multiplier of 8 (weights 2, gradients 2, fp32 master weights, first and second moments
  12 bytes a parameter);
* a block's saved activations, a sequence at a time, are ``43 * s * h`` bytes in bf16 with
  a fused attention kernel (no ``s^2`` scores kept): the norms' inputs and outputs, q, k
  and v, the attention's output and the output projection's input (``15 s h``), the MLP's
  gate and up projections, the SiLU and their product (``8 * s * 28672`` bytes, ``28 s
  h``); recomputing keeps only the block's input (``2 s h``); the head keeps the logits in
  fp32 for the loss.

The two cases: 8 stages on H200 nodes (``ib-400g-h200``, 141 GB) with the optimizer state
sharded over 8 data-parallel replicas (ZeRO-1: without it no 8-stage plan fits whatever
recomputes), 64 micro-batches; and 64 stages on H100 nodes (``ib-400g-h100``, 80 GB), 128
micro-batches. Both run 1F1B, which keeps ``min(S - k, M)`` micro-batches in flight on
stage ``k``: the first stages hold the most, so that is where recomputing pays.

    PYTHONPATH=. python bench/bench_recompute.py          # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.cli import main as syncpass
from syncpass.contracts.hardware import load_profile
from syncpass.core.units import num_bytes, seconds

LAYERS, WIDTH, HEADS, KV_HEADS, FFN, VOCAB, SEQ = 80, 8192, 64, 8, 28672, 128256, 4096
BF16, FP32 = 2, 4
#: Bytes a parameter takes in training, in units of its bf16 weight (see the docstring).
MEMORY_MULTIPLIER = 8
MODES = ("auto", "all", "none")


@dataclass(frozen=True)
class Case:
    name: str
    hardware: str
    stages: int
    microbatches: int
    optimizer_shards: int = 1


CASES = (
    Case("70B, 8 x H200, ZeRO-1 over 8", "ib-400g-h200", 8, 64, optimizer_shards=8),
    Case("70B, 64 x H100", "ib-400g-h100", 64, 128),
)


def llama_70b_costs(batch: int, hardware: str) -> dict[str, Any]:
    """The cost file of a batch of ``batch`` sequences, at ``hardware``'s compute rate."""
    profile = load_profile(hardware).hardware
    rate = profile.flops_per_s
    assert rate is not None, f"{hardware} gives no flops_per_s"
    head = WIDTH // HEADS
    block_params = 2 * WIDTH * WIDTH + 2 * WIDTH * KV_HEADS * head + 3 * WIDTH * FFN + 2 * WIDTH
    hidden = batch * SEQ * WIDTH * BF16  # the residual stream: what crosses a cut

    def op(
        name: str, flops: float, params: float, saved: float, kept: float, out: float
    ) -> dict[str, Any]:
        forward = flops / rate
        return {
            "id": name,
            "compute_s": forward,
            "backward_s": 2 * forward,
            "backward_input_s": forward,
            "param_bytes": params * BF16,
            "out_bytes": out,
            "saved_bytes": saved,
            "input_bytes": kept,
            "flops": flops,
        }

    tokens = batch * SEQ
    attention = 4.0 * batch * SEQ * SEQ * WIDTH
    ops = [op("embed", 0.0, VOCAB * WIDTH, tokens * 8, tokens * 8, hidden)]
    for index in range(LAYERS):
        saved = (15 * WIDTH + 4 * FFN) * tokens * BF16
        ops.append(
            op(f"layers.{index}", 2.0 * tokens * block_params + attention, block_params,
               saved, hidden, hidden)
        )  # fmt: skip
    ops.append(op("norm", 5.0 * tokens * WIDTH, WIDTH, hidden, hidden, hidden))
    logits = tokens * VOCAB * FP32
    ops.append(op("lm_head", 2.0 * tokens * WIDTH * VOCAB, VOCAB * WIDTH, hidden + logits,
                  hidden, logits))  # fmt: skip
    return {
        "version": 1,
        "model": "llama-70b-class (estimated)",
        "batch_size": batch,
        "training": True,
        "memory_multiplier": MEMORY_MULTIPLIER,
        "hardware": {
            "name": profile.name,
            "alpha_s": profile.alpha_s,
            "beta_bytes_per_s": profile.beta_bytes_per_s,
            "device_memory_bytes": profile.device_memory_bytes,
            "flops_per_s": rate,
        },
        "ops": ops,
        "cuts": [{"after": entry["id"], "live_bytes": hidden} for entry in ops[:-1]],
        "containers": {"layers": LAYERS},
    }


def planned(argv: list[str]) -> tuple[int, str]:
    """A ``syncpass plan`` command's exit status and standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = syncpass(["plan", *argv])
    return status, out.getvalue()


def run_case(case: Case, folder: Path) -> None:
    costs = folder / f"{case.hardware}-{case.stages}.costs.json"
    costs.write_text(json.dumps(llama_70b_costs(case.microbatches, case.hardware)))
    argv = ["--costs", str(costs), "--stages", str(case.stages), "--schedule", "1f1b"]
    argv += ["--microbatches", str(case.microbatches), "--threshold", "inf"]
    if case.optimizer_shards > 1:
        argv += ["--optimizer-shards", str(case.optimizer_shards)]
    limit = load_profile(case.hardware).hardware.device_memory_bytes
    print(f"\n{case.name}: {case.microbatches} micro-batches of one {SEQ}-token sequence, "
          f"1F1B, device memory {num_bytes(limit or 0)}")  # fmt: skip
    plans: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        status, out = planned([*argv, "--recompute", mode, "--json"])
        if status == 0:
            plans[mode] = json.loads(out)
        else:
            needs = re.search(r"it needs ([\d.]+ \w+)", out)
            print(
                f"  recompute {mode}: no plan fits"
                + (f" (needs {needs.group(1)})" if needs else "")
            )
    for mode, plan in plans.items():
        recomputed = len(plan.get("checkpointed", []))
        print(f"  recompute {mode:<4}  predicted step {seconds(plan['predicted_step_s']):>8}, "
              f"bottleneck {seconds(plan['bottleneck_s']):>8}, {recomputed} of {LAYERS} blocks "
              f"recompute, fullest stage {num_bytes(max(s['memory_bytes'] for s in plan['stages']))}")  # fmt: skip
    if "auto" in plans and "all" in plans:
        auto, every = plans["auto"], plans["all"]
        print(f"  auto over all: {every['predicted_step_s'] / auto['predicted_step_s']:.3f}x "
              "faster step")  # fmt: skip
        by_stage: dict[int, int] = {}
        for entry in auto.get("checkpointed", []):
            by_stage[entry["stage"]] = by_stage.get(entry["stage"], 0) + 1
        print("  stage  ops                      auto: time    memory  recomputes"
              "   all: time    memory")  # fmt: skip
        for mine, theirs in zip(auto["stages"], every["stages"], strict=True):
            ops = mine["ops"]
            span = f"{ops[0]} .. {ops[-1]}" if len(ops) > 1 else ops[0]
            print(f"  {mine['index']:<5}  {span:<23}  {seconds(mine['time_s']):>10}  "
                  f"{num_bytes(mine['memory_bytes']):>8}  {by_stage.get(mine['index'], 0):>10}  "
                  f"{seconds(theirs['time_s']):>10}  {num_bytes(theirs['memory_bytes']):>8}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 8-stage case only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for case in CASES[:1] if args.quick else CASES:
            run_case(case, Path(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())

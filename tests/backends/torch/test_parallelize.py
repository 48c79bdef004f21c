"""`syncpass.parallelize` and `syncpass.profiler.Profile` in a real 2-process gloo run.

Each rank builds the same model, calls ``syncpass.parallelize`` (rank 0
profiles and plans, every rank gets the plan), runs one training step of its
stage under 1F1B inside a ``Profile``; rank 0 then compares every gradient
with the unsplit model's and checks the profile's report and picture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO
from pngfile import read_png

from syncpass.core.picture import BACKWARD, FORWARD

SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.pipelining import Schedule1F1B

    sys.path.insert(0, {examples!r})
    import syncpass
    from syncpass.profiler import Profile
    from uneven_mlp import example

    MICROBATCHES = 4


    def run(rank, port, folder):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                                world_size=2)
        model, args, target, loss_fn = example()
        reference = {{name: p.detach().clone() for name, p in model.named_parameters()}}
        names = {{id(p): name for name, p in model.named_parameters()}}
        built = syncpass.parallelize(model, args, stages=2, loss_fn=loss_fn, target=target,
                                     microbatches=MICROBATCHES)
        schedule = Schedule1F1B(built.stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
        with Profile("step", built.stage, output=os.path.join(folder, "profile")) as profile:
            if rank == 0:
                schedule.step(*args)
            else:
                schedule.step(target=target)
        grads = {{names[id(p)]: p.grad for p in built.stage.submod.parameters()}}
        gathered = [None, None] if rank == 0 else None
        dist.gather_object(grads, gathered, dst=0)
        if rank == 0:
            fresh, _, _, _ = example()
            chunks = zip(args[0].tensor_split(MICROBATCHES), target.tensor_split(MICROBATCHES))
            loss = sum(loss_fn(fresh(x), y) for x, y in chunks) / MICROBATCHES
            loss.backward()
            expected = dict(fresh.named_parameters())
            seen, worst = set(), 0.0
            for part in gathered:
                for name, grad in part.items():
                    seen.add(name)
                    worst = max(worst, (grad - expected[name].grad).abs().max().item())
            same_weights = all(torch.equal(reference[n], p) for n, p in fresh.named_parameters())
            result = {{
                "sync_points": [point.after for point in built.plan.sync_points],
                "split_spec": dict(built.split_spec),
                "compared": sorted(seen),
                "parameters": sorted(expected),
                "worst": worst,
                "same_weights": same_weights,
                "ranks": [[f.rank, f.forward_calls, f.backward_calls, f.compute_s, f.elapsed_s]
                          for f in profile.report.ranks],
            }}
            with open(os.path.join(folder, "result.json"), "w") as stream:
                json.dump(result, stream)
        dist.destroy_process_group()


    if __name__ == "__main__":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(run, args=(port, sys.argv[1]), nprocs=2)
    """
)


@pytest.mark.slow
def test_parallelize_splits_where_the_plan_says_and_computes_what_the_model_does(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(examples=str(REPO / "examples")))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert len(result["sync_points"]) == 1
    (point,) = result["sync_points"]
    # The uneven MLP splits between layers: after a submodule, at its end.
    assert result["split_spec"] == {point: "end"}
    assert result["compared"] == result["parameters"]  # every parameter, on one stage or the other
    assert result["worst"] < 1e-5
    assert result["same_weights"]
    ranks = sorted(result["ranks"])
    assert [rank for rank, *_ in ranks] == [0, 1]
    for _, forwards, backwards, compute, elapsed in ranks:
        assert forwards == 4 and backwards == 4
        assert 0 < compute <= elapsed
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["name"] == "step" and len(report["ranks"]) == 2
    for figures in report["ranks"]:
        assert 0 <= figures["comm_wait_ratio"] <= 1
        kinds = {kind for kind, _, _ in figures["spans"]}
        assert {"forward", "backward"} <= kinds
    picture = read_png((tmp_path / "profile.png").read_bytes())
    for rank in (0, 1):  # a labelled row of each rank's forwards and backwards
        ((_, y),) = picture.find_text(f"rank {rank}")
        assert {FORWARD, BACKWARD} <= set(picture.line(y - 3))
    assert picture.find_text("step: 2 rank(s) over", bottom=30)

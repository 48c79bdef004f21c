"""What a transfer costs between two gloo processes that compute: the stall of posts made
together. ``syncpass calibrate`` measures the same curve, more briefly, for the hardware
profile's ``meet_stall_s`` and ``meet_window_s`` (docs/calibrate.md); this script prints it
whole, and counts the stalled posts of a real run.

Two processes (one thread each) repeat: compute for ``--compute-ms``, then post one small
transfer and wait for it. Process 1 computes ``offset`` longer (a negative offset:
shorter), so its post comes that long after process 0's. The transfer is an exchange: each
process sends one tensor to the other and receives one, in one batch, as torch's 1F1B
posts a stage's send and its next receive. Each line is one offset: the mean time a
repetition took beyond the compute of the slower process. The offsets far from 0 are the
baseline measured in the same run: what the exchange costs when the posts do not meet.

    python bench/bench_gloo_post.py [--compute-ms 3] [--repeats 150]
    python bench/bench_gloo_post.py --timeline RUN.json   # a `syncpass run --timeline`

With ``--timeline`` it reads the spans of a 2-rank run instead and counts the posts that
took more than 1 ms, split by whether the other rank posted within 0.2 ms of them (posts
under 10 us, of actions with nothing to send or receive, left out).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: Offsets of process 1's post after process 0's, in ms.
OFFSETS_MS = (-1.0, -0.2, -0.1, 0.0, 0.05, 0.1, 0.2, 1.0)
STALLED_S = 1e-3  # a post that took longer than this stalled
MET_S = 2e-4  # two posts this close met
EMPTY_S = 1e-5  # a post shorter than this had nothing to post (an action without transfers)


def _compute_for(seconds: float, work: Any) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work @ work


def _rank(rank: int, port: int, arguments: tuple[float, float, int], out: Any) -> None:
    import torch
    import torch.distributed as dist

    compute_s, offset_s, repeats = arguments
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    work = torch.randn(64, 64)
    outgoing, incoming = torch.ones(512), torch.zeros(512)
    peer = 1 - rank
    mine = compute_s + (offset_s if rank == 1 else 0.0)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(repeats):
        _compute_for(mine, work)
        ops = [dist.P2POp(dist.isend, outgoing, peer), dist.P2POp(dist.irecv, incoming, peer)]
        for posted in dist.batch_isend_irecv(ops):
            posted.wait()
    elapsed = (time.perf_counter() - started) / repeats
    if rank == 0:
        out.put(elapsed)
    dist.destroy_process_group()


def _repetition_s(compute_s: float, offset_s: float, repeats: int) -> float:
    """The mean time of one repetition (compute, then the exchange) over ``repeats``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    out = context.SimpleQueue()
    arguments = (compute_s, offset_s, repeats)
    ranks = [context.Process(target=_rank, args=(rank, port, arguments, out)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    if any(process.exitcode != 0 for process in ranks):
        raise RuntimeError("a rank failed; its error is above")
    return float(out.get())


def scan(compute_ms: float, repeats: int) -> int:
    print(
        f"two gloo processes, one thread each: {compute_ms:g} ms of compute, then one "
        f"transfer; {repeats} repetitions per line"
    )
    print(f"{'offset':>9}  {'a repetition beyond the slower compute':>40}")
    compute_s = compute_ms / 1e3
    for offset_ms in OFFSETS_MS:
        offset_s = offset_ms / 1e3
        extra = _repetition_s(compute_s, offset_s, repeats) - compute_s - max(0.0, offset_s)
        print(f"{offset_ms:>6.2f} ms  {extra * 1e3:>37.2f} ms", flush=True)
    return 0


def timeline(path: Path) -> int:
    ranks = json.loads(path.read_text())["ranks"]
    if len(ranks) != 2:
        print(f"{path}: {len(ranks)} ranks; this reads a 2-rank run", file=sys.stderr)
        return 2
    posts = [
        [
            (span[1], span[2])
            for span in rank["spans"]
            if span[0] == "post" and span[2] - span[1] > EMPTY_S
        ]
        for rank in ranks
    ]
    if not posts[0] or not posts[1]:
        print(f"{path}: no post spans (a timeline of an older syncpass?)", file=sys.stderr)
        return 2
    for me, other in ((0, 1), (1, 0)):
        counts = {(met, stalled): 0 for met in (True, False) for stalled in (True, False)}
        for start, end in posts[me]:
            met = any(abs(start - theirs) < MET_S for theirs, _ in posts[other])
            counts[(met, end - start > STALLED_S)] += 1
        lengths = sorted(end - start for start, end in posts[me])
        print(
            f"rank {me}: {len(lengths)} posts, median {statistics.median(lengths) * 1e3:.3f} ms; "
            f"of those within {MET_S * 1e3:g} ms of the other rank's post, "
            f"{counts[(True, True)]} of {counts[(True, True)] + counts[(True, False)]} took over "
            f"{STALLED_S * 1e3:g} ms; of the others, {counts[(False, True)]} of "
            f"{counts[(False, True)] + counts[(False, False)]}"
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compute-ms", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=150)
    parser.add_argument("--timeline", type=Path, help="a 2-rank `syncpass run --timeline` JSON")
    args = parser.parse_args()
    if args.timeline is not None:
        return timeline(args.timeline)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return scan(args.compute_ms, args.repeats)


if __name__ == "__main__":
    sys.exit(main())

"""Where a real pipeline run spends its time, rank by rank: ``syncpass.backends.torch.profiler.Profile``.

    from syncpass.backends.torch.profiler import Profile

    with Profile("train", stage, output="runs/train") as profile:
        for _ in range(steps):
            schedule.step(...)
    # rank 0 wrote runs/train.json and runs/train.png; every rank has profile.report

Inside the block, each rank records the spans its pipeline stage
(``torch.distributed.pipelining.PipelineStage``, or anything with
``forward_one_chunk``/``backward_one_chunk``; a list of them where a rank holds
several stages) spends computing forward and backward micro-batches (a
zero-bubble schedule's ``backward_weight_one_chunk`` counts as backward), the
spans it posts transfers (the schedule's batch of sends and receives for an
action: ``post``) and the spans it is blocked waiting for them (its waits on
those sends and receives: ``wait``). Posting is no wait in principle, but with
gloo on a CPU a post made as the peer posts can block for milliseconds (the
README's "Predictions against the run"), so it is shown apart. From them:

* ``compute_s``: time in the stage's own forward and backward;
* ``sync_time_s``: time posting and blocked on transfers;
* ``comm_wait_ratio``: ``sync_time_s`` over the block's wall time;
* ``other_s``: the rest (the runtime's own work, the loss, idling in bubbles).

With ``torch.distributed`` initialised, every rank must enter the profile
(it starts with a barrier, so the ranks start the block together, and ends
with a gather): rank 0 gathers every rank's figures and writes the JSON
report and a timeline picture (:mod:`syncpass.core.picture`); without it,
the one process writes its own. The transfer waits are found through the
schedule module's wait and post helpers, which torch does not promise to keep: when
the wait helper is missing, transfers show as ``other_s`` and the report says so (a
missing post helper leaves the posting in ``other_s``).

Importing this module does not import torch; entering a profile does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from syncpass.core.fileio import write_atomically
from syncpass.core.picture import Span, draw_timeline
from syncpass.core.units import seconds

_WAIT_HELPER = "_wait_batch_p2p"
_POST_HELPER = "_batch_p2p"


@dataclass(frozen=True)
class RankFigures:
    """What one rank did inside the profiled block."""

    rank: int
    elapsed_s: float
    compute_s: float
    sync_time_s: float
    comm_wait_ratio: float
    other_s: float
    forward_calls: int
    backward_calls: int
    spans: tuple[Span, ...] = field(repr=False)


@dataclass(frozen=True)
class ProfileReport:
    """Every rank's figures (only this rank's on ranks other than 0 of a process group)."""

    name: str
    ranks: tuple[RankFigures, ...]
    transfers_seen: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transfers_seen": self.transfers_seen,
            "ranks": [
                {
                    **{k: v for k, v in asdict(figures).items() if k != "spans"},
                    "spans": [[span.kind, span.start_s, span.end_s] for span in figures.spans],
                }
                for figures in self.ranks
            ],
        }

    def render(self) -> str:
        lines = [f"syncpass profile {self.name}:", "rank   elapsed   compute  sync wait  wait/step"]
        for figures in self.ranks:
            lines.append(
                f"{figures.rank:<4} {figures.elapsed_s * 1e3:>7.1f}ms {figures.compute_s * 1e3:>7.1f}ms"
                f" {figures.sync_time_s * 1e3:>8.1f}ms {figures.comm_wait_ratio:>9.1%}"
            )
        if not self.transfers_seen:
            lines.append("transfer waits were not visible in this torch; they count as other time")
        return "\n".join(lines) + "\n"


class Profile:
    """Context manager that profiles a pipeline stage's run; see the module docstring.

    ``stage`` is the rank's pipeline stage, or a list or tuple of them. ``output`` is
    the path without suffix of the report (``.json``) and the picture (``.png``);
    ``None`` writes nothing (the figures stay in :attr:`report`).
    """

    def __init__(self, name: str, stage: Any, output: str | Path | None = None) -> None:
        self.name = name
        self.stages = list(stage) if isinstance(stage, list | tuple) else [stage]
        self.output = None if output is None else Path(output)
        self.report: ProfileReport | None = None
        self._spans: list[Span] = []
        self._start = 0.0
        self._restore: list[Callable[[], None]] = []
        self._calls = {"forward": 0, "backward": 0}
        self._transfers_seen = False

    def __enter__(self) -> Profile:
        import torch.distributed as dist

        self._spans = []
        self._calls = {"forward": 0, "backward": 0}
        try:
            for stage in self.stages:
                for kind in ("forward", "backward"):
                    self._wrap_method(stage, f"{kind}_one_chunk", kind)
                if hasattr(stage, "backward_weight_one_chunk"):
                    self._wrap_method(stage, "backward_weight_one_chunk", "backward")
            self._wrap_transfers()
        except BaseException:
            for restore in reversed(self._restore):
                restore()
            self._restore = []
            raise
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        self._start = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self._start
        for restore in reversed(self._restore):
            restore()
        self._restore = []
        if kind is not None:
            return  # the run failed: its error is what matters, not a half profile
        mine = self._figures(elapsed)
        self.report = self._gather(mine)
        # Only rank 0 holds every rank's figures; the others must not overwrite its files.
        if self.output is not None and mine.rank == 0:
            self.write(self.report, self.output)

    # --- recording -----------------------------------------------------------------

    def _record(
        self, kind: str, function: Callable[..., Any], transfers: bool = False
    ) -> Callable[..., Any]:
        """``function``, recording each call as a span of ``kind``; with ``transfers``, a
        call given no transfers (torch's helpers take the list first: an action with
        nothing to send or receive) is not recorded."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            if transfers and not (args and args[0]):
                return function(*args, **kwargs)
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                ended = time.perf_counter()
                self._spans.append(Span(kind, began - self._start, ended - self._start))
                if kind in self._calls:
                    self._calls[kind] += 1

        return timed

    def _wrap_method(self, stage: Any, name: str, kind: str) -> None:
        original = getattr(stage, name, None)
        if original is None:
            raise TypeError(f"{type(stage).__name__} has no {name}(); profile a pipeline stage")
        had_own = name in vars(stage)
        setattr(stage, name, self._record(kind, original))

        def restore() -> None:
            if had_own:
                setattr(stage, name, original)
            else:
                delattr(stage, name)

        self._restore.append(restore)

    def _wrap_transfers(self) -> None:
        from torch.distributed.pipelining import schedules

        original = getattr(schedules, _WAIT_HELPER, None)
        self._transfers_seen = callable(original)
        if original is None:
            return
        setattr(schedules, _WAIT_HELPER, self._record("wait", original, transfers=True))
        self._restore.append(lambda: setattr(schedules, _WAIT_HELPER, original))
        posting = getattr(schedules, _POST_HELPER, None)
        if callable(posting):
            setattr(schedules, _POST_HELPER, self._record("post", posting, transfers=True))
            self._restore.append(lambda: setattr(schedules, _POST_HELPER, posting))

    def _figures(self, elapsed: float) -> RankFigures:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        transfers = ("wait", "post")
        compute = sum(s.end_s - s.start_s for s in self._spans if s.kind not in transfers)
        waiting = sum(s.end_s - s.start_s for s in self._spans if s.kind in transfers)
        return RankFigures(
            rank=rank,
            elapsed_s=elapsed,
            compute_s=compute,
            sync_time_s=waiting,
            comm_wait_ratio=waiting / elapsed if elapsed > 0 else 0.0,
            other_s=max(0.0, elapsed - compute - waiting),
            forward_calls=self._calls["forward"],
            backward_calls=self._calls["backward"],
            spans=tuple(self._spans),
        )

    def _gather(self, mine: RankFigures) -> ProfileReport:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return ProfileReport(self.name, (mine,), self._transfers_seen)
        gathered: list[Any] | None = [None] * dist.get_world_size() if mine.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if gathered is None:
            return ProfileReport(self.name, (mine,), self._transfers_seen)
        return ProfileReport(self.name, tuple(gathered), self._transfers_seen)

    @staticmethod
    def write(report: ProfileReport, output: Path) -> None:
        """``output.json`` (figures and spans) and ``output.png`` (the timeline)."""
        output.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(
            str(output.with_suffix(".json")), json.dumps(report.to_json(), indent=2) + "\n"
        )
        total = max(figures.elapsed_s for figures in report.ranks)
        picture = draw_timeline(
            [figures.spans for figures in report.ranks],
            total,
            labels=[f"rank {figures.rank}" for figures in report.ranks],
            title=f"{report.name}: {len(report.ranks)} rank(s) over {seconds(total)}",
        )
        write_atomically(str(output.with_suffix(".png")), picture)

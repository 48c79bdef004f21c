"""What `syncpass.profiler.Profile` records: a span per forward and backward call of the
stage, and per posting of, and wait for, transfers, but none for a call given nothing to
post or wait for (an action without transfers), which would only clutter the timeline."""

from __future__ import annotations

from typing import Any

from torch.distributed.pipelining import schedules

from syncpass.profiler import Profile


class _Stage:
    """A stand-in with the methods Profile wraps; the schedule helpers are torch's own."""

    def forward_one_chunk(self, *args: Any) -> None:
        schedules._wait_batch_p2p(schedules._batch_p2p([]))  # the first stage receives nothing

    def backward_one_chunk(self, *args: Any) -> None:
        pass


def test_an_action_with_nothing_to_post_or_wait_for_records_no_transfer_span() -> None:
    stage = _Stage()
    with Profile("step", stage) as profile:
        stage.forward_one_chunk(0)
        stage.backward_one_chunk(0)
    assert profile.report is not None
    (rank,) = profile.report.ranks
    assert [span.kind for span in rank.spans] == ["forward", "backward"]
    assert rank.sync_time_s == 0.0
    # The helpers are torch's own again once the profile ends.
    assert schedules._batch_p2p.__name__ == "_batch_p2p"
    assert schedules._wait_batch_p2p.__name__ == "_wait_batch_p2p"

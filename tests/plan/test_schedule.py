"""The schedule simulator against closed forms for cases simple enough to have one."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from syncpass.plan.schedule import (
    Link,
    StageLoad,
    meeting_stall_s,
    simulate,
    simulate_order,
    single_stage_order,
    stage_order,
)


def free_links(stages: int) -> tuple[Link, ...]:
    return tuple(
        Link(alpha_s=0.0, beta_bytes_per_s=1.0, batch_bytes=0.0) for _ in range(stages - 1)
    )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), [(1, 1), (2, 4), (4, 8), (4, 2), (3, 3)])
def test_balanced_pipeline_takes_fill_plus_drain(
    schedule: str, stages: int, microbatches: int
) -> None:
    # Equal stages, free links: (M + S - 1) slots of one micro-batch's forward + backward.
    loads = tuple(StageLoad(forward_s=2.0, backward_s=4.0) for _ in range(stages))
    prediction = simulate(loads, free_links(stages), microbatches, schedule, training=True)
    per_microbatch = (2.0 + 4.0) / microbatches
    assert prediction.step_s == pytest.approx((microbatches + stages - 1) * per_microbatch)
    assert prediction.bubble_ratio == pytest.approx((stages - 1) / (microbatches + stages - 1))
    assert prediction.comm_wait_ratio == 0.0


def test_forward_only_pipeline() -> None:
    loads = tuple(StageLoad(forward_s=1.0, backward_s=0.0) for _ in range(3))
    prediction = simulate(loads, free_links(3), 5, "gpipe", training=False)
    assert prediction.step_s == pytest.approx((5 + 3 - 1) * 1.0 / 5)


def test_one_microbatch_pays_every_transfer_on_the_critical_path() -> None:
    loads = (StageLoad(1.0, 2.0), StageLoad(3.0, 5.0))
    link = Link(alpha_s=0.5, beta_bytes_per_s=2.0, batch_bytes=1.0)  # 1.0 s per transfer
    prediction = simulate(loads, (link,), 1, "1f1b", training=True)
    # forward 1 + send 1 + forward 3 + backward 5 + send 1 + backward 2
    assert prediction.step_s == pytest.approx(13.0)
    assert [stage.sync_s for stage in prediction.stages] == [2.0, 2.0]


def test_gradients_sent_back_are_their_own_bytes_and_none_cost_nothing() -> None:
    loads = (StageLoad(1.0, 2.0), StageLoad(3.0, 5.0))
    # 1.0 s forward (0.5 + 1 byte), 0.75 s back (0.5 + half a byte of gradients).
    half = Link(alpha_s=0.5, beta_bytes_per_s=2.0, batch_bytes=1.0, grad_bytes=0.5)
    assert simulate(loads, (half,), 1, "1f1b", training=True).step_s == pytest.approx(12.75)
    none = Link(alpha_s=0.5, beta_bytes_per_s=2.0, batch_bytes=1.0, grad_bytes=0.0, backward=False)
    prediction = simulate(loads, (none,), 1, "1f1b", training=True)
    assert prediction.step_s == pytest.approx(12.0)
    assert [stage.sync_s for stage in prediction.stages] == [1.0, 1.0]


def test_latency_is_paid_per_microbatch_and_bytes_are_split() -> None:
    link = Link(alpha_s=1.0, beta_bytes_per_s=1.0, batch_bytes=8.0)
    assert link.transfer_s(1) == 9.0
    assert link.transfer_s(4) == 3.0


def test_1f1b_order_fills_then_alternates() -> None:
    assert stage_order("1f1b", 0, 3, 4, True) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert stage_order("1f1b", 2, 3, 4, True) == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
        ("F", 3),
        ("B", 3),
    ]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=5),
    st.lists(st.floats(0, 1e6), min_size=4, max_size=4),
    st.integers(1, 9),
    st.sampled_from(["gpipe", "1f1b"]),
    st.booleans(),
)
def test_simulated_steps_are_consistent(
    load_pairs: list[tuple[float, float]],
    sizes: list[float],
    microbatches: int,
    schedule: str,
    training: bool,
) -> None:
    loads = tuple(StageLoad(f, b) for f, b in load_pairs)
    links = tuple(Link(1e-3, 1e6, size) for size in sizes[: len(loads) - 1])
    prediction = simulate(loads, links, microbatches, schedule, training)
    busiest = max(stage.compute_s + stage.sync_s for stage in prediction.stages)
    # No stage can finish before its own work is done; nothing is negative.
    assert prediction.step_s >= busiest - 1e-9
    assert all(stage.idle_s >= -1e-9 for stage in prediction.stages)
    assert 0.0 <= prediction.comm_wait_ratio <= 1.0 + 1e-9
    # The work is the same whatever the schedule.
    total = sum(f + (b if training else 0.0) for f, b in load_pairs)
    assert math.isclose(
        sum(stage.compute_s for stage in prediction.stages), total, rel_tol=1e-9, abs_tol=1e-12
    )


def test_fixed_parts_and_runtime_overhead_are_paid_by_every_microbatch() -> None:
    # One stage, 4 micro-batches: each pays the fixed 1 s forward and 2 s backward,
    # a quarter of the rest, and the runtime's 0.5 s per forward and per backward.
    load = StageLoad(
        forward_s=5.0, backward_s=10.0, forward_fixed_s=1.0, backward_fixed_s=2.0, overhead_s=0.5
    )
    assert load.forward_microbatch_s(4) == pytest.approx(1.0 + 4.0 / 4 + 0.5)
    assert load.backward_microbatch_s(4) == pytest.approx(2.0 + 8.0 / 4 + 0.5)
    prediction = simulate((load,), (), 4, "1f1b", training=True)
    assert prediction.step_s == pytest.approx(4 * (2.5 + 4.5))
    # With one micro-batch the fixed parts are already in the full-batch times.
    assert simulate((load,), (), 1, "gpipe", training=True).step_s == pytest.approx(16.0)


def _stalling(link: Link, stall_s: float = 0.4, window_s: float = 0.1) -> Link:
    return dataclasses.replace(link, meet_stall_s=stall_s, meet_window_s=window_s)


def test_posts_that_meet_stall_and_posts_apart_do_not() -> None:
    # Balanced stages over a cheap link: in 1F1B's steady state stage 0 posts a forward's
    # send with the next gradient's receive as stage 1 posts a backward's send with the
    # next activation's receive, after every micro-batch but the first and the last. Each
    # of those M - 2 meetings stalls both stages 0.4 s, on the step's busy path.
    link = Link(alpha_s=0.01, beta_bytes_per_s=1.0, batch_bytes=0.0)
    balanced = (StageLoad(2.0, 4.0), StageLoad(2.0, 4.0))
    for microbatches in (2, 4, 8):
        plain = simulate(balanced, (link,), microbatches, "1f1b", training=True)
        stalled = simulate(balanced, (_stalling(link),), microbatches, "1f1b", training=True)
        assert stalled.step_s - plain.step_s == pytest.approx(0.4 * (microbatches - 2))
    assert sum(stage.sync_s for stage in stalled.stages) > sum(
        stage.sync_s for stage in plain.stages
    )
    # Stages a whole forward apart never post within the window of each other.
    uneven = (StageLoad(2.0, 4.0), StageLoad(5.0, 10.0))
    apart = simulate(uneven, (link,), 8, "1f1b", training=True)
    assert simulate(uneven, (_stalling(link),), 8, "1f1b", training=True).step_s == (
        pytest.approx(apart.step_s)
    )


def test_a_stall_falls_off_linearly_over_the_window() -> None:
    link = _stalling(Link(alpha_s=0.0, beta_bytes_per_s=1.0, batch_bytes=0.0), 2.0, 0.5)
    assert [meeting_stall_s(link, apart) for apart in (0.0, 0.25, -0.25, 0.5, 3.0)] == [
        2.0,
        1.0,
        1.0,
        0.0,
        0.0,
    ]
    assert meeting_stall_s(_stalling(link, 2.0, 0.0), 0.0) == 0.0  # no window: no stall


def test_the_stalls_are_the_same_through_either_simulator() -> None:
    link = _stalling(Link(alpha_s=0.01, beta_bytes_per_s=1.0, batch_bytes=0.0))
    loads = (StageLoad(2.0, 4.0), StageLoad(2.0, 4.0), StageLoad(2.1, 4.0))
    order = single_stage_order("1f1b", 3, 1, 6, True)
    assert simulate(loads, (link, link), 6, "1f1b", training=True).step_s == pytest.approx(
        simulate_order(loads, (link, link), order).step_s
    )

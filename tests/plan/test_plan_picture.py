"""`syncpass plan --picture`: the plan's simulated step drawn, then read back from the PNG."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
from conftest import EXAMPLE_COSTS
from costbuilder import cost_dict
from pngfile import Image, read_png

from syncpass.cli import main
from syncpass.contracts.costs import Costs, load_costs, parse_costs
from syncpass.core.picture import (
    AXIS,
    BACKGROUND,
    BACKWARD,
    FORWARD,
    IDLE,
    TRANSFER,
    text_width,
)
from syncpass.plan.picture import PLAN_KINDS, draw_plan_picture, schedule_chart
from syncpass.plan.planner import Plan, PlanCache, PlanRequest, make_plan, timed_step
from syncpass.plan.schedule import Prediction, stage_order

COLOUR_KIND = {kind.colour: kind.kind for kind in PLAN_KINDS} | {IDLE: "idle"}


def planned(
    costs: Costs, stages: int, schedule: str = "1f1b", **request: object
) -> tuple[Plan, Prediction]:
    orders = request.pop("orders", None)
    cache = PlanCache(costs) if orders is None else PlanCache(costs, orders)  # type: ignore[arg-type]
    wanted = PlanRequest(stages=stages, config=costs.config, schedule=schedule, **request)  # type: ignore[arg-type]
    plan = make_plan(costs, wanted, "", cache)
    return plan, timed_step(plan, cache)


def row_tops(image: Image, labels: list[str]) -> list[int]:
    """The top line of each labelled row (its label is written 4 pixels lower)."""
    tops = []
    for label in labels:
        ((_, y),) = image.find_text(label)
        tops.append(y - 4)
    assert tops == sorted(tops)
    return tops


def segments(image: Image, y: int) -> list[tuple[str, int, int]]:
    """``(kind, first x, end x)`` of each span along line ``y`` of a row, read by colour; a
    pixel of no kind's colour within the row (a span's darker first column) starts the
    span after it."""
    found: list[list] = []
    shade = None
    for x, colour in enumerate(image.line(y)):
        kind = COLOUR_KIND.get(colour)
        if colour == BACKGROUND:
            shade = None
        elif kind is None:
            shade = x if shade is None else shade
        elif shade is not None or not found or found[-1][0] != kind or found[-1][2] != x:
            found.append([kind, x if shade is None else shade, x + 1])
            shade = None
        else:
            found[-1][2] = x + 1
    return [tuple(segment) for segment in found]


def axis(image: Image, last_label: str) -> tuple[int, float]:
    """Where time 0 is and the pixels a second, from the axis's first and last ticks (the
    last labelled ``last_label``)."""
    line = max(range(image.height), key=lambda y: image.line(y).count(AXIS))
    ticks = [x for x in range(image.width) if image.pixel(x, line + 2) == AXIS]
    value, unit = last_label.split()
    end_s = float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]
    (_,) = [  # the last tick's label, centred under it
        left
        for left, _ in image.find_text(last_label, line, line + 30)
        if abs(left + text_width(last_label) / 2 - ticks[-1]) <= 1
    ]
    assert image.find_text("0", line, line + 30)[0][0] == ticks[0]
    return ticks[0], (ticks[-1] - ticks[0]) / end_s


def test_the_example_plans_picture_has_a_row_per_stage_in_the_order_1f1b_runs() -> None:
    costs = load_costs(EXAMPLE_COSTS)
    plan, prediction = planned(costs, 4)
    image = read_png(draw_plan_picture(plan, prediction))
    assert image.width == 1200
    tops = row_tops(image, [f"stage {s}" for s in range(4)])
    for stage, top in enumerate(tops):
        kinds = [kind for kind, _, _ in segments(image, top + 1) if kind in "FB"]
        expected = stage_order("1f1b", stage, 4, plan.microbatches, True)
        assert kinds == [kind for kind, _ in expected]
    # The step in pixels is the predicted step on the axis's scale (to a pixel).
    zero, per_s = axis(image, "160 ms")
    end = max(segments(image, top + 1)[-1][2] for top in tops)
    assert abs((end - zero) - plan.predicted_step_s * per_s) <= 1


def test_each_action_and_transfer_is_drawn_where_the_simulation_put_it() -> None:
    # Twice as wide, so that every transfer of the example is wider than two pixels.
    costs = load_costs(EXAMPLE_COSTS)
    plan, prediction = planned(costs, 4)
    image = read_png(draw_plan_picture(plan, prediction, width=2400))
    tops = row_tops(image, [f"stage {s}" for s in range(4)])
    zero, per_s = axis(image, "150 ms")
    transfers = [t for row in prediction.actions for a in row for t in (a.recv_s, a.send_s) if t]
    assert min(transfers) * per_s > 2

    # Its kind's colour in the middle of each action's compute, the transfers' in the
    # middle of its receive and of its send (the first stage receives no forward's input
    # nor sends a gradient back, the last the other way round). A pixel x stands for the
    # times that round to it: [x - 0.5, x + 0.5) pixels from the start.
    def kind_at(top: int, t: float) -> str | None:
        return COLOUR_KIND.get(image.pixel(zero + math.floor(t * per_s), top + 1))

    for stage, (top, actions) in enumerate(zip(tops, prediction.actions, strict=True)):
        for timed in actions:
            computing, sending = timed.start_s + timed.recv_s, timed.end_s - timed.send_s
            assert kind_at(top, (computing + sending) / 2) == timed.action.kind
            forward = timed.action.kind == "F"
            receives, sends = (stage > 0, stage < 3) if forward else (stage < 3, stage > 0)
            assert (timed.recv_s > 0, timed.send_s > 0) == (receives, sends)
            if receives:
                assert kind_at(top, timed.start_s + timed.recv_s / 2) == "transfer"
            if sends:
                assert kind_at(top, sending + timed.send_s / 2) == "transfer"


def test_the_picture_says_the_predicted_step_and_names_its_colours() -> None:
    costs = load_costs(EXAMPLE_COSTS)
    plan, prediction = planned(costs, 4)
    image = read_png(draw_plan_picture(plan, prediction))
    assert plan.model is not None
    assert image.find_text(f"{plan.model}, 4 stages: predicted step (1f1b, 8 micro-batches)")
    assert image.find_text("145 ms;")
    legend_top = max(range(image.height), key=lambda y: image.line(y).count(AXIS)) + 30
    for label, colour in [
        ("forward", FORWARD),
        ("backward", BACKWARD),
        ("send/recv", TRANSFER),
        ("idle (bubble, waiting for a partner)", IDLE),
    ]:
        ((x, y),) = image.find_text(label, legend_top)
        assert image.pixel(x - 12, y + 7) == colour
    assert not image.find_text("(I)") and not image.find_text("(W)")  # 1F1B has neither


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("training", [True, False])
def test_the_timed_step_is_the_plans_predicted_step(schedule: str, training: bool) -> None:
    # Nested groups (planned whole or looked into, by the stage count), a link that costs.
    data = cost_dict(
        [1.0, 0.5, 0.5, 4.0, 4.0, 4.0, 4.0, 1.0, 1.0],
        [1e6] * 8,
        backward=[2.0] * 9,
        alpha=0.01,
        beta=1e9,
        training=training,
    )
    ids = ["stem", "g.0.0", "g.0.1", "g.1.0", "g.1.1", "g.1.2.0", "g.1.2.1", "tail", "head"]
    for op, op_id in zip(data["ops"], ids, strict=True):
        op["id"] = op_id
    for cut, op_id in zip(data["cuts"], ids, strict=False):
        cut["after"] = op_id
    data["edges"] = [["<input>", "stem"], *itertools.pairwise(ids), ["head", "<output>"]]
    data["groups"] = [
        {"id": "g.0", "ops": ["g.0.0", "g.0.1"]},
        {"id": "g.1", "ops": ["g.1.0", "g.1.1", "g.1.2.0", "g.1.2.1"]},
        {"id": "g.1.2", "ops": ["g.1.2.0", "g.1.2.1"]},
    ]
    costs = parse_costs(json.loads(json.dumps(data)))
    for stages in (1, 2, 4):
        plan, prediction = planned(costs, stages, schedule, microbatches=4)
        assert prediction.step_s == pytest.approx(plan.predicted_step_s, rel=1e-12)
        assert [len(actions) for actions in prediction.actions] == [4 * (1 + training)] * stages
        assert schedule_chart(plan, prediction).total_s == prediction.step_s


def test_a_prediction_of_another_plan_is_refused() -> None:
    costs = load_costs(EXAMPLE_COSTS)
    plan, prediction = planned(costs, 4)
    other = dataclasses.replace(prediction, step_s=prediction.step_s * 2)
    with pytest.raises(ValueError, match="not the plan's"):
        schedule_chart(plan, other)
    with pytest.raises(ValueError, match="kept no actions"):
        schedule_chart(plan, dataclasses.replace(prediction, actions=()))


def test_a_zero_bubble_schedule_shows_its_input_and_weight_gradients() -> None:
    pytest.importorskip("torch")
    from syncpass.backends.registry import load_backend

    orders = load_backend("torch_stages").schedule_order
    costs = load_costs(EXAMPLE_COSTS)
    plan, prediction = planned(costs, 2, "zbv", stages_per_device=2, microbatches=4, orders=orders)
    image = read_png(draw_plan_picture(plan, prediction, width=2400))
    tops = row_tops(image, ["rank 0: stages 0,3", "rank 1: stages 1,2"])
    for top, actions in zip(tops, prediction.actions, strict=True):
        kinds = [kind for kind, _, _ in segments(image, top + 1) if kind in "FBIW"]
        assert kinds == [timed.action.kind for timed in actions]
        assert {"I", "W"} <= set(kinds)
    assert image.find_text("backward, inputs' gradient (I)")
    assert image.find_text("backward, weights' gradient (W)")


# --- the command -----------------------------------------------------------------


def test_plan_picture_writes_the_png_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "plan.png"
    assert (
        main(["plan", "--costs", str(EXAMPLE_COSTS), "--stages", "2", "--picture", str(target)])
        == 0
    )
    out, err = capsys.readouterr()
    assert "predicted step" in out and f"wrote {target}" in err
    image = read_png(target.read_bytes())
    row_tops(image, ["stage 0", "stage 1"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["plan.png"]  # no temporary left


@pytest.mark.parametrize(
    ("picture", "flags", "message"),
    [
        ("missing/plan.png", [], "no such folder"),
        (".", [], "is a folder"),
        ("-", [], "give its name, not -"),
        ("plan.png", ["--sweep-batch", "8,16"], "drop --picture"),
        ("plan.png", ["-o", "plan.png"], "name the same file"),
        ("plan.png", ["--strategy", "tensor", "--tp", "2"], "drop it for a tensor plan"),
    ],
)
def test_plan_picture_refuses_a_target_it_cannot_write(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    picture: str,
    flags: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--costs", str(EXAMPLE_COSTS), "--stages", "2", "--picture", picture, *flags]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_plan_picture_refuses_to_overwrite_the_cost_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = tmp_path / "m.costs.json"
    costs.write_bytes(EXAMPLE_COSTS.read_bytes())
    assert main(["plan", "--costs", str(costs), "--stages", "2", "--picture", str(costs)]) == 2
    assert "the cost file" in capsys.readouterr().err
    assert costs.read_bytes() == EXAMPLE_COSTS.read_bytes()

"""The Gantt pictures: decoded from their PNG bytes and read as a person reads them."""

from __future__ import annotations

import itertools
import string

import pytest
from pngfile import Image, read_png

from syncpass.core.picture import (
    AXIS,
    BACKGROUND,
    BACKWARD,
    FORWARD,
    IDLE,
    TEXT,
    TEXT_HEIGHT,
    TRANSFER,
    Canvas,
    Chart,
    Kind,
    Span,
    draw_chart,
    draw_timeline,
    text_width,
    time_axis,
)


def runs(colours: list[tuple[int, int, int]], palette: set[tuple[int, int, int]]) -> list:
    """``[(colour, length), ...]`` of the palette's colours in order; a pixel of another
    colour (a span's darker first column) counts with the run after it, and the white
    around the row not at all."""
    found: list[list] = []
    pending = 0
    for colour in colours:
        if colour == BACKGROUND:
            pending = 0  # outside the row
        elif colour not in palette:
            pending += 1
        elif found and found[-1][0] == colour:
            found[-1][1] += 1 + pending
            pending = 0
        else:
            found.append([colour, 1 + pending])
            pending = 0
    return [tuple(run) for run in found]


def axis_ticks(image: Image) -> tuple[int, list[int]]:
    """The axis line's row and the columns of its ticks (the marks below the line)."""
    line = max(range(image.height), key=lambda y: image.line(y).count(AXIS))
    ticks = [x for x in range(image.width) if image.pixel(x, line + 2) == AXIS]
    return line, ticks


def test_a_timeline_has_a_labelled_row_per_rank_with_its_spans_in_their_colours() -> None:
    rows = [
        [Span("forward", 0.0, 0.5), Span("wait", 0.5, 0.6)],
        [Span("backward", 0.2, 1.0)],
    ]
    image = read_png(draw_timeline(rows, 1.0, width=600))
    assert image.width == 600
    ((zero_x, zero_y),) = image.find_text("rank 0")
    ((one_x, one_y),) = image.find_text("rank 1")
    assert zero_x == one_x and one_y > zero_y
    palette = {FORWARD, BACKWARD, TRANSFER, IDLE}
    # A row's top line (its label is written 4 pixels lower), right of the label.
    rank0 = runs(image.line(zero_y - 3)[zero_x + text_width("rank 0") + 1 :], palette)
    rank1 = runs(image.line(one_y - 3)[one_x + text_width("rank 1") + 1 :], palette)
    assert [colour for colour, _ in rank0] == [FORWARD, TRANSFER, IDLE]
    assert [colour for colour, _ in rank1] == [IDLE, BACKWARD]
    # Both rows span the same second: the forward half of it, the backward 0.8 of it.
    whole = sum(length for _, length in rank0)
    assert whole == sum(length for _, length in rank1)
    assert abs(rank0[0][1] - whole / 2) <= 1 and abs(rank0[1][1] - whole / 10) <= 1
    assert abs(rank1[1][1] - whole * 0.8) <= 1


def test_the_time_axis_has_round_ticks_labelled_with_their_times() -> None:
    image = read_png(draw_timeline([[Span("forward", 0.0, 0.05)]], 0.05, width=700))
    line, ticks = axis_ticks(image)
    assert len(ticks) == 6 and ticks[0] < ticks[-1]
    gaps = {b - a for a, b in itertools.pairwise(ticks)}
    assert max(gaps) - min(gaps) <= 1  # evenly spaced
    for x, label in zip(ticks, ["0", "10 ms", "20 ms", "30 ms", "40 ms", "50 ms"], strict=True):
        # Under its tick: centred, the 0 starting at it.
        under = [
            left
            for left, _ in image.find_text(label, line, line + 30)
            if (left == x if label == "0" else abs(left + text_width(label) / 2 - x) <= 1)
        ]
        assert len(under) == 1, label
    # The forward span covers the axis from its first tick to its last, as the total does.
    ((_, label_y),) = image.find_text("rank 0")
    covered = [x for x in range(image.width) if image.pixel(x, label_y + 1) == FORWARD]
    assert abs(covered[0] - ticks[0]) <= 1 and abs(covered[-1] + 1 - ticks[-1]) <= 1


@pytest.mark.parametrize(
    ("total_s", "labels"),
    [
        (0.145, ["0", "20 ms", "40 ms", "60 ms", "80 ms", "100 ms", "120 ms", "140 ms", "160 ms"]),
        (2.5, ["0", "0.5 s", "1 s", "1.5 s", "2 s", "2.5 s"]),
        (3.2e-5, ["0", "5 us", "10 us", "15 us", "20 us", "25 us", "30 us", "35 us"]),
        (40.0, ["0", "5 s", "10 s", "15 s", "20 s", "25 s", "30 s", "35 s", "40 s"]),
    ],
)
def test_ticks_are_a_round_step_in_the_unit_that_reads_best(
    total_s: float, labels: list[str]
) -> None:
    axis = time_axis(total_s, 100, 1000)
    assert [label for _, label in axis.ticks()] == labels
    assert axis.end_s >= total_s
    assert axis.ticks()[0][0] == 100 and axis.ticks()[-1][0] == 1100


def test_ticks_thin_out_on_a_narrow_picture() -> None:
    wide = time_axis(0.145, 0, 1000).ticks()
    narrow = time_axis(0.145, 0, 250).ticks()
    assert len(narrow) < len(wide)
    lefts = [x - text_width(label) / 2 for x, label in narrow]
    rights = [x + text_width(label) / 2 for x, label in narrow]
    assert all(rights[i] < lefts[i + 1] for i in range(len(narrow) - 1))  # labels apart


def test_the_legend_names_each_colour_beside_its_swatch() -> None:
    image = read_png(draw_timeline([[Span("forward", 0.0, 1.0)]], 1.0, width=500))
    line, _ = axis_ticks(image)
    for label, colour in [
        ("forward", FORWARD),
        ("backward", BACKWARD),
        ("waiting on transfers", TRANSFER),
        ("other (runtime, loss, bubble)", IDLE),
    ]:
        ((x, y),) = image.find_text(label, line + 20)
        assert image.pixel(x - 12, y + 7) == colour, label
    # It wraps within the picture: its last entry starts a line of its own.
    assert image.find_text("forward", line + 20)[0][1] < image.find_text("other", line + 20)[0][1]


def test_a_chart_says_its_title_wrapping_it_to_the_width() -> None:
    chart = Chart(
        rows=((Span("F", 0.0, 1.0),),),
        labels=("stage 0",),
        total_s=1.0,
        kinds=(Kind("F", "forward", FORWARD),),
        title="gpt: predicted step 145 ms; communication wait 6.02%, bubble 26.9%",
    )
    one = read_png(draw_chart(chart, 1000))
    assert len(one.find_text(chart.title)) == 1
    two = read_png(draw_chart(chart, 500))
    first, second = two.find_text("gpt: predicted step 145 ms;"), two.find_text("bubble 26.9%")
    assert first and second and second[0][1] > first[0][1]
    assert two.height > one.height
    assert all(pixel == BACKGROUND for pixel in two.line(two.height - 1))  # a margin below


def test_a_span_is_numbered_when_its_number_fits() -> None:
    chart = Chart(
        rows=((Span("F", 0.0, 0.5, "12"), Span("F", 0.5, 0.51, "13")),),
        labels=("stage 0",),
        total_s=1.0,
        kinds=(Kind("F", "forward", FORWARD),),
    )
    image = read_png(draw_chart(chart, 600))
    ((x, y),) = image.find_text("12", ink=BACKGROUND)  # white on the bar
    assert image.pixel(x - 2, y) == FORWARD and image.pixel(x + text_width("12") + 1, y) == FORWARD
    assert image.find_text("13", ink=BACKGROUND) == []  # 1% of the step: no room


def test_every_printable_character_has_a_glyph_of_its_own() -> None:
    def drawn(char: str) -> bytes:
        canvas = Canvas(text_width(char), TEXT_HEIGHT)
        canvas.text(0, 0, char, TEXT)
        return b"".join(canvas.rows)

    printable = string.digits + string.ascii_letters + string.punctuation
    glyphs = {char: drawn(char) for char in printable}
    assert len(set(glyphs.values())) == len(printable)
    assert drawn("µ") == glyphs["?"]  # what the font lacks


def test_text_pixels_are_dark() -> None:
    assert max(TEXT) < 64 and max(AXIS) < 128


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Chart((), (), 1.0, ()), "at least one row"),
        (lambda: Chart(((),), ("a", "b"), 1.0, ()), "one label per row"),
        (lambda: Chart(((),), ("a",), -1.0, ()), "finite number >= 0"),
        (lambda: Chart(((),), ("a",), float("nan"), ()), "finite number >= 0"),
    ],
)
def test_a_chart_refuses_what_it_cannot_draw(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        make()


def test_a_picture_too_narrow_for_its_axis_is_refused() -> None:
    with pytest.raises(ValueError, match="no room for the time axis"):
        draw_timeline([[Span("forward", 0.0, 1.0)]], 1.0, width=150)
    with pytest.raises(ValueError, match="at least one row"):
        draw_timeline([], 1.0)

"""Gantt pictures (PNG) of what each pipeline rank does over a step, with no plotting library.

A :class:`Chart` is rows of timed :class:`Span` s (one row per rank, device or stage), a
label per row, the kinds of span with their colours and legend text, and a title. It is
drawn pixel by pixel: the title on top, then the rows (time running left to right, the
row's label on its left, what is not covered by a span light grey), a time axis with
round, labelled ticks (``0``, ``20 ms``, ``40 ms``, ...), and a legend of the colours.
Text is a 5x7 bitmap font (with a row below for the tails of g, j, p, q, y) drawn at
twice its size; the image is encoded as an 8-bit RGB PNG with :mod:`zlib`.

``syncpass run --timeline`` draws what a real run did (:func:`draw_timeline`), and
``syncpass plan --picture`` the plan's simulated step (:mod:`syncpass.plan.picture`).
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

RGB = tuple[int, int, int]

BACKGROUND: RGB = (255, 255, 255)
IDLE: RGB = (232, 232, 232)  # a row's time not covered by a span
TEXT: RGB = (33, 33, 33)
AXIS: RGB = (96, 96, 96)
FORWARD: RGB = (66, 133, 244)
BACKWARD: RGB = (52, 168, 83)
TRANSFER: RGB = (219, 68, 55)
POSTING: RGB = (244, 180, 0)
OTHER: RGB = (160, 160, 160)  # a span of a kind the chart does not name

# The classic 5x7 font, ASCII ' ' (32) to '~' (126), with an eighth row for the tails of
# g, j, p, q and y: five columns a glyph, two hex digits a column, the low bit the top row.
_FONT_HEX = """
0000000000 00005f0000 0007000700 147f147f14 242a7f2a12 2313086462 3649552250 0005030000
001c224100 0041221c00 082a1c2a08 08083e0808 0050300000 0808080808 0060600000 2010080402
3e5149453e 00427f4000 4261514946 2141454b31 1814127f10 2745454539 3c4a494930 0171090503
3649494936 064949291e 0036360000 0056360000 0008142241 1414141414 4122140800 0201510906
324979413e 7e1111117e 7f49494936 3e41414122 7f4141221c 7f49494941 7f09090101 3e41415132
7f0808087f 00417f4100 2040413f01 7f08142241 7f40404040 7f0204027f 7f0408107f 3e4141413e
7f09090906 3e4151215e 7f09192946 4649494931 01017f0101 3f4040403f 1f2040201f 7f2018207f
6314081463 0304780403 6151494543 007f414100 0204081020 0041417f00 0402010204 4040404040
0001020400 2054545478 7f48444438 3844444420 384444487f 3854545418 087e090102 18a4a4a47c
7f08040478 00447d4000 4080807d00 007f102844 00417f4000 7c04180478 7c08040478 3844444438
fc24242418 18242424fc 7c08040408 4854545420 043f444020 3c4040207c 1c2040201c 3c4030403c
4428102844 1ca0a0a07c 4464544c44 0008364100 00007f0000 0041360800 0804081008
"""
_GLYPHS = {chr(32 + index): bytes.fromhex(glyph) for index, glyph in enumerate(_FONT_HEX.split())}
SCALE = 2  # screen pixels per font pixel
ADVANCE = 6 * SCALE  # a glyph and the column between glyphs
TEXT_HEIGHT = 8 * SCALE
LINE = TEXT_HEIGHT + 6

MARGIN = 10
ROW_HEIGHT = TEXT_HEIGHT + 10
ROW_GAP = 6
TICK = 5


@dataclass(frozen=True)
class Span:
    """One thing one row did: ``kind`` from ``start_s`` to ``end_s`` (seconds from the step's
    start); ``label`` is written inside the bar when it fits (a micro-batch's number)."""

    kind: str
    start_s: float
    end_s: float
    label: str = ""


@dataclass(frozen=True)
class Kind:
    """A kind of span: its colour and what the legend calls it."""

    kind: str
    label: str
    colour: RGB


@dataclass(frozen=True)
class Chart:
    """What a picture shows: ``rows[r]``'s spans, labelled ``labels[r]``, over ``total_s``
    seconds; ``kinds`` in legend order (``idle`` names the rows' uncovered time)."""

    rows: tuple[tuple[Span, ...], ...]
    labels: tuple[str, ...]
    total_s: float
    kinds: tuple[Kind, ...]
    idle: str = "idle"
    title: str = ""

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError("a chart needs at least one row")
        if len(self.labels) != len(self.rows):
            raise ValueError("a chart needs one label per row")
        if not math.isfinite(self.total_s) or self.total_s < 0:
            raise ValueError(
                f"a chart's total time must be a finite number >= 0, got {self.total_s}"
            )


#: The kinds a profiled run records (``syncpass.backends.torch.profiler``).
RUN_KINDS = (
    Kind("forward", "forward", FORWARD),
    Kind("backward", "backward", BACKWARD),
    Kind("wait", "waiting on transfers", TRANSFER),
    Kind("post", "posting transfers", POSTING),
)


def draw_timeline(
    rows: Sequence[Sequence[Span]],
    total_s: float,
    width: int = 1200,
    labels: Sequence[str] | None = None,
    title: str = "",
) -> bytes:
    """The PNG of a profiled run: ``rows`` of spans (one per rank, labelled ``rank 0``, ...
    unless ``labels`` are given) over ``total_s`` seconds."""
    if not rows:
        raise ValueError("a timeline needs at least one row")
    if labels is None:
        labels = [f"rank {rank}" for rank in range(len(rows))]
    chart = Chart(
        rows=tuple(tuple(spans) for spans in rows),
        labels=tuple(labels),
        total_s=total_s,
        kinds=RUN_KINDS,
        idle="other (runtime, loss, bubble)",
        title=title,
    )
    return draw_chart(chart, width)


# --- layout -------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """Where time falls in a picture: ``x(t) = left + round(t * pixels_per_s)``; ticks every
    ``tick_s`` from 0 to ``end_s`` (a whole number of ticks, at least the chart's total)."""

    left: int
    pixels_per_s: float
    tick_s: float
    end_s: float
    unit: str
    unit_s: float

    def x(self, t: float) -> int:
        return self.left + round(t * self.pixels_per_s)

    def ticks(self) -> list[tuple[int, str]]:
        count = round(self.end_s / self.tick_s)
        return [(self.x(i * self.tick_s), self.tick_label(i)) for i in range(count + 1)]

    def tick_label(self, index: int) -> str:
        if index == 0:
            return "0"
        return f"{round(index * self.tick_s / self.unit_s, 6):g} {self.unit}"


def time_axis(total_s: float, left: int, plot_width: int) -> Axis:
    """The axis over ``plot_width`` pixels from ``left``: the finest round tick step
    (1, 2 or 5 times a power of ten) whose labels do not crowd each other."""
    total_s = total_s if total_s > 0 else 1e-9
    exponent = math.floor(math.log10(total_s)) - 3
    while True:
        for mantissa in (1, 2, 5):
            tick = mantissa * 10.0**exponent
            count = max(1, math.ceil(total_s / tick - 1e-9))
            unit, unit_s = _unit(count * tick)
            axis = Axis(left, plot_width / (count * tick), tick, count * tick, unit, unit_s)
            widest = max(text_width(axis.tick_label(count)), text_width("0"))
            if count <= 20 and plot_width / count >= widest + 3 * ADVANCE:
                return axis
        exponent += 1


def _unit(end_s: float) -> tuple[str, float]:
    """The unit of an axis ending at ``end_s``: the largest it is at least one of."""
    for unit, unit_s in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if end_s >= unit_s * (1 - 1e-9):
            return unit, unit_s
    return "ns", 1e-9


# --- drawing ------------------------------------------------------------------------


def draw_chart(chart: Chart, width: int = 1200) -> bytes:
    """The PNG file's bytes of ``chart``, ``width`` pixels wide (see the module docstring)."""
    label_width = max(text_width(label) for label in chart.labels) + MARGIN
    left = MARGIN + label_width
    # Room on the right for half the last tick's label, centred under its tick.
    right = MARGIN + 4 * ADVANCE
    if width - left - right < 200:
        raise ValueError(f"a picture {width} pixels wide leaves no room for the time axis")
    axis = time_axis(chart.total_s, left, width - left - right)
    title = _wrap(chart.title, width - 2 * MARGIN) if chart.title else []
    legend = _legend_layout(chart, width)
    rows_top = MARGIN + len(title) * LINE + (4 if title else 0)
    rows_bottom = rows_top + len(chart.rows) * (ROW_HEIGHT + ROW_GAP) - ROW_GAP
    axis_y = rows_bottom + 3
    legend_top = axis_y + TICK + 4 + LINE + 4
    height = legend_top + (max(y for _, y, _, _ in legend) + LINE if legend else 0) + MARGIN

    canvas = Canvas(width, height)
    for line, text in enumerate(title):
        canvas.text(MARGIN, MARGIN + line * LINE, text, TEXT)
    colours = {kind.kind: kind.colour for kind in chart.kinds}
    end = axis.x(chart.total_s)
    for index, (label, spans) in enumerate(zip(chart.labels, chart.rows, strict=True)):
        top = rows_top + index * (ROW_HEIGHT + ROW_GAP)
        canvas.text(MARGIN, top + (ROW_HEIGHT - TEXT_HEIGHT) // 2, label, TEXT)
        canvas.fill(left, top, max(end, left + 1), top + ROW_HEIGHT, IDLE)
        for span in spans:
            _draw_span(canvas, axis, span, colours.get(span.kind, OTHER), top)
    canvas.fill(left, axis_y, axis.x(axis.end_s) + 1, axis_y + 1, AXIS)
    for x, text in axis.ticks():
        canvas.fill(x, axis_y, x + 1, axis_y + TICK, AXIS)
        start = x - text_width(text) // 2 if x > left else x
        canvas.text(start, axis_y + TICK + 4, text, TEXT)
    for x, y, colour, text in legend:
        y += legend_top
        canvas.fill(x, y, x + TEXT_HEIGHT, y + TEXT_HEIGHT, colour)
        canvas.outline(x, y, x + TEXT_HEIGHT, y + TEXT_HEIGHT, AXIS)
        canvas.text(x + TEXT_HEIGHT + 6, y, text, TEXT)
    return canvas.png()


def _draw_span(canvas: Canvas, axis: Axis, span: Span, colour: RGB, top: int) -> None:
    left = axis.x(max(span.start_s, 0.0))
    right = max(left + 1, axis.x(span.end_s))
    canvas.fill(left, top, right, top + ROW_HEIGHT, colour)
    if right - left >= 4:  # a darker first column: back-to-back spans stay apart
        canvas.fill(left, top, left + 1, top + ROW_HEIGHT, _shade(colour, 0.7))
    if span.label and text_width(span.label) + 4 <= right - left:
        ink = TEXT if sum(colour) > 3 * 170 else BACKGROUND
        x = (left + right - text_width(span.label)) // 2
        canvas.text(x, top + (ROW_HEIGHT - TEXT_HEIGHT) // 2, span.label, ink)


def _shade(colour: RGB, factor: float) -> RGB:
    red, green, blue = (round(channel * factor) for channel in colour)
    return red, green, blue


def _legend_layout(chart: Chart, width: int) -> list[tuple[int, int, RGB, str]]:
    """Each legend entry's ``(x, y, colour, text)``, ``y`` from the legend's top: the kinds
    in order, then the idle time, wrapped to the picture's width."""
    entries = [(kind.colour, kind.label) for kind in chart.kinds]
    entries.append((IDLE, chart.idle))
    placed: list[tuple[int, int, RGB, str]] = []
    x, y = MARGIN, 0
    for colour, text in entries:
        wide = TEXT_HEIGHT + 6 + text_width(text)
        if x > MARGIN and x + wide > width - MARGIN:
            x, y = MARGIN, y + LINE
        placed.append((x, y, colour, text))
        x += wide + 3 * ADVANCE
    return placed


def text_width(text: str) -> int:
    """Pixels ``text`` takes in the picture's font."""
    return max(0, len(text) * ADVANCE - SCALE)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` pixels, broken at spaces (a word longer than a
    line is cut where the picture ends)."""
    lines: list[str] = []
    line = ""
    for word in text.split():
        candidate = f"{line} {word}" if line else word
        if line and text_width(candidate) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return [*lines, line] if line else lines


class Canvas:
    """An RGB image, ``rows[y]`` holding ``3 * width`` bytes; drawing outside it is clipped."""

    def __init__(self, width: int, height: int, colour: RGB = BACKGROUND) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(colour) * width) for _ in range(height)]

    def fill(self, x0: int, y0: int, x1: int, y1: int, colour: RGB) -> None:
        """The rectangle from ``(x0, y0)`` up to, not including, ``(x1, y1)``."""
        x0, x1 = max(0, x0), min(self.width, x1)
        if x0 >= x1:
            return
        run = bytes(colour) * (x1 - x0)
        for y in range(max(0, y0), min(self.height, y1)):
            self.rows[y][3 * x0 : 3 * x1] = run

    def outline(self, x0: int, y0: int, x1: int, y1: int, colour: RGB) -> None:
        self.fill(x0, y0, x1, y0 + 1, colour)
        self.fill(x0, y1 - 1, x1, y1, colour)
        self.fill(x0, y0, x0 + 1, y1, colour)
        self.fill(x1 - 1, y0, x1, y1, colour)

    def text(self, x: int, y: int, text: str, colour: RGB) -> None:
        """``text`` with its top left corner at ``(x, y)``; a character the font lacks is
        drawn as ``?``."""
        for index, char in enumerate(text):
            glyph = _GLYPHS.get(char, _GLYPHS["?"])
            for column, bits in enumerate(glyph):
                for row in range(8):
                    if bits >> row & 1:
                        left = x + index * ADVANCE + column * SCALE
                        top = y + row * SCALE
                        self.fill(left, top, left + SCALE, top + SCALE, colour)

    def png(self) -> bytes:
        """The image as a PNG file (8-bit RGB, no filtering)."""
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )

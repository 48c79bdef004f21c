"""A timeline picture (PNG) of what each pipeline stage did during a profiled run.

One row per rank, time running left to right: forward computation in blue,
backward in green, time blocked on transfers (send/recv) in red, anything
else (the runtime's own work, idling in a bubble) left light grey. Thin
vertical ticks mark every millisecond step of a round size. Drawn pixel by
pixel and encoded with :mod:`zlib`: no plotting library is needed.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

#: RGB per event kind.
COLOURS = {
    "forward": (66, 133, 244),
    "backward": (52, 168, 83),
    "wait": (219, 68, 55),
}
BACKGROUND = (255, 255, 255)
IDLE = (232, 232, 232)
TICK = (160, 160, 160)


@dataclass(frozen=True)
class Span:
    """One thing one rank did: ``kind`` from ``start_s`` to ``end_s`` (seconds from the step's start)."""

    kind: str
    start_s: float
    end_s: float


def draw_timeline(
    rows: Sequence[Sequence[Span]],
    total_s: float,
    width: int = 1200,
    row_height: int = 36,
    gap: int = 8,
) -> bytes:
    """The PNG file's bytes of ``rows`` (one per rank) over ``total_s`` seconds."""
    if not rows:
        raise ValueError("a timeline needs at least one row")
    total_s = max(total_s, 1e-9)
    height = gap + len(rows) * (row_height + gap)
    pixels = [[BACKGROUND] * width for _ in range(height)]
    scale = (width - 1) / total_s
    tick = _tick_step(total_s)
    for index, spans in enumerate(rows):
        top = gap + index * (row_height + gap)
        for y in range(top, top + row_height):
            pixels[y] = [IDLE] * width
        for span in spans:
            colour = COLOURS.get(span.kind, TICK)
            left = max(0, min(width - 1, int(span.start_s * scale)))
            right = max(left + 1, min(width, math.ceil(span.end_s * scale)))
            for y in range(top, top + row_height):
                row = pixels[y]
                row[left:right] = [colour] * (right - left)
        mark = 0.0
        while mark <= total_s:
            x = min(width - 1, int(mark * scale))
            for y in range(top + row_height - 4, top + row_height):
                pixels[y][x] = TICK
            mark += tick
    return _png(pixels)


def _tick_step(total_s: float) -> float:
    """A round tick spacing giving 5 to 50 ticks over ``total_s``."""
    step = 10.0 ** math.floor(math.log10(total_s / 5))
    while total_s / step > 50:
        step *= 10
    return step


def _png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )

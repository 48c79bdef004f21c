"""Read the PNG files syncpass draws (8-bit RGB, not interlaced) and find text in them,
with zlib and struct only."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from syncpass.core.picture import TEXT, Canvas, text_width

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    rows: tuple[bytes, ...]  # 3 bytes a pixel

    def pixel(self, x: int, y: int) -> RGB:
        red, green, blue = self.rows[y][3 * x : 3 * x + 3]
        return red, green, blue

    def line(self, y: int) -> list[RGB]:
        return [self.pixel(x, y) for x in range(self.width)]

    def count(self, colour: RGB, top: int = 0, bottom: int | None = None) -> int:
        """Pixels of ``colour`` in the rows from ``top`` up to ``bottom``."""
        return sum(
            self.line(y).count(colour)
            for y in range(top, self.height if bottom is None else bottom)
        )

    def find_text(
        self, text: str, top: int = 0, bottom: int | None = None, ink: RGB = TEXT
    ) -> list[tuple[int, int]]:
        """Where ``text`` is written in the picture's font (its top left corners), between the
        rows ``top`` and ``bottom``: every pixel of its glyphs is ``ink`` and every other
        pixel of its box is not."""
        mask = _mask(text)
        bottom = self.height if bottom is None else bottom
        inked = {
            (x, y)
            for y in range(top, bottom)
            for x in range(self.width)
            if self.rows[y][3 * x : 3 * x + 3] == bytes(ink)
        }
        ink = [(dx, dy) for dy, row in enumerate(mask) for dx, on in enumerate(row) if on]
        paper = [(dx, dy) for dy, row in enumerate(mask) for dx, on in enumerate(row) if not on]
        first = ink[0]
        corners = sorted({(x - first[0], y - first[1]) for x, y in inked}, key=lambda c: c[::-1])
        return [
            (x, y)
            for x, y in corners
            if all((x + dx, y + dy) in inked for dx, dy in ink)
            and not any((x + dx, y + dy) in inked for dx, dy in paper)
        ]


def _mask(text: str) -> list[list[bool]]:
    canvas = Canvas(text_width(text), 16)
    canvas.text(0, 0, text, TEXT)
    return [
        [bytes(row[3 * x : 3 * x + 3]) == bytes(TEXT) for x in range(canvas.width)]
        for row in canvas.rows
    ]


def read_png(data: bytes) -> Image:
    """Decode ``data``, checking the signature, every chunk's CRC and the header."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    at, chunks = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        at += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, interlace) == (8, 2, 0), "8-bit RGB, not interlaced"
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = 3 * width
    assert len(raw) == height * (1 + stride)
    rows: list[bytes] = []
    previous = bytes(stride)
    for y in range(height):
        kind, line = (
            raw[y * (1 + stride)],
            bytearray(raw[y * (1 + stride) + 1 : (y + 1) * (1 + stride)]),
        )
        for i in range(stride):
            left = line[i - 3] if i >= 3 else 0
            up, corner = previous[i], previous[i - 3] if i >= 3 else 0
            line[i] = (line[i] + _predict(kind, left, up, corner)) & 0xFF
        previous = bytes(line)
        rows.append(previous)
    return Image(width, height, tuple(rows))


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return left
    if kind == 2:
        return up
    if kind == 3:
        return (left + up) // 2
    assert kind == 4, f"unknown filter {kind}"
    guess = left + up - corner
    near = min(
        (abs(guess - left), 0, left), (abs(guess - up), 1, up), (abs(guess - corner), 2, corner)
    )
    return near[2]

"""The line length the project's formatter keeps, so that what syncpass writes stays as it is
when the project runs its formatter.

ruff reads ``line-length`` from the nearest ``ruff.toml``, ``.ruff.toml`` or
``pyproject.toml`` with a ``[tool.ruff]`` table; black from ``[tool.black]``. Without
either, both keep lines to 88 columns. A file that cannot be read counts as absent: this
only decides where a long line syncpass writes breaks.

This module imports neither torch nor libcst.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: black's and ruff's line length when the project sets none.
DEFAULT_LINE_LENGTH = 88


def formatter_line_length(path: str) -> int:
    """The line length of the formatter configured for the file at ``path`` (88 if none)."""
    start = Path(path).resolve()
    for folder in start.parents:
        for name in ("ruff.toml", ".ruff.toml"):
            length = _line_length(_read(folder / name), ())
            if length is not None:
                return length
        project = _read(folder / "pyproject.toml")
        for table in (("tool", "ruff"), ("tool", "black")):
            length = _line_length(project, table)
            if length is not None:
                return length
    return DEFAULT_LINE_LENGTH


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _line_length(data: dict[str, Any], table: tuple[str, ...]) -> int | None:
    for key in table:
        data = data.get(key, {})
        if not isinstance(data, dict):
            return None
    value = data.get("line-length", data.get("line_length"))
    return value if isinstance(value, int) and 40 <= value <= 320 else None

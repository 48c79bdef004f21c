"""Reading the project's JSON files (cost files, plans) with errors a user can act on.

Python's ``json`` accepts what no cost file means: integers of thousands of digits
(``int too large to convert to float`` later, or a refusal deep in the decoder),
``NaN`` and ``Infinity``, and nesting deep enough to exhaust the interpreter's
recursion. Here each is an error naming the file, before any field is read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from syncpass.core.errors import SyncpassError

#: The most digits an integer in a JSON file of ours may have (a byte count of 1e30 has 31).
MAX_DIGITS = 32


class _Refused(ValueError):
    """A literal the file may not hold."""


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _constant(name: str) -> float:
    raise _Refused(f"{name}, which is no number JSON allows")


def loads_json(text: str, origin: str) -> Any:
    """Decode ``text`` (from ``origin``, for messages)."""
    try:
        return json.loads(text, parse_int=_integer, parse_constant=_constant)
    except json.JSONDecodeError as error:
        raise SyncpassError(
            f"not valid JSON: {error.msg} at line {error.lineno} column {error.colno}", origin
        ) from None
    except _Refused as error:
        raise SyncpassError(f"not a number syncpass can use: {error}", origin) from None
    except RecursionError:
        raise SyncpassError("the JSON is nested too deeply to read", origin) from None


def read_json(path: str | Path, what: str) -> Any:
    """Read and decode the JSON file ``path`` (``what`` it is: "cost file", "plan file")."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SyncpassError(f"no such {what}", str(path)) from None
    except IsADirectoryError:
        raise SyncpassError(f"is a folder, not a {what}", str(path)) from None
    except OSError as error:
        raise SyncpassError(f"cannot read the {what}: {error.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise SyncpassError("not a text file (expected JSON)", str(path)) from None
    return loads_json(text, str(path))

"""Reading a model file into a libcst tree, with errors a user can act on."""

from __future__ import annotations

import ast
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from syncpass.core.errors import SyncpassError


def decode_source(data: bytes, name: str) -> str:
    """The text of a Python source file; refuses empty and binary files."""
    if not data.strip():
        raise SyncpassError("the file is empty; expected Python source with a model class", name)
    if b"\x00" in data:
        raise SyncpassError("this is a binary file, not Python source", name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SyncpassError(
            "not UTF-8 text: cannot read it as Python source", f"{name}:{line}"
        ) from None


BOM = "\ufeff"


@dataclass(frozen=True)
class SourceForm:
    """What a source's bytes carry that libcst does not give back, taken off before the
    pass and put back on what it writes, so an unchanged file comes back byte for byte:
    a UTF-8 byte-order mark, and CR-only line endings (classic Mac OS)."""

    bom: bool = False
    cr_only: bool = False

    @classmethod
    def of(cls, text: str) -> tuple[SourceForm, str]:
        """The form of ``text``, and ``text`` without it (a BOM off, ``\\r`` as ``\\n``)."""
        bom = text.startswith(BOM)
        if bom:
            text = text[len(BOM) :]
        cr_only = "\r" in text and "\n" not in text
        if cr_only:
            text = text.replace("\r", "\n")
        return cls(bom, cr_only), text

    def restore(self, text: str) -> str:
        """``text`` in this form again."""
        if self.cr_only:
            text = text.replace("\n", "\r")
        return BOM + text if self.bom else text


def read_model_text(path: str | Path) -> str:
    """The text of a model source file, or ``-`` for stdin, with errors that name it."""
    if str(path) == "-":
        return decode_source(sys.stdin.buffer.read(), "<stdin>")
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SyncpassError("no such file", str(path)) from None
    except IsADirectoryError:
        raise SyncpassError("is a folder, not a model source file", str(path)) from None
    except OSError as error:
        raise SyncpassError(f"cannot read the file: {error.strerror}", str(path)) from None
    return decode_source(data, str(path))


#: How many parsed texts this process keeps: one command parses its input several times
#: (the analysis, the expansion into stages, the rewrite), a second of a large file each.
#: libcst's trees are immutable, so every caller can share one.
PARSED_KEPT = 8
_PARSED: OrderedDict[str, cst.Module] = OrderedDict()


def parse_source(text: str, name: str) -> cst.Module:
    """Parse ``text``; a syntax error names ``name:line`` and what is wrong.

    The running interpreter's own parser reads the text first, as black does: it words
    syntax errors best and places them exactly, it refuses what libcst would read but the
    interpreter that runs the model cannot (3.12's ``type X = ...`` under 3.11, more than
    200 nested brackets), and it is fast, so libcst never sees a pathological input
    (a thousand nested lists). Text it reads and libcst does not is refused too.
    """
    cached = _PARSED.get(text)
    if cached is not None:
        _PARSED.move_to_end(text)
        return cached
    try:
        ast.parse(text.removeprefix(BOM))
    except SyntaxError as python_error:
        raise SyncpassError(
            f"syntax error at column {python_error.offset or 1}: {python_error.msg} (Python "
            f"{sys.version_info.major}.{sys.version_info.minor})",
            f"{name}:{python_error.lineno or 1}",
        ) from None
    except (RecursionError, MemoryError):
        raise SyncpassError(
            "the source is nested too deeply for Python's parser; split the expression into "
            "smaller ones",
            name,
        ) from None
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        first_line = error.message.splitlines()[0] if error.message else "invalid syntax"
        message = re.sub(r"^parser error: error at \d+:\d+: ", "", first_line)
        raise SyncpassError(
            f"syntax libcst cannot read, at column {error.raw_column + 1}: {message}",
            f"{name}:{error.raw_line}",
        ) from None
    _PARSED[text] = module
    while len(_PARSED) > PARSED_KEPT:
        _PARSED.popitem(last=False)
    return module


def read_source(path: str | Path) -> tuple[str, cst.Module]:
    """Read and parse a model file."""
    text = read_model_text(path)
    return text, parse_source(text, str(path))

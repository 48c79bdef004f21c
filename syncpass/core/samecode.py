"""Whether two Python texts are the same code laid out differently: what a formatter does to
the lines syncpass wrote does not make them stale.

A project whose formatter keeps another line length than the one syncpass lays its lines
out for (black's and ruff's 88), or that formats a line syncpass did not break up (a long
statement it copies into a stage), gets the written code back reformatted. Compared byte
for byte, that file would then always differ from what syncpass writes: ``rewrite
--check`` and ``syncpass check`` would call it stale after every commit, and the
pre-commit hook and the formatter would take turns rewriting it. Compared as code, it is
up to date, and syncpass leaves the formatted file as it is.
"""

from __future__ import annotations

import ast
import io
import tokenize


def same_code(one: str, other: str) -> bool:
    """Whether ``one`` and ``other`` are the same Python, only laid out differently: the
    same syntax tree (strings and docstrings included) and the same comments in the same
    order. Line breaks, parentheses, trailing commas, quotes, blank lines and the space
    after a comment's ``#`` may differ. Texts that do not parse are the same only when
    they are equal."""
    if one == other:
        return True
    try:
        trees = [ast.dump(ast.parse(text)) for text in (one, other)]
        comments = [_comments(text) for text in (one, other)]
    except (SyntaxError, ValueError, tokenize.TokenError):
        return False
    return trees[0] == trees[1] and comments[0] == comments[1]


def _comments(text: str) -> list[str]:
    """The comments of ``text`` in order, without their ``#`` and surrounding spaces."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [token.string.lstrip("#").strip() for token in tokens if token.type == tokenize.COMMENT]

"""What every backend's sync-point transformer shares, whatever its sync statement.

A plan reaches a transformer as :class:`SyncSite` values: after which statement
of the model's function a sync point goes, or between which two iterations of a
loop over a layer container. Every line syncpass writes ends with a comment
that starts with :data:`SYNC_COMMENT_PREFIX`, by which it is found and removed
again (:data:`SYNC_TRAILER`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem

#: Every sync line syncpass writes carries a comment with this prefix.
SYNC_COMMENT_PREFIX = "# syncpass sync"
_SYNC_COMMENT = re.compile(r"^#\s*syncpass sync\b")


def is_sync_comment(text: str) -> bool:
    """Whether a comment (``# syncpass sync 1/2: ...``) marks its line as syncpass's."""
    return bool(_SYNC_COMMENT.match(text))


#: The end of a line syncpass wrote, for matchers of a backend's sync lines.
SYNC_TRAILER = m.TrailingWhitespace(comment=m.Comment(value=m.MatchIfTrue(is_sync_comment)))


def sync_comment(text: str) -> str:
    """The comment on a sync line: ``# syncpass sync`` and the site's own text."""
    return f"{SYNC_COMMENT_PREFIX} {text}"


@dataclass(frozen=True)
class SyncSite:
    """Where one sync call goes in the forward.

    ``statement`` indexes the forward's top-level statements. With
    ``split_after`` set, the statement is a loop over a layer container and
    the sync goes between iterations ``split_after`` and ``split_after + 1``
    (absolute container indices); otherwise it goes after the statement.
    ``comment`` is the text after ``# syncpass sync``. ``values`` (the names
    live across the sync point) and ``stage`` (the stage it opens) are for
    backends whose sync call names what it moves and where (JAX).
    """

    statement: int
    split_after: int | None
    comment: str
    values: tuple[str, ...] = ()
    stage: int = 0


def add_import(module: cst.Module, context: CodemodContext, item: ImportItem) -> cst.Module:
    """Add ``item`` where AddImportsVisitor puts it, looking only at the module's leading imports.

    A model file of thousands of lines is not walked again for one import.
    """
    cut = 0
    for index, statement in enumerate(module.body):
        if isinstance(statement, cst.SimpleStatementLine):
            if any(isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body):
                cut = index + 1
        else:
            break
    head = module.with_changes(body=module.body[:cut])
    visitor = AddImportsVisitor(context, [item])
    new_head = head.visit(visitor)
    return module.with_changes(header=new_head.header, body=(*new_head.body, *module.body[cut:]))

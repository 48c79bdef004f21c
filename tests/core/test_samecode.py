"""Two texts are the same code when only their layout differs: what a formatter changes."""

from __future__ import annotations

from syncpass.core.samecode import same_code

WRITTEN = """class NetStage0(NetStage):
    keeps: tuple[str, ...] = ()  # what the stage holds; everything else is None

    def forward(self, x):
        return self.head(x), x.shape[0]  # syncpass sync 1/2: sends x; 1 KiB
"""

#: WRITTEN as ``ruff format --line-length 60`` lays it out.
FORMATTED = """class NetStage0(NetStage):
    keeps: tuple[
        str, ...
    ] = ()  # what the stage holds; everything else is None

    def forward(self, x):
        return self.head(x), x.shape[
            0
        ]  # syncpass sync 1/2: sends x; 1 KiB
"""


def test_a_text_laid_out_anew_by_a_formatter_is_the_same_code() -> None:
    assert same_code(WRITTEN, FORMATTED)
    assert same_code(WRITTEN, WRITTEN.replace("#", "#  "))
    assert same_code("x = ('a',)\n", 'x = (\n    "a",\n)\n')  # quotes, a trailing comma
    assert same_code(WRITTEN, WRITTEN.replace("\n\n", "\n\n\n"))  # blank lines


def test_other_code_other_comments_or_text_that_does_not_parse_is_not() -> None:
    assert not same_code(WRITTEN, WRITTEN.replace("x.shape[0]", "x.shape[1]"))
    assert not same_code(WRITTEN, WRITTEN.replace("1 KiB", "2 KiB"))  # a figure in a comment
    assert not same_code(WRITTEN, WRITTEN.replace("# what the stage", "# What the stage"))
    moved = WRITTEN.replace("  # what the stage holds; everything else is None", "")
    assert not same_code(WRITTEN, moved)  # a comment dropped
    assert not same_code(WRITTEN, WRITTEN.replace("    def", "  def"))  # does not parse
    assert same_code("x = (\n", "x = (\n") and not same_code("x = (\n", "x = ( \n")

"""The formatter's line length that long lines syncpass writes are laid out for."""

from __future__ import annotations

from pathlib import Path

from syncpass.settings.formatting import DEFAULT_LINE_LENGTH, formatter_line_length


def test_the_nearest_ruff_or_black_configuration_gives_the_line_length(tmp_path: Path) -> None:
    model = tmp_path / "pkg" / "models" / "net.py"
    model.parent.mkdir(parents=True)
    assert formatter_line_length(str(model)) == DEFAULT_LINE_LENGTH == 88
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 120\n")
    assert formatter_line_length(str(model)) == 120
    (tmp_path / "pkg" / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert formatter_line_length(str(model)) == 100
    (tmp_path / "pkg" / "models" / "ruff.toml").write_text("line-length = 79\n")
    assert formatter_line_length(str(model)) == 79
    (tmp_path / "pkg" / "models" / "ruff.toml").write_text("not = [toml\n")
    assert formatter_line_length(str(model)) == 100  # unreadable: as if absent

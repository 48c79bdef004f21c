"""What a backend's lint reports: one finding per line, as flake8 and ruff print them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """One finding of a backend's lint: ``path:line:column`` (1-based), its rule's code and why."""

    code: str
    path: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.code} {self.message}"

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_COSTS = REPO / "examples" / "costs" / "gpt_24x1024.costs.json"


@pytest.fixture
def example_costs_path() -> Path:
    return EXAMPLE_COSTS

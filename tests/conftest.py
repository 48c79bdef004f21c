from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# What syncpass caches (torch's schedule orders) goes to a folder of this run, not the
# user's: the commands the tests start inherit it.
os.environ["SYNCPASS_CACHE_DIR"] = tempfile.mkdtemp(prefix="syncpass-test-cache-")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_COSTS = REPO / "examples" / "costs" / "gpt_24x1024.costs.json"


@pytest.fixture
def example_costs_path() -> Path:
    return EXAMPLE_COSTS

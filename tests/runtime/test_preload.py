"""The ranks of a run start with the model file's own imports done: the fork server imports
them once (syncpass.runtime.preload), instead of every rank importing them again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.runtime.processes import top_level_imports

#: A library of the model's, which writes the id of each process that imports it.
LIBRARY = """
import os
from pathlib import Path

with Path(__file__).with_suffix(".pids").open("a") as record:
    record.write(f"{os.getpid()}\\n")

WIDTH = 32
"""

MODEL = """
import torch
from torch import nn

import model_library
from model_library import WIDTH


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(WIDTH, WIDTH)
        self.second = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x))
        return self.second(h)


def example():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, WIDTH),), torch.randn(8, WIDTH), nn.functional.mse_loss
"""


def test_the_top_level_imports_are_read_by_absolute_name() -> None:
    text = (
        "from __future__ import annotations\nimport os, torch.nn as nn\n"
        "from transformers.activations import ACT2FN\nfrom . import sibling\n"
        "import os\n\ndef f():\n    import json\n"
    )
    assert top_level_imports(text) == ("os", "torch.nn", "transformers.activations")
    assert top_level_imports("def broken(:\n") == ()


@pytest.mark.slow
def test_the_ranks_do_not_import_the_models_libraries_again(tmp_path: Path) -> None:
    (tmp_path / "model_library.py").write_text(LIBRARY)
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    out = tmp_path / "model_sync.py"

    def syncpass(*argv: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "syncpass", *argv],
            capture_output=True, text=True, cwd=tmp_path, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    syncpass(
        "rewrite", str(model), "--example", f"{model}:example", "--stages", "2", "-o", str(out)
    )
    pids = tmp_path / "model_library.pids"
    pids.unlink()
    syncpass("run", str(out), "--stages", "2", "--verify", "--steps", "1")
    # The fork server imported it; the example's guarded check and both ranks, forked from
    # it, found it imported.
    assert len(pids.read_text().split()) == 1

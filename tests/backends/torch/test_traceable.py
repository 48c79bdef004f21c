"""Profile asks torch's tracer once whether it takes the model, and says why not, at the line."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.torch.example import load_example
from syncpass.backends.torch.traceable import tracer_failure
from syncpass.cli import main

#: Data-dependent control flow: runs eagerly, but torch.export cannot capture it.
GATED = """
import torch
import torch.nn as nn


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        if x.sum() > 0:  # data-dependent
            x = self.b(x)
        return x


def example():
    return Gated(), (torch.randn(4, 8),)
"""


@pytest.fixture
def gated(tmp_path: Path) -> Path:
    path = tmp_path / "gated.py"
    path.write_text(textwrap.dedent(GATED).lstrip())
    return path


def test_a_model_the_tracer_cannot_take_is_named_at_its_line(gated: Path) -> None:
    example = load_example(f"{gated}:example")
    failure = tracer_failure(example.model, example.args, gated)
    assert failure is not None
    assert failure.startswith(f"{gated}:13: ")  # the `if x.sum() > 0` line
    assert "data-dependent" in failure


def test_a_model_the_tracer_takes_has_no_finding() -> None:
    path = REPO / "examples" / "uneven_mlp.py"
    example = load_example(f"{path}:example")
    assert tracer_failure(example.model, example.args, path) is None


def test_the_check_leaves_torch_logging_and_stderr_as_they_were(
    gated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = load_example(f"{gated}:example")
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    assert tracer_failure(example.model, example.args, gated) is not None
    assert not logger.disabled
    assert capsys.readouterr().err == ""  # torch's graph dump and warnings stayed quiet


def test_profile_warns_and_the_cost_file_says_so(
    gated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gated.costs.json"
    argv = ["profile", str(gated), "--backend", "torch", "--repeats", "1", "--warmup", "0"]
    assert main([*argv, "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        f"warning: torch.distributed.pipelining.pipeline() cannot trace this model ({gated}:13:"
        in err
    )
    notes = json.loads(out.read_text())["notes"]
    assert any("cannot trace this model" in note for note in notes)
    # Every plan of it shows the note.
    assert main(["plan", "--costs", str(out), "--stages", "2", "--no-baselines"]) == 0
    assert "cannot trace this model" in capsys.readouterr().out

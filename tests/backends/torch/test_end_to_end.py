"""The whole pass on a bundled example planned per child of its nn.Sequential stacks
(``--depth 2``): profile, rewrite with a pinned cut inside a stack, run split over gloo
processes and check that the loss and every gradient equal the unsplit model's.

Every bundled example's profile, rewrite at 2, 3 and 4 stages in both torch forms and
verified run (with the cost model's prediction beside it) is ``tests/test_plans_run.py``."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.contracts.costs import load_costs


@pytest.mark.slow
def test_depth_2_places_sync_points_inside_sequential_stages(tmp_path: Path) -> None:
    source = tmp_path / "resnet.py"
    shutil.copy(REPO / "examples" / "resnet.py", source)
    costs = tmp_path / "resnet.costs.json"
    assert (
        main(
            [
                "profile",
                str(source),
                "-o",
                str(costs),
                "--depth",
                "2",
                "--repeats",
                "2",
                "--warmup",
                "1",
            ]
        )
        == 0
    )
    ids = [op.id for op in load_costs(costs).ops]
    assert "layer1.0" in ids and "layer1" not in ids  # planned per child
    rewritten = tmp_path / "resnet_sync.py"
    assert (
        main(
            [
                *("rewrite", str(source), "--costs", str(costs), "--stages", "4"),
                # A sync point inside layer1, whatever the timings say about the others.
                *("--cuts", "layer1.1", "-o", str(rewritten)),
            ]
        )
        == 0
    )
    text = rewritten.read_text()
    # The pinned sync point after layer1.1: one piece ends at layer1's index 2 and the
    # next starts there. The timings may put another sync point inside layer1, before
    # (the piece then starts at 1) or after it (the next ends before the end).
    assert re.search(r"x = self\.layer1\[1?:2\]\(x\)", text), text
    assert "x = self.layer1[2:" in text
    assert main(["run", str(rewritten), "--stages", "4", "--verify", "--steps", "1"]) == 0

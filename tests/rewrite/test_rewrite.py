"""The torch pipeline rewrite: golden whole-model cases, transformer units, guarantees."""

from __future__ import annotations

import json

import libcst as cst
import pytest
from golden_cases import Case, cases, run_case
from libcst.codemod import CodemodTest

from syncpass.backends.torch.rewrite import strip_sync_points
from syncpass.frontend import parse_source
from syncpass.plan.planfile import plan_to_json
from syncpass.transformers.common import import_in_order
from syncpass.transformers.torch_pipeline import (
    InsertPipeSplitsCommand,
    RemovePipeSplitsCommand,
    SyncSite,
)

CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_golden_rewrite(case: Case) -> None:
    result = run_case(case)
    assert case.expected is not None, f"run `python tests/golden_cases.py` to create {case.path}"
    assert result.rewritten == case.expected
    assert plan_to_json(result.plan) == json.loads(case.plan_path.read_text())


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_rewrite_guarantees(case: Case) -> None:
    result = run_case(case)
    parse_source(result.rewritten, case.name)  # the output parses
    assert run_case(case, result.rewritten).rewritten == result.rewritten  # idempotent
    assert strip_sync_points(result.rewritten, case.name) == case.source  # reversible
    if not result.plan.sync_points:
        assert result.rewritten == case.source  # byte-identical with one stage
    # One sync call per sync point, each with its one-line comment; the user's own
    # pipe_split() calls count as sync points and stay as they were.
    lines = [line for line in result.rewritten.splitlines() if "pipe_split()" in line]
    assert len(lines) == len(result.plan.sync_points)
    ours = [line for line in lines if "# syncpass sync " in line]
    assert len(ours) == len(lines) - len(result.graph.written)
    assert all("predicted" in line for line in ours)


class TestInsertPipeSplits(CodemodTest):
    TRANSFORM = InsertPipeSplitsCommand

    def test_after_a_statement_with_import(self) -> None:
        before = """
            import torch

            class M(torch.nn.Module):
                def forward(self, x):
                    x = self.a(x)  # keep me
                    return self.b(x)
        """
        after = """
            import torch
            from torch.distributed.pipelining import pipe_split

            class M(torch.nn.Module):
                def forward(self, x):
                    x = self.a(x)  # keep me
                    pipe_split()  # syncpass sync 1/1: test
                    return self.b(x)
        """
        self.assertCodemod(before, after, "M", [SyncSite(0, None, "1/1: test")])

    def test_split_loop_over_slices(self) -> None:
        before = """
            class M:
                def forward(self, x):

                    for layer in self.layers[1:]:
                        x = layer(x)
                    return x
        """
        after = """
            from torch.distributed.pipelining import pipe_split

            class M:
                def forward(self, x):

                    for layer in self.layers[1:3]:
                        x = layer(x)
                    pipe_split()  # syncpass sync a
                    for layer in self.layers[3:]:
                        x = layer(x)
                    return x
        """
        self.assertCodemod(before, after, "M", [SyncSite(0, 2, "a")])

    def test_enumerate_keeps_counting_across_pieces(self) -> None:
        before = """
            import torch

            class M:
                def forward(self, x):
                    for i, b in enumerate(self.blocks[1:], 1):
                        x = b(x) * i
                    return x
        """
        after = """
            import torch
            from torch.distributed.pipelining import pipe_split

            class M:
                def forward(self, x):
                    for i, b in enumerate(self.blocks[1:3], 1):
                        x = b(x) * i
                    pipe_split()  # syncpass sync a
                    for i, b in enumerate(self.blocks[3:], 3):
                        x = b(x) * i
                    return x
        """
        self.assertCodemod(before, after, "M", [SyncSite(0, 2, "a")])

    def test_missing_site_warns_and_changes_nothing(self) -> None:
        before = """
            class M:
                def forward(self, x):
                    return x
        """
        self.assertCodemod(
            before,
            before,
            "Other",
            [SyncSite(0, None, "a")],
            expected_warnings=["no single Other.forward to place sync points in; nothing changed"],
        )

    def test_split_inside_a_loop_that_is_not_over_a_container_is_refused(self) -> None:
        before = """
            class M:
                def forward(self, x):
                    for k in range(3):
                        x = x * k
                    return x
        """
        self.assertCodemod(
            before,
            before,
            "M",
            [SyncSite(0, 1, "a")],
            expected_warnings=[
                "a sync point is planned inside a loop that is not over a layer container"
            ],
        )


class TestRemovePipeSplits(CodemodTest):
    TRANSFORM = RemovePipeSplitsCommand

    def test_removes_only_its_own_sync_points_and_merges_loops(self) -> None:
        before = """
            from torch.distributed.pipelining import pipe_split

            class M:
                def forward(self, x):
                    for i, b in enumerate(self.blocks[:2]):
                        x = b(x) + i
                    pipe_split()  # syncpass sync 1/2: 1 KiB, 3 us/step predicted
                    for i, b in enumerate(self.blocks[2:], start=2):
                        x = b(x) + i
                    x = self.head(x)
                    pipe_split()  # placed by hand
                    return x
        """
        after = """
            from torch.distributed.pipelining import pipe_split

            class M:
                def forward(self, x):
                    for i, b in enumerate(self.blocks):
                        x = b(x) + i
                    x = self.head(x)
                    pipe_split()  # placed by hand
                    return x
        """
        self.assertCodemod(before, after)

    def test_drops_the_import_when_unused(self) -> None:
        before = """
            import torch
            from torch.distributed.pipelining import pipe_split

            class M:
                def forward(self, x):
                    x = self.a(x)
                    pipe_split()  # syncpass sync 1/1: 1 KiB, 3 us/step predicted
                    return self.b(x)
        """
        after = """
            import torch

            class M:
                def forward(self, x):
                    x = self.a(x)
                    return self.b(x)
        """
        self.assertCodemod(before, after)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        # Among the from-imports of the last run, in the order of their modules.
        (
            "import os\n\nimport torch\nfrom torch import nn\nfrom zz import q\n",
            "import os\n\nimport torch\nfrom syncpass.rt import f\nfrom torch import nn\n"
            "from zz import q\n",
        ),
        # First in its run: it takes the run's blank lines above.
        (
            '"""Doc."""\n\nfrom torch import nn\n',
            '"""Doc."""\n\nfrom syncpass.rt import f\nfrom torch import nn\n',
        ),
        # Nothing above it sorts after it, or only an earlier section does: left last.
        (
            "from zz import q\n\nfrom abc import d\n",
            "from zz import q\n\nfrom abc import d\nfrom syncpass.rt import f\n",
        ),
    ],
)
def test_an_added_import_is_sorted_into_its_run(head: str, expected: str) -> None:
    module = cst.parse_module(head + "from syncpass.rt import f\n\nX = 1\n")
    assert import_in_order(module, "syncpass.rt").code == expected + "\nX = 1\n"

"""The layout is part of the design: no import cycles, a small top level, torch-free parts
that run without torch. (`lint-imports`, run by `.ci/run`, checks the layer order.)"""

from __future__ import annotations

import os
import subprocess
import sys

import grimp
import pytest
from conftest import REPO


def strongly_connected(edges: dict[str, list[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            groups.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return groups


def test_strongly_connected_finds_a_cycle() -> None:
    edges = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}
    assert sorted(map(len, strongly_connected(edges))) == [1, 3]


def test_no_import_cycle_among_syncpass_modules() -> None:
    graph = grimp.build_graph("syncpass")  # imports under TYPE_CHECKING and in functions count
    edges = {
        module: sorted(graph.find_modules_directly_imported_by(module)) for module in graph.modules
    }
    cycles = [group for group in strongly_connected(edges) if len(group) > 1]
    assert cycles == []


def test_the_top_level_holds_at_most_a_dozen_files() -> None:
    files = sorted(path.name for path in (REPO / "syncpass").iterdir() if path.is_file())
    assert len(files) <= 12, files


#: The tests of the parts that need neither torch nor jax: they must run on a machine without them.
TORCH_FREE = (
    "core",
    "contracts",
    "plan",
    "settings",
    "frontend",
    "rewrite",
    "commands",
    "backends/torch/test_estimate.py",  # the static estimator never needs torch
)


@pytest.mark.slow
def test_the_torch_free_parts_are_tested_without_torch_or_jax() -> None:
    hidden = REPO / "tests" / "data" / "without_torch"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), str(REPO)]))
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0 and "hidden for this run" in probe.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            # In one process: this test already holds one of the run's parallel workers.
            "-n",
            "0",
            # The example-based tests: the property tests search the same code's inputs at
            # length (half this run's time), which the main run does with torch beside it.
            "-m",
            "not slow and not property",
            *(str(REPO / "tests" / folder) for folder in TORCH_FREE),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout and "skipped" in done.stdout  # parallelize's test skips

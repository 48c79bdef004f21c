"""Golden rewrite cases: ``tests/golden/rewrite/<case>.py`` holds the input, a marker line
and the expected output; ``<case>.costs.json`` the costs and ``<case>.plan.json`` the plan.

Run ``python tests/golden_cases.py`` to (re)write the expected outputs and plans after a
deliberate change, then read the diff before committing it.
"""

from __future__ import annotations

import argparse
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncpass.backends.torch.analysis import analyse_model, loop_containers, sequential_calls
from syncpass.backends.torch.backend import BACKEND as TORCH
from syncpass.contracts.config import SyncConfig
from syncpass.contracts.costs import Costs, costs_to_json, load_costs, parse_costs
from syncpass.frontend import parse_source
from syncpass.plan.planfile import plan_to_json
from syncpass.plan.planner import PlanRequest
from syncpass.rewrite.driver import RewriteResult, rewrite_text

GOLDEN = Path(__file__).parent / "golden" / "rewrite"
MARKER = "# output:\n"


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    source: str
    expected: str | None
    stages: int
    config: SyncConfig
    model: str | None
    depth: int

    @property
    def costs_path(self) -> Path:
        return self.path.with_suffix(".costs.json")

    @property
    def plan_path(self) -> Path:
        return self.path.with_suffix(".plan.json")


def read_case(path: Path) -> Case:
    text = path.read_text()
    source, _, expected = text.partition(MARKER)
    first = source.splitlines()[0]
    assert first.startswith("# args:"), f"{path}: the first line must be '# args: ...'"
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", type=int, required=True)
    parser.add_argument("--threshold", type=float)
    parser.add_argument("--model")
    parser.add_argument("--depth", type=int, default=1)
    flags = parser.parse_args(shlex.split(first.removeprefix("# args:")))
    return Case(
        name=path.stem,
        path=path,
        source=source,
        expected=expected if _ else None,
        stages=flags.stages,
        config=SyncConfig().replace(communication_cost_threshold=flags.threshold),
        model=flags.model,
        depth=flags.depth,
    )


def cases() -> list[Case]:
    return [read_case(path) for path in sorted(GOLDEN.glob("*.py"))]


def estimated_costs(case: Case) -> dict[str, Any]:
    """Deterministic costs for a case: heavier ops where more is called, every cut sized by
    what is live (no measurement, so the golden files do not depend on the machine)."""
    module = parse_source(case.source, case.name)
    # Container lengths as the models' constructors make them.
    lengths = {"container_loop": 6, "enumerate_loop": 4, "sliced_loop": 8}
    sizes = {name: lengths[case.name] for name in loop_containers(module, case.model, case.name)}
    # With --depth 2, calls of these sequential containers are planned per child.
    sequentials = {"layer1": 3, "layer2": 3}
    expand = {
        name: sequentials[name]
        for name in sequential_calls(module, case.model, case.name)
        if case.depth >= 2 and name in sequentials
    }
    graph = analyse_model(module, case.name, case.model, sizes, expand=expand)
    ops = [
        {
            "id": op.id,
            "compute_s": 0.001 * (1 + len(op.calls) + index % 3),
            "backward_s": 0.002 * (1 + len(op.calls)),
            "param_bytes": 4096 * sum(call.startswith("self.") for call in op.calls),
            "out_bytes": 1024,
        }
        for index, op in enumerate(graph.ops)
    ]
    cuts = [
        {
            "after": cut.after,
            "live_bytes": 65536 * len(cut.live),
            **({"pinned": True} if cut.pinned else {}),
        }
        for cut in graph.cuts
    ]
    data = {
        "version": 1,
        "model": graph.model_class,
        "batch_size": 8,
        "training": True,
        "memory_multiplier": 4,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": ops,
        "cuts": cuts,
    }
    return costs_to_json(parse_costs(data))


def run_case(case: Case, source: str | None = None) -> RewriteResult:
    costs: Costs = load_costs(case.costs_path)
    request = PlanRequest(
        stages=case.stages,
        config=costs.config.replace(
            communication_cost_threshold=case.config.communication_cost_threshold
            if case.config != SyncConfig()
            else None
        ),
    )
    return rewrite_text(
        case.source if source is None else source, f"{case.name}.py", TORCH, request, costs
    )


def regenerate() -> None:
    for case in cases():
        if not case.costs_path.exists():
            case.costs_path.write_text(json.dumps(estimated_costs(case), indent=2) + "\n")
        result = run_case(case)
        case.path.write_text(case.source + MARKER + result.rewritten)
        case.plan_path.write_text(json.dumps(plan_to_json(result.plan), indent=2) + "\n")
        print(f"{case.name}: {len(result.plan.sync_points)} sync point(s)")


if __name__ == "__main__":
    regenerate()

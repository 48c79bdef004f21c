"""What the analysis saw, as JSON for ``rewrite --report``."""

from __future__ import annotations

from typing import Any

from syncpass.contracts.graph import OpGraph


def analysis_to_json(graph: OpGraph) -> dict[str, Any]:
    """Ops (with where they are and what they run), cuts with their live values, regions."""
    return {
        "model_class": graph.model_class,
        "forward": str(graph.forward),
        "inputs": list(graph.inputs),
        "ops": [
            {
                "id": op.id,
                "location": str(op.location),
                "calls": list(op.calls),
                "reads": list(op.reads),
                "writes": list(op.writes),
                **({"region": op.region} if op.region else {}),
                **({"alias": True} if op.alias else {}),
            }
            for op in graph.ops
        ],
        "cuts": [
            {"after": cut.after, "live": list(cut.live), "pinned": cut.pinned} for cut in graph.cuts
        ],
        "regions": [str(region) for region in graph.regions],
        "inlined": list(graph.inlined),
        "branches": list(graph.branches),
        "no_sync": list(graph.forbidden),
    }

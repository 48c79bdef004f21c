"""The analysis's live sets are what torch's own tracer sends: for generated forwards full
of aliases (``skip = x``, tuples packed and unpacked, lambdas that capture, stores into a
local dict), the bytes the profile measures as live across a cut equal the bytes of what
``torch.distributed.pipelining.pipeline()`` hands from the stage before the cut to the
stage after it (its outputs and the model inputs it reads), cut by cut."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from syncpass.cli import main

torch = pytest.importorskip("torch")


@st.composite
def forwards(draw: st.DrawFn) -> str:
    """A forward over (4, 8) tensors whose values go by many names; it returns the sum of
    every name, so no statement is dead (a statement that only names values keeps its
    reads live even when its names are never read: the eager stages run it verbatim and
    need them, while torch's tracer drops it; see ``frontend.analysis._dataflow``)."""
    names = ["x", "v0"]
    lines: list[str] = ["v0 = self.l0(x)"]
    counter = 0

    def fresh(prefix: str = "v") -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}{counter}"

    for _ in range(draw(st.integers(3, 9))):
        kind = draw(
            st.sampled_from(["linear", "linear", "add", "alias", "pack", "lambda", "store"])
        )
        a = draw(st.sampled_from(names))
        b = draw(st.sampled_from(names))
        if kind == "linear":
            name = fresh()
            lines.append(f"{name} = self.l{draw(st.integers(0, 2))}({a})")
            names.append(name)
        elif kind == "add":
            name = fresh()
            lines.append(f"{name} = {a} + {b}")
            names.append(name)
        elif kind == "alias":
            name = fresh("skip")
            lines.append(f"{name} = {a}")
            names.append(name)
        elif kind == "pack":
            pair, first, second = fresh("pair"), fresh(), fresh()
            lines.append(f"{pair} = ({a}, {b})")
            lines.append(f"{first}, {second} = {pair}")
            names.extend([first, second])
        elif kind == "lambda":
            function, name = fresh("f"), fresh()
            lines.append(f"{function} = lambda t: t * 0.5 + {a}")
            lines.append(f"{name} = self.l0({b})")
            lines.append(f"{name} = {function}({name})")
            names.append(name)
        else:
            box, name = fresh("box"), fresh()
            lines.append(f"{box} = {{}}")
            lines.append(f'{box}["k"] = {a}')
            lines.append(f"{name} = self.l1({b})")
            lines.append(f'{name} = {name} + {box}["k"]')
            names.append(name)
    used = names
    body = "".join(f"        {line}\n" for line in lines)
    return (
        "import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.l0 = nn.Linear(8, 8)\n        self.l1 = nn.Linear(8, 8)\n"
        "        self.l2 = nn.Linear(8, 8)\n\n"
        f"    def forward(self, x):\n{body}        return {' + '.join(used)}\n\n\n"
        "def example():\n    torch.manual_seed(0)\n    return Net(), (torch.randn(4, 8),)\n"
    )


def quiet(argv: list[str]) -> int:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


def crossing_bytes(path: Path) -> int:
    """Bytes torch's tracer hands from stage 0 of ``path``'s model to stage 1."""
    from torch.distributed.pipelining import pipeline

    spec = importlib.util.spec_from_file_location(f"_live_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    model, args = module.example()
    with contextlib.redirect_stderr(io.StringIO()):
        pipe = pipeline(model, mb_args=args)
    graph = pipe.split_gm.graph
    stages = [node for node in graph.nodes if node.op == "call_module"]
    assert len(stages) == 2
    first = pipe.split_gm.get_submodule(stages[0].target)
    (output,) = [node for node in first.graph.nodes if node.op == "output"]
    values: list[Any] = [
        node.meta["val"]
        for node in torch.utils._pytree.tree_leaves(output.args)
        if hasattr(node, "meta")
    ]
    inputs = [node for node in graph.nodes if node.op == "placeholder"]
    values += [args[index] for index, node in enumerate(inputs) if stages[1] in node.users]
    return sum(value.numel() * value.element_size() for value in values)


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example runs torch's tracer
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(source=forwards(), pick=st.integers(0, 1000))
def test_the_bytes_live_across_a_cut_are_what_torchs_tracer_sends(
    tmp_path_factory: pytest.TempPathFactory, source: str, pick: int
) -> None:
    folder = tmp_path_factory.mktemp("live")
    model = folder / "model.py"
    model.write_text(source)
    costs = folder / "costs.json"
    argv = ["profile", str(model), "--backend", "torch", "--repeats", "1", "--warmup", "0"]
    assert quiet([*argv, "-o", str(costs)]) == 0
    cuts = json.loads(costs.read_text())["cuts"]
    if not cuts:
        return
    cut = cuts[pick % len(cuts)]
    out = folder / "split.py"
    argv = ["rewrite", str(model), "--costs", str(costs), "--stages", "2", "--backend", "torch"]
    argv += ["--strategy", "manual", "--cuts", cut["after"], "-o", str(out)]
    assert quiet(argv) == 0
    assert crossing_bytes(out) == cut["live_bytes"], (cut, out.read_text())

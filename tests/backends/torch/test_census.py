"""Which layer each iteration of a loop runs, read off the example's run
(:mod:`syncpass.backends.torch.census`)."""

from __future__ import annotations

import textwrap

import libcst as cst
import torch
from conftest import REPO

from syncpass.backends.torch.census import candidate_loops, census_loops
from syncpass.backends.torch.example import load_example

RECORDED = REPO / "tests" / "data" / "recorded_layers.py"


def census_of(code: str, model: torch.nn.Module, args: tuple[object, ...]) -> dict[int, str]:
    return census_loops(cst.parse_module(code), type(model).__name__, model, args, "m.py")


def test_a_loop_over_a_tuple_built_in_the_forward_runs_one_layer_an_iteration() -> None:
    loaded = load_example(f"{RECORDED}:example")
    code = RECORDED.read_text()
    (loop,) = candidate_loops(cst.parse_module(code), "Stack", "m.py")
    state = torch.random.get_rng_state()
    assert census_of(code, loaded.model, tuple(loaded.args)) == {loop: "layers"}
    assert torch.equal(torch.random.get_rng_state(), state)  # the run draws nothing


def test_a_module_every_iteration_calls_keeps_the_loop_whole() -> None:
    # A module outside the container (shared by every layer) cannot go with one stage.
    loaded = load_example(f"{RECORDED}:example")
    loaded.model.rotary = torch.nn.Identity()
    assert census_of(RECORDED.read_text(), loaded.model, tuple(loaded.args)) == {}


def test_a_loop_whose_iterations_are_not_one_layer_each_is_not_recorded() -> None:
    code = textwrap.dedent(
        """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))
                self.a = nn.Linear(4, 4)
                self.b = nn.Linear(4, 4)

            def forward(self, x):
                for layer in [self.a, self.b]:  # not a container's items
                    x = layer(x)
                pairs = list(zip(self.layers[::2], self.layers[1::2]))
                for first, second in pairs:  # two layers an iteration
                    x = second(first(x))
                for step in range(2):  # no layer at all
                    x = x * 2
                return x
        """
    )
    namespace: dict[str, object] = {}
    exec(compile(code, "m.py", "exec"), namespace)
    model = namespace["Net"]()  # type: ignore[operator]
    module = cst.parse_module(code)
    assert len(candidate_loops(module, "Net", "m.py")) == 3
    assert census_loops(module, "Net", model, (torch.randn(2, 4),), "m.py") == {}

"""Any nesting of tuples, lists, dicts and ``None`` of tensors and constants crosses every
sync point: generated forwards build such a value before their layer loop, grow an
accumulator in it (a tuple, a list, a dict by layer), and read both after it, so each
crosses every cut between the layers; the rewrite into eager stages is run split over gloo
and its loss and every gradient compared with the unsplit model."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from conftest import without_meeting_stalls
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from syncpass.cli import main

pytest.importorskip("torch")

#: Leaves of the value built before the loop: tensors made from the input, and constants.
LEAVES = st.sampled_from(
    ["x * 0.5", "x.sum(-1)", "None", "'tag'", "True", "x[:, :1]", "x.shape[0]", "0.5"]
)


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    items = st.lists(children, min_size=0, max_size=3)
    return st.one_of(
        items.map(lambda parts: f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"),
        items.map(lambda parts: f"[{', '.join(parts)}]"),
        items.map(lambda parts: "{" + ", ".join(f"'k{i}': {p}" for i, p in enumerate(parts)) + "}"),
    )


VALUES = st.recursive(LEAVES, _containers, max_leaves=6)

#: How the forward grows an accumulator per layer: the statement before the loop, the one
#: in the loop (after the layer), and the tensors it holds once the loop is done.
ACCUMULATORS = {
    "tuple": ("acc = ()", "acc = acc + (h,)", "acc"),
    "list": ("acc = []", "acc.append(h)", "acc"),
    "dict": ("acc = {}", "acc[i] = h", "acc.values()"),
    "nested": ("acc = {'h': (), 'n': None}", "acc['h'] = acc['h'] + (h.mean(),)", "acc['h']"),
}

MODEL = '''import torch
from torch import nn


def tensors(value):
    """Every tensor in a nesting of tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors(item)]
    return []


def numbers(value):
    """The sum of the numbers in it (a micro-batch's size among them)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return sum(numbers(item) for item in value)
    return 0


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(4)])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        extra = {value}
        {start}
        h = self.embed(x)
        for i, layer in enumerate(self.layers):
            h = torch.tanh(layer(h))
            {grow}
        out = self.head(h).sum(-1) * numbers(extra)
        for tensor in tensors(extra) + tensors(list({held})):
            out = out + tensor.float().mean()
        return out


def example():
    torch.manual_seed(0)
    return Net(), (torch.randn(8, 8),), torch.randn(8), nn.functional.mse_loss
'''


def quiet(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(argv)
    return status, err.getvalue()


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example runs gloo
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(value=VALUES, accumulator=st.sampled_from(sorted(ACCUMULATORS)))
# A size that changes with the micro-batch, beside a tensor, and a per-layer dict.
@example(value="{'n': (x.shape[0], x * 0.5), 'm': [None, 0.5]}", accumulator="dict")
def test_pytrees_cross_every_cut_and_the_split_run_matches(
    tmp_path_factory: pytest.TempPathFactory, value: str, accumulator: str
) -> None:
    start, grow, held = ACCUMULATORS[accumulator]
    folder = tmp_path_factory.mktemp("pytree")
    source = folder / "model.py"
    source.write_text(MODEL.format(value=value, start=start, grow=grow, held=held))
    out = folder / "model_sync.py"
    report = folder / "plan.json"
    argv = ["rewrite", str(source), "--example", f"{source}:example", "--stages", "3"]
    # About what crosses a cut, not gloo's speed: planned without the stall of meeting
    # posts, which can trade the cuts between the layers for one before the value is made.
    argv += ["--hardware", str(without_meeting_stalls(folder))]
    status, err = quiet([*argv, "-o", str(out), "--report", str(report)])
    assert status == 0, err
    document = json.loads(report.read_text())
    live = {cut["after"]: cut["live"] for cut in document["analysis"]["cuts"]}
    cuts = [point["after"] for point in document["plan"]["sync_points"]]
    # Both sync points fall where the value and the accumulator are live: they cross both.
    assert len(cuts) == 2 and all({"extra", "acc"} <= set(live[cut]) for cut in cuts), cuts
    run = folder / "run.json"
    argv = ["run", str(out), "--stages", "3", "--verify", "--steps", "1", "--json-report", str(run)]
    status, err = quiet(argv)
    assert status == 0, err
    verify = json.loads(run.read_text())["verify"]
    assert verify["ok"] is True and verify["parameters_compared"] == verify["model_parameters"]

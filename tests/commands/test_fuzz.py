"""Hostile and unusual input, generated: whatever the source or cost file, syncpass exits
0, 1 or 2 with no traceback, leaves its input as it was, writes output that parses, and
writes nothing on error. Plus torch's own ``nn/modules`` sources, as installed."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from syncpass.cli import main

HEADER = "import torch\nfrom torch import nn\n\n\n"

LAYERS = ["nn.Linear(8, 8)", "nn.ReLU()", "nn.LayerNorm(8)", "nn.Dropout(0.1)", "nn.Identity()"]
EXPRESSIONS = [
    "self.{layer}(x)",
    "x + self.{layer}(x)",
    "torch.relu(self.{layer}(x))",
    "x * 2",
    "x.transpose(-1, -2).transpose(-1, -2)",
    "(x if x.shape[0] > 0 else x)",
    "[x][0]",
    "{{'v': x}}['v']",
    "self.{layer}(self.{layer}(x))",
]
WRAPPERS = [
    "{body}",
    "if x.shape[0] > 1:\n    {body}",
    "for _ in range(2):\n    {body}",
    "with torch.no_grad():\n    {body}",
    "try:\n    {body}\nexcept RuntimeError:\n    pass",
    "match 1:\n    case 1:\n        {body}\n    case _:\n        pass",
    "while False:\n    {body}",
    "skip = x\n{body}\nx = x + skip",
    "def helper(t):\n    return t\nx = helper(x)\n{body}",
    "# a comment\n{body}  # trailing",
]


@st.composite
def model_sources(draw: st.DrawFn) -> str:
    """A small nn.Module whose forward mixes ops, compound statements and aliases."""
    count = draw(st.integers(1, 4))
    layers = [draw(st.sampled_from(LAYERS)) for _ in range(count)]
    init = "".join(f"        self.l{i} = {layer}\n" for i, layer in enumerate(layers))
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        expression = draw(st.sampled_from(EXPRESSIONS)).format(
            layer=f"l{draw(st.integers(0, count - 1))}"
        )
        wrapper = draw(st.sampled_from(WRAPPERS))
        lines.extend(wrapper.format(body=f"x = {expression}").splitlines())
    body = "".join(f"        {line}\n" if line.strip() else "\n" for line in lines)
    return (
        f"{HEADER}class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        f"{init}\n    def forward(self, x):\n{body}        return x\n"
    )


FORMS = {
    "plain": lambda text: text.encode(),
    "bom": lambda text: b"\xef\xbb\xbf" + text.encode(),
    "crlf": lambda text: text.replace("\n", "\r\n").encode(),
    "cr": lambda text: text.replace("\n", "\r").encode(),
    "no_final_newline": lambda text: text.rstrip("\n").encode(),
    "tabs": lambda text: text.replace("    ", "\t").encode(),
}


def run(argv: list[str]) -> tuple[object, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status: object = main(argv)
        except BaseException as error:  # the contract: never raises
            status = f"raised {type(error).__name__}: {error}"
    return status, err.getvalue()


def assert_contract(status: object, err: str) -> None:
    assert status in (0, 1, 2), (status, err)
    assert "Traceback" not in err and "internal error" not in err, err


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    source=model_sources(),
    form=st.sampled_from(sorted(FORMS)),
    stages=st.integers(1, 4),
    backend=st.sampled_from(["torch_stages", "torch"]),
)
def test_any_source_in_any_form_keeps_the_contract(
    source: str, form: str, stages: int, backend: str
) -> None:
    data = FORMS[form](source)
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model.py"
        model.write_bytes(data)
        out = Path(folder) / "out.py"
        argv = ["rewrite", str(model), "--input-shape", "4x8", "--stages", str(stages)]
        status, err = run([*argv, "--backend", backend, "-o", str(out)])
        assert_contract(status, err)
        assert model.read_bytes() == data
        if status == 0:
            written = out.read_bytes()
            ast.parse(written.decode("utf-8-sig"))
            if stages == 1:
                assert written == data
            again = Path(folder) / "again.py"
            status, err = run([*argv, "--backend", backend, "-o", str(again)])
            assert status == 0 and again.read_bytes() == written  # the same input, the same output
        else:
            assert not out.exists()
        status, err = run(["check", str(model)])
        assert_contract(status, err)


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**40), 10**40),
    st.sampled_from([0, -0.0, 5e-324, 1e308, 1e30, 10**31]),
    st.text(max_size=3),
    st.none(),
    st.booleans(),
)
FIELDS = [
    ("ops", 0, "compute_s"),
    ("ops", 1, "backward_s"),
    ("ops", 0, "param_bytes"),
    ("ops", 2, "out_bytes"),
    ("cuts", 0, "live_bytes"),
    ("hardware", None, "alpha_s"),
    ("hardware", None, "beta_bytes_per_s"),
    ("hardware", None, "device_memory_bytes"),
    (None, None, "batch_size"),
    (None, None, "memory_multiplier"),
]


def _cost_file() -> dict[str, object]:
    ids = ["a", "b", "c", "d"]
    return {
        "version": 1,
        "model": "Net",
        "batch_size": 8,
        "training": True,
        "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9},
        "ops": [
            {"id": op, "compute_s": 0.001 * (i + 1), "backward_s": 0.002, "param_bytes": 4096}
            for i, op in enumerate(ids)
        ],
        "cuts": [{"after": op, "live_bytes": 65536} for op in ids[:-1]],
    }


@settings(max_examples=80, deadline=None)
@given(
    changes=st.lists(st.tuples(st.sampled_from(FIELDS), NUMBERS), max_size=3),
    stages=st.sampled_from(["1", "2", "4", "auto"]),
)
def test_any_cost_file_plans_or_is_refused_at_its_json_path(
    changes: list[tuple[tuple[str | None, int | None, str], object]], stages: str
) -> None:
    data = _cost_file()
    for (table, index, key), value in changes:
        where: dict[str, object] = data  # type: ignore[assignment]
        if table is not None:
            inner = data[table]
            where = inner[index] if isinstance(inner, list) and index is not None else inner  # type: ignore[index,assignment]
        where[key] = value
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "costs.json"
        text = json.dumps(data, allow_nan=True)
        path.write_text(text)
        status, err = run(["plan", "--costs", str(path), "--stages", stages, "--no-baselines"])
        assert_contract(status, err)
        assert path.read_text() == text
        bad = [
            value for _, value in changes if isinstance(value, float) and not math.isfinite(value)
        ]
        if bad:
            assert status == 2 and "costs.json" in err


@pytest.mark.slow
def test_torchs_own_module_sources_give_no_traceback(tmp_path: Path) -> None:
    import torch

    out = tmp_path / "out.py"
    runs = 0
    for source in sorted((Path(torch.__file__).parent / "nn" / "modules").glob("*.py")):
        tree = ast.parse(source.read_text())
        classes = [
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef)
            and any(
                isinstance(item, ast.FunctionDef) and item.name == "forward" for item in node.body
            )
        ]
        argvs = [["check", str(source)]]
        rewrite = ["rewrite", str(source), "--input-shape", "2x8", "--stages", "2", "-o", str(out)]
        argvs += [[*rewrite, "--model", name] for name in classes]
        before = source.read_bytes()
        for argv in argvs:
            status, err = run(argv)
            assert_contract(status, err)
            runs += 1
        assert source.read_bytes() == before
    assert runs > 100  # the sources are there: every class was tried

"""The forward lint: each rule finds its call, `# noqa` silences it, plain numbers are not flagged."""

from __future__ import annotations

import pytest

from syncpass.backends.torch.lint import RULES, finding, lint_source, noqa_lines
from syncpass.core.errors import SyncpassError
from syncpass.frontend.findings import Finding

MODEL = """\
import torch
import torch as T
from torch import nn
from torch.cuda import synchronize as wait_for_gpu


class Net(nn.Module):
    def __init__(self, dim: int = 4, config=None) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.scale = dim**-0.5
        self.temperature = nn.Parameter(torch.ones(1))

    def forward(self, x, steps: int = 2):
        y = self.fc(x)
        {line}
        return y
"""
LINE = 16  # where {line} lands


def findings(line: str) -> tuple[Finding, ...]:
    return lint_source(MODEL.format(line=line), "net.py")


POSITIVE = [  # rule, the line, where in it the finding starts
    ("SP101", "v = y.sum().item()", "y.sum()"),
    ("SP102", "v = y.tolist()", "y."),
    ("SP103", "v = y.cpu()", "y."),
    ("SP103", 'v = y.to("cpu")', "y."),
    ("SP103", 'v = y.to(device=torch.device("cpu"))', "y."),
    ("SP104", "v = y.detach().numpy()", "y."),
    ("SP105", "v = float(y.sum())", "float"),
    ("SP105", "v = int(y)", "int"),
    ("SP105", "v = bool(y.any())", "bool"),
    ("SP105", "s = y.sum(); v = int(s)", "int"),  # a name assigned from a tensor op
    ("SP105", "v = float(self.temperature)", "float"),  # a parameter, not a number
    ("SP105", "v = int(steps * y.max())", "int"),
    ("SP106", "print(y)", "print"),
    ("SP106", 'print("loss", y.mean())', "print"),
    ("SP106", 'print(f"y={y}")', "print"),
    ("SP107", "torch.cuda.synchronize()", "torch"),
    ("SP107", "T.cuda.synchronize()", "T."),  # through an import alias
    ("SP107", "wait_for_gpu()", "wait"),  # from-import under another name
]


@pytest.mark.parametrize(("code", "line", "start"), POSITIVE)
def test_each_rule_finds_its_call(code: str, line: str, start: str) -> None:
    found = findings(line)
    assert [finding.code for finding in found] == [code]
    finding = found[0]
    assert (finding.path, finding.line) == ("net.py", LINE)
    assert finding.column == 9 + line.index(start)  # 1-based; the body is indented 8
    assert "host" in finding.message
    assert str(finding).startswith(f"net.py:{LINE}:{finding.column}: {code} ")


@pytest.mark.parametrize(("code", "line"), [case[:2] for case in POSITIVE])
def test_noqa_with_the_code_suppresses_it(code: str, line: str) -> None:
    assert findings(f"{line}  # noqa: {code}") == ()
    assert findings(f"{line}  # noqa") == ()  # bare noqa: every rule
    assert findings(f"{line}  # NOQA:{code} reason given") == ()
    other = "SP199" if code != "SP199" else "SP100"
    assert [f.code for f in findings(f"{line}  # noqa: {other}")] == [code]


def test_noqa_lists_several_codes() -> None:
    line = "v = y.sum().item() + y.cpu().sum()"
    assert sorted(f.code for f in findings(line)) == ["SP101", "SP103"]
    assert findings(f"{line}  # noqa: SP101,SP103") == ()
    assert findings(f"{line}  # noqa: SP101, SP103") == ()
    assert [f.code for f in findings(f"{line}  # noqa: SP101")] == ["SP103"]


@pytest.mark.parametrize(
    "line",
    [
        "v = int(x.shape[0])",
        "v = int(len(x))",
        "v = float(0.5)",
        "v = int(x.size(0)) + int(x.dim()) + int(x.numel()) + int(x.ndim)",
        "b, t = x.shape[:2]; v = int(b * t)",
        "n = x.size(-1) // 2; v = float(n)",
        "v = int(steps)",  # annotated int
        "v = float(self.scale)",  # set from a number in __init__
        "v = bool(self.training)",
        'v = int("3")',
        'print("shape", x.shape, f"{x.size(0)} rows")',
        "print()",
        "v = x.items()",  # not .item()
        "v = y.to(torch.float16)",
        'v = y.to("cuda")',
        "for i in range(3): v = int(i)",
        "torch.synchronize = None",  # not a call
    ],
)
def test_plain_python_numbers_are_not_findings(line: str) -> None:
    assert findings(line) == ()


def test_only_forward_methods_are_read() -> None:
    source = """\
import torch


def helper(t):
    return t.item()


class Net(torch.nn.Module):
    def report(self, t):
        print(t)
        return t.cpu()

    def forward(self, x):
        def inner(t):
            return t.tolist()  # nested in forward: read

        return inner(x)


class NotAModel:
    def step(self, t):
        torch.cuda.synchronize()
"""
    found = lint_source(source, "m.py")
    assert [(f.code, f.line, f.column) for f in found] == [("SP102", 15, 20)]


def test_a_local_name_shadows_an_import() -> None:
    source = """\
import torch


class Net(torch.nn.Module):
    def forward(self, x, torch):
        torch.cuda.synchronize()  # a parameter called torch, not the module
        return x
"""
    assert lint_source(source, "m.py") == ()


def test_a_file_without_a_model_is_not_parsed() -> None:
    assert lint_source("this is not python (\n", "notes.py") == ()  # no forward: skipped
    with pytest.raises(SyncpassError, match=r"m\.py:2"):
        lint_source("class A:\n    def forward(self:\n", "m.py")


def test_noqa_lines_ignores_noqa_inside_strings() -> None:
    text = 'x = "# noqa"\ny = 1  # noqa: SP101,sp103\nz = 2  # noqa\n'
    assert noqa_lines(text) == {2: frozenset({"SP101", "SP103"}), 3: None}


def test_every_rule_has_a_code_and_findings_check_it() -> None:
    assert sorted(RULES) == [f"SP10{n}" for n in range(1, 8)]
    with pytest.raises(ValueError, match="unknown rule"):
        finding("XX1", "m.py", 1, 1, "?")


def test_a_parameter_rebound_to_a_number_is_not_a_number_everywhere() -> None:
    source = MODEL.replace("steps: int = 2", "temperature").format(
        line="if temperature is None:\n            temperature = 1.0\n        v = float(temperature)"
    )
    assert [finding.code for finding in lint_source(source, "net.py")] == ["SP105"]


def test_an_init_argument_is_a_setting_only_through_its_attributes() -> None:
    source = """\
from torch import nn


class Net(nn.Module):
    def __init__(self, table, config, dim=4):
        super().__init__()
        self.table = table
        self.eps = config.eps
        self.dim = dim

    def forward(self, x):
        a = float(self.eps) + int(self.dim)
        print(self.table)
        return x * a + int(self.table[0])
"""
    codes = [(finding.line, finding.code) for finding in lint_source(source, "net.py")]
    assert codes == [(13, "SP106"), (14, "SP105")]

"""Unusual and hostile input, as a fuzz campaign found it: each is exit 2 naming file:line
and the reason, or it works; never a traceback, never exit 1 (which a pre-commit hook
reads as "stale file"), never the input changed, never a file written on error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from syncpass.backends.torch.estimate import interpreter
from syncpass.cli import main

MODEL = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        x = self.b(x)
        x = self.c(x)
        return x
"""

MATCH = """\
        match self.mode:
            case "a":
                x = self.b(x)
            case _:
                x = x * 2
"""


def rewrite(source: Path, stages: int, *extra: str) -> list[str]:
    out = source.with_name(f"{source.stem}_sync.py")
    return [
        "rewrite",
        str(source),
        "--input-shape",
        "4x8",
        "--stages",
        str(stages),
        "-o",
        str(out),
        *extra,
    ]


def written(source: Path) -> Path:
    return source.with_name(f"{source.stem}_sync.py")


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("bom", b"\xef\xbb\xbf" + MODEL.encode()),
        ("cr_only", MODEL.replace("\n", "\r").encode()),
        ("crlf", MODEL.replace("\n", "\r\n").encode()),
        ("code_before_imports", b'"""A model."""\nVERSION = 2\n' + MODEL.encode()),
    ],
    ids=["bom", "cr_only", "crlf", "code_before_imports"],
)
@pytest.mark.parametrize("backend", ["torch_stages", "torch"])
def test_valid_python_in_any_form_comes_back_byte_for_byte_at_one_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: bytes, backend: str
) -> None:
    source = tmp_path / f"{name}.py"
    source.write_bytes(data)
    assert main([*rewrite(source, 1), "--backend", backend]) == 0, capsys.readouterr().err
    assert written(source).read_bytes() == data
    # Split, the output keeps the form: the mark, the line endings, and it parses.
    assert main([*rewrite(source, 2), "--backend", backend]) == 0, capsys.readouterr().err
    out = written(source).read_bytes()
    assert out.startswith(b"\xef\xbb\xbf") == data.startswith(b"\xef\xbb\xbf")
    if name == "cr_only":
        assert b"\n" not in out and out.count(b"\r") > data.count(b"\r")
    compile(out, str(source), "exec")
    assert source.read_bytes() == data


def test_a_match_statement_in_forward_is_a_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "matching.py"
    text = MODEL.replace("        x = self.b(x)\n", MATCH).replace(
        "        super().__init__()\n", "        super().__init__()\n        self.mode = 'a'\n"
    )
    source.write_text(text)
    assert main(rewrite(source, 2)) == 0
    err = capsys.readouterr().err
    assert f"no sync point inside {source}:15-19: a match statement" in err
    assert "match self.mode:" in written(source).read_text()


@pytest.mark.parametrize(
    ("change", "line", "message"),
    [
        (("class Net", "type Width = int\n\n\nclass Net"), 5, "syntax error at column"),
        (("self.c(x)", "self.c(" + "(" * 250 + "x" + ")" * 250 + ")"), 15, "too many nested"),
        (("x = self.a(x)", "x = self.a([" * 300 + "x" + "])" * 300), 13, "too many nested"),
    ],
)
def test_python_this_interpreter_cannot_read_is_a_syntax_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str],
    line: int,
    message: str,
) -> None:
    source = tmp_path / "newer.py"
    source.write_text(MODEL.replace(*change))
    if sys.version_info >= (3, 12) and "type Width" in change[1]:
        pytest.skip("3.12 reads `type` statements")
    for stages in (1, 2):
        assert main(rewrite(source, stages)) == 2
        err = capsys.readouterr().err
        assert f"syncpass: error: {source}:{line}: " in err and message in err, err
        assert not written(source).exists()


def test_an_expression_too_deep_to_follow_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    source = tmp_path / "terms.py"
    source.write_text(MODEL.replace("self.c(x)", "self.c(x" + " + x" * 3000 + ")"))
    done = subprocess.run(
        [sys.executable, "-m", "syncpass", *rewrite(source, 2)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr
    if done.returncode == 2:
        assert f"syncpass: error: {source}: " in done.stderr
        assert "nested too deeply" in done.stderr
        assert not written(source).exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("change"),
    [
        (
            "def __init__(self):",
            "def __init__(self, act=functools.partial(nn.GELU, approximate='tanh')):",
        ),
        ("def forward(self, x):", "def forward(self, *args):\n        x = args[0]"),
        (
            "class Net",
            "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\nDEPTH = fib(35)\n\n\nclass Net",
        ),
        (
            "self.a = nn.Linear(8, 8)",
            "self.s = 'a' * 100000 * 100000\n        self.a = nn.Linear(8, 8)",
        ),
        ("self.a = nn.Linear(8, 8)", "self.k = 99999**99999\n        self.a = nn.Linear(8, 8)"),
        (
            "self.a = nn.Linear(8, 8)",
            "self.s = [[[i * j for i in range(99)] for j in range(99)] for k in range(99)]\n"
            "        self.a = nn.Linear(8, 8)",
        ),
    ],
    ids=[
        "partial_default",
        "star_args",
        "fib_constant",
        "huge_string",
        "huge_power",
        "comprehension",
    ],
)
def test_the_static_estimate_stays_within_its_budget_and_sizes_what_it_can(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: tuple[str, str],
) -> None:
    # A tenth of the budget: fib(35) needs thirty times the whole of it, and the shipped
    # budget took 8 s to spend; the mechanism that stops it is the same.
    monkeypatch.setattr(interpreter, "MAX_STEPS", interpreter.MAX_STEPS // 10)
    source = tmp_path / "odd.py"
    source.write_text("import functools\n" + MODEL.replace(*change))
    assert main(rewrite(source, 2)) == 0, capsys.readouterr().err
    assert "syncpass: wrote" in capsys.readouterr().err


def test_check_reports_a_crash_on_one_file_as_an_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.py"
    deep.write_text(MODEL.replace("self.c(x)", "self.c(x" + " + x" * 500 + ")"))
    fine = tmp_path / "fine.py"
    fine.write_text(MODEL)
    assert main(["check", str(deep), str(fine)]) == 2
    err = capsys.readouterr().err
    assert f"syncpass: error: {deep}: the input is nested too deeply" in err
    assert "Traceback" not in err and "1 linted file(s)" in err


def test_a_config_nested_too_deeply_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.syncpass]\nstages = " + "[" * 2000 + "]" * 2000)
    (tmp_path / "m.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "m.py"]) == 2
    err = capsys.readouterr().err
    assert f"syncpass: error: {tmp_path / 'pyproject.toml'}: the TOML is nested too deeply" in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_standard_output_is_an_error(tmp_path: Path) -> None:
    source = tmp_path / "model.py"
    source.write_text(MODEL)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "syncpass", *rewrite(source, 2)[:-2]],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    assert done.returncode == 2, done.stderr
    assert "cannot write: No space left on device" in done.stderr
    assert "Traceback" not in done.stderr


EXAMPLE = """\
import ctypes
import sys
import time

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        return self.b(x)


def example():
    BODY
    return Net(), (torch.randn(4, 8),)
"""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("sys.exit(0)", "the example called sys.exit(0) (status 0) instead of returning"),
        ("sys.exit(3)", "the example called sys.exit(3) (status 3) instead of returning"),
        ("raise KeyboardInterrupt", "the user's code raised KeyboardInterrupt"),
        ("ctypes.string_at(0)", "the example died from SIGSEGV (a crash in native code)"),
        ("time.sleep(600)", "the example did not finish within 1 s (--timeout)"),
    ],
    ids=["exit_0", "exit_3", "keyboard_interrupt", "segfault", "never_returns"],
)
def test_an_example_that_misbehaves_is_an_error_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    pytest.importorskip("torch")  # the example builds a torch model
    for command in ("rewrite", "profile"):
        check_example_failure(tmp_path, capsys, body, message, command)


def check_example_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str, command: str
) -> None:
    source = tmp_path / "model.py"
    source.write_text(EXAMPLE.replace("BODY", body))
    out = tmp_path / "out"
    timeout = "1" if "time.sleep" in body else "120"  # the others end at once
    argv = [command, str(source), "--example", f"{source}:example", "--timeout", timeout]
    argv += ["--stages", "2", "-o", str(out)] if command == "rewrite" else ["-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"syncpass: error: {source}: {message}" in err, err
    assert "nothing was written" in err
    if "SIGSEGV" in message:  # and the frames it died in, the example's own among them
        line = EXAMPLE.splitlines().index("    BODY") + 1
        assert f'File "{source}", line {line} in example' in err, err
    assert not out.exists()

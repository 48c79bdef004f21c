"""`profile --static` and `rewrite --input-shape`: plans from the source alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.cli import main
from syncpass.contracts.costs import load_costs

EXAMPLES = REPO / "examples"


def test_profile_static_writes_a_cost_file_that_says_it_is_an_estimate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lm.costs.json"
    argv = ["profile", str(EXAMPLES / "transformer_lm.py"), "--static", "--input-shape", "8x32"]
    assert main([*argv, "-o", str(out)]) == 0
    assert "estimated from the source (nothing timed)" in capsys.readouterr().err
    costs = load_costs(out)
    assert costs.batch_size == 8 and costs.model == "TransformerLM"
    assert any("static estimate" in note for note in costs.notes)
    assert all(op.flops is not None for op in costs.ops)
    # The plan made from it says it rests on estimates.
    assert main(["plan", "--costs", str(out), "--stages", "2"]) == 0
    assert "static estimate" in capsys.readouterr().out


def test_rewrite_from_input_shapes_equals_rewrite_from_the_static_cost_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = EXAMPLES / "resnet.py"
    costs = tmp_path / "resnet.costs.json"
    assert (
        main(["profile", str(source), "--static", "--input-shape", "8x3x32x32", "-o", str(costs)])
        == 0
    )
    direct, via_file = tmp_path / "direct.py", tmp_path / "via_file.py"
    assert (
        main(
            [
                "rewrite",
                str(source),
                "--input-shape",
                "8x3x32x32",
                "--stages",
                "2",
                "-o",
                str(direct),
            ]
        )
        == 0
    )
    assert (
        main(["rewrite", str(source), "--costs", str(costs), "--stages", "2", "-o", str(via_file)])
        == 0
    )
    assert direct.read_text() == via_file.read_text()
    assert direct.read_text().count("# syncpass sync ") == 1


def test_an_op_it_cannot_size_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        textwrap.dedent(
            """\
            import torch
            from torch import nn


            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.first = nn.Linear(16, 32)
                    self.rnn = nn.LSTM(32, 32)
                    self.last = nn.Linear(32, 4)

                def forward(self, x):
                    x = self.first(x)
                    x, _ = self.rnn(x)
                    x = self.last(x)
                    return x
            """
        )
    )
    out = tmp_path / "model.costs.json"
    assert main(["profile", str(model), "--static", "--input-shape", "8x16", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{model}:14" in err and "rnn" in err and "fallback" in err
    assert any("1 op" in note or "unsized" in note for note in load_costs(out).notes)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--static"], "--static needs the forward's input shapes"),
        (["--input-shape", "8x32"], "go with --static"),
        (["--static", "--input-shape", "8xbanana"], "input-shape"),
        (
            ["--static", "--input-shape", "8x32", "--input-dtype", "int,float"],
            "--input-dtype gives 2",
        ),
    ],
)
def test_bad_static_requests_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "out.json"
    assert main(["profile", str(EXAMPLES / "transformer_lm.py"), *argv, "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_static_path_imports_neither_torch_nor_the_model(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    # Running this file would fail loudly: nothing of it may run.
    model.write_text((EXAMPLES / "resnet.py").read_text() + "\nraise SystemExit('the model ran')\n")
    script = textwrap.dedent(
        f"""
        import sys
        from syncpass.cli import main
        status = main(["rewrite", {str(model)!r}, "--input-shape", "8x3x32x32", "--stages", "2",
                       "-o", {str(tmp_path / "out.py")!r}])
        assert status == 0, status
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.py").read_text().count("# syncpass sync ") == 1

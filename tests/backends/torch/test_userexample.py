"""Loading a user's example: by path and by module, determinism, and every error with its location."""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO

from syncpass.backends.torch.example import default_loss, default_loss_terms, load_example
from syncpass.core.errors import SyncpassError
from syncpass.runtime.example import private_module_name

MODEL = """\
import torch
from torch import nn


def make():
    return nn.Linear(4, 2), (torch.randn(3, 4),)
"""


@pytest.fixture(autouse=True)
def _restore_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    # Loading a file puts its folder on sys.path and its sibling imports in sys.modules.
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def failure(spec: str) -> SyncpassError:
    with pytest.raises(SyncpassError) as caught:
        load_example(spec)
    return caught.value


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_load_by_path_without_loss_uses_the_default_loss() -> None:
    example = load_example(f"{REPO / 'examples' / 'resnet.py'}:example")
    assert type(example.model).__name__ == "ResNet"
    assert isinstance(example.args, tuple) and example.args[0].shape == (8, 3, 32, 32)
    assert example.target is None
    assert example.loss_fn is default_loss
    assert example.spec.endswith("resnet.py:example")
    assert example.origin.startswith(str(REPO / "examples" / "resnet.py") + ":")


def test_load_by_path_with_target_and_loss() -> None:
    example = load_example(f"{REPO / 'examples' / 'transformer_lm.py'}:example")
    (tokens,) = example.args
    assert tokens.shape == (8, 32)
    assert example.target is not None and example.target.shape == (8, 32)
    logits = example.model(tokens)
    loss = example.loss_fn(logits, example.target)
    assert loss.dim() == 0 and float(loss.detach()) > 0


def test_every_load_builds_the_same_weights_and_inputs(tmp_path: Path) -> None:
    path = write(tmp_path, "m.py", MODEL)
    first = load_example(f"{path}:make")
    torch.manual_seed(1234)  # whatever the caller's RNG state, the example is the same
    second = load_example(f"{path}:make")
    assert torch.equal(first.args[0], second.args[0])
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_file_gets_a_private_module_name(tmp_path: Path) -> None:
    # A user file named like a real module must not replace it in sys.modules.
    path = write(tmp_path, "json.py", MODEL)
    import json

    example = load_example(f"{path}:make")
    assert sys.modules["json"] is json
    module_name = type(example.model).__module__  # nn.Linear: torch's own
    assert module_name.startswith("torch")
    private = private_module_name(path.resolve())
    assert private.startswith("_syncpass_example_json_")
    assert sys.modules[private].__file__ == str(path.resolve())


def test_sibling_imports_work(tmp_path: Path) -> None:
    write(
        tmp_path,
        "layers.py",
        "from torch import nn\n\nWIDTH = 6\n\ndef block():\n    return nn.Linear(WIDTH, WIDTH)\n",
    )
    path = write(
        tmp_path,
        "net.py",
        """\
        import torch
        from layers import WIDTH, block

        def make():
            return block(), (torch.zeros(2, WIDTH),)
        """,
    )
    example = load_example(f"{path}:make")
    assert example.args[0].shape == (2, 6)


def test_load_by_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package, "models.py", MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    example = load_example("userpkg.models:make")
    assert isinstance(example.model, torch.nn.Linear)
    assert example.origin.startswith(str(package / "models.py"))


def test_default_loss_sums_over_tuple_outputs() -> None:
    a = torch.tensor([1.0, 2.0])
    b = torch.tensor([[3.0]], dtype=torch.float16)
    assert float(default_loss(a)) == pytest.approx(2.5)
    assert float(default_loss((a, b), None)) == pytest.approx(2.5 + 9.0)


@dataclasses.dataclass
class _Output:
    """A dataclass output, as Hugging Face's ``ModelOutput`` is (without its mapping)."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: None = None


def test_default_loss_takes_every_float_tensor_of_a_nested_output() -> None:
    a, b, c = torch.tensor([1.0, 2.0]), torch.tensor([3.0]), torch.tensor([[4.0]])
    tokens = torch.tensor([7, 8])  # an integer tensor is not a value to square
    output = {"main": _Output(a, hidden_states=(b, c)), "ids": tokens, "extra": [None, b]}
    assert float(default_loss(output)) == pytest.approx(2.5 + 9.0 + 16.0 + 9.0)
    assert default_loss_terms(output) == (
        "mean square of output['main'].last_hidden_state + output['main'].hidden_states[0]"
        " + output['main'].hidden_states[1] + output['extra'][1]"
    )


def test_default_loss_names_the_fields_of_a_mapping_dataclass_as_attributes() -> None:
    """Hugging Face's ``ModelOutput`` is a dataclass and an ordered dict of its non-None
    fields: it reads as ``output.field``."""

    @dataclasses.dataclass
    class MappingOutput(collections.OrderedDict[str, Any]):
        logits: torch.Tensor | None = None
        loss: torch.Tensor | None = None

        def __post_init__(self) -> None:
            for field in dataclasses.fields(self):
                if getattr(self, field.name) is not None:
                    self[field.name] = getattr(self, field.name)

    output = MappingOutput(logits=torch.tensor([2.0]))
    assert float(default_loss(output)) == pytest.approx(4.0)
    assert default_loss_terms(output) == "mean square of output.logits"


def test_default_loss_refuses_an_output_with_no_float_tensor() -> None:
    with pytest.raises(SyncpassError, match="returned tuple with none; give the example a loss"):
        default_loss((torch.tensor([1, 2]), None))


def test_importing_the_module_does_not_import_torch() -> None:
    code = "import sys, syncpass.runtime.example; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("spec", ["nocolon", "a.py:", ":make", "a.py:not-a-name"])
def test_malformed_spec(spec: str) -> None:
    error = failure(spec)
    assert "is not PATH.py:FUNC or package.module:FUNC" in str(error)


def test_missing_file(tmp_path: Path) -> None:
    error = failure(f"{tmp_path / 'absent.py'}:make")
    assert error.location == str(tmp_path / "absent.py")
    assert "no such file" in error.message


def test_missing_module() -> None:
    error = failure("no_such_package_here.models:make")
    assert "no module named 'no_such_package_here.models'" in error.message


def test_no_such_function_lists_the_candidates(tmp_path: Path) -> None:
    path = write(tmp_path, "m.py", MODEL)
    error = failure(f"{path}:build")
    assert error.location == str(path)
    assert error.message == "no function 'build'; functions defined there: make"


def test_not_a_function(tmp_path: Path) -> None:
    path = write(tmp_path, "m.py", MODEL + "\nTHING = 3\n")
    error = failure(f"{path}:THING")
    assert error.message == "'THING' is not a function (type int)"


def test_function_raises_points_at_the_users_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.py",
        """\
        def make():
            sizes = {"width": 4}
            return sizes["depth"]
        """,
    )
    error = failure(f"{path}:make")
    assert error.location == f"{path}:3"
    assert error.message == "make() raised: KeyError: 'depth'"


def test_error_inside_torch_points_at_the_users_call(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.py",
        """\
        import torch
        from torch import nn

        def make():
            model = nn.Linear(4, 2)
            x = torch.zeros(3, 5)
            model(x)
            return model, (x,)
        """,
    )
    error = failure(f"{path}:make")
    assert error.location == f"{path}:{line_of(path, 'model(x)')}"
    assert error.message.startswith("make() raised: RuntimeError: mat1 and mat2 shapes")


def test_error_in_a_sibling_module_points_there(tmp_path: Path) -> None:
    helper = write(tmp_path, "helper.py", "def build():\n    raise ValueError('no weights file')\n")
    path = write(tmp_path, "m.py", "from helper import build\n\ndef make():\n    return build()\n")
    error = failure(f"{path}:make")
    assert error.location == f"{helper}:2"
    assert "ValueError: no weights file" in error.message


def test_syntax_error_in_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "m.py", "def make(:\n    pass\n")
    error = failure(f"{path}:make")
    assert error.location == f"{path}:1"
    assert error.message.startswith("importing the file failed: SyntaxError")


def test_error_while_importing_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "m.py", "import torch\n\nWEIGHTS = torch.load('absent.pt')\n")
    error = failure(f"{path}:make")
    assert error.location == f"{path}:3"
    assert "FileNotFoundError" in error.message


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ("return nn.Linear(4, 2)", "it returned Linear"),
        ("return nn.Linear(4, 2), (x,), x", "it returned a tuple of 3"),
        ("return 'model', (x,)", "the model has type str, not torch.nn.Module"),
        ("return nn.Linear(4, 2), x", "args has type Tensor, not a tuple of inputs such as (x,)"),
        (
            "return nn.Linear(4, 2), (x,), 3, lambda out, t: out.sum()",
            "target has type int, not a tensor whose first dimension is the batch",
        ),
        (
            "return nn.Linear(4, 2), (x,), x, 'mse'",
            "loss_fn has type str, not a function(output, target)",
        ),
    ],
)
def test_wrong_return_shape_says_what_was_expected(tmp_path: Path, body: str, detail: str) -> None:
    path = write(
        tmp_path,
        "m.py",
        f"import torch\nfrom torch import nn\n\n\ndef make():\n    x = torch.zeros(3, 4)\n    {body}\n",
    )
    error = failure(f"{path}:make")
    assert error.location == f"{path}:5"  # the factory's def line
    assert error.message == (
        f"make() must return (model, args) or (model, args, target, loss_fn); {detail}"
    )


def test_a_list_of_args_is_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "m.py",
        "import torch\nfrom torch import nn\n\ndef make():\n    return nn.Linear(4, 2), [torch.zeros(3, 4)]\n",
    )
    assert isinstance(load_example(f"{path}:make").args, tuple)

"""A forward inherited from a base class: the bases read from source, the methods Python
runs, and what a statement copied from another module may read."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from syncpass.core.errors import SyncpassError
from syncpass.frontend.bases import Ancestry, read_ancestry
from syncpass.frontend.inline import Inlined, inline_own_methods

BASE = """\
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.grad_checkpointing = False

    def _embed(self, x):
        return F.gelu(self.embed(x))

    def features(self, x, is_causal=False):
        x = self._embed(x)
        if is_causal:
            raise NotImplementedError
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_sequential(self.blocks, 2, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        x = self.features(x, is_causal=is_causal)
        return self.head(x)
"""


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def ancestry(folder: Path, model: str, name: str = "Net") -> tuple[cst.Module, Ancestry]:
    path = folder / model
    module = cst.parse_module(path.read_text())
    return module, read_ancestry(module, name, str(path), ())


def expanded(folder: Path, model: str, name: str = "Net") -> tuple[Inlined, str]:
    module, found = ancestry(folder, model, name)
    result = inline_own_methods(module, name, ancestry=found)
    classdef = next(
        s for s in result.module.body if isinstance(s, cst.ClassDef) and s.name.value == name
    )
    members = [m for m in classdef.body.body if isinstance(m, cst.FunctionDef)]
    forward = next(m for m in members if m.name.value == "forward")
    return result, result.module.code_for_node(forward)


def test_the_inherited_forward_runs_the_overrides_and_its_dropped_branch_may_read_anything(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": BASE,
            "model.py": """\
                import torch
                from pkg.base import Backbone


                class Net(Backbone):
                    def _embed(self, x):
                        return torch.relu(self.embed(x))
                """,
        },
    )
    result, forward = expanded(tmp_path, "model.py")
    # The override wins; checkpoint_sequential sat in the branch decided away.
    assert "torch.relu(self.embed(x))" in forward and "F.gelu" not in forward
    assert "x = self.blocks(x)" in forward and "checkpoint_sequential" not in forward
    assert result.methods[0] == "Backbone.forward (pkg/base.py:25)"
    assert "self.features (Backbone's, pkg/base.py:15)" in result.methods
    (branch,) = result.branches
    assert branch.where("model.py") == "pkg/base.py:17"
    assert ("self.grad_checkpointing", False) in branch.reads  # from the base's __init__
    assert "# syncpass: the else branch of `if is_causal:` (pkg/base.py:17)" in forward


def test_a_base_method_reading_a_global_the_model_file_lacks_stays_one_call(
    tmp_path: Path,
) -> None:
    # Without the override, _embed reads F, which model.py does not import: the call of
    # _embed stays a call (Python finds the base's method and its F at run time).
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": BASE,
            "model.py": "import torch\nfrom pkg.base import Backbone\n\n\nclass Net(Backbone):\n"
            "    pass\n",
        },
    )
    result, forward = expanded(tmp_path, "model.py")
    assert "x = self._embed(x)" in forward and "F.gelu" not in forward
    assert not any("_embed" in method for method in result.methods)
    code = result.module.code
    assert "def _embed(self, x):" in code  # in the expanded class: what a stage holds


@pytest.mark.parametrize(
    "imports",
    [
        "import torch\nimport torch.nn.functional as F\n",
        "import torch\nfrom torch.nn import functional as F\n",
        "import torch\nfrom pkg.base import F\n",
    ],
)
def test_the_same_import_written_another_way_is_the_same_global(
    tmp_path: Path, imports: str
) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/base.py": BASE,
            "model.py": f"{imports}from pkg.base import Backbone\n\n\nclass Net(Backbone):\n"
            "    pass\n",
        },
    )
    _, forward = expanded(tmp_path, "model.py")
    assert "F.gelu(self.embed(x))" in forward


def test_a_forward_reading_a_global_the_model_file_binds_otherwise_is_refused(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        {
            "base.py": """\
                import torch.nn.functional as F
                from torch import nn


                class Base(nn.Module):
                    def forward(self, x):
                        return F.relu(self.fc(x))
                """,
            "model.py": "from base import Base\nF = None\n\n\nclass Net(Base):\n    pass\n",
        },
    )
    with pytest.raises(SyncpassError) as raised:
        expanded(tmp_path, "model.py")
    message = raised.value.message
    assert "Net inherits forward from Base (base.py:5)" in message
    assert "statement at base.py:7 reads" in message
    assert "F: model.py does not bind it as base.py does (import torch.nn.functional as F)" in (
        message
    )


def test_super_and_private_names_in_inherited_code_are_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "base.py": """\
                from torch import nn


                class Base(nn.Module):
                    def forward(self, x):
                        x = self.__scale(x)
                        return super().forward(x)
                """,
            "model.py": "from base import Base\n\n\nclass Net(Base):\n    pass\n",
        },
    )
    with pytest.raises(SyncpassError) as raised:
        expanded(tmp_path, "model.py")
    assert "__scale: Python mangles it with Base" in raised.value.message


def test_relative_imports_and_a_package_reexport_are_followed(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from .models import Backbone\n",
            "pkg/models/__init__.py": "from .base import Backbone\n",
            "pkg/models/base.py": BASE.replace(
                "from torch.utils.checkpoint import checkpoint_sequential",
                "from ..helpers import checkpoint_sequential",
            ),
            "pkg/helpers.py": "def checkpoint_sequential(*args):\n    pass\n",
            "model.py": "import torch\nimport pkg\n\n\nclass Net(pkg.Backbone):\n    pass\n",
        },
    )
    _, found = ancestry(tmp_path, "model.py")
    assert [cls.name for cls in found.classes] == ["Net", "Backbone"]
    assert found.classes[1].file.path == "pkg/models/base.py"
    binding = found.classes[1].file.bindings["checkpoint_sequential"]
    assert binding.key == "pkg.helpers.checkpoint_sequential"


def test_several_bases_follow_pythons_order_and_refuse_what_is_not_found(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        {
            "model.py": """\
                from torch import nn


                class Mixin:
                    def forward(self, x):
                        return self.fc(x)


                class Base(nn.Module):
                    def forward(self, x):
                        return x


                class Net(Mixin, Base):
                    pass


                class Other(Mixin, NotAnywhere):
                    pass
                """,
        },
    )
    _, found = ancestry(tmp_path, "model.py")
    assert [cls.name for cls in found.classes] == ["Net", "Mixin", "Base"]
    owner = found.method("forward")
    assert not isinstance(owner, str) and owner[0].name == "Mixin"
    with pytest.raises(SyncpassError) as raised:
        ancestry(tmp_path, "model.py", "Other")
    assert "Other inherits from several classes" in raised.value.message
    assert raised.value.location == "model.py:18"


def test_a_single_base_that_is_not_found_ends_what_is_known(tmp_path: Path) -> None:
    write(
        tmp_path,
        {"model.py": "from nowhere import Base\n\n\nclass Net(Base):\n    pass\n"},
    )
    _, found = ancestry(tmp_path, "model.py")
    assert [cls.name for cls in found.classes] == ["Net"]
    reason = found.method("forward")
    assert isinstance(reason, str) and "no source of module nowhere" in reason

"""Branches decided before the run: an ``if`` the eager stages plan as the branch it takes."""

from __future__ import annotations

import textwrap

import libcst as cst

from syncpass.frontend.inline import inline_own_methods

TIMM_STYLE = """
import torch


class Net:
    def __init__(self):
        self.blocks = Blocks()
        self.grad_checkpointing = False

    def forward_features(self, x, attn_mask=None, is_causal=False):
        x = self.embed(x)
        if attn_mask is not None or is_causal:
            for blk in self.blocks:
                x = blk(x, attn_mask=attn_mask)
        elif self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            # the usual way
            x = self.blocks(x)
        return self.norm(x)

    def forward(self, x):
        x = self.forward_features(x)
        return self.head(x)
"""


def forward_body(code: str) -> list[str]:
    module = cst.parse_module(code)
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == "Net":
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef) and member.name.value == "forward":
                    return module.code_for_node(member).strip().splitlines()[1:]
    raise AssertionError("no forward")


def test_an_inlined_methods_defaults_and_an_init_flag_decide_the_branch() -> None:
    result = inline_own_methods(cst.parse_module(TIMM_STYLE), "Net")
    assert forward_body(result.module.code) == [
        "    attn_mask = None",
        "    is_causal = False",
        "    x = self.embed(x)",
        "    # syncpass: the else branch of `if attn_mask is not None or is_causal:` (line 12)",
        "    # the usual way",
        "    x = self.blocks(x)",
        "    x = self.norm(x)",
        "    return self.head(x)",
    ]
    (branch,) = result.branches
    assert (branch.line, branch.taken) == (12, "else")
    assert branch.reads == (
        ("attn_mask", None),
        ("is_causal", False),
        ("self.grad_checkpointing", False),
    )
    assert [(a.name, a.value) for a in branch.assumed] == [("grad_checkpointing", False)]
    assert "the else branch of `if attn_mask is not None or is_causal:` at m.py:12" in (
        branch.describe("m.py")
    )


def fold(forward: str, init: str = "pass") -> tuple[list[str], tuple[str, ...]]:
    code = textwrap.dedent(
        f"""
        class Net:
            def __init__(self):
                {init}

        """
    ) + textwrap.indent(textwrap.dedent(forward), "    ")
    result = inline_own_methods(cst.parse_module(code), "Net")
    return forward_body(result.module.code), tuple(b.taken for b in result.branches)


def test_a_forward_parameter_with_a_constant_default_decides_and_the_elif_taken_runs() -> None:
    body, taken = fold(
        """
        def forward(self, x, mode="train", scale=None):
            if mode == "eval":
                x = self.a(x)
            elif scale is None:
                x = self.b(x)
            else:
                x = self.c(x)
            return x
        """
    )
    assert taken == ("elif 1",)
    assert body[1:] == ["    x = self.b(x)", "    return x"]


def test_no_branch_taken_removes_the_if() -> None:
    body, taken = fold(
        """
        def forward(self, x, output_hidden=False):
            if output_hidden:
                self.keep(x)
            return self.a(x)
        """
    )
    assert (body, taken) == (["    return self.a(x)"], ("none",))


def test_what_is_not_known_before_the_run_stays_a_region() -> None:
    undecided = [
        "if x.sum() > 0:",  # the data
        "if self.training:",  # set by train() / eval(), not __init__
        "if self.flag:",  # __init__ assigns it twice
        "if scale is None:",  # the forward assigns the parameter
        "if self.other and torch.jit.is_scripting():",  # not set in __init__
        "if torch.cuda.is_available():",  # not a call known to be false when eager
    ]
    for test in undecided:
        forward = f"""
        def forward(self, x, scale=None):
            scale = scale or 1.0
            {test}
                x = self.a(x) * scale
            return x
        """
        body, taken = fold(forward, "self.flag = False; self.flag = True")
        assert taken == (), test
        assert f"    {test}" in body, test


def test_a_branch_that_returns_is_not_folded() -> None:
    body, taken = fold(
        """
        def forward(self, x, return_dict=True):
            if return_dict:
                return {"out": self.a(x)}
            return self.a(x)
        """
    )
    assert taken == () and "    if return_dict:" in body


def test_a_name_assigned_once_to_a_constant_before_the_if_decides_it() -> None:
    body, taken = fold(
        """
        def forward(self, x):
            use_cache = False
            if not use_cache and self.fused:
                x = self.fused_path(x)
            else:
                x = self.plain_path(x)
            return x
        """,
        "self.fused = True",
    )
    assert taken == ("if",)
    assert "    x = self.fused_path(x)" in body and "    x = self.plain_path(x)" not in body


SUBMODULE_STACK = """
class Body:
    def forward(self, x, scale=None):
        if scale is not None:
            x = x * scale
        for layer in self.layers:
            x = layer(x)
        return x


class Net:
    def __init__(self):
        self.body = Body()

    def forward(self, x):
        x = self.body(x)
        return x
"""


def test_a_branch_of_a_submodules_forward_is_named_at_its_line_in_the_file() -> None:
    # The submodule's statements are rewritten when inlined (self read as self.body): the
    # decided if still has its line, 4.
    result = inline_own_methods(cst.parse_module(SUBMODULE_STACK), "Net")
    assert "for layer in self.body.layers:" in result.module.code
    (branch,) = result.branches
    assert (branch.line, branch.taken) == (4, "none")
    assert "at m.py:4 (scale=None)" in branch.describe("m.py")

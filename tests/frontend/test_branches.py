"""Branches decided before the run: an ``if`` the eager stages plan as the branch it takes."""

from __future__ import annotations

import textwrap

import libcst as cst

from syncpass.frontend.branches import (
    PASSED,
    UNKNOWN,
    AssumedDefault,
    ObjectValues,
    input_key,
    recorded_values,
)
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
        "if scale is None:",  # the forward assigns the parameter from the data
        "if gain is None:",  # assigned in a branch nobody decided
        "if self.other and torch.jit.is_scripting():",  # not set in __init__
        "if torch.cuda.is_available():",  # not a call known to be false when eager
        "if self.config.fused:",  # a setting, with no built model to read it off
    ]
    for test in undecided:
        forward = f"""
        def forward(self, x, scale=None, gain=None):
            scale = scale or x.amax()
            if x.sum() > 0:
                gain = 2.0
            {test}
                x = self.a(x) * scale
            return x
        """
        body, taken = fold(forward, "self.flag = False; self.flag = True")
        assert taken == (), test
        assert f"    {test}" in body, test


def test_a_branch_taken_that_returns_ends_the_forward_there() -> None:
    # Hugging Face's `if not return_dict: return tuple(...)`: nothing after the `if` runs.
    body, taken = fold(
        """
        def forward(self, x, return_dict=False):
            x = self.a(x)
            if not return_dict:
                return (x,)
            return {"out": x}
        """
    )
    assert taken == ("if",)
    assert body[-1] == "    return (x,)" and body[-2].startswith("    # syncpass: the if branch")
    assert not any("out" in line for line in body)


def test_a_branch_that_returns_before_its_end_is_not_folded() -> None:
    body, taken = fold(
        """
        def forward(self, x, return_dict=True):
            if return_dict:
                if x is None:
                    return x
                x = self.a(x)
            return self.b(x)
        """
    )
    assert taken == () and "    if return_dict:" in body


def test_the_examples_inputs_decide_is_none_and_nothing_else() -> None:
    code = textwrap.dedent(
        """
        class Net:
            def forward(self, input_ids=None, inputs_embeds=None, mask=None):
                if input_ids is not None and inputs_embeds is not None:
                    raise ValueError("both")
                elif input_ids is not None:
                    x = self.embed(input_ids)
                else:
                    x = inputs_embeds
                if input_ids:
                    x = x * 2
                if mask is None:
                    x = self.a(x)
                return x
        """
    )
    # The example passes a tensor for input_ids and None for mask (inputs 0 and 2).
    values = recorded_values([(input_key(0), "Tensor"), (input_key(2), None)])
    result = inline_own_methods(cst.parse_module(code), "Net", values=values)
    body = forward_body(result.module.code)
    assert [branch.taken for branch in result.branches] == ["elif 1", "if"]
    assert "    x = self.embed(input_ids)" in body and "    x = self.a(x)" in body
    assert "    if input_ids:" in body  # a tensor's truth is the data's: not decided
    assert result.branches[0].defaults[0] == AssumedDefault("input_ids", PASSED, 0)
    # Without the example, input_ids keeps its default (None): the else branch.
    plain = inline_own_methods(cst.parse_module(code), "Net")
    assert plain.branches[0].taken == "else"


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


HF_STYLE = """
class Base:
    def forward(self, x, output_hidden_states=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None
            else self.config.output_hidden_states
        )
        hidden = () if output_hidden_states else None
        for layer in self.layers:
            x = layer(x)
        if not return_dict:
            return (x, hidden)
        return Output(x, hidden)


class Net:
    def __init__(self, config):
        self.config = config
        self.base = Base(config)

    def forward(self, x, labels=None, return_dict=None):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.base(x, return_dict=return_dict)
        logits = self.head(outputs[0])
        if not return_dict:
            return (logits,) + outputs[1:]
        return Output(logits)
"""

SETTINGS = {
    "config.return_dict": True,
    "base.config.return_dict": True,
    "base.config.output_hidden_states": False,
}


def test_a_setting_read_off_the_built_model_decides_hugging_faces_early_returns() -> None:
    # `return_dict = return_dict if return_dict is not None else self.config.return_dict`:
    # the parameter keeps its default (None) up to there, so the name holds the setting,
    # which decides the caller's `if not return_dict:` and, handed on, the base model's
    # early return: the base model's layers are planned in the forward.
    asked: list[str] = []

    def values(path: str) -> object:
        asked.append(path)
        return SETTINGS.get(path, UNKNOWN)

    result = inline_own_methods(cst.parse_module(HF_STYLE), "Net", values=values)
    body = forward_body(result.module.code)
    assert "    for layer in self.base.layers:" in body
    assert "    outputs = Output(x, hidden)" in body
    assert not any("return (" in line for line in body)
    assert result.methods == ("self.base",)
    assert "config.return_dict" in asked
    lines = {branch.line: branch for branch in result.branches}
    caller = lines[26]  # the model's own `if not return_dict:`
    assert caller.taken == "none"
    assert dict(caller.reads) == {"self.config.return_dict": True, "return_dict": True}
    assert [(d.name, d.value, d.position) for d in caller.defaults] == [("return_dict", None, 2)]
    base = lines[12]  # the base model's, decided with what the call hands it
    assert base.taken == "none"
    assert ("return_dict", None, 2) in [(d.name, d.value, d.position) for d in base.defaults]


def test_without_the_built_models_settings_the_base_model_stays_one_op() -> None:
    result = inline_own_methods(cst.parse_module(HF_STYLE), "Net")
    assert "    outputs = self.base(x, return_dict=return_dict)" in forward_body(result.module.code)
    assert result.methods == ()


def test_a_setting_that_is_not_a_constant_is_not_known() -> None:
    class Config:
        return_dict = True
        layers = (1, 2)

        @property
        def broken(self) -> bool:
            raise RuntimeError("no")

    class Model:
        config = Config()

    values = ObjectValues(Model())
    assert values("config.return_dict") is True
    assert values("config.layers") is PASSED  # a tuple: only that it is not None is known
    assert values("config.broken") is UNKNOWN
    assert values("config.missing") is UNKNOWN
    assert values.read == {"config.return_dict": True, "object:config.layers": "tuple"}
    recorded = recorded_values(sorted(values.read.items()))
    assert recorded("config.return_dict") is True and recorded("config.layers") is PASSED
    assert recorded_values([("config.return_dict", False)])("config.return_dict") is False
    assert recorded_values([])("config.return_dict") is UNKNOWN


def test_the_built_models_attributes_and_one_line_helpers_decide_tests() -> None:
    # lucidrains-style code: flags set from __init__'s arguments, submodules that may be
    # None, and `exists(...)` for `... is not None`.
    code = textwrap.dedent(
        """
        def exists(val):
            return val is not None

        def pick(a, b=None):
            "The first given."
            return a if exists(a) else b

        class Net:
            def __init__(self, looped=False, rotary=None):
                self.looped = looped
                self.rotary = rotary
                self.mode = "a"

            def forward(self, x, mask=None):
                if exists(self.rotary):
                    x = self.rotary(x)
                if not (self.looped or exists(mask)):
                    x = self.a(x)
                if pick(mask, self.mode) == "a":
                    x = self.b(x)
                if self.training and exists(self.rotary):
                    x = self.c(x)
                if exists(self.gate):
                    x = self.gate(x)
                return x
        """
    )

    class Built:
        looped = False
        rotary = None
        training = True
        mode = "a"
        gate = object()

    values = ObjectValues(Built(), [None])
    result = inline_own_methods(cst.parse_module(code), "Net", values=values)
    body = forward_body(result.module.code)
    assert [branch.taken for branch in result.branches] == ["none", "if", "if", "if"]
    assert "    x = self.a(x)" in body and "    x = self.b(x)" in body
    assert "    x = self.gate(x)" in body and "    x = self.rotary(x)" not in body
    assert "    if self.training and exists(self.rotary):" in body  # the mode is not read
    assert values.read["object:gate"] == "object" and values.read["looped"] is False
    # What was read decides the same branches again from a cost file's settings.
    again = inline_own_methods(
        cst.parse_module(code), "Net", values=recorded_values(sorted(values.read.items()))
    )
    assert forward_body(again.module.code) == body


def test_an_attribute_the_forward_assigns_is_not_read_off_the_model() -> None:
    class Built:
        cache = None

    code = textwrap.dedent(
        """
        class Net:
            def forward(self, x):
                if self.cache is None:
                    self.cache = self.make(x)
                if self.cache is None:
                    x = self.a(x)
                return x
        """
    )
    result = inline_own_methods(cst.parse_module(code), "Net", values=ObjectValues(Built()))
    assert result.branches == ()


def test_a_local_named_like_an_init_flag_does_not_hide_the_flag() -> None:
    # Only `self.fused = ...` in the forward would change the flag; a local `fused` does not.
    body, taken = fold(
        """
        def forward(self, x):
            fused = x.sum()
            if self.fused:
                x = self.fused_path(x)
            return x + fused
        """,
        "self.fused = True",
    )
    assert taken == ("if",) and "    x = self.fused_path(x)" in body


def test_tuple_assignments_comparisons_and_augmented_flags_stay_known() -> None:
    # x-transformers: `b, n, has_memory_tokens = ..., self.num_memory_tokens > 0` and
    # `return_hiddens |= return_gumbel_log_probs` before `if not return_hiddens: return x`.
    body, taken = fold(
        """
        def forward(self, x, return_hiddens=False, extra=False):
            b, has_memory = x.shape[0], self.memory > 0
            if has_memory:
                x = self.a(x)
            return_hiddens |= extra
            count = 2
            count += 1
            if count >= 3 and not return_hiddens:
                x = self.b(x)
            return x
        """,
        init="self.memory = 0",
    )
    assert taken == ("none", "if")
    assert "    x = self.b(x)" in body and "    x = self.a(x)" not in body

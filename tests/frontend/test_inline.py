"""Inlining a model's own methods into its forward (what the eager stage form plans)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from syncpass.frontend import inline as inline_module
from syncpass.frontend.analysis import model_class_names
from syncpass.frontend.inline import Inlined, ModuleClasses, inline_own_methods


def forward_of(code: str, name: str = "Net") -> str:
    module = cst.parse_module(code)
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef) and member.name.value == "forward":
                    return module.code_for_node(member)
    raise AssertionError("no forward")


class _Layer:
    def __init__(self, scale: int) -> None:
        self.scale = scale

    def __call__(self, x: int) -> int:
        return x * self.scale


def run_forward(source: str, forward: str | None = None, inputs: int = 1) -> int:
    """What ``Net().forward(1, 2, ...)`` (``inputs`` of them) returns, with its forward
    replaced by ``forward`` (the expanded one): both run as plain Python on integers."""
    namespace: dict[str, object] = {}
    exec(textwrap.dedent(source), namespace)
    net_class = namespace["Net"]
    assert isinstance(net_class, type)
    if forward is not None:
        exec(textwrap.dedent(forward), namespace)
        net_class.forward = namespace["forward"]  # type: ignore[attr-defined]
    net = net_class.__new__(net_class)
    for name, scale in (("encoder", 2), ("decoder", 3)):
        stack = namespace.get("Stack")
        if isinstance(stack, type):
            part = stack.__new__(stack)
            part.layers = [_Layer(scale), _Layer(scale + 2)]
            setattr(net, name, part)
    net.proj = _Layer(5)
    result = net.forward(*range(1, inputs + 1))  # type: ignore[attr-defined]
    assert isinstance(result, int)
    return result


def inline(source: str) -> tuple[str, tuple[str, ...]]:
    result = inline_own_methods(cst.parse_module(textwrap.dedent(source)), "Net")
    return forward_of(result.module.code), result.methods


def test_a_delegating_forward_becomes_the_methods_statements_comments_kept() -> None:
    forward, methods = inline(
        """
        class Net:
            def _forward_impl(self, x):
                # the stem
                x = self.stem(x)
                x = self.layer1(x)
                return self.fc(x)

            def forward(self, x):
                return self._forward_impl(x)
        """
    )
    assert methods == ("self._forward_impl",)
    assert forward.strip() == textwrap.dedent(
        """\
        def forward(self, x):
            # the stem
            x = self.stem(x)
            x = self.layer1(x)
            return self.fc(x)"""
    )


def test_several_methods_in_sequence_and_methods_that_call_methods() -> None:
    forward, methods = inline(
        """
        class Net:
            def embed(self, tokens):
                return self.wte(tokens)

            def forward_features(self, x):
                x = self.embed(x)
                x = self.blocks(x)
                return x

            def forward_head(self, x, pre_logits: bool = False):
                x = self.norm(x)
                return x if pre_logits else self.head(x)

            def forward(self, x):
                x = self.forward_features(x)
                x = self.forward_head(x)
                return x
        """
    )
    assert methods == ("self.forward_features", "self.forward_head", "self.embed")
    assert forward.strip() == textwrap.dedent(
        """\
        def forward(self, x):
            tokens = x
            x = self.wte(tokens)
            x = self.blocks(x)
            pre_logits = False
            x = self.norm(x)
            x = x if pre_logits else self.head(x)
            return x"""
    )


def test_a_method_whose_names_the_forward_reads_later_uses_names_of_its_own() -> None:
    source = """
        class Net:
            def branch(self, x):
                skip = self.proj(x)
                return skip * 2

            def forward(self, x):
                skip = x
                y = self.branch(x)
                return y + skip
        """
    forward, methods = inline(source)
    assert methods == ("self.branch",)
    assert "branch_skip = self.proj(x)" in forward and "y = branch_skip * 2" in forward
    assert run_forward(source, forward) == run_forward(source)


def test_arguments_are_bound_before_the_body_as_python_binds_them() -> None:
    # One class called twice; the second call hands `mask` another value and the first
    # `mask` under another name: the bindings must not read each other's results.
    source = """
        class Stack:
            def __call__(self, *args, **kwargs):
                return self.forward(*args, **kwargs)

            def forward(self, x, mask, memory_mask=0, flag=None):
                flag = flag if flag is not None else 1
                for layer in self.layers:
                    x = layer(x) + mask + memory_mask
                return x * flag

        class Net:
            def __init__(self):
                self.encoder = Stack()
                self.decoder = Stack()

            def forward(self, x, mask, dec_x, dec_mask, flag=None):
                flag = flag if flag is not None else 3
                memory = self.encoder(x, mask, flag=flag)
                out = self.decoder(dec_x, mask=dec_mask, memory_mask=mask, flag=flag)
                return out + memory + flag
        """
    forward, methods = inline(source)
    assert methods == ("self.encoder", "self.decoder")
    assert "decoder_mask = dec_mask" in forward and "memory_mask = mask" in forward
    assert "decoder_flag = decoder_flag if decoder_flag is not None else 1" in forward
    assert run_forward(source, forward, 4) == run_forward(source, None, 4)


def test_early_returns_decorators_and_star_arguments_are_left_alone() -> None:
    source = """
        import functools

        class Net:
            def early(self, x):
                if x is None:
                    return x
                return self.a(x)

            @functools.lru_cache
            def cached(self, x):
                return self.b(x)

            def starred(self, *xs):
                return self.c(*xs)

            def forward(self, x):
                x = self.early(x)
                x = self.cached(x)
                x = self.starred(x)
                return x
        """
    forward, methods = inline(source)
    assert methods == ()
    assert forward.count("self.") == 3


def test_a_nested_function_may_return_inside_an_inlined_method() -> None:
    forward, methods = inline(
        """
        class Net:
            def run(self, x):
                def act(v):
                    return v.relu()
                return act(self.a(x))

            def forward(self, x):
                return self.run(x)
        """
    )
    assert methods == ("self.run",)
    assert "return act(self.a(x))" in forward


def test_an_annotated_assignment_of_a_call_is_inlined_too() -> None:
    forward, methods = inline(
        """
        class Net:
            def features(self, x):
                return self.body(x)

            def forward(self, x):
                h: Tensor = self.features(x)
                return self.head(h)
        """
    )
    assert methods == ("self.features",)
    assert "h = self.body(x)" in forward


def test_a_submodule_forward_behind_known_decorators_and_kwargs_is_followed() -> None:
    # Hugging Face's shape: an LM head calling its base model with **kwargs, the base
    # model's forward decorated by the library's wrappers.
    forward, methods = inline(
        """
        class Base:
            @merge_with_config_defaults
            @capture_outputs
            @auto_docstring
            @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
            def forward(self, input_ids=None, mask=None, use_cache=None, **kwargs):
                kwargs.pop("output_attentions", None)
                hidden_states = self.wte(input_ids)
                for block in self.h:
                    hidden_states = block(hidden_states, mask, **kwargs)
                return Output(last_hidden_state=self.ln_f(hidden_states))

        class Net:
            def __init__(self, config):
                self.transformer = Base(config)

            def forward(self, input_ids=None, mask=None, labels=None, **kwargs):
                outputs = self.transformer(input_ids, mask=mask, use_cache=False, **kwargs)
                hidden_states = outputs.last_hidden_state
                return self.lm_head(hidden_states)
        """
    )
    assert methods == (
        "self.transformer (without @merge_with_config_defaults, @capture_outputs, "
        "@auto_docstring, @deprecate_kwarg)",
    )
    assert "for block in self.transformer.h:" in forward
    assert "use_cache = False" in forward
    assert "kwargs = " not in forward  # the same dict, under the same name


def test_keywords_a_submodule_forward_does_not_name_go_into_its_star_parameter() -> None:
    # HF BertModel: self.encoder(x, position_ids=position_ids, **kwargs) into
    # BertEncoder.forward(self, hidden_states, mask=None, **kwargs), as Python binds it.
    forward, methods = inline(
        """
        class Encoder:
            def forward(self, hidden_states, mask=None, **kwargs):
                for layer in self.layer:
                    hidden_states = layer(hidden_states, mask, **kwargs)
                return hidden_states

        class Net:
            def __init__(self, config):
                self.encoder = Encoder(config)

            def forward(self, x, position_ids=None, **kwargs):
                h = self.encoder(x, mask=None, position_ids=position_ids, **kwargs)
                return self.head(h)
        """
    )
    assert methods == ("self.encoder",)
    assert 'kwargs = {"position_ids": position_ids, **kwargs}' in forward
    assert "for layer in self.encoder.layer:" in forward


def test_unknown_decorators_are_not_followed() -> None:
    source = """
        class Net:
            @torch.no_grad()
            def frozen(self, x):
                return self.a(x)

            def forward(self, x):
                x = self.frozen(x)
                return x
        """
    forward, methods = inline(source)
    assert methods == ()
    assert forward.count("self.") == 1


def test_kwargs_handed_on_fill_the_parameters_the_call_does_not_name_as_python_would() -> None:
    # Hugging Face's self.vit(pixel_values, **kwargs) into forward(self, pixel_values,
    # bool_masked_pos=None, **kwargs): kwargs may hold bool_masked_pos.
    forward, methods = inline(
        """
        class Net:
            def open_ended(self, x, scale=1, **options):
                return self.b(x) * scale

            def forward(self, x, **kwargs):
                x = self.open_ended(x, **kwargs)
                return x
        """
    )
    assert methods == ("self.open_ended",)
    assert 'scale = kwargs.get("scale", 1)' in forward
    assert (
        'options = {key: value for key, value in kwargs.items() if key not in ("scale",)}'
        in forward
    )
    # Those two lines, run, bind as Python binds open_ended(x, **kwargs).
    lines = [line.strip() for line in forward.splitlines() if " = " in line][:2]
    for kwargs, expected in (({"scale": 3, "other": 4}, (3, {"other": 4})), ({}, (1, {}))):
        scope: dict[str, object] = {"kwargs": kwargs}
        exec("\n".join(lines), {}, scope)
        assert (scope["scale"], scope["options"]) == expected


def test_a_name_assigned_again_after_the_call_may_be_bound_by_the_method() -> None:
    forward, methods = inline(
        """
        class Net:
            def features(self, x):
                h = self.body(x)
                return self.norm(h)

            def forward(self, x):
                out = self.features(x)
                h = out * 2
                return self.head(h)
        """
    )
    assert methods == ("self.features",)
    assert "h = self.body(x)" in forward


def test_a_method_reading_a_global_the_forward_shadows_is_left_alone() -> None:
    source = """
        class Net:
            def scaled(self, x):
                return self.a(x) * scale

            def forward(self, x, scale=2):
                return self.scaled(x)
        """
    _, methods = inline(source)
    assert methods == ()


NESTED = """
class Stack:
    def __init__(self):
        self.layers = [Layer() for _ in range(4)]

    def forward(self, x, mask, keep: bool = False):
        extra = () if keep else None
        for layer in self.layers:
            x = layer(x, mask)
        return x, extra


class Body:
    def __init__(self):
        self.embed = Embed()
        self.stack = Stack()

    def forward(self, tokens, return_dict: bool = True):
        mask = make_mask(tokens)
        x = self.embed(tokens)
        x, extra = self.stack(x, mask)
        if not return_dict:
            return (x, extra)
        return {"x": x}


class Net:
    def __init__(self):
        self.body = Body()
        self.head = Head()

    def forward(self, tokens):
        out = self.body(tokens)
        return self.head(out["x"])
"""


def test_a_layer_stack_two_submodules_deep_is_followed_through_an_early_return() -> None:
    """Body holds no loop, but builds the Stack that does: both are inlined; Body's early
    return sits in a branch its caller's default decides, the Stack hands back a tuple."""
    result = inline_own_methods(cst.parse_module(NESTED), "Net")
    assert result.methods == ("self.body", "self.body.stack")
    assert forward_of(result.module.code).strip() == textwrap.dedent(
        """\
        def forward(self, tokens):
            return_dict = True
            mask = make_mask(tokens)
            x = self.body.embed(tokens)
            keep = False
            extra = () if keep else None
            for layer in self.body.stack.layers:
                x = layer(x, mask)
            out = {"x": x}
            return self.head(out["x"])"""
    )
    assert [branch.test for branch in result.branches] == ["not return_dict"]
    frames = [(frame.class_name, frame.path, frame.last) for frame in result.frames]
    assert frames == [("Net", "", 1), ("Body", "body", 4), ("Stack", "body.stack", 2)]
    # Where a sync point after each statement goes in the file: (frame, statement).
    homes = [result.home(index) for index in range(len(result.origins) - 1)]
    assert homes == [
        None,  # between an argument bound and the body
        (1, 0),  # after `mask = ...` in Body
        (1, 1),
        None,  # between the Stack's argument and its body
        (2, 0),
        (2, 1),  # after the loop, in Stack (before its return)
        (0, 0),  # after `out = self.body(tokens)`, in Net
    ]


def test_a_function_inlined_twice_has_no_home_for_a_sync_point() -> None:
    source = NESTED.replace(
        "out = self.body(tokens)\n",
        "out = self.body(tokens)\n        again = self.other(tokens)\n",
    ).replace("self.body = Body()", "self.body = Body()\n        self.other = Body()")
    result = inline_own_methods(cst.parse_module(source), "Net")
    assert result.methods.count("self.body.stack") == 1 and "self.other.stack" in result.methods
    homes = {result.home(index) for index in range(len(result.origins) - 1)}
    # A sync point inside either call would be written into both: only Net's own remain.
    assert homes == {None, (0, 0), (0, 1)}


def test_a_stack_run_inside_an_expression_is_followed_one_call_a_statement() -> None:
    # torchvision's ViT encoder: the layers are an nn.Sequential built from a container,
    # run in the middle of the returned expression.
    forward, methods = inline(
        """
        class Encoder(nn.Module):
            def __init__(self, blocks):
                super().__init__()
                self.dropout = nn.Dropout(0.1)
                self.layers = nn.Sequential(blocks)
                self.ln = nn.LayerNorm(8)

            def forward(self, input):
                input = input + 1
                return self.ln(self.layers(self.dropout(input)))

        class Mlp(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(8, 8), nn.GELU())

            def forward(self, x):
                return self.net(x)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = Encoder(blocks)
                self.mlp = Mlp()

            def forward(self, x):
                x = self.encoder(x)
                x = self.mlp(x)
                return x
        """
    )
    assert methods == ("self.encoder",)  # an MLP written out in its Sequential is not a stack
    assert forward.strip() == textwrap.dedent(
        """\
        def forward(self, x):
            input = x
            input = input + 1
            x = self.encoder.dropout(input)
            x = self.encoder.layers(x)
            x = self.encoder.ln(x)
            x = self.mlp(x)
            return x"""
    )


# The per-module class index (ModuleClasses) and the test that passes over the classes
# whose forward cannot change: they must give the answers the whole-module reading gave.

DUPLICATES_AND_STACKS = """
import torch
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        return x


class Block(nn.Module):  # a second definition: Python binds this one
    def forward(self, x):
        return x * 2


class Stack(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class BuiltInAnIf(nn.Module):
    def __init__(self, deep=True):
        super().__init__()
        if deep:
            self.stack = Stack(4)
        else:
            with torch.no_grad():
                self.stack = Stack(1)

    def forward(self, x):
        x = self.stack(x)
        return x


class BuiltInANestedFunction(nn.Module):
    def __init__(self):
        super().__init__()

        def build():
            self.stack = Stack(2)

        build()

    def forward(self, x):
        y = self.stack(x)
        return y


class CallsItsOwn(nn.Module):
    def helper(self, x):
        return x + 1

    def forward(self, x):
        x = self.helper(x)
        return x


class Decides(nn.Module):
    def __init__(self):
        super().__init__()
        self.flag = True

    def forward(self, x):
        if self.flag:
            x = x + 1
        return x


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        y = self.proj(x)
        return y
"""

DATA = Path(__file__).resolve().parent.parent / "data"
SOURCES = {path.name: path.read_text() for path in sorted(DATA.glob("*.py"))}
SOURCES["duplicates_and_stacks.py"] = DUPLICATES_AND_STACKS
#: The methods each kind of module is read with: torch's, then Flax's.
METHODS = (("forward", "__init__"), ("__call__", "setup"))


def test_the_class_index_answers_as_the_module_body_does() -> None:
    for name, text in SOURCES.items():
        module = cst.parse_module(text)
        index = ModuleClasses.of(module)
        classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
        assert dict(index.classes) == {c.name.value: c for c in classes}, name
        for class_name in {c.name.value for c in classes}:
            found = [
                (i, s)
                for i, s in enumerate(module.body)
                if isinstance(s, cst.ClassDef) and s.name.value == class_name
            ]
            assert index.single(class_name) == (found[0] if len(found) == 1 else None), name
    assert ModuleClasses.of(cst.parse_module(DUPLICATES_AND_STACKS)).single("Block") is None


def test_a_class_index_of_another_module_is_refused() -> None:
    module = cst.parse_module(DUPLICATES_AND_STACKS)
    other = cst.parse_module(DUPLICATES_AND_STACKS)
    with pytest.raises(ValueError, match=r"ModuleClasses\.of"):
        inline_own_methods(module, "Plain", classes=ModuleClasses.of(other))
    with pytest.raises(ValueError, match=r"ModuleClasses\.of"):
        ModuleClasses(module, ModuleClasses.of(other).positions, ModuleClasses.of(other).classes)


def expanded(result: Inlined) -> tuple[object, ...]:
    return (result.module.code, result.methods, result.branches, result.frames, result.origins)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_classes_passed_over_expand_as_the_full_expansion_does(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every model class, expanded with the quick test that passes over a forward that
    cannot change and with that test answering yes for all: the same module, inlined
    calls, decided branches and origins; and the quick test passes over only classes
    whose full expansion changes nothing."""
    module = cst.parse_module(SOURCES[name])
    for forward, init in METHODS:
        for class_name in model_class_names(module, forward):
            quick = inline_own_methods(module, class_name, forward_method=forward, init_method=init)
            with monkeypatch.context() as patch:
                patch.setattr(inline_module, "_may_expand", lambda *args: True)
                full = inline_own_methods(
                    module, class_name, forward_method=forward, init_method=init
                )
            assert expanded(quick) == expanded(full), class_name
            assert (quick.module is module) == (full.module is module), class_name


def test_the_quick_test_passes_over_only_forwards_that_cannot_change() -> None:
    module = cst.parse_module(DUPLICATES_AND_STACKS)
    index = ModuleClasses.of(module)
    names = inline_module._Names()
    may = {}
    for class_name in model_class_names(module):
        found = index.single(class_name)
        if found is None:
            continue
        classdef = found[1]
        methods = {
            member.name.value: member
            for member in classdef.body.body
            if isinstance(member, cst.FunctionDef)
        }
        forward = methods["forward"]
        may[class_name] = inline_module._may_expand(
            forward, methods, classdef, index.classes, names
        )
    assert may == {
        "Stack": False,
        "BuiltInAnIf": True,
        "BuiltInANestedFunction": True,
        "CallsItsOwn": True,
        "Decides": True,
        "Plain": False,
    }
    assert inline_own_methods(module, "BuiltInAnIf").methods == ("self.stack",)

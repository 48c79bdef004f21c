"""Inlining a model's own methods into its forward (what the eager stage form plans)."""

from __future__ import annotations

import textwrap

import libcst as cst

from syncpass.frontend.inline import inline_own_methods


def forward_of(code: str, name: str = "Net") -> str:
    module = cst.parse_module(code)
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef) and member.name.value == "forward":
                    return module.code_for_node(member)
    raise AssertionError("no forward")


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


def test_a_method_whose_names_would_clobber_a_later_value_is_left_alone() -> None:
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
    assert methods == ()
    assert "y = self.branch(x)" in forward


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

"""The op graph the analysis builds from source alone."""

from __future__ import annotations

import textwrap

import pytest

from syncpass.backends.torch.analysis import analyse_model
from syncpass.contracts.graph import OpGraph
from syncpass.core.errors import SyncpassError
from syncpass.frontend import parse_source


def graph_of(source: str, sizes: dict[str, int] | None = None, model: str | None = None) -> OpGraph:
    text = textwrap.dedent(source)
    return analyse_model(parse_source(text, "m.py"), "m.py", model, sizes)


def test_ops_are_recognised_by_qualified_name() -> None:
    graph = graph_of(
        """
        import torch as t
        from torch.nn import functional as F

        def matmul(a, b):
            return a

        class M:
            def forward(self, x, y):
                a = t.matmul(x, y)
                b = matmul(x, y)
                c = F.relu(a) @ b
                return c
        """
    )
    assert [op.id for op in graph.ops] == ["torch.matmul@L10", "matmul@L11", "operator.matmul@L12"]
    assert graph.ops[0].calls == ("torch.matmul",)
    assert graph.ops[1].calls == ("matmul",)  # the local function, not torch's
    assert graph.ops[2].calls == ("operator.matmul", "torch.nn.functional.relu")


def test_submodule_calls_name_their_ops_and_edges_follow_def_use() -> None:
    graph = graph_of(
        """
        class M:
            def forward(self, x):
                h = self.stem(x)
                skip = h
                h = self.body.conv(h)
                h = self.blocks[2](h) + skip
                return self.head(h)
        """
    )
    assert [op.id for op in graph.ops] == ["stem", "stmt@L5", "body.conv", "blocks.2", "head"]
    assert set(graph.edges) == {
        ("stem", "stmt@L5"),
        ("stem", "body.conv"),
        ("body.conv", "blocks.2"),
        # `skip = h` only names stem's value: blocks.2 uses what stem made.
        ("stem", "blocks.2"),
        ("blocks.2", "head"),
        ("<input>", "stem"),
    }
    assert [op.alias for op in graph.ops] == [False, True, False, False, False]
    live = {cut.after: cut.live for cut in graph.cuts}
    assert live == {
        "stem": ("h",),  # no cut after the alias: the one before sends the same value
        "body.conv": ("h", "skip"),
        "blocks.2": ("h",),
    }


def test_every_way_a_value_goes_by_another_name_leads_back_to_the_op_that_made_it() -> None:
    graph = graph_of(
        """
        class M:
            def forward(self, x, y):
                a = self.stem(x)
                pair = (a, y)
                b, c = pair
                scale = lambda t: t * c
                def shift(t):
                    return t + b
                h = self.body(x)
                h += self.side(y)
                cache = {}
                cache["k"] = self.key(h)
                state = self.state(y)
                state.last = h
                return self.head(scale(h), shift(h), cache, state)
        """
    )
    ids = [op.id for op in graph.ops]
    assert ids == [
        "stem", "stmt@L5", "stmt@L6", "operator.mul@L7", "def@L8", "body",
        "side", "stmt@L12", "key", "state", "stmt@L15", "head",
    ]  # fmt: skip
    aliases = {op.id for op in graph.ops if op.alias}
    assert aliases == {"stmt@L5", "stmt@L6", "operator.mul@L7", "def@L8"}
    assert graph.ops[4].reads == ("b",) and graph.ops[4].writes == ("shift",)
    into_head = {producer for producer, consumer in graph.edges if consumer == "head"}
    # The lambda and the nested def carry what they capture (c is y, b is stem's a);
    # the store into the dict and onto the local object make new versions of them.
    assert into_head == {"<input>", "stem", "side", "key", "stmt@L15"}
    # h += ... reads h: it depends on body.
    assert ("body", "side") in graph.edges
    # A store into a local reads the container and the value stored.
    assert ("stmt@L12", "key") in graph.edges and ("side", "stmt@L15") in graph.edges


def test_container_loops_are_planned_per_iteration() -> None:
    source = """
        class M:
            def forward(self, x):
                for i, block in enumerate(self.layers[1:]):
                    x = block(x)
                return x
        """
    graph = graph_of(source, {"layers": 4})
    assert [op.id for op in graph.ops] == ["layers.1", "layers.2", "layers.3"]
    assert [op.loop.index for op in graph.ops if op.loop] == [1, 2, 3]
    assert [cut.after for cut in graph.cuts] == ["layers.1", "layers.2"]
    # Without the container's length the loop is one region, named with file:line.
    unknown = graph_of(source)
    assert [op.id for op in unknown.ops] == ["for@L4"]
    assert "length of self.layers is unknown" in str(unknown.regions[0])
    assert str(unknown.regions[0]).startswith("m.py:4-5: ")


def test_a_loops_names_read_after_it_are_live_after_its_last_iteration() -> None:
    """ESM-2's forward reads ``layer_idx`` after its layer loop: a cut after the last layer
    must carry it (Python keeps the last iteration's binding), and one inside the loop need
    not (each iteration binds it again)."""
    source = """
        class M:
            def forward(self, x):
                for layer_idx, layer in enumerate(self.layers):
                    x = layer(x)
                x = self.norm(x)
                if (layer_idx + 1) in self.keep:
                    x = x * 2
                return x
        """
    graph = graph_of(source, {"layers": 3})
    assert graph.ops[2].id == "layers.2" and "layer_idx" in graph.ops[2].writes
    assert "layer_idx" not in graph.ops[1].writes
    live = {cut.after: cut.live for cut in graph.cuts}
    assert "layer_idx" in live["layers.2"] and "layer_idx" in live["norm"]
    assert "layer_idx" not in live["layers.1"]


def test_a_keyword_arguments_name_is_no_read() -> None:
    """T5's forward ends in ``Seq2SeqModelOutput(..., encoder_hidden_states=...)``, and its
    decoder loop binds a local ``encoder_hidden_states``: the keyword is no read of the
    local, which the last stage must not be sent (in a loop body either)."""
    source = """
        class M:
            def forward(self, x, mask):
                for layer in self.layers:
                    x = layer(x, mask=mask)
                mask = x.mean()
                x = self.norm(x)
                return Output(last=x, mask=x.sum())
        """
    graph = graph_of(source, {"layers": 2})
    assert graph.ops[-1].reads == ("x",)
    assert "mask" in graph.ops[0].reads
    live = {cut.after: cut.live for cut in graph.cuts}
    assert "mask" not in live["norm"] and "mask" not in live[graph.ops[2].id]


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        ("if x.sum() > 0:\n    x = self.a(x)", "an if statement"),
        ("while x.norm() > 1:\n    x = x / 2", "a while loop"),
        ("with torch.no_grad():\n    x = self.a(x)", "a with block"),
        ("for k in range(3):\n    x = x * k", "a loop over something other"),
        ("for b in self.blocks:\n    if b is None:\n        break\n    x = b(x)", "break"),
    ],
)
def test_regions_take_no_sync_point_inside(block: str, reason: str) -> None:
    body = textwrap.indent(f"x = self.pre(x)\n{block}\nx = self.post(x)\nreturn x\n", " " * 8)
    graph = graph_of(f"class M:\n    def forward(self, x):\n{body}", {"blocks": 2})
    assert graph.ops[0].id == "pre"
    assert len(graph.ops) == 3
    assert graph.ops[1].region is not None and reason in graph.ops[1].region
    assert [cut.after for cut in graph.cuts] == ["pre", graph.ops[1].id]


def test_user_pins_and_forbids_sync_points() -> None:
    graph = graph_of(
        """
        class M:
            def forward(self, x):
                x = self.a(x)  # syncpass: sync
                x = self.b(x)  # syncpass: no-sync
                for blk in self.blocks:  # syncpass: no-sync
                    x = blk(x)
                return self.c(x)
        """,
        {"blocks": 3},
    )
    cuts = {cut.after: cut.pinned for cut in graph.cuts}
    assert cuts == {"a": True, "blocks.2": False}  # after the loop is still allowed
    assert set(graph.forbidden) == {"b", "blocks.0", "blocks.1"}


def test_model_class_is_chosen_or_named() -> None:
    source = """
        class A:
            def forward(self, x):
                return self.f(x)

        class B:
            def forward(self, x):
                x = self.g(x)
                return x
        """
    with pytest.raises(
        SyncpassError, match=r"several model classes \(A, B\); choose one with --model"
    ):
        graph_of(source)
    assert graph_of(source, model="B").model_class == "B"
    with pytest.raises(
        SyncpassError, match="no top-level class named 'C'; model classes here: A, B"
    ):
        graph_of(source, model="C")
    with pytest.raises(SyncpassError, match="no model class"):
        graph_of("def forward(x):\n    return x\n")


def test_syntax_errors_name_file_and_line() -> None:
    with pytest.raises(SyncpassError) as caught:
        parse_source("x = 1\nclass M(:\n    pass\n", "m.py")
    assert caught.value.location == "m.py:2"
    assert "syntax error" in caught.value.message


def test_a_name_overwritten_before_its_next_read_is_not_live() -> None:
    graph = graph_of(
        """
        class UNet:
            def forward(self, x, mask):
                skip = self.enc(x)
                x = self.pool(skip)
                if mask is not None:
                    x = x * mask
                x = self.dec(x, skip)
                return x
        """
    )
    live = {cut.after: cut.live for cut in graph.cuts}
    assert live["enc"] == ("mask", "skip")  # x is overwritten by pool before any read
    assert live["pool"] == ("x", "mask", "skip")
    # A region only may assign: what it writes stays live across it if read later.
    assert live["if@L6"] == ("x", "skip")


def test_loop_iterations_are_named_by_their_container_whatever_they_call() -> None:
    graph = graph_of(
        """
        class M:
            def forward(self, x):
                for block in self.blocks:
                    x = self.drop(block(x))
                for b in self.more:  # syncpass: sync
                    h = b.norm(x)
                    x = x + h
                return x
        """,
        {"blocks": 3, "more": 2},
    )
    assert [op.id for op in graph.ops] == ["blocks.0", "blocks.1", "blocks.2", "more.0", "more.1"]
    # h is written before it is read in each iteration: only x crosses a cut inside the loop.
    live = {cut.after: cut.live for cut in graph.cuts}
    assert live["more.0"] == ("x",)
    assert [cut.after for cut in graph.cuts if cut.pinned] == []  # the loop is the last op


@pytest.mark.parametrize(
    ("body", "per_layer"),
    [
        # OPT's LayerDrop: a continue only ends the iteration, as over a slice.
        ("if self.training and self.drop > 0.0:\n    continue\nx = block(x)", True),
        ("for part in block:\n    if part is None:\n        break\n    x = part(x)", True),
        ("def skip(y):\n    return y\nx = block(skip(x))", True),
        ("if x.sum() > 0:\n    break\nx = block(x)", False),  # it may end the loop early
        ("if x.sum() > 0:\n    return x\nx = block(x)", False),
    ],
)
def test_a_layer_loop_may_continue_but_not_break_or_return(body: str, per_layer: bool) -> None:
    inner = textwrap.indent(body, " " * 20)
    graph = graph_of(
        f"""
        class M:
            def forward(self, x):
                for block in self.blocks:
{inner}
                return x
        """,
        {"blocks": 3},
    )
    expected = ["blocks.0", "blocks.1", "blocks.2"] if per_layer else ["for@L4"]
    assert [op.id for op in graph.ops] == expected

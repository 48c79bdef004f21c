"""Loops as people write them: unpacked layer pairs and bounds counted from the end."""

from __future__ import annotations

import textwrap

from costbuilder import cost_dict

from syncpass.backends.torch.analysis import analyse_model
from syncpass.contracts.costs import costs_to_json, parse_costs
from syncpass.frontend import parse_source
from syncpass.transformers.common import SyncSite
from syncpass.transformers.torch_pipeline import insert_pipe_splits, remove_pipe_splits

PAIRS = textwrap.dedent(
    """\
    class Net:
        def forward(self, x):
            x = self.stem(x)
            for attn, ff in self.layers[:-1]:
                x = x + attn(x)
                x = x + ff(x)
            attn, ff = self.layers[-1]
            return self.head(attn(x) + ff(x))
    """
)


def test_each_pair_is_one_op_calling_both_of_its_modules() -> None:
    graph = analyse_model(parse_source(PAIRS, "net.py"), "net.py", "Net", {"layers": 5})
    loop_ops = [op for op in graph.ops if op.loop is not None]
    assert [op.id for op in loop_ops] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert {"self.layers.2.0", "self.layers.2.1"} <= set(loop_ops[2].calls)
    assert "attn" not in loop_ops[0].reads  # the unpacked names belong to the iteration
    assert dict(graph.containers) == {"layers": 5}


def test_a_bound_counted_from_the_end_plans_the_iterations_python_runs() -> None:
    text = PAIRS.replace("self.layers[:-1]", "self.layers[-3:]")
    graph = analyse_model(parse_source(text, "net.py"), "net.py", "Net", {"layers": 5})
    assert [op.id for op in graph.ops if op.loop is not None] == [
        "layers.2",
        "layers.3",
        "layers.4",
    ]


def test_splitting_a_loop_with_a_negative_bound_keeps_it_and_joins_back() -> None:
    module = parse_source(PAIRS, "net.py")
    site = SyncSite(statement=1, split_after=1, comment="1/1: test")
    rewritten, warnings = insert_pipe_splits(module, "Net", [site], "net.py")
    assert warnings == ()
    assert "for attn, ff in self.layers[:2]:" in rewritten.code
    assert "for attn, ff in self.layers[2:-1]:" in rewritten.code
    stripped = remove_pipe_splits(rewritten, "Net", "net.py").code
    assert stripped == PAIRS


def test_cost_files_keep_container_lengths() -> None:
    data = cost_dict([1.0, 2.0])
    data["containers"] = {"layers": 7}
    costs = parse_costs(data)
    assert costs.containers == (("layers", 7),)
    assert costs_to_json(costs)["containers"] == {"layers": 7}


MODULE_DICT = textwrap.dedent(
    """\
    class Net:
        def forward(self, x):
            x = self.stem(x)
            for layer in self.layers.values():
                x = layer(x, self.freqs)
            for name, block in self.blocks.items():
                x = block(x)
            return self.head(x)
    """
)


def test_a_module_dicts_values_and_items_are_planned_per_layer() -> None:
    sizes = {"layers": 3, "blocks": 2}
    graph = analyse_model(parse_source(MODULE_DICT, "net.py"), "net.py", "Net", sizes)
    ids = [op.id for op in graph.ops]
    assert ids == ["stem", "layers.0", "layers.1", "layers.2", "blocks.0", "blocks.1", "head"]
    assert "self.layers.1" in graph.ops[2].calls
    assert "name" not in graph.ops[4].reads  # the key belongs to the iteration


def test_splitting_a_module_dict_loop_slices_it_as_a_list_and_joins_back() -> None:
    module = parse_source(MODULE_DICT, "net.py")
    sites = [
        SyncSite(statement=1, split_after=0, comment="1/2: test"),
        SyncSite(statement=2, split_after=0, comment="2/2: test"),
    ]
    rewritten, warnings = insert_pipe_splits(module, "Net", sites, "net.py")
    assert warnings == ()
    assert "for layer in list(self.layers.values())[:1]:" in rewritten.code
    assert "for layer in list(self.layers.values())[1:]:" in rewritten.code
    assert "for name, block in list(self.blocks.items())[1:]:" in rewritten.code
    assert remove_pipe_splits(rewritten, "Net", "net.py").code == MODULE_DICT


ZIPPED = textwrap.dedent(
    """\
    class Net:
        def forward(self, x):
            h = self.stem(x)
            scales = [1.0 / (1 + i) for i in range(len(self.layers))]
            for layer, norm, scale in zip(self.layers[:-1], self.norms[:-1], scales[:-1]):
                h = h + scale * layer(norm(h))
            return self.head(h)
    """
)


def test_a_zipped_loop_runs_each_containers_item_and_reads_the_local_sequence() -> None:
    graph = analyse_model(parse_source(ZIPPED, "net.py"), "net.py", "Net", {"layers": 4})
    loop_ops = [op for op in graph.ops if op.loop is not None]
    assert [op.id for op in loop_ops] == ["layers.0", "layers.1", "layers.2"]
    assert {"self.layers.1", "self.norms.1"} <= set(loop_ops[1].calls)
    assert loop_ops[1].loop is not None and loop_ops[1].loop.zipped == ("norms",)
    assert loop_ops[0].reads == ("scales", "h")  # not layer, norm, scale: the iteration's own
    # The comprehension's variable is its own, not a read of the forward.
    assert graph.ops[1].reads == () and graph.ops[1].writes == ("scales",)


def test_splitting_a_zipped_loop_slices_every_sequence_alike_and_joins_back() -> None:
    module = parse_source(ZIPPED, "net.py")
    site = SyncSite(statement=2, split_after=1, comment="1/1: test")
    rewritten, warnings = insert_pipe_splits(module, "Net", [site], "net.py")
    assert warnings == ()
    assert "in zip(self.layers[:2], self.norms[:2], scales[:2]):" in rewritten.code
    assert "in zip(self.layers[2:-1], self.norms[2:-1], scales[2:-1]):" in rewritten.code
    assert remove_pipe_splits(rewritten, "Net", "net.py").code == ZIPPED


ENUMERATED_ZIP = textwrap.dedent(
    """\
    class Net:
        def forward(self, x):
            h = self.stem(x)
            for i, (layer, norm) in enumerate(zip(self.layers, self.norms), start=1):
                h = h + layer(norm(h)) / i
            return self.head(h)
    """
)


def test_an_enumerated_zip_is_planned_per_layer_and_split_counting_on() -> None:
    graph = analyse_model(parse_source(ENUMERATED_ZIP, "net.py"), "net.py", "Net", {"layers": 4})
    loop_ops = [op for op in graph.ops if op.loop is not None]
    assert [op.id for op in loop_ops] == [f"layers.{index}" for index in range(4)]
    assert {"self.layers.2", "self.norms.2"} <= set(loop_ops[2].calls)
    module = parse_source(ENUMERATED_ZIP, "net.py")
    site = SyncSite(statement=1, split_after=1, comment="1/1: test")
    rewritten, warnings = insert_pipe_splits(module, "Net", [site], "net.py")
    assert warnings == ()
    assert "enumerate(zip(self.layers[:2], self.norms[:2]), start=1):" in rewritten.code
    assert "enumerate(zip(self.layers[2:], self.norms[2:]), start=3):" in rewritten.code
    assert remove_pipe_splits(rewritten, "Net", "net.py").code == ENUMERATED_ZIP
    counted_back = ENUMERATED_ZIP.replace("self.norms)", "self.norms[-4:])").replace(
        "self.layers,", "self.layers[-4:],"
    )
    graph = analyse_model(parse_source(counted_back, "net.py"), "net.py", "Net", {"layers": 4})
    assert all(op.loop is None for op in graph.ops)  # the index would not follow the bounds


def test_zips_that_cannot_be_sliced_alike_stay_regions() -> None:
    for iterable in (
        "zip(self.layers[1:], self.norms)",  # sliced differently
        "zip(self.layers, reversed(skips))",  # not a sequence to slice
        "zip(self.layers, self.layers)",  # one container twice
        "zip(skips, self.layers)",  # the layers are not first
    ):
        text = ZIPPED.replace("zip(self.layers[:-1], self.norms[:-1], scales[:-1])", iterable)
        text = text.replace("layer, norm, scale", "layer, norm")
        graph = analyse_model(parse_source(text, "net.py"), "net.py", "Net", {"layers": 4})
        assert all(op.loop is None for op in graph.ops), iterable
        assert len(graph.regions) == 1, iterable


def _enumerated(code: str, taken: tuple[str, ...] = ()) -> str | None:
    import libcst as cst

    from syncpass.frontend.analysis import enumerated_index_loop

    loop = cst.parse_statement(textwrap.dedent(code))
    assert isinstance(loop, cst.For)
    found = enumerated_index_loop(loop, taken)
    return None if found is None else cst.Module([found]).code


def test_a_loop_over_an_index_is_the_layer_loop_it_runs() -> None:
    found = _enumerated(
        """\
        for i in range(len(self.layers)):
            x = self.layers[i](x) * (i + 1)
        """,
        taken=("layer",),  # a local of the forward: the layer gets another name
    )
    assert found is not None
    assert "for i, layer_2 in enumerate(self.layers):" in found
    assert "x = layer_2(x) * (i + 1)" in found  # the index still counts
    bounded = _enumerated("for i in range(2, 5):\n    x = self.blocks[i](x)\n")
    assert bounded is not None and "enumerate(self.blocks[2:5], start=2)" in bounded
    read = _enumerated("for i in range(self.config.n):\n    x = self.h[i](x)\n")
    assert read is not None and "enumerate(self.h[:self.config.n])" in read


def test_a_loop_indexing_several_containers_runs_them_zipped() -> None:
    found = _enumerated(
        """\
        for i in range(len(self.blocks)):
            x = self.norms[i](self.blocks[i](x)) * self.gates[i](x) + self.norms[i](x)
        """,
        taken=("norm",),
    )
    assert found is not None
    assert (
        "for i, (layer, norm_2, gate) in enumerate(zip(self.blocks, self.norms, self.gates)):"
        in found
    )
    assert "x = norm_2(layer(x)) * gate(x) + norm_2(x)" in found
    assert "self.blocks[i] as layer, self.norms[i] as norm_2, self.gates[i] as gate" in found
    bounded = _enumerated("for i in range(1, 3):\n    x = self.h[i](self.ln[i](x))\n")
    assert bounded is not None
    assert "enumerate(zip(self.h[1:3], self.ln[1:3]), start=1)" in bounded
    graph = analyse_model(
        parse_source(
            "class Net:\n    def forward(self, x):\n"
            "        for i, (layer, ln) in enumerate(zip(self.h[1:3], self.ln[1:3]), start=1):\n"
            "            x = layer(ln(x))\n        return x\n",
            "net.py",
        ),
        "net.py",
        "Net",
        {"h": 4},
    )
    assert [op.id for op in graph.ops if op.loop is not None] == ["h.1", "h.2"]


def test_index_loops_that_are_no_layer_loop_stay_as_written() -> None:
    for code in (
        "for i in range(0, 6, 2):\n    x = self.layers[i](x)\n",  # a step
        "for i in range(len(self.layers)):\n    x = self.layers[i](x) + scales[i]\n",  # a local
        "for i in range(len(self.norms)):\n    x = self.layers[i](x)\n",  # another length
        "for i in range(4):\n    i = i + 1\n    x = self.layers[i](x)\n",  # rebound
        "for i in range(n):\n    x = self.layers[i](x)\n",  # a local bound
        "for i in range(4):\n    x = x * i\n",  # indexes nothing
    ):
        assert _enumerated(code) is None, code


def _while(code: str) -> str | None:
    import libcst as cst

    from syncpass.frontend.analysis import while_index_loop

    start, loop, *after = cst.parse_module(textwrap.dedent(code)).body
    assert isinstance(loop, cst.While)
    found = while_index_loop(start, loop, after)
    return None if found is None else cst.Module([found]).code


def test_a_while_stepping_an_index_is_the_layer_loop_it_runs() -> None:
    found = _while(
        """\
        i = 0
        while i < len(self.layers):
            x = self.layers[i](x) * i
            i += 1
        y = x
        """
    )
    assert found is not None
    assert "# syncpass: `while i < len(self.layers):` stepping i by 1 from 0" in found
    assert "for i, layer in enumerate(self.layers):" in found
    assert "x = layer(x) * i" in found and "i += 1" not in found
    later = _while("i = 2\nwhile i < self.depth:\n    x = self.h[i](x)\n    i += 1\n")
    assert later is not None and "enumerate(self.h[2:self.depth], start=2)" in later


def test_whiles_that_are_no_layer_loop_stay_as_written() -> None:
    for code in (
        "i = 0\nwhile i < 4:\n    x = self.layers[i](x)\n    i += 2\n",  # a step of 2
        "i = 0\nwhile i < 4:\n    i += 1\n    x = self.layers[i](x)\n",  # stepped first
        "i = 0\nwhile i < 4:\n    if x.sum() > 0:\n        break\n    x = self.layers[i](x)\n"
        "    i += 1\n",  # may end early
        "i = 0\nwhile i < 4:\n    x = self.layers[i](x)\n    i += 1\nprint(i)\n",  # read after
        "i = n\nwhile i < 4:\n    x = self.layers[i](x)\n    i += 1\n",  # a start not known
        "i = 0\nwhile i <= 4:\n    x = self.layers[i](x)\n    i += 1\n",  # another test
    ):
        assert _while(code) is None, code

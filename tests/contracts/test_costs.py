"""Cost files: the documented format reads back as written; bad input names its JSON path."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from costbuilder import cost_dict

from syncpass.contracts.config import SyncConfig, default_sync_config
from syncpass.contracts.costs import (
    costs_to_json,
    known_kind,
    load_costs,
    parse_costs,
    pytree_leaves,
    pytree_pieces,
    same_tensor_as,
)
from syncpass.core.errors import SyncpassError
from syncpass.settings.project import load_project_config

ISSUE_EXAMPLE = {
    "version": 1,
    "batch_size": 64,
    "training": True,
    "memory_multiplier": 4,
    "hardware": {"alpha_s": 2e-05, "beta_bytes_per_s": 5e9, "device_memory_bytes": 8e10},
    "config": {"strategy": "adaptive", "min_sync_interval": 1, "communication_cost_threshold": 0.1},
    "ops": [
        {
            "id": "layers.0",
            "compute_s": 0.001,
            "backward_s": 0.002,
            "param_bytes": 4096,
            "out_bytes": 1024,
        },
        {
            "id": "layers.1",
            "compute_s": 0.001,
            "backward_s": 0.002,
            "param_bytes": 4096,
            "out_bytes": 1024,
        },
    ],
    "cuts": [{"after": "layers.0", "live_bytes": 1024}],
}


def test_reads_the_documented_example() -> None:
    costs = parse_costs(ISSUE_EXAMPLE)
    assert [op.id for op in costs.ops] == ["layers.0", "layers.1"]
    assert costs.cut_comm_s(costs.cuts[0]) == pytest.approx(2 * (2e-05 + 1024 / 5e9))
    assert costs.op_compute_s(costs.ops[0]) == pytest.approx(0.003)
    assert costs.op_memory_bytes(costs.ops[0]) == 4 * 4096 + 1024


def test_round_trips(example_costs_path: Path) -> None:
    costs = load_costs(example_costs_path)
    assert parse_costs(json.loads(json.dumps(costs_to_json(costs)))) == costs


def test_defaults_come_from_the_shipped_config() -> None:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    del data["config"]
    assert parse_costs(data).config == default_sync_config() == SyncConfig()


def _broken(change: Any) -> dict[str, Any]:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "where", "what"),
    [
        (lambda d: d.pop("ops"), "$", "missing required field 'ops'"),
        (lambda d: d["ops"][1].pop("compute_s"), "$.ops[1]", "missing required field 'compute_s'"),
        (lambda d: d["ops"][0].update(compute_s=-1), "$.ops[0].compute_s", "must be >= 0"),
        (
            lambda d: d["ops"][0].update(compute_s="fast"),
            "$.ops[0].compute_s",
            "must be a finite number",
        ),
        (
            lambda d: d["cuts"][0].update(after="layers.9"),
            "$.cuts[0].after",
            "unknown op id 'layers.9'",
        ),
        (lambda d: d["cuts"][0].update(after="layers.1"), "$.cuts[0].after", "is the last op"),
        (lambda d: d["ops"][1].update(id="layers.0"), "$.ops[1].id", "already used by $.ops[0]"),
        (lambda d: d.update(version=2), "$.version", "unsupported version 2"),
        (lambda d: d.update(extra=1), "$", "unknown field 'extra'"),
        (
            lambda d: d["hardware"].update(beta_bytes_per_s=0),
            "$.hardware.beta_bytes_per_s",
            "must be > 0",
        ),
        (lambda d: d.update(batch_size=0), "$.batch_size", "whole number >= 1"),
        (lambda d: d.update(ops={}), "$.ops", "must be a JSON array"),
        (lambda d: d.update(ops=[]), "$.ops", "needs at least one op"),
        (lambda d: d["config"].update(strategy="greedy"), "$.config", "strategy must be one of"),
        (lambda d: d["config"].update(colour="red"), "$.config", "unknown setting 'colour'"),
        (lambda d: d["cuts"][0].update(live_bytes=-5), "$.cuts[0].live_bytes", "must be >= 0"),
        (
            lambda d: d["ops"][0].update(fixed_s=d["ops"][0]["compute_s"] * 2),
            "$.ops[0].fixed_s",
            "cannot exceed compute_s",
        ),
        (
            lambda d: d["hardware"].update(stage_overhead_s=-1),
            "$.hardware.stage_overhead_s",
            "must be >= 0",
        ),
        (
            lambda d: d.update(model_settings={"config.return_dict": [1]}),
            "$.model_settings.config.return_dict",
            "must be a number, a string, true, false or null",
        ),
        (lambda d: d.update(model_settings=[]), "$.model_settings", "must be an object"),
        (lambda d: d.update(speed_probe_s=0), "$.speed_probe_s", "must be > 0"),
        # Finite and bounded: sums and ratios of the figures must stay finite floats.
        (lambda d: d["ops"][0].update(compute_s=1e308), "$.ops[0].compute_s", "at most 1e+30"),
        (lambda d: d["ops"][0].update(compute_s=10**400), "$.ops[0].compute_s", "at most 1e+30"),
        (
            lambda d: d["hardware"].update(beta_bytes_per_s=5e-324),
            "$.hardware.beta_bytes_per_s",
            "at least 1e-30",
        ),
    ],
)
def test_bad_fields_are_named_by_json_path(change: Any, where: str, what: str) -> None:
    with pytest.raises(SyncpassError) as caught:
        parse_costs(_broken(change), "model.costs.json")
    assert caught.value.location == f"model.costs.json:{where}"
    assert what in caught.value.message


def test_out_of_order_cuts_are_refused() -> None:
    data = cost_dict([1, 1, 1], [0, 0])
    data["cuts"].reverse()
    with pytest.raises(SyncpassError, match="out of order"):
        parse_costs(data)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("{", "not valid JSON"),
        ("", "not valid JSON"),
        ("\udcff", "not a text file"),
        ('{"version": ' + "9" * 401 + "}", "an integer of 401 digits"),
        ('{"version": ' + "9" * 5001 + "}", "an integer of 5001 digits"),
        ('{"version": NaN}', "NaN, which is no number JSON allows"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
    ids=["truncated", "empty", "binary", "401_digits", "5001_digits", "nan", "deep"],
)
def test_unreadable_files(tmp_path: Path, text: str, what: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b"\xff\xfe\x00" if text == "\udcff" else text.encode())
    with pytest.raises(SyncpassError, match=what) as caught:
        load_costs(path)
    assert caught.value.location == str(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SyncpassError, match="no such cost file"):
        load_costs(tmp_path / "absent.json")


def test_config_file_reads_pyproject_table_and_names_unknown_keys(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "m"\n[tool.syncpass]\nmin_sync_interval = 3\n')
    assert load_project_config(pyproject).sync_over(SyncConfig()).min_sync_interval == 3
    bad = tmp_path / "sync.toml"
    bad.write_text("min_interval = 3\n")
    with pytest.raises(SyncpassError) as caught:
        load_project_config(bad).sync_over(SyncConfig())
    assert "unknown setting 'min_interval'" in str(caught.value)
    assert "min_sync_interval" in str(caught.value)  # lists the valid ones


def test_fixed_parts_and_runtime_overhead_round_trip_and_count_per_microbatch() -> None:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    data["training"] = True
    data["ops"][0].update(compute_s=4.0, fixed_s=1.0, backward_s=6.0, backward_fixed_s=2.0)
    data["hardware"].update(stage_overhead_s=0.25)
    costs = parse_costs(data)
    assert parse_costs(costs_to_json(costs)) == costs
    op = costs.ops[0]
    # Four micro-batches: each pays the fixed part, the rest is split between them.
    assert costs.op_compute_s(op, 4) == pytest.approx(4.0 + 3 * 1.0 + 6.0 + 3 * 2.0)
    assert costs.op_compute_s(op) == pytest.approx(10.0)
    cut = costs.cuts[0]
    hardware = costs.hardware
    per_step = 2 * (4 * hardware.alpha_s + cut.live_bytes / hardware.beta_bytes_per_s)
    assert costs.cut_comm_s(cut, 4) == pytest.approx(per_step)


def test_the_models_settings_round_trip() -> None:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    data["model_settings"] = {"transformer.config.use_cache": False, "config.return_dict": True}
    costs = parse_costs(data)
    assert costs.model_settings == (
        ("config.return_dict", True),
        ("transformer.config.use_cache", False),
    )
    assert parse_costs(json.loads(json.dumps(costs_to_json(costs)))) == costs
    assert "model_settings" not in costs_to_json(parse_costs(ISSUE_EXAMPLE))


def test_a_same_kind_names_the_value_and_the_piece_whose_tensor_it_is() -> None:
    assert same_tensor_as("same:encoder_outputs.last_hidden_state") == (
        "encoder_outputs",
        ".last_hidden_state",
    )
    assert same_tensor_as("same:x") == ("x", "")
    assert same_tensor_as('same:masks["full"][-1]') == ("masks", '["full"][-1]')
    assert known_kind("same:pair[1]")
    # Only a name, attributes and constant subscripts: pieces as kinds write them.
    for kind in ("same:x[i]", "same:x + y", "same:(x)[0]", "same: x", "same:x[1.5]", "same:"):
        assert same_tensor_as(kind) is None and not known_kind(kind), kind
    assert same_tensor_as("pytree:(T,)") is None


def test_a_pytree_kind_names_its_tensors_by_subscript_and_nothing_else_is_one() -> None:
    assert known_kind("pytree:(T, None, T)")
    assert pytree_pieces("pytree:(T, None, T)") == ("[0]", "[2]")
    assert pytree_pieces("pytree:[None, None]") == ()
    # Numbers are sent too (they may be sizes): I for an int, F for a float.
    kind = 'pytree:{0: T, "mask": (T, F), -1: [I, None]}'
    assert pytree_pieces(kind) == ("[0]", '["mask"][0]', '["mask"][1]', "[-1][0]")
    assert pytree_leaves(kind) == ("T", "T", "F", "I")
    assert not known_kind("pytree:(T, 3)")  # a number is never written in
    assert pytree_pieces("pytree:{'a\"b': T}") == ('["a\\"b"]',)
    # A dataclass by its fields (the class by its name in the model's module), read by
    # attribute; a set of constants.
    assert pytree_pieces("pytree:Output(logits=T, loss=None, extra=(T,))") == (
        ".logits",
        ".extra[0]",
    )
    assert pytree_pieces("pytree:{'layers': {1, 3}, 'none': set()}") == ()
    # An iterator of constants, as what it has left to give: the stage after makes it again.
    assert pytree_pieces("pytree:(iter([None]), T)") == ("[1]",)
    # Only literals, T and dataclasses by keyword: no other names, calls or sets.
    for kind in (
        "pytree:x",
        "pytree:{'a': print}",
        "pytree:f(1)",
        "pytree:a.b(x=T)",
        "pytree:T(x=T)",
        "pytree:{T}",
        "pytree:set([1])",
        "pytree:iter([T])",  # an iterator of tensors: its items would have to be sent
        "pytree:iter(x=[None])",
        "pytree:(T,",
    ):
        assert not known_kind(kind) and pytree_pieces(kind) is None, kind


def test_the_least_microbatch_round_trips_and_is_checked() -> None:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    assert "min_microbatch_size" not in costs_to_json(parse_costs(data))  # 1: not written
    assert parse_costs(data).min_microbatch_size == 1
    data.update(min_microbatch_size=2, min_microbatch_by="layer4.1.bn2 (resnet.py:96)")
    costs = parse_costs(data)
    assert (costs.min_microbatch_size, costs.min_microbatch_by) == (
        2,
        "layer4.1.bn2 (resnet.py:96)",
    )
    assert parse_costs(json.loads(json.dumps(costs_to_json(costs)))) == costs
    for size, by, field in [
        (0, None, "$.min_microbatch_size"),
        (1.5, "x", "$.min_microbatch_size"),
        (2, None, "$.min_microbatch_by"),
        (1, "bn", "$.min_microbatch_by"),
    ]:
        bad = copy.deepcopy(ISSUE_EXAMPLE)
        bad.update(min_microbatch_size=size, min_microbatch_by=by)
        with pytest.raises(SyncpassError, match=re.escape(field)):
            parse_costs(bad)
    with pytest.raises(ValueError, match="min_microbatch_by"):
        dataclasses.replace(costs, min_microbatch_by=None)


def test_the_speed_probe_round_trips_and_is_written_only_when_measured() -> None:
    costs = parse_costs(copy.deepcopy(ISSUE_EXAMPLE))
    assert costs.speed_probe_s is None and "speed_probe_s" not in costs_to_json(costs)
    probed = dataclasses.replace(costs, speed_probe_s=0.00125)
    assert costs_to_json(probed)["speed_probe_s"] == 0.00125
    assert parse_costs(json.loads(json.dumps(costs_to_json(probed)))) == probed
    with pytest.raises(ValueError, match="speed_probe_s"):
        dataclasses.replace(costs, speed_probe_s=-1.0)


def test_the_collectives_link_round_trips_and_is_checked() -> None:
    data = copy.deepcopy(ISSUE_EXAMPLE)
    data["hardware"].update(collective_alpha_s=1.4e-4, collective_beta_bytes_per_s=1.35e9)
    costs = parse_costs(data)
    assert (costs.hardware.collective_alpha_s, costs.hardware.collective_beta_bytes_per_s) == (
        1.4e-4,
        1.35e9,
    )
    assert parse_costs(json.loads(json.dumps(costs_to_json(costs)))) == costs
    data["hardware"]["collective_beta_bytes_per_s"] = 0
    with pytest.raises(SyncpassError, match=re.escape("$.hardware.collective_beta_bytes_per_s")):
        parse_costs(data)

"""`syncpass plan` as a user runs it: output, exit codes, errors, files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from costbuilder import cost_dict

from syncpass.cli import main
from syncpass.commands.run import _crowded
from syncpass.contracts.hardware import cpu_devices


def write_costs(tmp_path: Path, data: object, name: str = "m.costs.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_report_names_stages_sync_points_threshold_and_baselines(
    example_costs_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--costs", str(example_costs_path), "--stages", "4"]) == 0
    out = capsys.readouterr().out
    for expected in (
        "stage",
        "bottleneck",
        "threshold: 10% (met)",
        "predicted step (1f1b",
        "communication wait",
        "sync points:",
        "closes stage 0",
        "uniform",
        "parameters",
        "time",
        "syncpass speedup",
    ):
        assert expected in out


def test_json_plan_on_stdout(example_costs_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "plan",
                "--costs",
                str(example_costs_path),
                "--stages",
                "3",
                "--json",
                "--schedule",
                "gpipe",
                "--microbatches",
                "6",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["strategy"] == "adaptive"
    assert plan["threshold"] == {
        "requested": 0.1,
        "used": 0.1,
        "forced_by": None,
        "admitting": None,
        "admitting_step_s": None,
    }
    assert len(plan["sync_points"]) == 2 and len(plan["stages"]) == 3
    assert plan["schedule"] == "gpipe" and plan["microbatches"] == 6
    assert all(set(p) >= {"after", "comm_s", "live_bytes", "reason"} for p in plan["sync_points"])
    assert all(set(s) >= {"ops", "compute_s", "time_s", "memory_bytes"} for s in plan["stages"])
    assert plan["bottleneck_s"] == max(s["time_s"] for s in plan["stages"])


def test_flags_override_the_cost_file_and_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = write_costs(tmp_path, cost_dict([1] * 8, [0] * 7))
    config = tmp_path / "sync.toml"
    config.write_text("min_sync_interval = 3\nstrategy = 'uniform'\n")
    assert (
        main(["plan", "--costs", str(costs), "--stages", "2", "--config", str(config), "--json"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert (plan["strategy"], plan["min_sync_interval"]) == ("uniform", 3)
    assert (
        main(
            [
                "plan",
                "--costs",
                str(costs),
                "--stages",
                "2",
                "--config",
                str(config),
                "--strategy",
                "fixed",
                "--min-sync-interval",
                "2",
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert (plan["strategy"], plan["min_sync_interval"]) == ("fixed", 2)


def test_stages_auto(example_costs_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["plan", "--costs", str(example_costs_path), "--stages", "auto", "--max-stages", "5"])
        == 0
    )
    assert "--stages auto:" in capsys.readouterr().out


def test_manual_cuts_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    costs = write_costs(tmp_path, cost_dict([1] * 4, [0] * 3))
    assert (
        main(["plan", "--costs", str(costs), "--strategy", "manual", "--cuts", "op0,op2", "--json"])
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert [p["after"] for p in plan["sync_points"]] == ["op0", "op2"]


@pytest.mark.parametrize(
    ("data", "args", "message"),
    [
        ("{not json", ["--stages", "2"], "m.costs.json: not valid JSON"),
        (
            cost_dict([1, -1], [0]),
            ["--stages", "2"],
            "m.costs.json:$.ops[1].compute_s: must be >= 0",
        ),
        (
            {**cost_dict([1, 1], [0]), "cuts": [{"after": "nope", "live_bytes": 1}]},
            ["--stages", "2"],
            "m.costs.json:$.cuts[0].after: unknown op id 'nope'",
        ),
        (cost_dict([1, 1], [0]), ["--stages", "3"], "3 stages need at least 3 ops"),
        (
            cost_dict([1, 1, 1, 1], [9, 9, 9]),
            ["--stages", "2", "--strategy", "fixed"],
            "communication_cost_threshold, strategy fixed",
        ),
        (cost_dict([1, 1], [0]), ["--stages", "2", "--cuts", "op7"], "no op has that id"),
    ],
)
def test_bad_input_exits_2_naming_the_file_and_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: object, args: list[str], message: str
) -> None:
    path = tmp_path / "m.costs.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    output = tmp_path / "plan.json"
    assert main(["plan", "--costs", str(path), *args, "-o", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("syncpass: error: ")
    assert message.replace("m.costs.json", str(path)) in captured.err or message in captured.err
    assert not output.exists()  # nothing half-written


def test_output_file_is_the_json_plan(example_costs_path: Path, tmp_path: Path) -> None:
    output = tmp_path / "plan.json"
    assert (
        main(["plan", "--costs", str(example_costs_path), "--stages", "2", "-o", str(output)]) == 0
    )
    assert json.loads(output.read_text())["num_stages"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary files left


def test_usage_errors_exit_2(example_costs_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["plan", "--costs", str(example_costs_path), "--stages", "0"])
    assert caught.value.code == 2


def test_plan_never_imports_torch_or_jax(example_costs_path: Path) -> None:
    probe = (
        "import sys\n"
        "from syncpass.cli import main\n"
        f"status = main(['plan', '--costs', {str(example_costs_path)!r}, '--stages', '4'])\n"
        "heavy = sorted(m for m in ('torch', 'jax', 'libcst') if m in sys.modules)\n"
        "print('heavy:', heavy, file=sys.stderr)\n"
        "sys.exit(status if not heavy else 3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stderr


def test_console_script_runs(example_costs_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "syncpass",
            "plan",
            "--costs",
            str(example_costs_path),
            "--stages",
            "2",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "sync points:" in result.stdout


def test_plan_output_dash_is_stdout(
    example_costs_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--costs", str(example_costs_path), "--stages", "2", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["num_stages"] == 2
    assert list(tmp_path.iterdir()) == []


def test_batch_size_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = cost_dict([1.0] * 9, [1.0] * 8, alpha=0.2, beta=64.0)
    costs = write_costs(tmp_path, data)
    args = [
        "plan",
        "--costs",
        str(costs),
        "--stages",
        "3",
        "--threshold",
        "inf",
        "--microbatches",
        "1",
    ]
    assert main([*args, "--batch-size", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 64
    assert main([*args, "--sweep-batch", "1,4,16,64"]) == 0
    out = capsys.readouterr().out
    assert "how the plan moves with the batch size" in out and "each plan is optimal over:" in out
    assert main([*args, "--sweep-batch", "1,64", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [point["batch_size"] for point in document["sweep"]] == [1, 64]
    assert document["ranges"][0]["low"] == 1 and document["ranges"][-1]["high"] == 64
    assert main([*args, "--sweep-batch", "1,x"]) == 2


def test_hardware_flag_is_reported(
    example_costs_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "plan",
                "--costs",
                str(example_costs_path),
                "--stages",
                "2",
                "--hardware",
                "pcie4-gpus",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "hardware GPUs over PCIe 4.0 x16, 24 GB" in out
    assert "note: re-targeted from" in out and "compute x" in out


def test_manual_with_stages_auto_and_baselines_that_cannot_follow_the_pins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = cost_dict([1] * 4, [0] * 3, pinned=[0], config={"min_sync_interval": 2})
    costs = write_costs(tmp_path, data)
    # The pin breaks min_sync_interval: the manual plan says so, the baselines drop out.
    assert main(["plan", "--costs", str(costs), "--strategy", "manual", "--stages", "auto"]) == 0
    out = capsys.readouterr().out
    assert "violates: stage 0 holds 1 op(s), fewer than min_sync_interval 2" in out


def test_unlimited_threshold_round_trips_through_json(tmp_path: Path) -> None:
    from syncpass.contracts.costs import costs_to_json, parse_costs

    data = cost_dict([1, 1], [0], config={"communication_cost_threshold": None})
    costs = parse_costs(data)
    assert costs.config.communication_cost_threshold == float("inf")
    text = json.dumps(costs_to_json(costs), allow_nan=False)  # valid JSON, no Infinity
    assert parse_costs(json.loads(text)) == costs


def test_run_warns_when_the_stages_outnumber_the_cores() -> None:
    cores = cpu_devices()
    assert _crowded(cores, 1, "cpu") is None
    warning = _crowded(cores + 1, 1, "auto")
    assert warning is not None and f"on {cores} CPU core(s)" in warning
    assert _crowded(cores, 2, "cpu") is not None or cores == 1  # two threads a stage
    assert _crowded(10 * cores, 1, "cuda") is None  # GPUs are counted by the GPU run

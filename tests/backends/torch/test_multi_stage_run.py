"""Several stages per rank on real gloo process groups: a model rewritten to four stages runs
on two ranks (``--stages 2 --stages-per-device 2``) under each of torch's multi-stage
schedules, in both torch forms, and matches the unsplit model's loss and every gradient; each
rank runs, action for action, the order syncpass plans with (``schedule_order``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.torch.schedules import schedule_order
from syncpass.cli import main
from syncpass.contracts.config import MULTI_STAGE_SCHEDULES, SCHEDULES, stage_devices
from syncpass.runtime.contracts import RunRequest, RunResult, StageFigures
from syncpass.runtime.render import dumps_report, render_run

MODEL = REPO / "examples" / "transformer_lm.py"
TIED = REPO / "tests" / "data" / "masked_gpt.py"  # its head is tied to its embedding
# Few micro-batches and one timed step: the runs check what runs, not how fast.
QUICK = "--microbatches 4 --steps 1"
ZERO_BUBBLE = ("interleaved-zb", "zbv", "dualpipev")


def rewritten(
    folder: Path,
    stages: int,
    backend: str,
    capsys: pytest.CaptureFixture[str],
    model: Path = MODEL,
    cuts: str | None = None,
) -> Path:
    """``model`` rewritten to ``stages`` stages in ``backend``'s form, from static costs
    (``--input-shape``: nothing runs) or, for the tied model, measured ones; with ``cuts``,
    at those sync points (``--strategy manual``), whatever the timings say."""
    source = folder / model.name
    if not source.exists():
        shutil.copy(model, source)
    out = folder / f"{model.stem}_{backend}_{stages}{'' if cuts is None else '_' + cuts}.py"
    costs = ["--input-shape", "8x32"] if model == MODEL else ["--example", f"{source}:example"]
    argv = ["rewrite", str(source), *costs, "--stages", str(stages), "--backend", backend]
    if cuts is not None:
        argv += ["--strategy", "manual", "--cuts", cuts]
    status = main([*argv, "-o", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return out


def run_report(
    path: Path, options: str, capsys: pytest.CaptureFixture[str], backend: str = "torch_stages"
) -> dict:  # type: ignore[type-arg]
    report = path.with_name(f"{path.stem}_report.json")
    argv = ["run", str(path), *options.split(), "--backend", backend, "--json-report", str(report)]
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 0, captured.err + captured.out
    document: dict = json.loads(report.read_text())  # type: ignore[type-arg]
    document["text"] = captured.out
    return document


def assert_verified(document: dict) -> None:  # type: ignore[type-arg]
    verify = document["verify"]
    assert verify["ok"] is True and verify["mismatches"] == 0
    assert verify["parameters_compared"] == verify["model_parameters"]
    assert len(verify["losses"]) == document["microbatches"]


def assert_placed(document: dict, schedule: str) -> None:  # type: ignore[type-arg]
    """Each rank reports the stages the schedule places on it; every stage ran once."""
    placement = stage_devices(schedule, 2, 2)
    assert document["stages"] == 4 and document["ranks"] == 2
    for entry in document["stage_reports"]:
        assert entry["stages"] == [s for s in range(4) if placement[s] == entry["rank"]]
    # Every gradient is checked under the stage that holds it, on the rank the schedule says.
    held = {entry["rank"]: set(entry["stages"]) for entry in document["stage_reports"]}
    assert {p["stage"] for p in document["verify"]["parameters"]} == {0, 1, 2, 3}
    assert set().union(*held.values()) == {0, 1, 2, 3}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multi_stage")


def test_interleaved_1f1b_two_stages_per_rank_verifies(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(folder, 4, "torch_stages", capsys)
    options = f"--stages 2 --stages-per-device 2 --schedule interleaved-1f1b {QUICK} --verify"
    document = run_report(path, options, capsys)
    assert_verified(document)
    assert_placed(document, "interleaved-1f1b")
    assert document["order_notes"] == []
    # The report's rows are ranks, each naming the stages it holds.
    assert "4 stage(s) on 2 rank(s), 2 per rank" in document["text"]
    assert "rank  stages" in document["text"]
    assert "\n0     0, 2 " in document["text"] and "\n1     1, 3 " in document["text"]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", MULTI_STAGE_SCHEDULES)
@pytest.mark.parametrize("backend", ["torch_stages", "torch"])
def test_every_multi_stage_schedule_verifies_in_both_forms(
    folder: Path, capsys: pytest.CaptureFixture[str], schedule: str, backend: str
) -> None:
    path = rewritten(folder, 4, backend, capsys)
    options = f"--stages 2 --stages-per-device 2 --schedule {schedule} {QUICK} --verify"
    document = run_report(path, options, capsys, backend)
    assert_verified(document)
    assert_placed(document, schedule)
    assert document["order_notes"] == []
    # The loss is computed where the last stage is: rank 0 under a V, rank 1 otherwise.
    last_rank = stage_devices(schedule, 2, 2)[3]
    assert document["stage_reports"][last_rank]["stages"][-1] == 3


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "interleaved-zb"])
def test_a_weight_tied_across_stages_of_one_rank_gets_its_gradient_once(
    folder: Path, capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    # Under zbv rank 0 holds stages 0 and 3, the embedding and the head tied to it: each stage
    # must scale and sum its own copy, not the one parameter twice.
    path = rewritten(folder, 4, "torch_stages", capsys, TIED, "blocks.0,blocks.2,blocks.4")
    options = f"--stages 2 --stages-per-device 2 --schedule {schedule} {QUICK} --verify"
    document = run_report(path, options, capsys)
    assert_verified(document)
    tied = [p for p in document["verify"]["parameters"] if "several stages" in p["note"]]
    assert sorted((p["name"], p["stage"]) for p in tied) == [("wte.weight", 0), ("wte.weight", 3)]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "1f1b"])
def test_a_later_stage_that_receives_only_token_ids_gets_its_weight_gradients(
    folder: Path, capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    # Stage 0 sends the ids and the length on; stage 1 embeds them. Nothing it receives
    # carries a gradient, and torch's split backward (I, then W) finds a stage's weights
    # through its inputs: stage 1 runs its whole backward at I instead. 1f1b runs the
    # same file with whole backwards.
    path = rewritten(folder, 4, "torch_stages", capsys, TIED, "stmt@L61,blocks.2,blocks.4")
    assert 'sends = ("idx", "seq")' in path.read_text()
    per_device = 2 if schedule == "zbv" else 1
    options = f"--stages {4 // per_device} --stages-per-device {per_device}"
    document = run_report(path, f"{options} --schedule {schedule} {QUICK} --verify", capsys)
    assert_verified(document)
    stage_1 = [p for p in document["verify"]["parameters"] if p["stage"] == 1]
    assert {p["name"].split(".")[0] for p in stage_1} == {"blocks", "wte"}


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_rank_runs_the_order_syncpass_plans_with(
    folder: Path, capsys: pytest.CaptureFixture[str], schedule: str
) -> None:
    # gpipe and 1f1b at one stage per rank: their order is syncpass's own (stage_order), and
    # this checks it against what torch's ScheduleGPipe and Schedule1F1B run.
    per_device = 1 if schedule in ("gpipe", "1f1b") else 2
    path = rewritten(folder, 2 * per_device, "torch_stages", capsys)
    options = f"--stages 2 --stages-per-device {per_device} --schedule {schedule} {QUICK}"
    document = run_report(path, options, capsys)
    order = schedule_order(schedule, 2, per_device, document["microbatches"])
    for entry in document["stage_reports"]:
        ran = [tuple(action) for action in entry["actions"]]
        assert ran == [tuple(action) for action in order.actions[entry["rank"]]], entry["rank"]
    # The zero-bubble schedules split backwards into the inputs' and the weights' gradients.
    kinds = {action[0] for entry in document["stage_reports"] for action in entry["actions"]}
    assert ("W" in kinds) == (schedule in ZERO_BUBBLE)
    assert document["order_notes"] == []


@pytest.mark.slow
def test_a_file_with_another_stage_count_is_refused_with_its_line(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(folder, 4, "torch_stages", capsys)
    argv = ["run", str(path), "--stages", "3", "--stages-per-device", "2"]
    status = main([*argv, "--schedule", "interleaved-1f1b", "--microbatches", "4"])
    err = capsys.readouterr().err
    assert status == 2
    assert "the file has 4 stage classes" in err
    assert "--stages 3 x --stages-per-device 2 asks for 6" in err
    assert "run it with --stages 2" in err
    assert f"{path}:" in err  # the last stage class's line
    assert err.count("syncpass: error:") == 1 and "(the same on all 3 ranks)" in err


@pytest.mark.slow
def test_a_traced_file_with_another_stage_count_is_refused(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(folder, 4, "torch", capsys)
    argv = ["run", str(path), "--backend", "torch", "--stages", "3", "--stages-per-device", "2"]
    status = main([*argv, "--schedule", "looped-bfs", "--microbatches", "4"])
    err = capsys.readouterr().err
    assert status == 2
    assert "3 pipe_split() sync point(s), which make 4 stage(s)" in err
    assert "asks for 6, which 5 pipe_split() calls make" in err


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ("--schedule zbv --stages-per-device 3", "places exactly two stages on each device"),
        ("--schedule dualpipev --stages-per-device 1", "--stages-per-device is 1: use 2"),
        ("--schedule 1f1b --stages-per-device 2", "--schedule 1f1b holds one stage per device"),
        ("--schedule gpipe --stages-per-device 2", "holds several (interleaved-1f1b"),
        (
            "--schedule dualpipev --stages-per-device 2 --microbatches 2",
            "--microbatches 2: torch's ScheduleDualPipeV refuses 2 device(s) x 2 stage(s) with "
            "2 micro-batch(es)",
        ),
        (
            "--schedule interleaved-1f1b --stages-per-device 2 --microbatches 5",
            "multiple of the number of rounds",
        ),
    ],
)
def test_what_a_schedule_cannot_hold_is_refused_before_any_process_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: str, said: str
) -> None:
    # A file that fails when imported: the flags are refused before it is loaded.
    path = tmp_path / "model.py"
    path.write_text("raise SystemExit('imported')\n")
    status = main(["run", str(path), "--stages", "2", *options.split()])
    err = capsys.readouterr().err
    assert status == 2, err
    assert said in err
    assert err.count("syncpass: error:") == 1 and "rank 0:" not in err and "imported" not in err


def test_the_report_shows_each_rank_with_the_stages_it_holds() -> None:
    request = RunRequest(
        file="m.py", example="m.py:example", stages=2, schedule="zbv", stages_per_device=2
    )
    assert request.total_stages == 4 and request.placement == (0, 1, 1, 0)
    assert request.stages_of(0) == (0, 3)
    ranks = (
        StageFigures(0, 0, 6, 2, (0.2,) * 3, (0.1,) * 3, held=(0, 3), actions=(("F", 0, 0),)),
        StageFigures(1, 1, 8, 2, (0.2,) * 3, (0.15,) * 3, held=(1, 2)),
    )
    note = "rank 1 ran 0 action(s), 24 planned; action 0 is nothing, planned F0 of stage 1"
    result = RunResult(request, 8, 4, "gloo", "cpu", ranks, 4, order_notes=(note,))
    assert result.stage_count == 4
    lines = render_run(result).splitlines()
    assert "4 stage(s) on 2 rank(s), 2 per rank, zbv" in lines[0]
    assert lines[2].split()[:3] == ["rank", "stages", "params"]
    assert lines[3].split()[:3] == ["0", "0,", "3"] and lines[4].split()[:3] == ["1", "1,", "2"]
    assert "most compute: rank 1, stages 1, 2 (150 ms)" in lines
    assert f"note: not the order syncpass plans with: {note}" in lines
    document = json.loads(dumps_report(result))
    assert (document["stages"], document["ranks"], document["stages_per_device"]) == (4, 2, 2)
    assert [entry["stages"] for entry in document["stage_reports"]] == [[0, 3], [1, 2]]
    assert document["stage_reports"][0]["actions"] == [["F", 0, 0]]
    assert document["order_notes"] == [note]


@pytest.mark.slow
def test_the_timeline_covers_every_stage_of_a_rank_and_the_weight_gradients(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewritten(folder, 4, "torch_stages", capsys)
    timeline = folder / "timeline"
    options = f"--stages 2 --stages-per-device 2 --schedule interleaved-zb {QUICK}"
    run_report(path, f"{options} --timeline {timeline}", capsys)
    ranks = json.loads(timeline.with_suffix(".json").read_text())["ranks"]
    # Two stages a rank, four micro-batches: 8 forwards; each backward split into I and W.
    assert [(r["forward_calls"], r["backward_calls"]) for r in ranks] == [(8, 16), (8, 16)]
    assert timeline.with_suffix(".png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_user_profiles_plans_rewrites_and_runs_interleaved_with_its_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The whole flow a user follows: profile, rewrite for 2 ranks x 2 stages under
    # interleaved 1F1B, run that with --verify and the prediction beside the measurement.
    source = tmp_path / MODEL.name
    shutil.copy(MODEL, source)
    costs = tmp_path / "costs.json"
    assert main(["profile", str(source), "-o", str(costs), "--repeats", "2"]) == 0
    out = tmp_path / "lm_sync.py"
    plan_flags = ["--stages", "2", "--schedule", "interleaved-1f1b", "--stages-per-device", "2"]
    status = main(["rewrite", str(source), "--costs", str(costs), *plan_flags, "-o", str(out)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "4 stage(s)" in captured.err
    assert out.read_text().count("# syncpass sync ") == 3
    options = f"--stages 2 --stages-per-device 2 --schedule interleaved-1f1b {QUICK} --verify"
    document = run_report(out, f"{options} --costs {costs}", capsys)
    assert_verified(document)
    assert "rank 0 (stages 0, 2): predicted busy" in document["text"]
    prediction = document["prediction"]
    assert prediction["predicted_step_s"] > 0
    assert [stage["device"] for stage in prediction["stages"]] == [0, 1, 0, 1]

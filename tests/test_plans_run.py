"""Every plan `rewrite` writes runs: each bundled torch example and each torch test model,
at 2, 3 and 4 stages in the eager form and at 2 and 4 in the pipe_split() form, is
profiled once, rewritten, checked with torch's own tracer as `rewrite --example` checks it
(the traced form), and run split over gloo with `--verify`. A plan may be refused (exit 2, naming file:line); one that is written must run
and match the unsplit model: no pipelining error reaches `run`. Every run is also given
the cost file (`run --costs`): the cost model's prediction for the very sync points the
file carries is reported beside the measured step."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from syncpass.backends.registry import load_backend
from syncpass.backends.spec import Confirmation
from syncpass.cli import main
from syncpass.contracts.costs import load_costs
from syncpass.core.errors import SyncpassError
from syncpass.plan.planfile import parse_plan

MODELS = [
    *(
        REPO / "examples" / f"{name}.py"
        for name in ("resnet", "transformer_lm", "unet", "uneven_mlp")
    ),
    *(
        REPO / "tests" / "data" / f"{name}.py"
        for name in (
            "aliased_skip",
            "encoder_decoder",
            "index_loops",
            "late_input",
            "layerdrop_decoder",
            "lookup_output",
            "mask_mapping",
            "masked_gpt",
            "module_dict_layers",
            "named_sequential",
            "nested_encoder",
            "nested_sequential",
            "pair_layers",
            "pytree_outputs",
            "rope_cache_gpt",
            "rotary_mapping",
            "stage_named",
            "submodule_method",
            "tied_object_head",
            "typed_sends",
            "zipped_layers",
        )
    ),
]
LOCATED = re.compile(r"syncpass: error: \S+\.py(:\d+)?: ")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch_stages", "torch"])
@pytest.mark.parametrize("model", MODELS, ids=lambda path: path.stem)
def test_every_plan_rewrite_writes_runs_and_verifies(
    model: Path, backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / model.name
    shutil.copy(model, source)
    example = f"{source}:example"
    costs = tmp_path / "costs.json"
    argv = ["profile", str(source), "--example", example, "--backend", backend]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "-o", str(costs)]) == 0
    capsys.readouterr()
    measured = load_costs(costs)
    assert [op.id for op in measured.ops]  # the graph's ids, measured
    assert measured.hardware.flops_per_s and measured.hardware.flops_per_s > 0  # for --hardware
    untraceable = any(
        "cannot trace this model" in note for note in json.loads(costs.read_text()).get("notes", [])
    )
    spec = load_backend(backend)
    written = 0
    # The eager form at 2, 3 and 4 stages; pipe_split() at 2 and 4 (a first, a middle and
    # a last stage are in both; its three-stage runs added nothing but their time).
    for stages in (2, 3, 4) if backend == "torch_stages" else (2, 4):
        out = tmp_path / f"sync_{stages}.py"
        report = tmp_path / f"plan_{stages}.json"
        argv = ["rewrite", str(source), "--costs", str(costs), "--stages", str(stages)]
        status = main([*argv, "--backend", backend, "-o", str(out), "--report", str(report)])
        err = capsys.readouterr().err
        if status != 0:
            assert status == 2 and LOCATED.search(err), err
            continue
        plan = parse_plan(json.loads(report.read_text())["plan"])
        assert len(plan.stages) == stages
        written_text = out.read_text()
        assert written_text.count("# syncpass sync ") == stages - 1
        assert written_text.count("pipe_split()  # syncpass sync") == (
            stages - 1 if backend == "torch" else 0
        )
        if spec.confirm is not None:
            # What `rewrite --example` does before writing.
            document = json.loads(report.read_text())
            where = {op["id"]: op["location"] for op in document["analysis"]["ops"]}
            points = tuple((p.after, where[p.after]) for p in plan.sync_points)
            confirmation = Confirmation(written_text, str(source), example, stages, points)
            try:
                spec.confirm(confirmation)
            except SyncpassError as error:
                assert error.location, error  # names file:line
                continue
            assert not untraceable  # a model torch cannot trace is never confirmed
        argv = ["run", str(out), "--stages", str(stages), "--backend", backend, "--verify"]
        run_report = tmp_path / f"run_{stages}.json"
        argv += ["--steps", "1", "--json-report", str(run_report)]
        status = main([*argv, "--costs", str(costs)])
        err = capsys.readouterr().err
        assert status == 0, f"{stages} stages: {err}"
        figures = json.loads(run_report.read_text())
        assert figures["verify"]["ok"] is True
        # The cost model's prediction for the very sync points the file carries.
        prediction = figures["prediction"]
        assert prediction["sync_points"] == [point.after for point in plan.sync_points]
        assert prediction["predicted_step_s"] > 0 and prediction["measured_step_s"] > 0
        written += 1
    # The eager form plans every one of these models at every stage count asked.
    if backend == "torch_stages":
        assert written == 3

"""A backend as one frozen spec of hooks: what the commands need of torch, JAX or a plugin.

Every command takes a :class:`Backend` from :func:`syncpass.backends.registry.load_backend`
and calls its hooks; none asks a backend's name. The rewrite hooks are
required; a backend without a profiler, a static estimator or a runtime
leaves that hook ``None``, and a command that needs it says so
(:meth:`Backend.need`) with exit status 2.

The rewrite hooks split the pass so that the driver (:mod:`syncpass.rewrite.driver`)
is the same for every backend:

* ``analyse(text, path, known, name)``: parse ``text``, take out the sync points
  an earlier run wrote, find the model (``name``, else the one ``known`` names,
  else the file's one model) and build its op graph, loops sized by the op ids
  of the cost file or plan (:class:`KnownOps`); a :class:`ModelSource`;
* ``insert(source, sites, path)``: the module with one sync statement per
  :class:`~syncpass.transformers.torch_pipeline.SyncSite`, and warnings for
  sites it could not place;
* ``remove(module, source, path)``: the code of ``module`` without syncpass's sync
  statements (the driver checks that it gives back ``source.base``);
* ``strip(text, path, name)``: ``text`` without syncpass's sync statements.

``lint(text, path)`` is what ``syncpass check`` reports about a model file
(the torch backend's finds implicit host-device synchronisation).

Importing this module imports neither torch nor jax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from syncpass.core.errors import SyncpassError
from syncpass.plan.schedule import OrderSource
from syncpass.plan.tensor_plan import TensorPlan
from syncpass.rewrite.source import KnownOps, ModelSource

if TYPE_CHECKING:
    import libcst as cst

    from syncpass.contracts.costs import Costs
    from syncpass.frontend.findings import Finding
    from syncpass.runtime.contracts import RunRequest, RunResult, TensorRunRequest, TensorRunResult
    from syncpass.runtime.prediction import RunPrediction, TensorRunPrediction
    from syncpass.transformers.common import CheckpointSite, SyncSite


@dataclass(frozen=True)
class MeasureRequest:
    """Profile the model of ``file`` (source ``text``) on the example ``example``.

    ``threads`` and ``depth`` are the torch profiler's (CPU threads; 2 plans the
    children of ``nn.Sequential`` calls); a backend that cannot honour a value
    other than the default refuses it. ``meta`` names a hardware profile: the
    model is built on torch's meta device and its FLOPs and bytes counted
    (nothing allocated, nothing timed), compute at the profile's FLOP/s.
    """

    file: Path
    text: str
    example: str
    model: str | None = None
    repeats: int = 5
    warmup: int = 2
    threads: int = 1
    depth: int = 1
    meta: str | None = None  # a hardware profile: count on torch's meta device, time nothing


@dataclass(frozen=True)
class EstimateRequest:
    """Estimate the costs of the model in ``text`` from the source alone, for these inputs."""

    file: str
    text: str
    input_shape: str
    model: str | None = None
    input_dtype: str | None = None
    hardware: str | None = None
    depth: int = 1


@dataclass(frozen=True)
class TensorRewriteRequest:
    """Write a tensor-parallel plan for ``tp`` ranks into the model of ``file`` (source
    ``text``), planned on a recording of the example ``example``, for ``hardware``
    (a profile name or file; ``None``: the local CPU's), in ``style``: ``eager`` (the
    conjugate functions in the forwards) or ``dtensor`` (torch's parallel styles for
    ``parallelize_module``). ``placement`` ``megatron`` writes Megatron-LM's hand
    placement instead of the optimiser's (within what the rewrite can write)."""

    file: str
    text: str
    example: str
    tp: int
    hardware: str | None = None
    timeout_s: float = 300.0
    style: str = "eager"
    placement: str = "syncpass"


@dataclass(frozen=True)
class TensorRewriteResult:
    """The rewritten source, the plan it carries, why ops stay replicated (``notes``) and
    the collective lines it wrote."""

    rewritten: str
    plan: TensorPlan
    notes: tuple[str, ...]
    lines: int


@dataclass(frozen=True)
class Confirmation:
    """A rewritten model to split with the engine before it is written: ``text`` is the
    rewritten source of ``path``, ``example`` the user's ``PATH.py:FUNC``, ``stages`` the
    plan's stage count, ``sync_points`` each planned sync point's op id and ``file:line``
    in the input."""

    text: str
    path: str
    example: str
    stages: int
    sync_points: tuple[tuple[str, str], ...]


Analyse = Callable[[str, str, KnownOps, "str | None"], ModelSource]
Insert = Callable[[ModelSource, Sequence["SyncSite"], str], "tuple[cst.Module, tuple[str, ...]]"]
InsertCheckpointed = Callable[
    [ModelSource, Sequence["SyncSite"], Sequence["CheckpointSite"], str],
    "tuple[cst.Module, tuple[str, ...]]",
]
Remove = Callable[["cst.Module", ModelSource, str], str]
Strip = Callable[[str, str, "str | None"], str]
Measure = Callable[[MeasureRequest], "Costs"]
Estimate = Callable[[EstimateRequest], "Costs"]
Run = Callable[["RunRequest"], "RunResult"]
Lint = Callable[[str, str], "Sequence[Finding]"]
Predict = Callable[[str, str, "Costs", "RunResult"], "RunPrediction"]
LoadExample = Callable[[str], Any]
#: Raises :class:`SyncpassError` when the engine cannot split the rewritten model as planned,
#: :class:`SplitRefused` when one sync point is the reason.
Confirm = Callable[[Confirmation], None]
TensorRewrite = Callable[[TensorRewriteRequest], TensorRewriteResult]
TensorRun = Callable[["TensorRunRequest"], "TensorRunResult"]
TensorPredict = Callable[["TensorRunResult", "Costs"], "TensorRunPrediction"]


@dataclass(frozen=True)
class Backend:
    """Every per-backend hook; one instance per backend (``BACKEND`` in its folder's ``backend.py``).

    ``schedules`` are the pipeline schedules its ``run`` hook runs, its default first;
    ``load_example(spec)`` loads the user's example factory (``PATH.py:FUNC``) as
    the backend's profiler and runtime do, running the user's code.
    ``predict(text, path, costs, result)`` plans the sync points a rewritten file
    carries on a cost file, beside a run of it (``syncpass run --costs``).
    ``carries_values`` is true when the stages it writes pass any value on to any
    later stage; plans for a backend without it keep every value within the next
    stage (the rule of torch's tracer). ``refused_kinds`` are the kinds of value
    that are no tensor (:data:`syncpass.contracts.costs.VALUE_KINDS`) its stages
    cannot send: plans put no sync point where one would cross.
    ``schedule_order`` gives the order each rank runs a schedule's actions in, as the
    engine runs it (:data:`~syncpass.plan.schedule.OrderSource`); plans for a backend
    without it know only ``gpipe`` and ``1f1b``.
    ``confirm(confirmation)`` splits a rewritten model with the engine's own splitter
    on the example, raising a :class:`SyncpassError` when the split is not the plan
    (``rewrite`` then writes nothing).
    """

    name: str
    description: str
    analyse: Analyse
    insert: Insert
    remove: Remove
    strip: Strip
    measure: Measure | None = None
    estimate: Estimate | None = None
    run: Run | None = None
    lint: Lint | None = None
    predict: Predict | None = None
    load_example: LoadExample | None = None
    confirm: Confirm | None = None
    schedules: tuple[str, ...] = ()
    schedule_order: OrderSource | None = None
    carries_values: bool = False
    refused_kinds: tuple[str, ...] = ()
    #: ``rewrite --strategy tensor``: a tensor-parallel plan written into the source.
    tensor_rewrite: TensorRewrite | None = None
    #: ``run --tp N``: the rewritten model on N ranks, checked against the unsplit one.
    tensor_run: TensorRun | None = None
    #: ``run --tp N --costs COSTS``: the cost model's step for the layouts a file carries.
    tensor_predict: TensorPredict | None = None
    #: ``rewrite --recompute``: ``insert`` that also has the ops of ``CheckpointSite``
    #: recompute in the backward (activation checkpointing); ``None``: the backend's form
    #: cannot carry it, and the rewrite says so.
    insert_checkpointed: InsertCheckpointed | None = None
    #: Modules the process that runs the user's example imports ahead of time (a fork
    #: server's preload, :func:`syncpass.runtime.guard.call_guarded`).
    preload: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"a backend's name must be an identifier, got {self.name!r}")
        for hook in ("analyse", "insert", "remove", "strip"):
            if not callable(getattr(self, hook)):
                raise ValueError(f"backend {self.name!r}: {hook} must be a function")

    def need(self, hook: str, wanted: str) -> Callable[..., Any]:
        """The hook ``hook``, or an error saying that this backend cannot do ``wanted``."""
        found: Callable[..., Any] | None = getattr(self, hook)
        if found is None:
            raise SyncpassError(f"the {self.name} backend has no {_HOOK_NAMES[hook]}; {wanted}")
        return found


_HOOK_NAMES = {
    "measure": "profiler (it cannot time a model on an example)",
    "estimate": "static estimator (it cannot estimate costs from source)",
    "run": "runtime (it cannot run a pipeline)",
    "predict": "prediction of a run (it cannot plan the sync points a file carries)",
    "load_example": "example loader (it cannot run the user's example)",
    "tensor_rewrite": "tensor-parallel rewrite (it cannot write --strategy tensor)",
    "tensor_run": "tensor-parallel runtime (it cannot run --tp)",
    "tensor_predict": "tensor-parallel prediction (it cannot predict a --tp run)",
}

from __future__ import annotations

import dataclasses
import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from syncpass.contracts.costs import Costs

# What syncpass caches (torch's schedule orders) goes to a folder of this run, not the
# user's: the commands the tests start inherit it, and so do pytest-xdist's workers (started
# after this runs in the main process: they keep its folder).
if "SYNCPASS_TEST_RUN" not in os.environ:
    os.environ["SYNCPASS_TEST_RUN"] = "1"
    os.environ["SYNCPASS_CACHE_DIR"] = tempfile.mkdtemp(prefix="syncpass-test-cache-")
    # JAX compiles every operation of an eager call (a Flax init) on its own, about 0.1 s
    # each on this CPU: the JAX processes of one run share their compiled programs through
    # JAX's persistent cache, this run's only (a clean run compiles everything once).
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="syncpass-test-jax-")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    # XLA's CPU compiler without its expensive LLVM passes: the tests compare a split run with
    # the unsplit model, both compiled alike, and time nothing they assert; a 4-stage Flax
    # run took 20% less.
    fast = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {fast}".strip()

# Under pytest-xdist each worker is one of the cores' tests: torch's and OpenMP's thread
# pools of one thread each (set before torch is imported; the processes the tests start
# inherit it, and a rank or a profile sets its own count as before). Two workers each
# spinning two OpenMP threads on two cores ran the quick subset slower than one process.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent


def syncpass_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``syncpass ARGS`` in a process of its own, from the repository's root, as a user runs
    it (its status and output kept)."""
    return subprocess.run(
        [sys.executable, "-m", "syncpass", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )


def bench_script(name: str) -> ModuleType:
    """``bench/NAME.py`` loaded as module ``NAME`` (the bench folder is no package)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def hardware_as_profiled(costs: Costs, device_memory_bytes: float) -> str:
    """A hardware profile (TOML) that is the machine ``costs`` were measured on (link,
    overhead per action, cores, FLOP rate) with another device memory: a plan for it and
    a run's prediction, which reads the cost file's own machine, see the same one."""
    machine = {
        field: value
        for field, value in dataclasses.asdict(costs.hardware).items()
        if value is not None and field not in ("name", "device_memory_bytes")
    }
    lines = [f"{field} = {value!r}" for field, value in machine.items()]
    return "\n".join(
        ['name = "as profiled"', *lines, f"device_memory_bytes = {device_memory_bytes}", ""]
    )


def without_meeting_stalls(folder: Path) -> Path:
    """The shipped CPU profile less its meeting posts' stall, written into ``folder``: a
    test about a split's shape (not its speed on gloo) plans with it (``--hardware``), so
    that the optimiser does not trade the balanced split it is about for one whose posts
    do not meet (docs/formats.md, "Predicted step time")."""
    shipped = REPO / "configs" / "hardware" / "cpu-gloo-loopback.toml"
    lines = shipped.read_text().splitlines(keepends=True)
    path = folder / "no-meeting-stall.toml"
    path.write_text("".join(line for line in lines if not line.startswith("meet_")))
    return path


EXAMPLE_COSTS = REPO / "examples" / "costs" / "gpt_24x1024.costs.json"

#: What the fork server of a test process imports once, beyond the torch backend's own
#: preload: what every guarded example run and every stage then imports (libcst, the
#: analysis, the probes, the stages, torch.export). A fork server keeps the preload of the
#: first command that starts it, and a JAX command has none: without this, whichever test
#: came first decided whether each later torch child imported torch again (seconds each).
TEST_PRELOAD = (
    "torch._dynamo",
    "torch.export._trace",
    "syncpass.backends.torch.analysis",
    "syncpass.backends.torch.measure",
    "syncpass.backends.torch.norms",
    "syncpass.backends.torch.rewrite",
    "syncpass.backends.torch.stages",
    "syncpass.frontend.analysis",
    "syncpass.transformers.probes",
    "syncpass.transformers.torch_pipeline",
    "syncpass.transformers.torch_stages",
)


#: The longest tests, started first (below).
LONGEST = ("test_corpus.py", "test_jax.py", "test_plans_run.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, the longest of them (real models, JAX compiling) first of all:
    parallel workers then end on quick tests instead of one worker finishing a long run
    while the other cores wait."""

    def rank(item: pytest.Item) -> tuple[bool, bool, int]:
        slow = item.get_closest_marker("slow") is not None
        # The most stages first; and one model's stage counts apart, so that parallel workers
        # do not wait on each other for its profile (tests/test_corpus.py).
        callspec = getattr(item, "callspec", None)
        stages = callspec.params.get("stages", 0) if callspec is not None else 0
        return not slow, item.path.name not in LONGEST, -stages if isinstance(stages, int) else 0

    items.sort(key=rank)
    for item in items:  # `-m "not property"` leaves out the hypothesis tests (test_layout.py)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            # A search over generated inputs is slow by what it is: the quick subset keeps
            # the example-based tests of the same code.
            item.add_marker(pytest.mark.property)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _fork_server() -> Iterator[None]:
    """This test process's fork server, started before any test with the torch preload and
    ``TEST_PRELOAD`` (it imports them in the background while the first tests run)."""
    try:  # tests/test_layout.py runs the torch-free tests with torch hidden
        has_torch = importlib.util.find_spec("torch") is not None
    except ImportError:
        has_torch = False
    if has_torch and "forkserver" in multiprocessing.get_all_start_methods():
        from syncpass.backends.torch.run import PRELOAD

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([*PRELOAD, *TEST_PRELOAD])
        multiprocessing.forkserver.ensure_running()
    yield


@pytest.fixture
def example_costs_path() -> Path:
    return EXAMPLE_COSTS

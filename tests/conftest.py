from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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

REPO = Path(__file__).resolve().parent.parent
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

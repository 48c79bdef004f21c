"""Imported once by the fork server when it starts (it is in ``run``'s preload list): the
modules that ``$SYNCPASS_PRELOAD_MODULES`` names, the model file's own top-level imports
(:func:`syncpass.runtime.processes.preloading_imports_of` sets it), so that the ranks forked
from the server start with the model's libraries imported instead of each importing them
again (Hugging Face's transformers takes about 5 s a process). It also sets the allocator
every forked process measures with (:func:`~syncpass.runtime.processes.steady_allocator`).

Each module is imported in its own ``try``: one that fails here fails again, with its own
error, in the rank that imports the model, where the run reports it.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from syncpass.runtime.processes import PRELOAD_ENV, steady_allocator

steady_allocator()  # before the imports allocate: every process forked from here keeps it
for _name in filter(None, os.environ.get(PRELOAD_ENV, "").split(",")):
    with contextlib.suppress(Exception):
        importlib.import_module(_name)

"""Imported at start-up when this folder is on PYTHONPATH: torch, jax and flax fail to import,
as on a machine without them (tests/test_layout.py runs the torch-free tests so)."""

import sys
from importlib.abc import MetaPathFinder


class _Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name.split(".")[0] in ("torch", "jax", "jaxlib", "flax"):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden for this run)")
        return None


sys.meta_path.insert(0, _Missing())

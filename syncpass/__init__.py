"""syncpass: place the sync points of a model-parallel program, and write them into its source."""

from __future__ import annotations

__version__ = "0.1.0"

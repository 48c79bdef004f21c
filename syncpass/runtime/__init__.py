"""What every backend's run shares: the run request and result, their report, example loading.

A backend runs a rewritten model as a real pipeline (``syncpass run``) and
returns a :class:`~syncpass.runtime.contracts.RunResult`; :mod:`.render` turns
it into the report and its JSON form. :mod:`.example` finds the user's example
factory. Nothing here imports torch or jax.
"""

from __future__ import annotations

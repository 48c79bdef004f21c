"""The public home of :class:`Profile` (``from syncpass.profiler import Profile``).

The profiler is the torch backend's; see :mod:`syncpass.backends.torch.profiler`.
"""

from __future__ import annotations

from syncpass.backends.torch.profiler import Profile

__all__ = ["Profile"]

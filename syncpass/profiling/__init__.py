"""Measuring a model's costs: ``syncpass profile``.

:mod:`syncpass.profiling.measure` runs an instrumented copy of the model's
forward and backward and returns a cost file (:class:`syncpass.costs.Costs`)
whose op ids are the op graph's; :mod:`syncpass.profiling.command` is the
``profile`` subcommand. Importing this package imports neither torch nor
libcst: the command imports them when it runs.
"""

from __future__ import annotations

__all__: list[str] = []

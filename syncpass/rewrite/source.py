"""What a backend's analysis hands the rewrite driver, and the hooks the driver calls.

:class:`KnownOps` is what a cost file or plan says of its model; a backend's
``analyse`` hook returns a :class:`ModelSource`; the driver writes through any
object with the :class:`SyncWriter` hooks (a :class:`~syncpass.backends.spec.Backend`
has them). Importing this module imports no libcst.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import libcst as cst

    from syncpass.contracts.costs import Costs, SettingValue
    from syncpass.contracts.graph import OpGraph
    from syncpass.plan.schedule import OrderSource
    from syncpass.transformers.common import CheckpointSite, SyncSite


@dataclass(frozen=True)
class KnownOps:
    """What a cost file or a plan says of the model it was made for: its name and op ids.

    The analysis reads the length of each loop container off the ids
    (``blocks.11`` -> 12) unless ``sizes`` gives it (a loop over part of a
    container, ``self.layers[:-1]``), and picks the model the file or plan names.
    ``settings`` are the model's settings the profile read to decide branches
    (``config.return_dict``), so the analysis decides them alike.
    """

    model: str | None
    ids: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...] = ()
    settings: tuple[tuple[str, SettingValue], ...] = ()  # the model's, as profiled

    @classmethod
    def of_costs(cls, costs: Costs) -> KnownOps:
        ids = tuple(op.id for op in costs.ops)
        return cls(costs.model, ids, costs.containers, costs.model_settings)


@dataclass(frozen=True)
class ModelSource:
    """A model's source as the analysis read it: the contract between analysis and rewrite.

    ``base`` is ``text`` without the sync points syncpass wrote before (equal to
    ``text`` when there were none); ``module`` is ``base`` parsed and ``graph``
    the op graph of its model. ``handle`` is the backend's own note of where
    the model is (opaque to everything else).
    """

    text: str
    base: str
    module: cst.Module
    graph: OpGraph
    handle: Any = None


class SyncWriter(Protocol):
    """The two hooks :func:`syncpass.rewrite.driver.apply_plan` writes and checks with."""

    @property
    def insert(
        self,
    ) -> Callable[[ModelSource, Sequence[SyncSite], str], tuple[cst.Module, tuple[str, ...]]]: ...

    @property
    def insert_checkpointed(
        self,
    ) -> (
        Callable[
            [ModelSource, Sequence[SyncSite], Sequence[CheckpointSite], str],
            tuple[cst.Module, tuple[str, ...]],
        ]
        | None
    ): ...

    @property
    def remove(self) -> Callable[[cst.Module, ModelSource, str], str]: ...

    @property
    def name(self) -> str: ...

    @property
    def carries_values(self) -> bool: ...

    @property
    def refused_kinds(self) -> tuple[str, ...]: ...

    @property
    def schedule_order(self) -> OrderSource | None: ...

    @property
    def analyse(self) -> Callable[[str, str, KnownOps, str | None], ModelSource]: ...

"""The registry of cell kinds with exact online learning: per kind its trace class (:class:`.traces.LayerTrace`), what
:meth:`.learner.OnlineLearner.exactness` reports, and the readout filter it carries under a leaky readout. A cell no
entry claims learns with 1-step truncation (:class:`.traces.GenericTrace`). docs/architecture.md ("Adding a cell kind
to online learning") lists the steps for a new kind.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...layers.alif import ALIF
from ...layers.lif import LIF
from ...layers.lru import LRU
from ...layers.readout import LeakyReadout
from .readout_filter import LinearOutputFilter, ReadoutFilter
from .traces import GenericTrace, LayerTrace
from .traces_alif import ALIFTrace
from .traces_lif import LIFTrace
from .traces_lru import LRUTrace
from .traces_readout import LinearReadoutTrace, ReadoutTrace

__all__ = ["OnlineKind", "register_online_kind", "online_kind", "online_trace", "registered_kinds"]

INDEPENDENT = "exact e-prop eligibility traces (independent neurons)"


@dataclass(frozen=True)
class OnlineKind:
    """How the online learner treats the cells of one kind.

    ``tag``: the kind's name; ``cell``: the layer class; ``make``: ``(cell, rule) -> LayerTrace``; ``exactness``: what
    :meth:`OnlineLearner.exactness` says of a layer without lateral weights; ``claims(cell)``: whether this entry
    covers the cell; ``readout_filter``: the class of its readout-filtered traces under a leaky readout
    (:class:`.readout_filter.ReadoutFilter` for a spike map of the state, :class:`.readout_filter.LinearOutputFilter`
    for a linear output map; ``None``: none)."""

    tag: str
    cell: type
    make: Callable[..., LayerTrace]
    exactness: str
    claims: Callable[[object], bool] = lambda cell: True
    readout_filter: type | None = None


_KINDS: list[OnlineKind] = []


def register_online_kind(kind: OnlineKind) -> OnlineKind:
    """Add ``kind`` ahead of the earlier ones (a kind for a subclass claims its cells first; same tag: replaced)."""
    _KINDS[:] = [kind] + [k for k in _KINDS if k.tag != kind.tag]
    return kind


def registered_kinds() -> tuple[OnlineKind, ...]:
    return tuple(_KINDS)


def online_kind(cell) -> OnlineKind | None:
    """The registered kind that claims ``cell``, or ``None``."""
    for k in _KINDS:
        if isinstance(cell, k.cell) and k.claims(cell):
            return k
    return None


def online_trace(cell, rule: str, index: int) -> LayerTrace:
    """The online form of ``cell``: its kind's trace (``tr.online_kind`` set), else :class:`GenericTrace`."""
    kind = online_kind(cell)
    if kind is not None:
        tr = kind.make(cell, rule)
        tr.online_kind = kind
        return tr
    for m in ("initial_state", "step", "output"):
        if not hasattr(cell, m):
            raise TypeError(f"OnlineLearner: layer {index} ({type(cell).__name__}) does not follow the cell "
                            f"protocol: it has no '{m}'")
    return GenericTrace(cell, rule, stateless=False)


register_online_kind(OnlineKind("lru", LRU, LRUTrace, "exact RTRL traces (diagonal linear recurrence)",
                                readout_filter=LinearOutputFilter))
register_online_kind(OnlineKind("lif", LIF, LIFTrace, INDEPENDENT, readout_filter=ReadoutFilter))
register_online_kind(OnlineKind("alif", ALIF, ALIFTrace, INDEPENDENT, readout_filter=ReadoutFilter))
register_online_kind(OnlineKind("leaky_readout", LeakyReadout, ReadoutTrace,
                                "exact eligibility traces (leaky integrator)", claims=lambda c: c.leaky))
register_online_kind(OnlineKind("readout", LeakyReadout, LinearReadoutTrace, "stateless (exact)",
                                claims=lambda c: not c.leaky))

"""Recurrent cells behind one protocol (see :mod:`spikerec.layers.base`)."""
from .alif import ALIF, ALIFState
from .base import Cell
from .gru import GRU, GRUState
from .lif import LIF, CubaLIFState, LIFState
from .lru import LRU, LRUState
from .readout import LeakyReadout, ReadoutState, aggregate
from .wcrnn import WCRNN, WCRNNState

__all__ = ["Cell", "LIF", "LIFState", "CubaLIFState", "ALIF", "ALIFState", "LeakyReadout", "ReadoutState", "aggregate",
           "LRU", "LRUState", "GRU", "GRUState", "WCRNN", "WCRNNState"]

"""Recurrent cells behind one protocol (see :mod:`spikerec.layers.base`)."""
from .alif import ALIF, ALIFState
from .base import Cell
from .lif import LIF, CubaLIFState, LIFState
from .readout import LeakyReadout, ReadoutState, aggregate

__all__ = ["Cell", "LIF", "LIFState", "CubaLIFState", "ALIF", "ALIFState", "LeakyReadout", "ReadoutState", "aggregate"]

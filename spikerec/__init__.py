"""spikerec: spiking and recurrent neural networks for neuromorphic research.

Time-first ``[T, B, C]`` everywhere; every cell follows the protocol of
:mod:`spikerec.layers.base`.
"""
__version__ = "0.1.0"

from . import surrogate  # noqa: F401
from .layers import ALIF, LIF, LeakyReadout  # noqa: F401
from .models import RecurrentStack, build_model  # noqa: F401

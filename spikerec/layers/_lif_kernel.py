"""Moved to :mod:`spikerec.kernels.lif_sequence` and :mod:`spikerec.kernels.alif_sequence`."""
from ..kernels.alif_sequence import ALIFSequence  # noqa: F401
from ..kernels.lif_sequence import LIFSequence  # noqa: F401

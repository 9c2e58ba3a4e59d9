"""Weakly coupled residual RNNs (Dubinin & Effenberger, "Fading memory as inductive bias in residual
recurrent networks", Neural Networks 2024): the cell and its residual constructions live in
:mod:`spikerec.layers.wcrnn` (re-exported here); this module adds the spectral analysis of Sec. 4.2.
"""
from __future__ import annotations

import math

import numpy as np

from ..layers.wcrnn import (RESIDUALS, VARIANTS, WCRNN, WCRNNState, block_rotation, diagonal_residual,
                            haar_orthogonal, heterogeneous_diagonal, informed_heterogeneous, make_residual,
                            random_block_rotation, scaled_identity, weakly_coupled_elman_init)

__all__ = [
    "WCRNN", "WCRNNState", "VARIANTS", "RESIDUALS",
    "scaled_identity", "diagonal_residual", "heterogeneous_diagonal", "block_rotation",
    "random_block_rotation", "haar_orthogonal", "informed_heterogeneous", "make_residual",
    "weakly_coupled_elman_init", "characteristic_frequency",
]


def characteristic_frequency(sequences, *, min_bin: int = 2):
    """Frequency of the largest peak of the mean power spectrum (Sec. 4.2).

    ``sequences [n, T]``; each sequence's mean is removed, ``|FFT|^2`` averaged, and the largest
    local maximum at DFT bin ``>= min_bin`` is returned as ``(phi_c [rad/step], bins, power)``
    (bin 1 is excluded by default: the low-frequency envelope is not a "peak").
    """
    s = np.asarray(sequences, dtype=float)
    if s.ndim != 2 or s.shape[1] < 4:
        raise ValueError(f"sequences: expected [n, T] with T >= 4, got shape {s.shape}")
    s = s - s.mean(axis=1, keepdims=True)
    p = (np.abs(np.fft.rfft(s, axis=1)) ** 2).mean(0)
    T = s.shape[1]
    cand = [k for k in range(max(1, min_bin), p.size - 1) if p[k] > p[k - 1] and p[k] >= p[k + 1]]
    if not cand:
        raise ValueError("characteristic_frequency: the mean power spectrum has no interior peak")
    k = max(cand, key=lambda i: p[i])
    return 2 * math.pi * k / T, np.arange(p.size), p

"""The compiled step (numba) of the readout for online learning's stream, ``y_t = alpha y_{t-1} + W h_t + b``
(:mod:`spikerec.neurons.readout`; ``alpha = 0`` for the linear readout), on rows of a window; the package's
MSE step loss with its gradient; the stream's input row, copied and checked for NaN.
"""
from __future__ import annotations

from .trace_numba import _nb  # numba is optional: None without it

__all__ = ["readout_rows", "mse_row", "copy_row", "events"]

if _nb is not None:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def events(x, Wt, out):  # pragma: no cover - compiled
        """``out = x Wt`` summed over the nonzero entries of ``x`` only (a spike train is mostly zeros)."""
        for b in range(x.shape[0]):
            for n in range(out.shape[1]):
                out[b, n] = 0
            for h in range(x.shape[1]):
                xv = x[b, h]
                if xv != 0:
                    for n in range(out.shape[1]):
                        out[b, n] += xv * Wt[h, n]

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def readout_rows(j, X, S, Y, Wt, bias, has_b, alpha, leaky, y):  # pragma: no cover - compiled
        """Step ``j``: ``S[j + 1] = alpha S[j] + X[j] W^T + b`` (``alpha`` if ``leaky``), copied to ``Y[j]``."""
        events(X[j], Wt, y)
        for b in range(y.shape[0]):
            for o in range(y.shape[1]):
                v = y[b, o] + bias[o] if has_b else y[b, o]
                if leaky:
                    v = alpha[o] * S[j, b, o] + v
                S[j + 1, b, o] = v
                Y[j, b, o] = v

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def mse_row(j, Y, target, GY, L):  # pragma: no cover - compiled
        """``GY[j] = Y[j] - target`` and ``L[j] = 0.5 sum GY[j]^2`` (the package's MSE step loss)."""
        total = 0.0
        for b in range(target.shape[0]):
            for o in range(target.shape[1]):
                d = Y[j, b, o] - target[b, o]
                GY[j, b, o] = d
                total += d * d
        L[j] = 0.5 * total

    @_nb.njit(cache=True, nogil=True)
    def copy_row(j, u, X):  # pragma: no cover - compiled
        """``X[j] = u``; whether ``u`` holds a NaN."""
        nan = False
        for b in range(u.shape[0]):
            for h in range(u.shape[1]):
                x = u[b, h]
                nan = nan or x != x
                X[j, b, h] = x
        return nan
else:
    readout_rows = mse_row = copy_row = events = None

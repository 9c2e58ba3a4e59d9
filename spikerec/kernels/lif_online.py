"""The compiled step and partials (numba) of a plain LIF layer for online learning: one step of
:func:`spikerec.neurons.lif.step` (float, bias into the current) on rows of the stream's window (:func:`lif_rows`)::

    z_{t-1} = H(v_{t-1} - thr),  I = W x_t + b + W_rec z_{t-1}
    v_t = alpha v_{t-1} + I - thr z_{t-1}   (reset "subtract"; "zero": alpha (1 - z_{t-1}) v_{t-1} + I; "none")
    z_t = H(v_t - thr)

and ``J = d v_t / d v_{t-1}`` with the immediate partials of a block's rows (:func:`lif_block_partials`,
the compiled :meth:`spikerec.hardware.online.traces_lif.LIFTrace.partials`), planar for :mod:`.trace_numba`.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import neurons
from .lif_sequence_numba import surrogate_code

from .trace_numba import _nb  # numba is optional: None without it
if _nb is not None:
    from .readout_online import events
    from .surrogate_numba import atan_d, fast_sigmoid_d, sd_consts

__all__ = ["lif_rows", "lif_block_partials", "RESET_CODES", "COLUMNS"]

COLUMNS = ("log_tau_mem", "threshold", "bias")  # the per-neuron parameters, in kernel order

RESET_CODES = {"subtract": 0, "zero": 1, "none": 2}

if _nb is not None:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def lif_rows(j, X, V, Z, Wt, bias, has_b, Rt, has_r, alpha, thr, mode, cur, zp, tmp):  # pragma: no cover
        """Step ``j``: ``V[j + 1]`` and spikes ``Z[j]`` from ``X[j]``, ``V[j]`` (``cur, zp, tmp``: scratch)."""
        B, N = zp.shape
        one, zero = V.dtype.type(1), V.dtype.type(0)
        for b in range(B):
            for n in range(N):
                zp[b, n] = one if V[j, b, n] > thr[n] else zero
        events(X[j], Wt, cur)  # the input's and the previous spikes' events
        if has_r:
            events(zp, Rt, tmp)
            cur += tmp
        for b in range(B):
            for n in range(N):
                i = cur[b, n] + bias[n] if has_b else cur[b, n]
                v0 = V[j, b, n]
                if mode == 0:
                    v = (alpha[n] * v0 + i) - thr[n] * zp[b, n]
                elif mode == 1:
                    v = alpha[n] * ((one - zp[b, n]) * v0) + i
                else:
                    v = alpha[n] * v0 + i
                V[j + 1, b, n] = v
                Z[j, b, n] = one if v > thr[n] else zero

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _partials(v0, psi, sur, p1, p2, alpha, dalpha, thr, co, m0, m1, cols, J, V, zp):  # pragma: no cover
        """Per row and neuron of ``v0 [K, B, N]``: the previous spike ``zp``, ``J [K, B, 1, N]`` and the immediate
        partials ``V [m, K, B, 1, N]`` of the columns ``cols`` (indices into :data:`COLUMNS`), branch-free with the
        coefficients ``co`` (:func:`lif_block_partials`); the surrogate derivative into ``psi`` here (``sur`` 1,
        2) or given (``sur`` 0). One pass per array written, so that each vectorises::

            J = alpha - co0 zp + psi (co1 + co2 v),   d v / d thr = psi (co3 + co4 v) - m0 zp,
            d v / d log_tau_mem = dalpha v (1 - m1 zp)"""
        K, B, N = v0.shape
        dt = v0.dtype.type
        zero, one, m0, m1 = dt(0), dt(1), dt(m0), dt(m1)  # in the arrays' type (float32 stays float32)
        s1, s2 = sd_consts(sur, p1, p2)
        c1, c2 = dt(s1), dt(s2)
        if sur == 1:  # one loop per formula (a branch inside the loop keeps it scalar)
            for t in range(K):
                for b in range(B):
                    for n in range(N):
                        psi[t, b, n] = fast_sigmoid_d(v0[t, b, n] - thr[n], c1, c2, one)
        elif sur == 2:
            for t in range(K):
                for b in range(B):
                    for n in range(N):
                        psi[t, b, n] = atan_d(v0[t, b, n] - thr[n], c1, c2, one)
        for t in range(K):
            for b in range(B):
                for n in range(N):
                    zp[t, b, n] = one if v0[t, b, n] > thr[n] else zero
                for n in range(N):
                    J[t, b, 0, n] = (alpha[n] - co[0, n] * zp[t, b, n]) + psi[t, b, n] * (co[1, n] + co[2, n] * v0[t, b, n])
                for q in range(cols.shape[0]):
                    if cols[q] == 0:
                        for n in range(N):
                            V[q, t, b, 0, n] = dalpha[n] * v0[t, b, n] * (one - m1 * zp[t, b, n])
                    elif cols[q] == 1:
                        for n in range(N):
                            V[q, t, b, 0, n] = psi[t, b, n] * (co[3, n] + co[4, n] * v0[t, b, n]) - m0 * zp[t, b, n]
                    else:
                        for n in range(N):
                            V[q, t, b, 0, n] = one
else:
    lif_rows = None


def lif_block_partials(v0, surrogate, k: dict, cols, reset: str, detach_reset: bool):
    """:func:`_partials` on torch ``v0 [K, B, N]`` with the layer's constants ``k`` (``alpha``, ``dalpha``, ``thr``,
    ``Rd``): ``(J [K, B, 1, N], V [m, K, B, 1, N], zp [K, B, N])``; ``co = (alpha m1, r - thr nd m0, -alpha nd m1,
    thr nd m0 - r, alpha nd m1)`` with the reset's flags ``m0`` (subtract), ``m1`` (zero), ``nd = 1`` where its
    spike path is not detached, ``r`` the lateral self-weight (a surrogate without a compiled form: by torch)."""
    K, B, N = v0.shape
    sur, p1, p2 = surrogate_code(surrogate)
    psi = surrogate.derivative(v0 - k["thr"]).contiguous() if sur == 0 else torch.empty_like(v0)
    co = k.get(("co", reset, detach_reset))
    if co is None:
        m0, m1 = float(reset == "subtract"), float(reset == "zero")
        nd = float(not detach_reset and reset != "none")
        a, thr = k["alpha"], k["thr"]
        r = k["Rd"] if k["Rd"] is not None else torch.zeros_like(a)
        co = k[("co", reset, detach_reset)] = (
            torch.stack([a * m1, r - thr * nd * m0, -a * nd * m1, thr * nd * m0 - r, a * nd * m1]).contiguous().numpy(),
            m0, m1, k["alpha"].numpy(), k["dalpha"].numpy(), k["thr"].numpy())
    J, V, zp = np.empty((K, B, 1, N), dtype=co[0].dtype), np.empty((len(cols), K, B, 1, N), dtype=co[0].dtype), \
        np.empty((K, B, N), dtype=co[0].dtype)
    _partials(v0.numpy(), psi.numpy(), sur, p1, p2, co[3], co[4], co[5], co[0], co[1], co[2], cols, J, V, zp)
    return torch.from_numpy(J), torch.from_numpy(V), torch.from_numpy(zp)


neurons.register_backend("lif", "kernels.lif_online (compiled block partials, lif_block_partials)",
                         lif_block_partials, test="tests/test_online_partials.py::test_compiled_partials_equal_derived_ones")

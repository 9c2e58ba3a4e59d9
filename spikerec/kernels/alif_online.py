"""The compiled step and partials (numba) of an ALIF layer for online learning (the adaptive
threshold of Bellec et al. 2018, eq. 2-3, as :func:`spikerec.neurons.alif.step` writes it)::

    z_{t-1} = H(v_{t-1} - theta_{t-1}),  a_t = rho a_{t-1} + (1 - rho) z_{t-1},  theta_t = b + beta a_t
    v_t = alpha v_{t-1} + W x_t + b_v + W_rec z_{t-1} - theta_t z_{t-1},      z_t = H(v_t - theta_t)

:func:`alif_rows` is one step on rows of the stream's window; :func:`alif_block_partials` the Jacobian ``J =
d(v_t, a_t) / d(v_{t-1}, a_{t-1})`` and the immediate partials of a block's rows (the compiled
:meth:`spikerec.hardware.online.traces_alif.ALIFTrace.partials`), planar for :mod:`.trace_numba`.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import neurons
from .lif_sequence_numba import surrogate_code

from .trace_numba import _nb  # numba is optional: None without it

__all__ = ["alif_rows", "alif_block_partials", "COLUMNS"]

COLUMNS = ("log_tau_mem", "log_tau_adapt", "b", "beta", "bias")  # the per-neuron parameters, in kernel order

if _nb is not None:
    from .readout_online import events
    from .surrogate_numba import sd_consts, sd_typed

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def alif_rows(j, X, V, A, Z, Wt, bias, has_b, Rt, has_r, alpha, rho, b, beta, cur, zp, tmp):  # pragma: no cover
        """Step ``j``: ``V[j + 1]``, ``A[j + 1]``, spikes ``Z[j]`` from ``X[j]``, ``V[j]``, ``A[j]`` (+ scratch)."""
        B, N = zp.shape
        one, zero = V.dtype.type(1), V.dtype.type(0)
        for r in range(B):
            for n in range(N):
                zp[r, n] = one if V[j, r, n] > b[n] + beta[n] * A[j, r, n] else zero
        events(X[j], Wt, cur)  # the input's and the previous spikes' events
        if has_r:
            events(zp, Rt, tmp)
            cur += tmp
        for r in range(B):
            for n in range(N):
                z = zp[r, n]
                a = rho[n] * A[j, r, n] + (one - rho[n]) * z
                theta = b[n] + beta[n] * a
                i = cur[r, n] + bias[n] if has_b else cur[r, n]
                v = (alpha[n] * V[j, r, n] + i) - theta * z
                A[j + 1, r, n] = a
                V[j + 1, r, n] = v
                Z[j, r, n] = one if v > theta else zero

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _partials(v0, a0, psi, sur, p1, p2, cn, rd, nd, cols, J, V, zp):  # pragma: no cover - compiled
        """Per row ``(t, b)`` and neuron ``n`` of ``v0, a0 [K, B, N]``: the previous spike ``zp``, the Jacobian ``J
        [K, B, 4, N]`` (rows ``dv/dv, dv/da, da/dv, da/da``) and the immediate partials ``V [m, K, B, 2, N]`` of the
        columns ``cols`` (indices into :data:`COLUMNS`). ``cn [7, N]``: ``alpha, dalpha/dlog_tau_mem, rho,
        drho/dlog_tau_adapt, 1 - rho, b, beta``; ``rd`` the lateral self-weights (zeros without); ``nd`` 1 where the
        reset's gradient is kept, else 0; the surrogate derivative into ``psi`` here (``sur`` 1, 2) or given (``sur``
        0). Branch-free, one pass per array written (``theta = b + beta (rho a + w z)``, ``w = 1 - rho``)::

            dv/dv = alpha + r psi - nd psi (theta + z beta w)      da/dv = w psi
            dv/da = -beta psi (r - nd theta) - nd z beta (rho - w beta psi),   da/da = rho - w beta psi
            b: (-psi (r - nd theta) - nd z (1 - beta w psi), -w psi)
            beta: (-a psi (r - nd theta) - nd z (theta_a - beta w a psi), -w a psi),  theta_a = rho a + w z
            log_tau_mem: (v dalpha, 0),  log_tau_adapt: (-nd z beta (a - z) drho, (a - z) drho),  bias: (1, 0)
        """
        K, B, N = v0.shape
        dt = v0.dtype.type
        zero, one, nd = dt(0), dt(1), dt(nd)  # in the arrays' type (float32 stays float32)
        s1, s2 = sd_consts(sur, p1, p2)
        c1, c2 = dt(s1), dt(s2)
        al, dal, rho, drho, w, bb, be = cn[0], cn[1], cn[2], cn[3], cn[4], cn[5], cn[6]
        for t in range(K):
            for r in range(B):
                for n in range(N):
                    zp[t, r, n] = one if v0[t, r, n] > bb[n] + be[n] * a0[t, r, n] else zero
                if sur != 0:
                    for n in range(N):
                        psi[t, r, n] = sd_typed(v0[t, r, n] - (bb[n] + be[n] * a0[t, r, n]), sur, c1, c2, one)
                for n in range(N):
                    th = bb[n] + be[n] * (rho[n] * a0[t, r, n] + w[n] * zp[t, r, n])
                    J[t, r, 0, n] = al[n] + rd[n] * psi[t, r, n] - nd * psi[t, r, n] * (th + zp[t, r, n] * be[n] * w[n])
                for n in range(N):
                    th = bb[n] + be[n] * (rho[n] * a0[t, r, n] + w[n] * zp[t, r, n])
                    J[t, r, 1, n] = (-be[n] * psi[t, r, n] * (rd[n] - nd * th)
                                     - nd * zp[t, r, n] * be[n] * (rho[n] - w[n] * be[n] * psi[t, r, n]))
                for n in range(N):
                    J[t, r, 2, n] = w[n] * psi[t, r, n]
                for n in range(N):
                    J[t, r, 3, n] = rho[n] - w[n] * be[n] * psi[t, r, n]
                for q in range(cols.shape[0]):
                    c = cols[q]
                    if c == 0:
                        for n in range(N):
                            V[q, t, r, 0, n] = v0[t, r, n] * dal[n]
                        for n in range(N):
                            V[q, t, r, 1, n] = zero
                    elif c == 1:
                        for n in range(N):
                            V[q, t, r, 0, n] = -nd * zp[t, r, n] * be[n] * (a0[t, r, n] - zp[t, r, n]) * drho[n]
                        for n in range(N):
                            V[q, t, r, 1, n] = (a0[t, r, n] - zp[t, r, n]) * drho[n]
                    elif c == 2:
                        for n in range(N):
                            th = bb[n] + be[n] * (rho[n] * a0[t, r, n] + w[n] * zp[t, r, n])
                            V[q, t, r, 0, n] = (-psi[t, r, n] * (rd[n] - nd * th)
                                                - nd * zp[t, r, n] * (one - be[n] * w[n] * psi[t, r, n]))
                        for n in range(N):
                            V[q, t, r, 1, n] = -w[n] * psi[t, r, n]
                    elif c == 3:
                        for n in range(N):
                            a = a0[t, r, n]
                            th = bb[n] + be[n] * (rho[n] * a + w[n] * zp[t, r, n])
                            ta = rho[n] * a + w[n] * zp[t, r, n]
                            V[q, t, r, 0, n] = (-a * psi[t, r, n] * (rd[n] - nd * th)
                                                - nd * zp[t, r, n] * (ta - be[n] * w[n] * a * psi[t, r, n]))
                        for n in range(N):
                            V[q, t, r, 1, n] = -w[n] * a0[t, r, n] * psi[t, r, n]
                    else:
                        for n in range(N):
                            V[q, t, r, 0, n] = one
                        for n in range(N):
                            V[q, t, r, 1, n] = zero
else:
    alif_rows = None


def alif_block_partials(v0, a0, surrogate, cn, cols, rd, detach: bool):
    """:func:`_partials` on torch ``v0, a0 [K, B, N]``: ``(J [K, B, 4, N], V [m, K, B, 2, N], zp [K, B, N])``."""
    K, B, N = v0.shape
    dt = v0.dtype
    sur, p1, p2 = surrogate_code(surrogate)
    psi = surrogate.derivative(v0 - (cn[5] + cn[6] * a0)).contiguous() if sur == 0 else torch.empty_like(v0)
    J, V = torch.empty((K, B, 4, N), dtype=dt), torch.empty((len(cols), K, B, 2, N), dtype=dt)
    zp = torch.empty((K, B, N), dtype=dt)
    _partials(v0.numpy(), a0.numpy(), psi.numpy(), sur, p1, p2, cn.numpy(),
              rd.numpy() if rd is not None else np.zeros(N, psi.numpy().dtype), 0.0 if detach else 1.0, cols,
              J.numpy(), V.numpy(), zp.numpy())
    return J, V, zp


neurons.register_backend("alif", "kernels.alif_online (compiled block partials, alif_block_partials)",
                         alif_block_partials,
                         test="tests/test_online_partials.py::test_compiled_partials_equal_derived_ones")

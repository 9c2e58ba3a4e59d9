"""Compiled CPU kernel (numba) for the streaming hot path: the matrix eligibility trace of one layer.

The same operation as :mod:`.triton_kernels` (and its torch reference
:func:`.triton_kernels.mat_trace_step_torch`), for every neuron ``n`` and presynaptic input ``h``
with ``k`` in {1, 2} state fields per neuron::

    eps[n, b, :, h] <- J[b, n] eps[n, b, :, h] + c[b, n, :] x[b, h]          (trace advance)
    G_r[n, h]        = sum_b sum_f g_r[b, n, f] eps[n, b, f, h]              (contraction)

fused in one pass over ``eps`` (read once, written once), parallel over neurons. Used for CPU
float32/float64 tensors when numba is installed (``pip install 'spikerec[fast]'``); other cases
fall back to the torch path.
"""
from __future__ import annotations

import torch

__all__ = ["numba_available", "mat_trace_step_numba"]

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False


def numba_available() -> bool:
    return _HAVE_NUMBA


if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_trace(eps, J, c, x, g1, g2, G1, G2, use_g, two):  # pragma: no cover - compiled
        N, B, k, H = eps.shape
        for n in range(N):
            for h in range(H):
                G1[n, h] = 0.0
                G2[n, h] = 0.0
            for b in range(B):
                jb = b if J.shape[0] > 1 else 0
                if k == 1:
                    j00 = J[jb, n, 0, 0]
                    c0 = c[b, n, 0]
                    q = g1[b, n, 0] if use_g else 0.0
                    r = g2[b, n, 0] if two else 0.0
                    for h in range(H):
                        e = j00 * eps[n, b, 0, h] + c0 * x[b, h]
                        eps[n, b, 0, h] = e
                        G1[n, h] += q * e
                        G2[n, h] += r * e
                else:
                    j00, j01, j10, j11 = J[jb, n, 0, 0], J[jb, n, 0, 1], J[jb, n, 1, 0], J[jb, n, 1, 1]
                    c0, c1 = c[b, n, 0], c[b, n, 1]
                    q0 = g1[b, n, 0] if use_g else 0.0
                    q1 = g1[b, n, 1] if use_g else 0.0
                    r0 = g2[b, n, 0] if two else 0.0
                    r1 = g2[b, n, 1] if two else 0.0
                    for h in range(H):
                        e0 = eps[n, b, 0, h]
                        e1 = eps[n, b, 1, h]
                        xv = x[b, h]
                        f0 = j00 * e0 + j01 * e1 + c0 * xv
                        f1 = j10 * e0 + j11 * e1 + c1 * xv
                        eps[n, b, 0, h] = f0
                        eps[n, b, 1, h] = f1
                        G1[n, h] += q0 * f0 + q1 * f1
                        G2[n, h] += r0 * f0 + r1 * f1


def mat_trace_step_numba(eps, J, c, x, gs):
    """Advance ``eps [N, B, k, H]`` in place and return ``[G_r [N, H]]`` for ``gs`` (each ``g_r``
    ``[B, N, k]`` or ``None``); ``J [B or 1, N, k, k]``, ``c [B, N, k]``, ``x [B, H]``."""
    from .triton_kernels import mat_trace_step_torch

    N, B, k, H = eps.shape
    if (not _HAVE_NUMBA or eps.device.type != "cpu" or k not in (1, 2) or len(gs) > 2
            or eps.dtype not in (torch.float32, torch.float64) or not eps.is_contiguous()
            or eps.requires_grad):
        return mat_trace_step_torch(eps, J, c, x, gs)
    dt = eps.dtype
    arr = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    Jn = J if J.shape[0] in (1, B) else J.expand(B, -1, -1, -1)
    use_g = gs[0] is not None
    two = use_g and len(gs) == 2 and gs[1] is not None
    cn = arr(c.expand(B, N, k))
    g1 = arr(gs[0]) if use_g else cn
    g2 = arr(gs[1]) if two else g1
    G1 = torch.empty(N, H, dtype=dt)
    G2 = torch.empty(N, H, dtype=dt)
    _mat_trace(eps.numpy(), arr(Jn), cn, arr(x), g1, g2, G1.numpy(), G2.numpy(), use_g, two)
    if not use_g:
        return [None] * len(gs)
    return [G1, G2] if len(gs) == 2 and two else ([G1] if len(gs) == 1 else [G1, None])

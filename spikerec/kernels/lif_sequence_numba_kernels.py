"""The numba kernels behind :mod:`spikerec.kernels.lif_sequence_numba` (imported on first use).

Forward and reverse loops of the feed-forward LIF recurrence; the equations are in
:mod:`spikerec.kernels.lif_sequence`. Compiled on first call and cached on disk.
"""
import numpy as np
from numba import njit, prange

from . import LIF_BLOCK as BLOCK  # neurons per parallel work item (contiguous in memory)
from .surrogate_numba import atan_d, fast_sigmoid_d, sd_consts


@njit(cache=True, nogil=True)
def _fwd_block(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Zf, Iseq, vT, iT, lo, hi):  # pragma: no cover - compiled
    """The forward loop over all steps for the neurons ``lo:hi`` (of the flattened ``[B*N]``)."""
    T = I.shape[0]
    n = hi - lo
    v = v0[lo:hi].copy()
    i = i0[lo:hi].copy()
    z = np.empty(n, dtype=v0.dtype)
    for m in range(n):
        z[m] = 1.0 if v[m] > thr[lo + m] else 0.0
    al = alpha[lo:hi]
    als = alpha_s[lo:hi]
    th = thr[lo:hi]
    for t in range(T):
        It = I[t, lo:hi]
        Vt = V[t, lo:hi]
        Zft = Zf[t, lo:hi]
        if syn:
            St = Iseq[t, lo:hi]
            for m in range(n):
                i[m] = It[m] + als[m] * i[m]
                St[m] = i[m]
            It = St
        if mode == 0:
            for m in range(n):
                vv = (It[m] + al[m] * v[m]) - th[m] * z[m]
                v[m] = vv
                Vt[m] = vv
                zz = 1.0 if vv > th[m] else 0.0
                z[m] = zz
                Zft[m] = zz
        elif mode == 1:
            for m in range(n):
                vv = It[m] + (al[m] * (1.0 - z[m])) * v[m]
                v[m] = vv
                Vt[m] = vv
                zz = 1.0 if vv > th[m] else 0.0
                z[m] = zz
                Zft[m] = zz
        else:
            for m in range(n):
                vv = It[m] + al[m] * v[m]
                v[m] = vv
                Vt[m] = vv
                zz = 1.0 if vv > th[m] else 0.0
                z[m] = zz
                Zft[m] = zz
    for m in range(n):
        vT[lo + m] = v[m]
        iT[lo + m] = i[m]


@njit(parallel=True, cache=True, nogil=True)
def fwd(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Zf, Iseq, vT, iT):  # pragma: no cover - compiled
    """The forward loop, blocks of :data:`BLOCK` neurons in parallel."""
    M = I.shape[1]
    nblk = (M + BLOCK - 1) // BLOCK
    for k in prange(nblk):
        _fwd_block(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Zf, Iseq, vT, iT, k * BLOCK, min(M, k * BLOCK + BLOCK))


@njit(cache=True, nogil=True)
def fwd_serial(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Zf, Iseq, vT, iT):  # pragma: no cover - compiled
    """:func:`fwd` on the calling thread, for callers with one block of neurons (no parallel
    region to enter: the chunked online blocks call it many times on small arrays)."""
    M = I.shape[1]
    for lo in range(0, M, BLOCK):
        _fwd_block(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Zf, Iseq, vT, iT, lo, min(M, lo + BLOCK))


@njit(parallel=True, cache=True, nogil=True)
def bwd(gZ, SD, sur_code, p1, p2, sd0, V, v0, z0, i0, Iseq, alpha, alpha_s, thr, mode, syn, detach, gvT, giT,
        DJ, gv0, gi0, g_alpha, g_alpha_s, g_thr):  # pragma: no cover - compiled
    T, M = V.shape
    nblk = (M + BLOCK - 1) // BLOCK
    c1, c2 = sd_consts(sur_code, p1, p2)  # the surrogate's constants (float64, as the sums)
    for k in prange(nblk):
        lo = k * BLOCK
        hi = min(M, lo + BLOCK)
        n = hi - lo
        gv = gvT[lo:hi].copy()
        gi = giT[lo:hi].copy()
        carry = np.zeros(n, dtype=gv.dtype)
        ga = np.zeros(n, dtype=gv.dtype)
        gas = np.zeros(n, dtype=gv.dtype)
        gth = np.zeros(n, dtype=gv.dtype)
        sdbuf = np.empty(n, dtype=gv.dtype)
        zbuf = np.empty(n, dtype=gv.dtype)
        al = alpha[lo:hi]
        als = alpha_s[lo:hi]
        th = thr[lo:hi]
        for t in range(T - 1, -1, -1):
            gZt = gZ[t, lo:hi]
            Vt = V[t, lo:hi]
            if sur_code == 0:
                SDt = SD[t, lo:hi]
            else:
                SDt = sdbuf
                if sur_code == 1:  # one loop per formula (a branch inside the loop keeps it scalar)
                    for m in range(n):
                        sdbuf[m] = fast_sigmoid_d(Vt[m] - th[m], c1, c2, 1.0)
                else:
                    for m in range(n):
                        sdbuf[m] = atan_d(Vt[m] - th[m], c1, c2, 1.0)
            DJt = DJ[t, lo:hi]
            Zp = zbuf  # z_{t-1}, recomputed exactly from the saved membrane
            if t > 0:
                Vp = V[t - 1, lo:hi]
                Ip = Iseq[t - 1, lo:hi] if syn else Vp
                for m in range(n):
                    zbuf[m] = 1.0 if Vp[m] > th[m] else 0.0
            else:
                Vp = v0[lo:hi]
                Ip = i0[lo:hi]
                for m in range(n):
                    zbuf[m] = 1.0 if z0[lo + m] else 0.0
            if mode != 1 and detach and not syn:  # the common case: no carries, no synapse
                for m in range(n):
                    gu = gZt[m] * SDt[m]
                    g = gv[m] + gu
                    gth[m] -= gu
                    ga[m] += g * Vp[m]
                    if mode == 0:
                        gth[m] -= g * Zp[m]
                    DJt[m] = g
                    gv[m] = al[m] * g
                continue
            for m in range(n):
                vp = Vp[m]
                zp = Zp[m]
                gz = gZt[m] + carry[m]
                gu = gz * SDt[m]
                g = gv[m] + gu
                gth[m] -= gu
                if mode == 0:
                    ga[m] += g * vp
                    gth[m] -= g * zp
                elif mode == 1:
                    ga[m] += g * (1.0 - zp) * vp
                else:
                    ga[m] += g * vp
                if syn:
                    gii = gi[m] + g
                    DJt[m] = gii
                    gas[m] += gii * Ip[m]
                    gi[m] = als[m] * gii
                else:
                    DJt[m] = g
                c = 0.0
                if not detach:
                    if mode == 0:
                        c = -th[m] * g
                    elif mode == 1:
                        c = -al[m] * vp * g
                carry[m] = c
                if mode == 1:
                    gv[m] = (al[m] * (1.0 - zp)) * g
                else:
                    gv[m] = al[m] * g
        for m in range(n):
            j = lo + m
            gu0 = carry[m] * sd0[j]
            gv0[j] = gv[m] + gu0
            gi0[j] = gi[m]
            g_alpha[j] = ga[m]
            g_alpha_s[j] = gas[m]
            g_thr[j] = gth[m] - gu0

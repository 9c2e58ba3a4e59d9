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

__all__ = ["numba_available", "mat_trace_step_numba", "lru_trace_step_numba"]

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


# --- the whole trace step of one LRU layer ---------------------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _lru_trace(hr, hi, nr, ni, x, g, use_g, lr, li, gam, wnu, wth, cols, ev, em, has_mat, G_nu, G_th, G_ga,
                   G_bre, G_bim, has_bre, has_bim):  # pragma: no cover - compiled
        B, N = hr.shape
        H = x.shape[1]
        m = cols.shape[0]
        for n in range(N):
            a, c = lr[n], li[n]
            for b in range(B):
                p0, p1 = hr[b, n], hi[b, n]
                q0 = g[b, n, 0] if use_g else 0.0
                q1 = g[b, n, 1] if use_g else 0.0
                for j in range(m):
                    kind = cols[j]
                    if kind == 0:
                        i0, i1 = wnu[n, 0] * p0 - wnu[n, 1] * p1, wnu[n, 0] * p1 + wnu[n, 1] * p0
                    elif kind == 1:
                        i0, i1 = wth[n, 0] * p0 - wth[n, 1] * p1, wth[n, 0] * p1 + wth[n, 1] * p0
                    else:
                        i0, i1 = nr[b, n] - (a * p0 - c * p1), ni[b, n] - (a * p1 + c * p0)
                    e0, e1 = ev[b, n, 0, j], ev[b, n, 1, j]
                    f0 = a * e0 - c * e1 + i0
                    f1 = c * e0 + a * e1 + i1
                    ev[b, n, 0, j] = f0
                    ev[b, n, 1, j] = f1
                    if use_g:
                        val = q0 * f0 + q1 * f1
                        if kind == 0:
                            G_nu[n] += val
                        elif kind == 1:
                            G_th[n] += val
                        else:
                            G_ga[n] += val
                if has_mat:
                    gm = gam[n]
                    for h in range(H):
                        e0, e1 = em[n, b, 0, h], em[n, b, 1, h]
                        f0 = a * e0 - c * e1 + gm * x[b, h]
                        f1 = c * e0 + a * e1
                        em[n, b, 0, h] = f0
                        em[n, b, 1, h] = f1
                        if use_g:
                            if has_bre:
                                G_bre[n, h] += q0 * f0 + q1 * f1
                            if has_bim:
                                G_bim[n, h] += q1 * f0 - q0 * f1


def lru_trace_step_numba(prev, new, x, g, lam, gam, wnu, wth, cols, ev, em, G_vec, G_bre, G_bim):
    """The whole stream-mode trace step of one LRU layer (``full``/``snap1`` rule) in one pass,
    the recursions of :mod:`.traces_lru` on (Re, Im) pairs:

        eps^p <- lam eps^p + imm^p     for the stacked per-neuron traces ``ev [B, N, 2, m]``
                                       (``cols[j]``: 0 = ``nu_log``, 1 = ``theta_log``, 2 = ``gamma_log``)
        s^B   <- lam s^B + gamma x     for the input-matrix trace ``em [N, B, 2, H]`` (or ``None``)
        G     += sum_b g . eps         into ``G_vec`` (three ``[N]`` accumulators or ``None``, by
                                       ``cols`` kind), ``G_bre``, ``G_bim [N, H]`` (``None``: not traced)

    all in place; ``g [B, N, 2]`` or ``None`` (no loss at this step: the traces still advance).
    ``lam = (Re lam, Im lam)``, ``wnu``/``wth [N, 2]``: ``d lam / d nu_log``, ``d lam / d theta_log``."""
    dt = ev.dtype
    z = _EMPTY.get(dt)
    if z is None:
        z = _EMPTY[dt] = (torch.zeros(1, 2, dtype=dt).numpy(), torch.zeros(1, dtype=dt).numpy())
    z2, z1 = z
    use_g = g is not None
    gn = g.numpy() if use_g else ev[:0, :, :, 0].numpy()
    has_mat = em is not None
    emn = em.numpy() if has_mat else ev[:1, :1, :1, :1].numpy()
    Gs = [z1 if G is None else G.numpy() for G in G_vec]
    _lru_trace(prev.x_re.numpy(), prev.x_im.numpy(), new.x_re.numpy(), new.x_im.numpy(), x.numpy(), gn, use_g,
               lam[0].numpy(), lam[1].numpy(), gam.numpy(), z2 if wnu is None else wnu.numpy(),
               z2 if wth is None else wth.numpy(), cols, ev.numpy(), emn, has_mat, Gs[0], Gs[1], Gs[2],
               z2 if G_bre is None else G_bre.numpy(), z2 if G_bim is None else G_bim.numpy(),
               G_bre is not None, G_bim is not None)


_EMPTY: dict = {}

"""Compiled CPU kernels (numba) of the exact online learning of an LRU layer (Orvieto et al. 2023,
Sec. 3: ``h_t = lam h_{t-1} + gamma B u_t`` on (Re, Im) pairs): the whole stream-mode trace step
(:func:`lru_trace_step_numba`) and the passes of the chunked block (:func:`lru_block_scan_numba`,
:func:`lru_block_traces_numba`, :func:`lru_matrix_carry_numba`, :func:`lru_reverse_filter_numba`),
the RTRL recursions of :mod:`spikerec.hardware.online.traces_lru` (Zucchet et al. 2023, Sec. 3),
each tested against that torch form.
"""
from __future__ import annotations

import numpy as np
import torch

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False

from .. import neurons
from .trace_numba import as_numpy, placeholders

__all__ = ["lru_trace_step_numba", "lru_block_scan_numba", "lru_block_traces_numba", "lru_matrix_carry_numba",
           "lru_reverse_filter_numba", "lru_step_numba"]


# --- the whole trace step of one LRU layer ---------------------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _lru_mat_trace(em, x, lr, li, gam, g, Gr, Gi, do_re, do_im):  # pragma: no cover - compiled
        """The input-matrix trace ``s^B <- lam s^B + gamma x`` on (Re, Im) rows ``em [N, B, 2, H]``, then
        ``G_re += Re(conj(g) s)``, ``G_im += Re(conj(g) i s)`` (``Gr``/``Gi [N, H]``): one branch-free loop
        over contiguous rows per (n, b), which LLVM vectorises (the trace and both accumulations in
        one pass rather than three)."""
        N, B, _, H = em.shape
        for n in range(N):
            a, c, gm = lr[n], li[n], gam[n]
            Rn, In = Gr[n], Gi[n]
            for b in range(B):
                e0r, e1r, xr = em[n, b, 0], em[n, b, 1], x[b]
                q0, q1 = g[b, n, 0], g[b, n, 1]
                if do_re and do_im:
                    for h in range(H):
                        e0, e1 = e0r[h], e1r[h]
                        n0 = a * e0 - c * e1 + gm * xr[h]
                        n1 = c * e0 + a * e1
                        e0r[h] = n0
                        e1r[h] = n1
                        Rn[h] += q0 * n0 + q1 * n1
                        In[h] += q1 * n0 - q0 * n1
                else:
                    for h in range(H):
                        e0, e1 = e0r[h], e1r[h]
                        e0r[h] = a * e0 - c * e1 + gm * xr[h]
                        e1r[h] = c * e0 + a * e1
                    if do_re:
                        for h in range(H):
                            Rn[h] += q0 * e0r[h] + q1 * e1r[h]
                    if do_im:
                        for h in range(H):
                            In[h] += q1 * e0r[h] - q0 * e1r[h]

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _lru_trace(hr, hi, nr, ni, x, g, use_g, lr, li, gam, wnu, wth, cols, ev, em, has_mat, G_nu, G_th, G_ga,
                   G_bre, G_bim, has_bre, has_bim):  # pragma: no cover - compiled
        B, N = hr.shape
        H = x.shape[1]
        m = cols.shape[0]
        zero = ev.dtype.type(0)  # of the arrays' dtype (a float64 literal would promote float32 math)
        for n in range(N):
            a, c = lr[n], li[n]
            for b in range(B):
                p0, p1 = hr[b, n], hi[b, n]
                q0 = g[b, n, 0] if use_g else zero
                q1 = g[b, n, 1] if use_g else zero
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
            _lru_mat_trace(em, x, lr, li, gam, g, G_bre, G_bim, use_g and has_bre, use_g and has_bim)



def lru_trace_step_numba(prev, new, x, g, lam, gam, wnu, wth, cols, ev, em, G_vec, G_bre, G_bim):
    """The whole stream-mode trace step of one LRU layer (``full``/``snap1`` rule) in one pass,
    the recursions of :mod:`spikerec.hardware.online.traces_lru` on (Re, Im) pairs:

        eps^p <- lam eps^p + imm^p     for the stacked per-neuron traces ``ev [B, N, 2, m]``
                                       (``cols[j]``: 0 = ``nu_log``, 1 = ``theta_log``, 2 = ``gamma_log``)
        s^B   <- lam s^B + gamma x     for the input-matrix trace ``em [N, B, 2, H]`` (or ``None``)
        G     += sum_b g . eps         into ``G_vec`` (three ``[N]`` accumulators or ``None``, by
                                       ``cols`` kind), ``G_bre``, ``G_bim [N, H]`` (``None``: not traced)

    all in place; ``g [B, N, 2]`` or ``None`` (no loss at this step: the traces still advance).
    ``lam = (Re lam, Im lam)``, ``wnu``/``wth [N, 2]``: ``d lam / d nu_log``, ``d lam / d theta_log``."""
    z2, z1 = placeholders(ev.dtype)
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




# --- the chunked block of one LRU layer ------------------------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _lru_block_scan(u, lr, li, h0r, h0i, pr, pi, nr, ni):  # pragma: no cover - compiled
        """``h_k = lam h_{k-1} + u_k`` on (Re, Im) pairs over a block: ``u [K, B, 2N]`` (Re in
        columns ``:N``, Im in ``N:``), the state before the block ``h0r, h0i [B, N]``; writes the
        states before (``pr, pi``) and after (``nr, ni``) each step, ``[K, B, N]``."""
        K, B, _ = u.shape
        N = lr.shape[0]
        for b in range(B):
            for n in range(N):
                pr[0, b, n] = h0r[b, n]
                pi[0, b, n] = h0i[b, n]
        for k in range(K):
            for b in range(B):
                uk = u[k, b]
                p_r, p_i, o_r, o_i = pr[k, b], pi[k, b], nr[k, b], ni[k, b]
                for n in range(N):
                    a, c = lr[n], li[n]
                    x0, x1 = p_r[n], p_i[n]
                    o_r[n] = (a * x0 - c * x1) + uk[n]
                    o_i[n] = (a * x1 + c * x0) + uk[N + n]
                if k + 1 < K:
                    q_r, q_i = pr[k + 1, b], pi[k + 1, b]
                    for n in range(N):
                        q_r[n] = o_r[n]
                        q_i[n] = o_i[n]

    @_nb.njit(cache=True, nogil=True)
    def _lru_block_sums(pr, pi, nr, ni, gh, use_g, lr, li, PK, need_h, need_u, carry, S_h, S_u, Q_h,
                        Q_u):  # pragma: no cover - compiled
        """The per-neuron sums of :meth:`.traces_lru.LRUTrace.block_contract` in one pass over the
        block (complex numbers as (Re, Im) pairs; ``u_k = h_k - lam hp_k``):

            S_h[n] = sum_{k,b} conj(gh_k) hp_k,     S_u[n] = sum_{k,b} conj(gh_k) u_k     (with ``use_g``)
            Q_h[b, n] = sum_k PK_k hp_k,            Q_u[b, n] = sum_k PK_k u_k              (with ``carry``)

        ``pr, pi, nr, ni [K, B, N]`` the states before/after each step, ``gh [K, B, N, 2]`` the
        reverse-filtered error, ``PK [K, N, 2]`` the powers ``lam^(K-1-k)``; outputs (Re, Im)
        ``S_* [2, N]``, ``Q_* [2, B, N]`` (overwritten)."""
        K, B, N = pr.shape
        zero = pr.dtype.type(0)
        S_h[:] = zero
        S_u[:] = zero
        Q_h[:] = zero
        Q_u[:] = zero
        u0 = np.empty(N, dtype=pr.dtype)
        u1 = np.empty(N, dtype=pr.dtype)
        g0 = np.empty(N, dtype=pr.dtype)
        g1 = np.empty(N, dtype=pr.dtype)
        w0 = np.empty(N, dtype=pr.dtype)
        w1 = np.empty(N, dtype=pr.dtype)
        Sh0, Sh1, Su0, Su1 = S_h[0], S_h[1], S_u[0], S_u[1]
        # branch-free inner loops over the neurons on contiguous rows (the flags are tested once
        # per row; the interleaved (Re, Im) inputs are split into rows first)
        for k in range(K):
            if carry:
                for n in range(N):
                    w0[n] = PK[k, n, 0]
                    w1[n] = PK[k, n, 1]
            for b in range(B):
                p0, p1, h0, h1 = pr[k, b], pi[k, b], nr[k, b], ni[k, b]
                if need_u:
                    for n in range(N):
                        u0[n] = h0[n] - (lr[n] * p0[n] - li[n] * p1[n])
                        u1[n] = h1[n] - (lr[n] * p1[n] + li[n] * p0[n])
                if use_g:
                    for n in range(N):
                        g0[n] = gh[k, b, n, 0]
                        g1[n] = gh[k, b, n, 1]
                    if need_h:  # conj(g) p = g0 p0 + g1 p1 + i (g0 p1 - g1 p0)
                        for n in range(N):
                            Sh0[n] += g0[n] * p0[n] + g1[n] * p1[n]
                            Sh1[n] += g0[n] * p1[n] - g1[n] * p0[n]
                    if need_u:
                        for n in range(N):
                            Su0[n] += g0[n] * u0[n] + g1[n] * u1[n]
                            Su1[n] += g0[n] * u1[n] - g1[n] * u0[n]
                if carry:
                    if need_h:
                        Qh0, Qh1 = Q_h[0, b], Q_h[1, b]
                        for n in range(N):
                            Qh0[n] += w0[n] * p0[n] - w1[n] * p1[n]
                            Qh1[n] += w0[n] * p1[n] + w1[n] * p0[n]
                    if need_u:
                        Qu0, Qu1 = Q_u[0, b], Q_u[1, b]
                        for n in range(N):
                            Qu0[n] += w0[n] * u0[n] - w1[n] * u1[n]
                            Qu1[n] += w0[n] * u1[n] + w1[n] * u0[n]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _lru_matrix_carry(q, do_c, gam, Lr, Li, e, has_e, out, gh0, lr, li, do_b, do_s, bnd):  # pragma: no cover - compiled
        """One pass over the carried input-matrix trace ``e [N, B, 2, H]`` of an LRU block:

            gradient (``do_s``, ``do_b``):  bnd[n, 0] = gamma_n S[n, 0] + sum_b Re(z e[n, b]),
                                            bnd[n, 1] = gamma_n S[n, 1] - sum_b Im(z e[n, b]),
                                            z = lam_n conj(gh0[b, n])
            carry (``do_c``):               out[n, b] = gamma_n q[n, :, b] + lam_n^K e[n, b]

        on (Re, Im) rows. ``bnd [N, 2, H]`` holds the block's sums ``S = (Re gh, Im gh)^T X`` on
        entry with ``do_s`` (else they are taken as zero) and the gradient on exit; the boundary
        term needs ``do_b`` and ``has_e``. ``q [N, 2, B, H]`` is the GEMM ``sum_k lam^(K-1-k)
        x_k``, ``gh0 [B, N, 2]``. Each loop takes its bounds from the array it writes and indexes
        the arrays directly (no row views), so the compiler can tell the rows apart and vectorises
        it."""
        zero = out.dtype.type(0)
        if do_s or (do_b and has_e):
            N, _, H = bnd.shape
            for n in range(N):
                gm = gam[n]
                for f in range(2):
                    for h in range(H):
                        bnd[n, f, h] = gm * bnd[n, f, h] if do_s else zero
            if do_b and has_e:
                B = gh0.shape[0]
                for n in range(N):
                    for b in range(B):  # z = lam conj(g) = (lr g0 + li g1) + i (li g0 - lr g1)
                        g0, g1 = gh0[b, n, 0], gh0[b, n, 1]
                        zr = lr[n] * g0 + li[n] * g1
                        zi = li[n] * g0 - lr[n] * g1
                        for h in range(H):
                            bnd[n, 0, h] += zr * e[n, b, 0, h] - zi * e[n, b, 1, h]
                            bnd[n, 1, h] -= zi * e[n, b, 0, h] + zr * e[n, b, 1, h]
        if do_c:
            N, B, _, H = out.shape
            for n in range(N):
                gm, a, c = gam[n], Lr[n], Li[n]
                for b in range(B):
                    if has_e:
                        for h in range(H):
                            e0, e1 = e[n, b, 0, h], e[n, b, 1, h]
                            out[n, b, 0, h] = gm * q[n, 0, b, h] + (a * e0 - c * e1)
                            out[n, b, 1, h] = gm * q[n, 1, b, h] + (a * e1 + c * e0)
                    else:
                        for h in range(H):
                            out[n, b, 0, h] = gm * q[n, 0, b, h]
                            out[n, b, 1, h] = gm * q[n, 1, b, h]


def lru_matrix_carry_numba(q, gam, lamK, e, gh0, lr, li, S=None):
    """:func:`_lru_matrix_carry` on torch tensors: ``q [N, 2, B, H]`` or ``None`` (no carry),
    ``e [N, B, 2, H]`` or ``None`` (advanced in place with the carry), ``gh0 [B, N]`` complex or
    ``None`` (no boundary term), ``S [N, 2, H]`` the block's sums ``(Re gh, Im gh)^T X`` or
    ``None`` (overwritten with the gradient). Returns ``(new trace or None, gradient [N, 2, H]
    (``gamma S`` plus the boundary term) or None)``."""
    do_b = gh0 is not None and e is not None
    if q is None and not do_b and S is None:
        return None, None
    c = as_numpy
    en = None if e is None else c(e)
    # the trace is advanced in place (each element is read before it is written)
    if en is not None and e.is_contiguous() and not e.requires_grad:  # en is a view of e
        out, outn = e, en
    elif q is not None:
        N, _, B, H = q.shape
        outn = np.empty((N, B, 2, H), dtype=c(q).dtype)
        out = torch.from_numpy(outn)
    else:  # no carry: nothing is written there
        outn = np.empty((1, 1, 2, 1), dtype=(en if en is not None else c(S)).dtype)
        out = None
    N, H = (e.shape[0], e.shape[3]) if e is not None else (S.shape[0], S.shape[2]) if S is not None else (1, 1)
    if S is not None:
        bnd_t = S if S.is_contiguous() and not S.requires_grad else S.detach().contiguous()
        bnd = bnd_t.numpy()
    else:
        bnd = np.empty((N, 2, H) if do_b else (1, 2, 1), dtype=outn.dtype)
        bnd_t = torch.from_numpy(bnd)
    Lr, Li = lamK if isinstance(lamK, tuple) else (lamK.real, lamK.imag)
    _lru_matrix_carry(outn if q is None else c(q), q is not None, c(gam), c(Lr), c(Li),
                      outn if en is None else en, e is not None, outn,
                      c(torch.view_as_real(gh0)) if do_b else np.zeros((1, 1, 2), dtype=outn.dtype),
                      c(lr), c(li), do_b, S is not None, bnd)
    return (out if q is not None else None), (bnd_t if (do_b or S is not None) else None)


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _lru_block_tail(Sh, Su, Qh, Qu, gh0, use_g, do_b, lr, li, W, kinds, E, has_e, carry, Lr, Li, dG,
                        Eout):  # pragma: no cover - compiled
        """The per-neuron traces' part of an LRU block after its sums (:func:`_lru_block_sums`), for
        the trace columns ``kinds[j]`` (0 ``nu_log``, 1 ``theta_log`` with ``w = W[kind]``, 2
        ``gamma_log``), complex numbers as (Re, Im):

            dG[j, n]   = Re[w_n S_h[n]] (or Re S_u[n]) + sum_b Re[lam_n conj(gh0[b, n]) E[j, b, n]]   (``use_g``; the boundary with ``do_b``)
            Eout[j, b, n] = w_n Q_h[b, n] (or Q_u[b, n]) + lam_n^K E[j, b, n]                       (``carry``)"""
        m = kinds.shape[0]
        B, N = Qh.shape[1], Qh.shape[2]
        for j in range(m):
            kind = kinds[j]
            wk = W[min(kind, 1)]
            if use_g:
                d = dG[j]
                for n in range(N):
                    if kind == 2:
                        d[n] = Su[0, n]
                    else:
                        d[n] = wk[0, n] * Sh[0, n] - wk[1, n] * Sh[1, n]
                if do_b and has_e[j]:
                    for b in range(B):
                        for n in range(N):
                            g0, g1 = gh0[b, n, 0], gh0[b, n, 1]
                            zr = lr[n] * g0 + li[n] * g1
                            zi = li[n] * g0 - lr[n] * g1
                            d[n] += zr * E[j, b, n, 0] - zi * E[j, b, n, 1]
            if carry:
                for b in range(B):
                    for n in range(N):
                        if kind == 2:
                            q0, q1 = Qu[0, b, n], Qu[1, b, n]
                        else:
                            q0 = wk[0, n] * Qh[0, b, n] - wk[1, n] * Qh[1, b, n]
                            q1 = wk[0, n] * Qh[1, b, n] + wk[1, n] * Qh[0, b, n]
                        if has_e[j]:
                            e0, e1 = E[j, b, n, 0], E[j, b, n, 1]
                            q0 += Lr[n] * e0 - Li[n] * e1
                            q1 += Lr[n] * e1 + Li[n] * e0
                        Eout[j, b, n, 0] = q0
                        Eout[j, b, n, 1] = q1


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _lru_reverse_filter(G, lr, li, gh):  # pragma: no cover - compiled
        """``gh_k = g_k + conj(lam) gh_{k+1}`` on (Re, Im) pairs over a block, ``G, gh [K, B, N, 2]``
        (``gh_{K-1} = g_{K-1}``): the LRU's reverse filter ``gh_k = g_k + J^T gh_{k+1}``, where
        ``J^T`` multiplies by ``conj(lam)``."""
        K, B, N, _ = gh.shape
        for b in range(B):
            for n in range(N):
                gh[K - 1, b, n, 0] = G[K - 1, b, n, 0]
                gh[K - 1, b, n, 1] = G[K - 1, b, n, 1]
        for k in range(K - 2, -1, -1):
            for b in range(B):
                for n in range(N):
                    a, c = lr[n], li[n]
                    x0, x1 = gh[k + 1, b, n, 0], gh[k + 1, b, n, 1]
                    gh[k, b, n, 0] = G[k, b, n, 0] + (a * x0 + c * x1)
                    gh[k, b, n, 1] = G[k, b, n, 1] + (a * x1 - c * x0)


def lru_reverse_filter_numba(G, lr, li):
    """:func:`_lru_reverse_filter` on torch tensors: ``G [K, B, N, 2]``, ``lr``, ``li`` numpy or
    torch ``[N]``; returns ``gh [K, B, N, 2]``."""
    Gn = as_numpy(G)
    gh = np.empty(Gn.shape, dtype=Gn.dtype)
    _lru_reverse_filter(Gn, as_numpy(lr), as_numpy(li), gh)
    return torch.from_numpy(gh)


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _lru_block_traces(G, use_g, filt, gh, pr, pi, nr, ni, lr, li, PK, need_h, need_u, carry, S_h, S_u, Q_h, Q_u,
                          tail, W, kinds, E, has_e, do_b, Lr, Li, dG, Eout):  # pragma: no cover - compiled
        """The per-neuron part of an LRU block in one call: the reverse filter (``filt``:
        :func:`_lru_reverse_filter` of ``G`` into ``gh``; else ``gh`` is ``G``), then with ``tail``
        the block sums (:func:`_lru_block_sums`) and the traces' part (:func:`_lru_block_tail`),
        while the filtered error is still in cache."""
        if use_g and filt:
            _lru_reverse_filter(G, lr, li, gh)
        if tail:
            _lru_block_sums(pr, pi, nr, ni, gh, use_g, lr, li, PK, need_h, need_u, carry, S_h, S_u, Q_h, Q_u)
            _lru_block_tail(S_h, S_u, Q_h, Q_u, gh[0], use_g, do_b, lr, li, W, kinds, E, has_e, carry, Lr, Li, dG,
                            Eout)


_ALL_TRUE: dict[int, np.ndarray] = {}


def _all_true(m: int) -> np.ndarray:
    """A boolean array of ``m`` True values, made once per length (the kernels only read it)."""
    out = _ALL_TRUE.get(m)
    if out is None:
        out = _ALL_TRUE[m] = np.ones(m, dtype=np.bool_)
    return out


def lru_block_traces_numba(G, filt: bool, pr, pi, nr, ni, lr, li, PK, need_h: bool, need_u: bool, W, kinds, traces,
                           lamK):
    """:func:`_lru_block_traces` on torch tensors: ``G [K, B, N, 2]`` or ``None`` (no loss in the
    block), ``filt`` (the ``J``-rules: reverse-filter ``G``), the states before/after each step
    ``pr, pi, nr, ni [K, B, N]``, ``PK [K, N, 2]`` or ``None`` (no carry), ``kinds`` the traced
    per-neuron columns (``None``: none, no sums), ``traces`` their carried ``[B, N, 2]`` traces
    (or ``None`` each), or all of them as one ``[m, B, N, 2]`` tensor. Returns ``(gh [K, B, N, 2]
    or None, dG [m, N] or None, new traces [m, B, N, 2] or None)``."""
    c = as_numpy
    prn = c(pr)
    K, B, N = prn.shape
    npdt = prn.dtype
    use_g = G is not None
    Gn = c(G) if use_g else np.zeros((1, B, N, 2), dtype=npdt)
    gh = np.empty(Gn.shape, dtype=npdt) if (use_g and filt) else Gn
    tail = kinds is not None and len(kinds) > 0
    m = len(kinds) if tail else 0
    carry = PK is not None
    S = np.empty((2, 2, N), dtype=npdt)
    Q = np.empty((2, 2, B, N), dtype=npdt)
    any_e = tail
    if tail and isinstance(traces, torch.Tensor):  # all carried, as the rows of one array
        has = _all_true(m)
        E = c(traces)
    elif tail and all(t is not None for t in traces):
        has = _all_true(m)
        E = np.stack([c(t) for t in traces])
    else:
        has = np.array([t is not None for t in traces] if tail else [False], dtype=np.bool_)
        any_e = bool(has.any())
        E = np.zeros((max(m, 1), B, N, 2), dtype=npdt)
        for j, t in enumerate(traces if tail else []):
            if t is not None:
                E[j] = c(t)
    dG = np.empty((max(m, 1), N), dtype=npdt)
    Eout = np.empty((max(m, 1), B, N, 2), dtype=npdt)
    Lr, Li = lamK if isinstance(lamK, tuple) else (lamK.real, lamK.imag)
    _lru_block_traces(Gn, use_g, bool(filt), gh, prn, c(pi), c(nr), c(ni), c(lr), c(li),
                      c(PK) if carry else np.zeros((1, 1, 2), dtype=npdt), bool(need_h), bool(need_u), carry,
                      S[0], S[1], Q[0], Q[1], tail, c(W),
                      kinds if tail else np.zeros(1, dtype=np.int64), E, has, use_g and any_e, c(Lr), c(Li),
                      dG, Eout)
    return ((torch.from_numpy(gh) if use_g else None), (torch.from_numpy(dG) if (tail and use_g) else None),
            (torch.from_numpy(Eout) if (tail and carry) else None))


def lru_block_scan_numba(u, lr, li, h0r, h0i):
    """:func:`_lru_block_scan` on torch tensors: ``u [K, B, 2N]``; returns the states before and
    after each step, ``(pr, pi, nr, ni)``, each ``[K, B, N]``."""
    K, B, _ = u.shape
    N = lr.shape[0]
    c = as_numpy
    un = c(u)
    out = np.empty((4, K, B, N), dtype=un.dtype)
    _lru_block_scan(un, c(lr), c(li), c(h0r), c(h0i), out[0], out[1], out[2], out[3])
    return tuple(torch.from_numpy(out).unbind(0))


# --- the whole-stack stream step's forward and backward of one layer (whole_stack) ---------

if _HAVE_NUMBA:
    from .trace_numba import FASTMATH

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True, inline="always")
    def _skip_gemm(left, v, M, D, dvec, out):  # pragma: no cover - compiled
        """``out = [left | v] M`` with the LRU's skip matrix ``D`` in the last rows of ``M`` (``v``
        is copied into the last columns of ``left``); for a diagonal ``D [K, 1]``,
        ``out = left M + v diag(D)``."""
        B, W = left.shape
        if not dvec:
            off = W - v.shape[1]
            for b in range(B):
                for j in range(v.shape[1]):
                    left[b, off + j] = v[b, j]
        np.dot(left, M, out)
        if dvec:
            for b in range(B):
                for k in range(out.shape[1]):
                    out[b, k] += D[k, 0] * v[b, k]

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _lru_fwd(u, hr, hi, pr, pi, lr, li, Bg, Cs, D, dvec, w, hu, y):  # pragma: no cover - compiled
        """One LRU step in place: ``w = u Bg`` (one GEMM, ``Bg = [gamma B_re^T | gamma B_im^T]``),
        ``h = lam h + w`` on (Re, Im) pairs (the previous state kept in ``pr, pi``), then
        ``y = [Re h | Im h | u] Cs`` (one GEMM, ``Cs = [C_re^T; -C_im^T; D^T]``; a diagonal ``D``
        is added elementwise instead)."""
        B = u.shape[0]
        N = hr.shape[1]
        np.dot(u, Bg, w)
        for b in range(B):
            for n in range(N):
                p0, p1 = hr[b, n], hi[b, n]
                pr[b, n] = p0
                pi[b, n] = p1
                a = (lr[n] * p0 - li[n] * p1) + w[b, n]
                c = (lr[n] * p1 + li[n] * p0) + w[b, N + n]
                hr[b, n] = a
                hi[b, n] = c
                hu[b, n] = a
                hu[b, N + n] = c
        _skip_gemm(hu, u, Cs, D, dvec, y)


    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _lru_bwd(gy, use_g, u, hr, hi, pr, pi, Cst, D, dvec, Bs, gam, lr, li, dD, has_d, t, a, g, gu, need_gu,
                 wnu, wth, cols, ev, em, has_mat, G_nu, G_th, G_ga, G_bre, G_bim, has_bre, has_bim, dCr, has_cr, dCi,
                 has_ci):  # pragma: no cover - compiled
        """An LRU layer's spatial backward, then its trace step (:func:`spikerec.kernels.lru_online._lru_trace`):
        ``[g_re | g_im] = gy Cst`` (one GEMM, ``Cst = [C_re | -C_im]``), ``dD += gy u``,
        ``gu = [gamma g_re | gamma g_im | gy] Bs`` (one GEMM, ``Bs = [B_re; B_im; D]``; a diagonal
        ``D`` elementwise instead), ``dC_re += gy^T Re h``, ``dC_im -= gy^T Im h``."""
        B, H = u.shape
        N = hr.shape[1]
        K = gy.shape[1]
        if use_g and (has_cr or has_ci):
            for k in range(K):
                for b in range(B):
                    q = gy[b, k]
                    if has_cr:
                        for n in range(dCr.shape[1]):
                            dCr[k, n] += q * hr[b, n]
                    if has_ci:
                        for n in range(dCi.shape[1]):
                            dCi[k, n] -= q * hi[b, n]
        if use_g:
            np.dot(gy, Cst, t)
            for b in range(B):
                for n in range(N):
                    g[b, n, 0] = t[b, n]
                    g[b, n, 1] = t[b, N + n]
            if has_d:
                for k in range(K):
                    for b in range(B):
                        q = gy[b, k]
                        if dvec:
                            dD[k, 0] += q * u[b, k]
                        else:
                            row = dD[k]
                            for h in range(H):
                                row[h] += q * u[b, h]
            if need_gu:
                for b in range(B):
                    for n in range(N):
                        a[b, n] = gam[n] * t[b, n]
                        a[b, N + n] = gam[n] * t[b, N + n]
                _skip_gemm(a, gy, Bs, D, dvec, gu)
        _lru_trace(pr, pi, hr, hi, u, g, use_g, lr, li, gam, wnu, wth, cols, ev, em, has_mat, G_nu, G_th, G_ga,
                   G_bre, G_bim, has_bre, has_bim)


neurons.register_backend("lru", "kernels.lru_online (compiled trace step of online learning)", lru_trace_step_numba,
                         test="tests/test_online_partials.py::test_compiled_lru_trace_step_equals_derived_partials")


def lru_step_numba(params, state, x_t, options=None):
    """One LRU step (:func:`spikerec.neurons.lru.step` in float arithmetic) by the compiled forward
    of the whole-stack stream step (``_lru_fwd``); returns ``(y_t, LRUState(Re h_t, Im h_t))`` as new
    tensors."""
    from ..neurons import lru as _lru

    dt = state.x_re.dtype
    as_np = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    B, N = state.x_re.shape
    lr, li = _lru.lam_parts(params)
    g = _lru.gamma(params)[:, None]
    Bg = torch.cat([(params.B_re * g).t(), (params.B_im * g).t()], 1)  # [H, 2N]
    dvec = params.D.dim() == 1
    Dm = params.D.reshape(-1, 1) if dvec else params.D
    Cs = torch.cat([params.C_re.t(), -params.C_im.t()] + ([] if dvec else [Dm.t()]))
    hr, hi = state.x_re.detach().clone().contiguous(), state.x_im.detach().clone().contiguous()
    pr, pi = np.empty((B, N), as_np(hr).dtype), np.empty((B, N), as_np(hr).dtype)
    w = np.empty((B, 2 * N), pr.dtype)
    hu = np.empty((B, Cs.shape[0]), pr.dtype)
    y = np.empty((B, Cs.shape[1]), pr.dtype)
    _lru_fwd(as_np(x_t), hr.numpy(), hi.numpy(), pr, pi, as_np(lr.expand(N)), as_np(li.expand(N)), as_np(Bg),
             as_np(Cs), as_np(Dm), dvec, w, hu, y)
    return torch.from_numpy(y), _lru.LRUState(hr, hi)


neurons.register_backend("lru", "kernels.lru_online (compiled forward of the online stream step)", lru_step_numba,
                         test="tests/test_online_partials.py::test_compiled_forward_steps_equal_the_neuron_steps")

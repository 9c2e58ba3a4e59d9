"""Compiled CPU kernels (numba) of the online learner: the matrix eligibility trace of one layer,
the whole trace step of an LRU or ALIF layer (stream mode; the ALIF matrix traces also as one
pass over several buffered steps, ``_mat_nest_steps``, for the whole-stack step), and the passes
of the LRU and ALIF chunked blocks (``*_block_*``, ``*_matrix_carry_*``), each beside the torch
form it is tested against.

The matrix trace: the same operation as :mod:`.triton_kernels` (and its torch reference
:func:`.triton_kernels.mat_trace_step_torch`), for every neuron ``n`` and presynaptic input ``h``
with ``k`` in {1, 2} state fields per neuron::

    eps[n, b, :, h] <- J[b, n] eps[n, b, :, h] + c[b, n, :] x[b, h]          (trace advance)
    G_r[n, h]        = sum_b sum_f g_r[b, n, f] eps[n, b, f, h]              (contraction)

fused in one pass over ``eps`` (read once, written once), parallel over neurons. Used for CPU
float32/float64 tensors when numba is installed (``pip install 'spikerec[fast]'``); other cases
fall back to the torch path.
"""
from __future__ import annotations

import numpy as np
import torch

from ...kernels import numpy_dtype
from ...kernels.lif_sequence_numba import surrogate_code
from ...surrogate import heaviside

__all__ = ["numba_available", "compiled_cpu", "compiled_dtype", "mat_trace_step_numba", "lru_trace_step_numba",
           "alif_trace_step_numba", "alif_block_numba", "alif_matrix_carry_numba", "lru_block_scan_numba", "lru_block_traces_numba",
           "lru_matrix_carry_numba", "alif_spatial_numba", "lru_reverse_filter_numba",
           "lif_block_mat_numba", "lif_block_workspace", "lif_spatial_numba"]

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False


def numba_available() -> bool:
    return _HAVE_NUMBA


COMPILED_DTYPES = (torch.float32, torch.float64)


def compiled_cpu(*tensors) -> bool:
    """Whether the compiled kernels apply to ``tensors``: numba installed, every tensor on the CPU
    in float32 or float64 (the one test behind each compiled path's choice)."""
    if not _HAVE_NUMBA:
        return False
    for t in tensors:
        if not t.is_cpu or t.dtype not in COMPILED_DTYPES:
            return False
    return True


def compiled_dtype(dtype, device) -> bool:
    """:func:`compiled_cpu` for a dtype and device not yet held in a tensor."""
    return _HAVE_NUMBA and torch.device(device).type == "cpu" and dtype in COMPILED_DTYPES


if _HAVE_NUMBA:
    from ...kernels.lif_sequence_numba_kernels import sd_consts, sd_typed

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_trace(eps, J, c, x, g1, g2, G1, G2, use_g, two):  # pragma: no cover - compiled
        N, B, k, H = eps.shape
        zero = eps.dtype.type(0)  # constants of the arrays' dtype (a float64 literal would promote float32 math)
        for n in range(N):
            for h in range(H):
                G1[n, h] = 0.0
                G2[n, h] = 0.0
            for b in range(B):
                jb = b if J.shape[0] > 1 else 0
                if k == 1:
                    j00 = J[jb, n, 0, 0]
                    c0 = c[b, n, 0]
                    q = g1[b, n, 0] if use_g else zero
                    r = g2[b, n, 0] if two else zero
                    for h in range(H):
                        e = j00 * eps[n, b, 0, h] + c0 * x[b, h]
                        eps[n, b, 0, h] = e
                        G1[n, h] += q * e
                        G2[n, h] += r * e
                else:
                    j00, j01, j10, j11 = J[jb, n, 0, 0], J[jb, n, 0, 1], J[jb, n, 1, 0], J[jb, n, 1, 1]
                    c0, c1 = c[b, n, 0], c[b, n, 1]
                    q0 = g1[b, n, 0] if use_g else zero
                    q1 = g1[b, n, 1] if use_g else zero
                    r0 = g2[b, n, 0] if two else zero
                    r1 = g2[b, n, 1] if two else zero
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
    if (not compiled_cpu(eps) or k not in (1, 2) or len(gs) > 2 or not eps.is_contiguous()
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


def _arr(t):
    """A numpy view of ``t`` (a torch tensor, made contiguous; a numpy array as it is: the
    callers pass per-sequence constants already converted). The common case, a contiguous tensor
    without autograd, skips the ``detach``/``contiguous`` calls."""
    if isinstance(t, np.ndarray):
        return t
    if not t.requires_grad and t.is_contiguous():
        return t.numpy()
    return t.detach().contiguous().numpy()


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


# --- the whole trace step of one ALIF layer --------------------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_nest(em, pre, Jc, g, G, use_g):  # pragma: no cover - compiled
        """A matrix trace ``eps[n, b] <- J[n, b] eps[n, b] + (pre[b], 0)`` (``em [N, B, 2, H]``,
        ``Jc [N, B, 4]`` the 2x2 Jacobians) and ``G[n] += sum_b g[b, n] . eps[n, b]``: one step of
        :func:`_mat_nest_steps`."""
        use = np.empty(1, dtype=np.bool_)
        use[0] = use_g
        B, H = pre.shape
        N = Jc.shape[0]
        if use_g:
            gs = np.ascontiguousarray(g).reshape((1, B, N, 2))
        else:  # (g may be a placeholder)
            gs = np.zeros((1, B, N, 2), dtype=em.dtype)
        _mat_nest_steps(em, np.ascontiguousarray(pre).reshape((1, B, H)),
                        np.ascontiguousarray(Jc).reshape((1, N, B, 4)), gs, use, G, 1)

    @_nb.njit(cache=True, fastmath=False, nogil=True, inline="always")
    def _alif_partials(v, a, ps, z, alpha, rho, omr, bb, beta, rd, has_rd, detach_reset, zero):
        """The partials of :meth:`.traces_lif.ALIFTrace.partials` for one neuron and sample, from
        ``v_{t-1}, a_{t-1}``, the surrogate derivative ``ps`` and the spike ``z`` of that state:
        ``(dv_v, dv_a, da_v, da_a, dv_b, da_b, dv_beta, da_beta, da_rho, dR_rho)`` (the 2 x 2
        Jacobian of ``(v, a)``, the immediate partials of ``b`` and ``beta``, of ``rho``, and the
        reset's ``d / d rho`` without ``detach_reset``)."""
        dz_a, dz_beta = -beta * ps, -a * ps
        da_v, da_a, da_b, da_beta = omr * ps, omr * dz_a + rho, -(omr * ps), omr * dz_beta
        da_rho = a - z
        dR_rho = zero
        if detach_reset:
            if has_rd:
                dv_v = rd * ps + alpha
                dv_a, dv_b, dv_beta = rd * dz_a, -(rd * ps), rd * dz_beta
            else:
                dv_v, dv_a, dv_b, dv_beta = alpha, zero, zero, zero
        else:
            a1 = rho * a + omr * z
            theta = bb + beta * a1
            dR_v = theta * ps + z * (beta * da_v)
            dR_a = theta * dz_a + z * (beta * da_a)
            dR_b = -(theta * ps) + z * (beta * da_b + 1.0)
            dR_beta = theta * dz_beta + z * (beta * da_beta + a1)
            dR_rho = z * (beta * da_rho)
            if has_rd:
                dv_v = (rd * ps - dR_v) + alpha
                dv_a, dv_b, dv_beta = rd * dz_a - dR_a, -(rd * ps) - dR_b, rd * dz_beta - dR_beta
            else:
                dv_v, dv_a, dv_b, dv_beta = alpha - dR_v, -dR_a, -dR_b, -dR_beta
        return dv_v, dv_a, da_v, da_a, dv_b, da_b, dv_beta, da_beta, da_rho, dR_rho

    @_nb.njit(cache=True, fastmath=False, nogil=True, inline="always")
    def _alif_imm(kind, v, dalpha, drho, dv_b, da_b, dv_beta, da_beta, da_rho, dR_rho, zero, one):
        """The immediate partial ``(d v_t, d a_t)`` of per-neuron parameter ``kind`` (0
        ``log_tau_mem``, 1 ``log_tau_adapt``, 2 ``b``, 3 ``beta``, 4 ``bias``)."""
        if kind == 0:
            return v * dalpha, zero
        if kind == 1:
            return -dR_rho * drho, da_rho * drho
        if kind == 2:
            return dv_b, da_b
        if kind == 3:
            return dv_beta, da_beta
        return one, zero

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _alif_vec_step(v0, a0, psi, zp, g, use_g, cn, cols, ev, G_vec, Rd, has_rd, detach_reset,
                       Jc):  # pragma: no cover - compiled
        """The per-neuron part of one ALIF trace step: the partials, the stacked per-neuron traces
        ``ev [B, N, 2, m]`` and their contraction into ``G_vec``; writes the 2x2 Jacobians into
        ``Jc [N, B, 4]`` for the matrix traces (:func:`_mat_nest`)."""
        B, N = v0.shape
        m = cols.shape[0]
        zero, one = ev.dtype.type(0), ev.dtype.type(1)  # of the arrays' dtype (no float64 promotion)
        for n in range(N):
            alpha, dalpha, rho, drho, omr, bb, beta = cn[0, n], cn[1, n], cn[2, n], cn[3, n], cn[4, n], cn[5, n], cn[6, n]
            rd = Rd[n] if has_rd else zero
            for b in range(B):
                v, a, ps, z = v0[b, n], a0[b, n], psi[b, n], zp[b, n]
                dv_v, dv_a, da_v, da_a, dv_b, da_b, dv_beta, da_beta, da_rho, dR_rho = _alif_partials(
                    v, a, ps, z, alpha, rho, omr, bb, beta, rd, has_rd, detach_reset, zero)
                q0 = g[b, n, 0] if use_g else zero
                q1 = g[b, n, 1] if use_g else zero
                for j in range(m):
                    kind = cols[j]
                    i0, i1 = _alif_imm(kind, v, dalpha, drho, dv_b, da_b, dv_beta, da_beta, da_rho, dR_rho, zero, one)
                    e0, e1 = ev[b, n, 0, j], ev[b, n, 1, j]
                    f0 = dv_v * e0 + dv_a * e1 + i0
                    f1 = da_v * e0 + da_a * e1 + i1
                    ev[b, n, 0, j] = f0
                    ev[b, n, 1, j] = f1
                    if use_g:
                        G_vec[kind, n] += q0 * f0 + q1 * f1
                Jc[n, b, 0], Jc[n, b, 1], Jc[n, b, 2], Jc[n, b, 3] = dv_v, dv_a, da_v, da_a

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _alif_trace(v0, a0, psi, zp, x, g, use_g, cn, cols, ev, ew, er, has_w, has_r, G_vec, G_w, G_r, Rd, has_rd,
                    detach_reset):  # pragma: no cover - compiled
        """One ALIF trace step (:func:`alif_trace_step_numba`): :func:`_alif_vec_step`, then the
        input and lateral matrix traces (:func:`_mat_nest`)."""
        B, N = v0.shape
        Jc = np.empty((N, B, 4), dtype=ev.dtype)  # the 2x2 Jacobians, for the matrix traces
        _alif_vec_step(v0, a0, psi, zp, g, use_g, cn, cols, ev, G_vec, Rd, has_rd, detach_reset, Jc)
        if has_w:
            _mat_nest(ew, x, Jc, g, G_w, use_g)
        if has_r:
            _mat_nest(er, zp, Jc, g, G_r, use_g)

    @_nb.njit(cache=True, fastmath=False, nogil=True)
    def _mat_nest_steps(em, pres, Jcs, gs, use_gs, G, S):  # pragma: no cover - compiled
        """``S`` steps of the matrix trace ``eps[n, b] <- J_s[n, b] eps[n, b] + (pre_s[b], 0)`` and
        ``G[n] += sum_b g_s[b, n] . eps[n, b]`` in one pass over ``em [N, B, 2, H]`` (``pres [S, B,
        H]``, ``Jcs [S, N, B, 4]`` the 2x2 Jacobians, ``gs [S, B, N, 2]``, ``use_gs [S]``; no
        accumulation where ``use_gs[s]`` is false). Each neuron's rows stay in cache for all ``S``
        steps, so the trace is read and written once instead of ``S`` times; every element and
        every accumulator sees the same operations in the same order as ``S`` passes of one step
        (bit-identical). The inner loops run over contiguous rows without branches, index the trace
        directly and add into a local copy of the neuron's accumulator row (so the compiler can tell
        the rows apart and vectorise them)."""
        N, B, _, H = em.shape
        acc = np.empty(H, dtype=G.dtype)  # the neuron's accumulator row, kept apart from the trace
        for n in range(N):
            for h in range(H):
                acc[h] = G[n, h]
            for s in range(S):
                use_g = use_gs[s]
                for b in range(B):
                    j00, j01, j10, j11 = Jcs[s, n, b, 0], Jcs[s, n, b, 1], Jcs[s, n, b, 2], Jcs[s, n, b, 3]
                    if use_g:
                        q0, q1 = gs[s, b, n, 0], gs[s, b, n, 1]
                        for h in range(H):
                            e0, e1 = em[n, b, 0, h], em[n, b, 1, h]
                            f0 = j00 * e0 + j01 * e1 + pres[s, b, h]
                            f1 = j10 * e0 + j11 * e1
                            em[n, b, 0, h] = f0
                            em[n, b, 1, h] = f1
                            acc[h] += q0 * f0 + q1 * f1
                    else:
                        for h in range(H):
                            e0, e1 = em[n, b, 0, h], em[n, b, 1, h]
                            em[n, b, 0, h] = j00 * e0 + j01 * e1 + pres[s, b, h]
                            em[n, b, 1, h] = j10 * e0 + j11 * e1
            for h in range(H):
                G[n, h] = acc[h]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _alif_part(i, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, k, r):  # pragma: no cover - compiled
        """Partial ``i`` of :func:`_alif_partials` at row ``(k, r)`` of a block's planar ``[K, B*N]``
        states (the other partials are dead code after inlining)."""
        return _alif_partials(v0[k, r], a0[k, r], psi[k, r], zp[k, r], cx[0, r], cx[2, r], cx[4, r], cx[5, r],
                              cx[6, r], rdx[r], has_rd, detach_reset, zero)[i]

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _alif_imm_at(c, kind, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, k, r):  # pragma: no cover
        """Row ``c`` (0: ``v``, 1: ``a``) of the immediate partial of column ``kind``
        (:func:`_alif_imm`) at row ``(k, r)``."""
        p = _alif_partials(v0[k, r], a0[k, r], psi[k, r], zp[k, r], cx[0, r], cx[2, r], cx[4, r], cx[5, r],
                           cx[6, r], rdx[r], has_rd, detach_reset, zero)
        return _alif_imm(kind, v0[k, r], cx[1, r], cx[3, r], p[4], p[5], p[6], p[7], p[8], p[9], zero, one)[c]

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _alif_block_imm(kind, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, i0, i1):  # pragma: no cover - compiled
        """The immediate partials ``(i0, i1) [K, B*N]`` of column ``kind`` over a block, one loop per
        row with the kind fixed outside it (a switch inside kept the loops scalar: 28 % of the
        block)."""
        K = i0.shape[0]
        zero, one = i0.dtype.type(0), i0.dtype.type(1)
        if kind == 4:  # bias: (1, 0)
            for k in range(K):
                for r in range(i0.shape[1]):
                    i0[k, r] = one
                for r in range(i1.shape[1]):
                    i1[k, r] = zero
        elif kind == 0:
            _alif_block_imm_of(0, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, i0, i1)
        elif kind == 1:
            _alif_block_imm_of(1, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, i0, i1)
        elif kind == 2:
            _alif_block_imm_of(2, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, i0, i1)
        else:
            _alif_block_imm_of(3, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, i0, i1)

    @_nb.njit(cache=True, nogil=True, inline="always", error_model="numpy")
    def _alif_block_imm_of(kind, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, i0, i1):  # pragma: no cover
        """:func:`_alif_block_imm` for a literal ``kind`` (inlined per call site, so each copy has
        the kind as a constant)."""
        for k in range(i0.shape[0]):
            for r in range(i0.shape[1]):
                i0[k, r] = _alif_imm_at(0, kind, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, k, r)
            for r in range(i1.shape[1]):
                i1[k, r] = _alif_imm_at(1, kind, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, one, k, r)

    @_nb.njit(cache=True, nogil=True)
    def _alif_carry_step(J00, J01, J10, J11, i0, i1, k, h0, h1, t0, t1):  # pragma: no cover - compiled
        """``t = J_k h + imm_k`` on ``[B*N]`` rows, one loop per written row."""
        for r in range(t0.shape[0]):
            t0[r] = J00[k, r] * h0[r] + J01[k, r] * h1[r] + i0[k, r]
        for r in range(t1.shape[0]):
            t1[r] = J10[k, r] * h0[r] + J11[k, r] * h1[r] + i1[k, r]

    @_nb.njit(cache=True, nogil=True)
    def _alif_block_carry(J00, J01, J10, J11, i0, i1, h0, h1, t0, t1):  # pragma: no cover - compiled
        """``h <- J_k h + imm_k`` over a block's steps on ``[B*N]`` rows ``h0, h1`` (``t0, t1``:
        scratch); two steps per round, h -> t -> h, so no array reference is swapped."""
        K = J00.shape[0]
        for k in range(0, K - 1, 2):
            _alif_carry_step(J00, J01, J10, J11, i0, i1, k, h0, h1, t0, t1)
            _alif_carry_step(J00, J01, J10, J11, i0, i1, k + 1, t0, t1, h0, h1)
        if K % 2 == 1:
            _alif_carry_step(J00, J01, J10, J11, i0, i1, K - 1, h0, h1, t0, t1)
            h0[:] = t0
            h1[:] = t1

    @_nb.njit(cache=True, nogil=True)
    def _alif_phi_step(J00, J01, J10, J11, k, P0, a00, a01, a10, a11, o00, o01, o10, o11):  # pragma: no cover
        """The first column of ``a = Phi_{K-1,k}`` into ``P0[:, k]``, then ``o = a J_k``, on
        ``[B*N]`` rows, one loop per written row."""
        N = P0.shape[3]
        for b in range(P0.shape[0]):
            for n in range(P0.shape[3]):
                P0[b, k, 0, n] = a00[b * N + n]
            for n in range(P0.shape[3]):
                P0[b, k, 1, n] = a10[b * N + n]
        for r in range(o00.shape[0]):
            o00[r] = a00[r] * J00[k, r] + a01[r] * J10[k, r]
        for r in range(o01.shape[0]):
            o01[r] = a00[r] * J01[k, r] + a01[r] * J11[k, r]
        for r in range(o10.shape[0]):
            o10[r] = a10[r] * J00[k, r] + a11[r] * J10[k, r]
        for r in range(o11.shape[0]):
            o11[r] = a10[r] * J01[k, r] + a11[r] * J11[k, r]

    @_nb.njit(cache=True, nogil=True)
    def _alif_block_phi(J00, J01, J10, J11, P0, q00, q01, q10, q11, u00, u01, u10, u11):  # pragma: no cover - compiled
        """``Phi_{K-1,k} = J_{K-1} ... J_{k+1}`` from the right on ``[B*N]`` rows (``q`` starts as
        the identity and ends as ``Phi_{K-1,-1}``), its first column into ``P0 [B, K, 2, N]``; two
        steps per round, q -> u -> q, so no array reference is swapped."""
        K = J00.shape[0]
        for k in range(K - 1, 0, -2):
            _alif_phi_step(J00, J01, J10, J11, k, P0, q00, q01, q10, q11, u00, u01, u10, u11)
            _alif_phi_step(J00, J01, J10, J11, k - 1, P0, u00, u01, u10, u11, q00, q01, q10, q11)
        if K % 2 == 1:
            _alif_phi_step(J00, J01, J10, J11, 0, P0, q00, q01, q10, q11, u00, u01, u10, u11)
            q00[:] = u00
            q01[:] = u01
            q10[:] = u10
            q11[:] = u11

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _alif_block(v0_, a0_, psi_, zp_, sur, p1, p2, cn, cols, Rd, has_rd, detach_reset, G_, use_g, carry, ev_in,
                    has_ev, GHv_, P0, Phi, Gvec, b0, ev_out):  # pragma: no cover - compiled
        """The chunked block of one ALIF layer (``full``/``snap1``) for every sample and neuron:
        the previous spikes ``zp = H(u)`` and their surrogate derivative ``psi`` at
        ``u = v - (b + beta a)`` (written here when the surrogate has an inline form, ``sur != 0``;
        else ``psi`` and ``zp`` are inputs), the 2x2 Jacobians of each step (:func:`_alif_partials`),
        the reverse filter ``gh_k = g_k + J_{k+1}^T gh_{k+1}`` (its ``v`` row into ``GHv [K, B, N]``,
        the operand of the weights' GEMM), per traced column ``j`` its immediate partials
        (:func:`_alif_imm`), the contraction ``Gvec[j, n] += sum_{k,b} gh_k . imm_k`` plus the
        boundary term with the carried traces (``b0 = J_0^T gh_0``) and the advanced carried trace
        ``ev_out``, and for the matrix traces' carry the first columns ``P0 [B, K, 2, N]`` of
        ``Phi_{K-1,k} = J_{K-1} ... J_{k+1}`` and ``Phi = Phi_{K-1,-1}``.

        All samples at once on planar ``[K, B*N]`` rows, in passes that each write one array
        indexed directly with its own bounds, so the compiler vectorises every pass (one fused
        loop per sample writing ten partials stays scalar)."""
        K, B, N = v0_.shape
        R = B * N
        m = cols.shape[0]
        dt = v0_.dtype
        zero, one = dt.type(0), dt.type(1)
        v0, a0, psi, zp = v0_.reshape(K, R), a0_.reshape(K, R), psi_.reshape(K, R), zp_.reshape(K, R)
        G = G_.reshape(K, R, 2) if use_g else G_.reshape(1, G_.size // 2, 2)
        GHv = GHv_.reshape(K, R)
        cx = np.empty((7, R), dtype=dt)  # the per-neuron constants repeated per sample
        for c in range(7):
            for b in range(B):
                for n in range(N):
                    cx[c, b * N + n] = cn[c, n]
        rdx = np.zeros(R, dtype=dt)
        if has_rd:
            for b in range(B):
                for n in range(N):
                    rdx[b * N + n] = Rd[n]
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2 = dt.type(s1), dt.type(s2)  # the surrogate in the states' dtype (vectorised)
        if sur != 0:
            for k in range(K):
                for r in range(psi.shape[1]):
                    psi[k, r] = sd_typed(v0[k, r] - (cx[5, r] + cx[6, r] * a0[k, r]), sur, sg1, sg2, one)
                for r in range(zp.shape[1]):
                    zp[k, r] = one if v0[k, r] - (cx[5, r] + cx[6, r] * a0[k, r]) > zero else zero
        J00, J01, J10, J11 = np.empty((K, R), dt), np.empty((K, R), dt), np.empty((K, R), dt), np.empty((K, R), dt)
        for k in range(K):
            for r in range(J00.shape[1]):
                J00[k, r] = _alif_part(0, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, k, r)
            for r in range(J01.shape[1]):
                J01[k, r] = _alif_part(1, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, k, r)
            for r in range(J10.shape[1]):
                J10[k, r] = _alif_part(2, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, k, r)
            for r in range(J11.shape[1]):
                J11[k, r] = _alif_part(3, v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, zero, k, r)
        gp1 = np.empty((K, R), dt)  # the reverse-filtered error: its v row in GHv, its a row here
        if use_g:
            g1 = np.empty((K, R), dt)  # the a row of G, planar
            for k in range(K):
                for r in range(GHv.shape[1]):
                    GHv[k, r] = G[k, r, 0]
                for r in range(g1.shape[1]):
                    g1[k, r] = G[k, r, 1]
            for r in range(gp1.shape[1]):
                gp1[K - 1, r] = g1[K - 1, r]
            for k in range(K - 2, -1, -1):
                for r in range(GHv.shape[1]):
                    GHv[k, r] = GHv[k, r] + (J00[k + 1, r] * GHv[k + 1, r] + J10[k + 1, r] * gp1[k + 1, r])
                for r in range(gp1.shape[1]):
                    gp1[k, r] = g1[k, r] + (J01[k + 1, r] * GHv[k + 1, r] + J11[k + 1, r] * gp1[k + 1, r])
        i0, i1 = np.empty((K, R), dt), np.empty((K, R), dt)
        acc = np.empty(R, dtype=np.float64)
        h0, h1, t0, t1 = np.empty(R, dt), np.empty(R, dt), np.empty(R, dt), np.empty(R, dt)
        for j in range(m):  # one column at a time: its immediate partials, its sums, its carry
            _alif_block_imm(cols[j], v0, a0, psi, zp, cx, rdx, has_rd, detach_reset, i0, i1)
            if use_g:
                for r in range(acc.shape[0]):
                    acc[r] = 0.0
                for k in range(K):
                    for r in range(acc.shape[0]):
                        acc[r] += GHv[k, r] * i0[k, r] + gp1[k, r] * i1[k, r]
                for b in range(B):
                    for n in range(N):
                        Gvec[j, n] += acc[b * N + n]
            if carry:
                for b in range(B):
                    for n in range(N):
                        h0[b * N + n] = ev_in[j, b, n, 0] if has_ev else zero
                        h1[b * N + n] = ev_in[j, b, n, 1] if has_ev else zero
                _alif_block_carry(J00, J01, J10, J11, i0, i1, h0, h1, t0, t1)
                for b in range(B):
                    for n in range(N):
                        ev_out[j, b, n, 0], ev_out[j, b, n, 1] = h0[b * N + n], h1[b * N + n]
        if use_g:
            for b in range(B):
                for n in range(N):
                    r = b * N + n
                    g0, g1_ = GHv[0, r], gp1[0, r]
                    c0, c1 = J00[0, r] * g0 + J10[0, r] * g1_, J01[0, r] * g0 + J11[0, r] * g1_
                    b0[b, n, 0], b0[b, n, 1] = c0, c1
                    if has_ev:
                        for j in range(m):
                            Gvec[j, n] += c0 * ev_in[j, b, n, 0] + c1 * ev_in[j, b, n, 1]
        if carry:
            q00, q01, q10, q11 = np.ones(R, dt), np.zeros(R, dt), np.zeros(R, dt), np.ones(R, dt)
            u00, u01, u10, u11 = np.empty(R, dt), np.empty(R, dt), np.empty(R, dt), np.empty(R, dt)
            _alif_block_phi(J00, J01, J10, J11, P0, q00, q01, q10, q11, u00, u01, u10, u11)
            for b in range(B):
                for n in range(N):
                    r = b * N + n
                    Phi[b, n, 0], Phi[b, n, 1], Phi[b, n, 2], Phi[b, n, 3] = q00[r], q01[r], q10[r], q11[r]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _alif_spatial_error(gout, v, a, bb, beta, sur, sg1, sg2, one, gp, gl, r):  # pragma: no cover - compiled
        """Row ``r`` of the spatial backward of an ALIF layer's spikes ``z = H(v - b - beta a)``:
        ``gp = gout sigma'(v - (b + beta a))`` and the error on ``(v, a)``, ``gl = (gp, -beta gp)``
        (one written array per loop, with its own bounds; the surrogate's constants ``sg1, sg2, one``
        of :func:`sd_typed` in the arrays' dtype: vectorised in a caller compiled with
        ``error_model="numpy"``)."""
        for n in range(gp.shape[1]):
            gp[r, n] = gout[r, n] * sd_typed(v[r, n] - (bb[n] + beta[n] * a[r, n]), sur, sg1, sg2, one)
        for n in range(gl.shape[1]):
            gl[r, n, 0] = gp[r, n]
            gl[r, n, 1] = -beta[n] * gp[r, n]

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _alif_spatial(gout, v, a, bb, beta, sur, p1, p2, gp, gl, sums):  # pragma: no cover - compiled
        """:func:`_alif_spatial_error` over ``[rows, N]`` and the per-neuron sums ``sums[0] = sum
        gp``, ``sums[1] = sum gp a`` in float64."""
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2, one = gp.dtype.type(s1), gp.dtype.type(s2), gp.dtype.type(1)
        for r in range(v.shape[0]):
            _alif_spatial_error(gout, v, a, bb, beta, sur, sg1, sg2, one, gp, gl, r)
            for n in range(sums.shape[1]):
                sums[0, n] += gp[r, n]
                sums[1, n] += gp[r, n] * a[r, n]


def alif_spatial_numba(gout, v, a, bb, beta, sur):
    """:func:`_alif_spatial` on torch tensors (``[rows, N]``; ``bb``, ``beta`` ``[N]``) for a
    surrogate with an inline form; returns ``(gp, gl [rows, N, 2], sum gp, sum gp a)`` or ``None``
    (another surrogate: the caller uses torch)."""
    code, p1, p2 = surrogate_code(sur)
    if not code:
        return None
    R, N = v.shape
    c = _arr
    vn = c(v)
    gp = np.empty((R, N), dtype=vn.dtype)
    gl = np.empty((R, N, 2), dtype=vn.dtype)
    sums = np.zeros((2, N), dtype=np.float64)
    _alif_spatial(c(gout), vn, c(a), c(bb.expand(N)), c(beta.expand(N)), code, p1, p2, gp, gl, sums)
    s = torch.from_numpy(sums.astype(vn.dtype))
    return torch.from_numpy(gp), torch.from_numpy(gl), s[0], s[1]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_spatial(gout, v, thr, sur, p1, p2, gp, want_sum, sums):  # pragma: no cover - compiled
        """The spatial backward of a plain LIF layer's spikes ``z = H(v - thr)`` over ``[rows, N]``:
        ``gp = gout sigma'(v - thr)`` (the surrogate inline, the loop vectorised) and, with
        ``want_sum``, ``sums[n] = sum_rows gp`` in float64 (the threshold's gradient is minus it)."""
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2, one = gp.dtype.type(s1), gp.dtype.type(s2), gp.dtype.type(1)
        for r in range(v.shape[0]):
            for n in range(gp.shape[1]):
                gp[r, n] = gout[r, n] * sd_typed(v[r, n] - thr[n], sur, sg1, sg2, one)
            if want_sum:
                for n in range(sums.shape[0]):
                    sums[n] += gp[r, n]


def lif_spatial_numba(gout, v, thr, sur: tuple, want_sum: bool):
    """:func:`_lif_spatial` on torch tensors (``gout``, ``v`` ``[rows, N]``; ``thr`` the threshold
    row ``[N]`` as a numpy array of their dtype; ``sur = (code, slope, scale)`` of
    :func:`surrogate_code`); returns ``(gp, sum gp or None)`` (the sum in the arrays' dtype), or
    ``None`` for a surrogate without an inline form (the caller uses torch)."""
    code, p1, p2 = sur
    if not code:
        return None
    R, N = v.shape
    vn = _arr(v)
    gp = torch.empty((R, N), dtype=v.dtype)
    sums = np.zeros(N if want_sum else 1, dtype=np.float64)
    _lif_spatial(_arr(gout), vn, thr, code, p1, p2, gp.numpy(), bool(want_sum), sums)
    return gp, (torch.from_numpy(sums.astype(vn.dtype)) if want_sum else None)


def alif_block_numba(v0, a0, sur, cn, cols, Rd, detach_reset, G, carry, ev_in):
    """:func:`_alif_block` on torch tensors (``[K, B, N]`` states, the cell's surrogate ``sur``,
    ``G [K, B, N, 2]`` or ``None``, ``ev_in [m, B, N, 2]`` or ``None``; ``cn``, ``Rd``: torch or
    numpy); returns ``(zp, GHv [K, B, N], P0 [B, K, 2, N], Phi [B, N, 2, 2], Gvec [m, N] float64,
    b0, ev_out)``: ``zp``, ``GHv``, ``Gvec`` and ``ev_out`` as torch tensors, the carry's operands
    ``P0``, ``Phi``, ``b0`` as numpy arrays for :func:`alif_matrix_carry_numba` (unused ones hold
    garbage). A surrogate without an inline form has its derivative taken by torch first."""
    K, B, N = v0.shape
    dt = v0.dtype
    m = int(cols.shape[0])
    code, p1, p2 = surrogate_code(sur)
    v0n, a0n = _arr(v0), _arr(a0)
    npdt = v0n.dtype
    if code:
        psi, zp = np.empty((K, B, N), dtype=npdt), np.empty((K, B, N), dtype=npdt)
    else:
        cnt = torch.as_tensor(cn)
        u = v0 - (cnt[5] + cnt[6] * a0)
        psi, zp = _arr(sur.derivative(u)), _arr(heaviside(u))
    GHv = np.empty((K, B, N), dtype=npdt)
    P0 = np.empty((B, K, 2, N), dtype=npdt)
    Phi = np.empty((B, N, 4), dtype=npdt)
    Gvec = np.zeros((max(m, 1), N), dtype=np.float64)
    b0 = np.empty((B, N, 2), dtype=npdt)
    ev_out = np.empty((max(m, 1), B, N, 2), dtype=npdt)
    dummy = np.zeros((1, 1, 1, 2), dtype=npdt)
    _alif_block(v0n, a0n, psi, zp, code, p1, p2, _arr(cn), cols,
                np.zeros(1, dtype=npdt) if Rd is None else _arr(Rd), Rd is not None, bool(detach_reset),
                dummy if G is None else _arr(G), G is not None, bool(carry),
                dummy if ev_in is None else _arr(ev_in), ev_in is not None, GHv, P0, Phi, Gvec, b0, ev_out)
    return (torch.from_numpy(zp), torch.from_numpy(GHv), P0, Phi.reshape(B, N, 2, 2), torch.from_numpy(Gvec), b0,
            torch.from_numpy(ev_out))


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _alif_matrix_carry(P0, pre, Phi, e, has_e, b0, do_b, carry, out, bnd, pb, tmp):  # pragma: no cover - compiled
        """One pass over the carried matrix trace ``e [N, B, 2, H]`` of an ALIF block:

            boundary (``do_b``):  bnd[n] += b0[b, n, 0] e[n, b, 0] + b0[b, n, 1] e[n, b, 1]
            carry:                out[n, b] = sum_k P0[b, k, :, n] pre[k, b]^T + Phi[b, n] e[n, b]

        the sum over the block's steps as one GEMM per sample into ``tmp [B, 2N, H]`` (rows ``(v/a,
        n)``; ``P0 [B, K, 2N]`` the first columns of ``Phi_{K-1,k}``, planar, ``pre [K, B, H]``,
        ``Phi [B, N, 2, 2]``), then one pass over the trace in memory order. With ``has_e`` the
        trace is advanced in place (``out`` is written only without one); the loops index the
        arrays directly (no row views), so the compiler can tell the rows apart and vectorise them.
        ``pb [K, H]``: scratch."""
        B, K = P0.shape[0], P0.shape[1]
        zero = bnd.dtype.type(0)
        if do_b:
            bnd[:, :] = zero
        if carry:
            for b in range(B):
                for k in range(K):
                    for h in range(pb.shape[1]):
                        pb[k, h] = pre[k, b, h]
                np.dot(P0[b].T, pb, tmp[b])  # rows (v / a, n)
        if has_e:
            _alif_carry_pass(e, Phi, tmp, b0, do_b, carry, bnd)
        elif carry:
            N, B, _, H = out.shape  # the loop bounds of the array written (see _alif_carry_pass)
            for n in range(N):
                for b in range(B):
                    for h in range(H):
                        out[n, b, 0, h] = tmp[b, n, h]
                        out[n, b, 1, h] = tmp[b, N + n, h]

    @_nb.njit(cache=True, nogil=True)
    def _alif_carry_pass(e, Phi, tmp, b0, do_b, carry, bnd):  # pragma: no cover - compiled
        """The pass of :func:`_alif_matrix_carry` over a carried trace ``e``, advanced in place. The
        loop bounds are ``e``'s own shape and the rows are indexed directly (no row views): with
        both, the compiler can prove that the two rows of a (neuron, sample) pair do not overlap
        and vectorises the loops (with bounds taken from another array it cannot)."""
        N, B, _, H = e.shape
        for n in range(N):
            for b in range(B):
                if do_b:
                    c0, c1 = b0[b, n, 0], b0[b, n, 1]
                    for h in range(H):
                        bnd[n, h] += c0 * e[n, b, 0, h] + c1 * e[n, b, 1, h]
                if carry:
                    p00, p01, p10, p11 = Phi[b, n, 0, 0], Phi[b, n, 0, 1], Phi[b, n, 1, 0], Phi[b, n, 1, 1]
                    for h in range(H):
                        x0, x1 = e[n, b, 0, h], e[n, b, 1, h]
                        e[n, b, 0, h] = tmp[b, n, h] + (x0 * p00 + x1 * p01)
                        e[n, b, 1, h] = tmp[b, N + n, h] + (x0 * p10 + x1 * p11)


def alif_matrix_carry_numba(P0, pre, Phi, e, b0, carry: bool):
    """:func:`_alif_matrix_carry` on torch tensors or numpy arrays: ``P0 [B, K, 2, N]``, ``pre
    [K, B, H]``, ``Phi [B, N, 2, 2]``, ``e [N, B, 2, H]`` (a tensor) or ``None``, ``b0 [B, N, 2]``
    or ``None`` (no boundary term). The carried trace is advanced in place (a new one when ``e`` is
    ``None``). Returns ``(new trace or None, boundary [N, H] or None)``."""
    B, K, _, N = P0.shape
    H = pre.shape[-1]
    P0n = _arr(P0)
    npdt = P0n.dtype
    do_b = b0 is not None and e is not None
    if not carry and not do_b:
        return None, None
    out = e if e is not None else torch.from_numpy(np.empty((N, B, 2, H), dtype=npdt))
    outn = out.numpy()
    bnd = np.empty((N, H) if do_b else (1, 1), dtype=npdt)
    pb = np.empty((K, H) if carry else (1, 1), dtype=npdt)
    tmp = np.empty((B, 2 * N, H) if carry else (1, 2, 1), dtype=npdt)
    _alif_matrix_carry(P0n.reshape(B, K, 2 * N), _arr(pre), _arr(Phi), outn, e is not None,
                       _arr(b0) if do_b else np.zeros((1, 1, 2), dtype=npdt), do_b, bool(carry), outn,
                       bnd, pb, tmp)
    return (out if carry else None), (torch.from_numpy(bnd) if do_b else None)


def alif_trace_step_numba(v0, a0, psi, zp, x, g, cn, cols, ev, ew, er, G_vec, G_w, G_r, Rd, detach_reset):
    """The whole stream-mode trace step of one ALIF layer (``full``/``snap1`` rule) in one pass:
    the partials of :meth:`.traces_lif.ALIFTrace.partials` (the 2x2 Jacobian ``J`` of ``(v, a)``
    and the immediate partials, from ``v_{t-1}, a_{t-1}``, the surrogate derivative ``psi`` and the
    previous spikes ``zp``), the trace advance ``eps <- J eps + imm`` of the stacked per-neuron
    traces ``ev [B, N, 2, m]`` (``cols[j]``: 0 ``log_tau_mem``, 1 ``log_tau_adapt``, 2 ``b``,
    3 ``beta``, 4 ``bias``) and of the matrix traces ``ew [N, B, 2, H]`` (pre-synaptic ``x``),
    ``er [N, B, 2, N]`` (pre-synaptic ``zp``), and ``G += sum_b g . eps`` into ``G_vec [5, N]``,
    ``G_w``, ``G_r`` (in place). ``cn [7, N]``: ``alpha, d alpha / d log tau_mem, rho,
    d rho / d log tau_adapt, 1 - rho, b, beta``; ``Rd [N]``: the lateral self-weights or ``None``."""
    dt = ev.dtype
    z = _EMPTY.get(dt)
    if z is None:
        z = _EMPTY[dt] = (torch.zeros(1, 2, dtype=dt).numpy(), torch.zeros(1, dtype=dt).numpy())
    z2, z1 = z
    use_g = g is not None
    gn = g.numpy() if use_g else ev[:0, :, :, 0].numpy()
    dummy4 = ev[:1, :1, :1, :1].numpy()
    _alif_trace(v0.numpy(), a0.numpy(), psi.numpy(), zp.numpy(), x.numpy(), gn, use_g, cn.numpy(), cols, ev.numpy(),
                dummy4 if ew is None else ew.numpy(), dummy4 if er is None else er.numpy(), ew is not None,
                er is not None, G_vec.numpy(), z2 if G_w is None else G_w.numpy(), z2 if G_r is None else G_r.numpy(),
                z1 if Rd is None else Rd.numpy(), Rd is not None, bool(detach_reset))


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_coefs(cn, rd, has_rd, mode, detach_reset, co):  # pragma: no cover - compiled
        """The per-neuron coefficients of the plain LIF partials (:meth:`.traces_lif.LIFTrace.partials`)
        into ``co [5, N]``: with ``cn`` rows ``alpha``, ``d alpha / d log_tau_mem``, ``thr``, the
        lateral self-weight ``r`` (0 without), ``nd = 0`` with ``detach_reset`` (else 1) and the
        reset mode's flags ``m0`` (subtract) and ``m1`` (zero), the partials at a previous membrane
        ``v``, its spike ``zp = H(v - thr)`` and surrogate derivative ``psi`` are

            J            = alpha - z1 zp + psi (cJ0 + cJ1 v)        (:func:`_lif_jac`)
            d v / d log_tau_mem = dalpha v (1 - m1 zp)              (:func:`_lif_dtau`)
            d v / d thr  = psi (cT0 + cT1 v) - m0 zp                (:func:`_lif_dthr`)

        with ``co = (z1, cJ0, cJ1, cT0, cT1) = (alpha m1, r - thr nd m0, -alpha nd m1,
        thr nd m0 - r, alpha nd m1)``: subtract reset ``v' = alpha v + I - thr z``, zero reset
        ``v' = alpha (1 - z) v + I``, none ``v' = alpha v + I``, with ``d z / d v = psi`` where the
        reset is not detached and ``I`` holding ``r z``. Returns ``(m0, m1)``."""
        dt = co.dtype.type
        zero, one = dt(0), dt(1)
        nd = zero if detach_reset else one
        m0 = one if mode == 0 else zero
        m1 = one if mode == 1 else zero
        for n in range(co.shape[1]):
            a, t = cn[0, n], cn[2, n]
            r = rd[n] if has_rd else zero
            co[0, n] = a * m1
            co[1, n] = -t * nd * m0 + r
            co[2, n] = -a * nd * m1
            co[3, n] = t * nd * m0 - r
            co[4, n] = a * nd * m1
        return m0, m1

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_jac(alpha, co, n, zp, psi, v):  # pragma: no cover - compiled
        """``J`` of :func:`_lif_coefs` for neuron ``n``."""
        return (alpha - co[0, n] * zp) + psi * (co[1, n] + co[2, n] * v)

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_dtau(dalpha, m1, zp, v, one):  # pragma: no cover - compiled
        """``d v / d log_tau_mem`` of :func:`_lif_coefs`."""
        return dalpha * v * (one - m1 * zp)

    @_nb.njit(cache=True, nogil=True, inline="always")
    def _lif_dthr(co, n, m0, zp, psi, v):  # pragma: no cover - compiled
        """``d v / d thr`` of :func:`_lif_coefs` for neuron ``n``."""
        return psi * (co[3, n] + co[4, n] * v) - m0 * zp


# --- the chunked block of a one-state layer (plain LIF) ------------------------------------------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True)
    def _chunk1(J, V, G, use_g, ev_in, has_ev, carry, gh, Gv, ev_out, P0, phi, b0, ones):  # pragma: no cover - compiled
        """The per-neuron part of :func:`.traces_base.chunk_contract` for a one-state layer (``k =
        1``: every Jacobian is a number per sample and neuron), over a block ``J, G [K, B, N]``
        with the immediate partials ``V [m, K, B, N]`` of ``m`` per-neuron parameters:

            gh_{K-1} = g_{K-1},  gh_k = g_k + J_{k+1} gh_{k+1}          (``use_g``)
            Gv[j, n] = sum_{k,b} gh_k V[j, k] + sum_b b0 ev_in[j],  b0 = J_0 gh_0
            P0[b, k] = Phi_k = J_{K-1} ... J_{k+1},  phi = Phi_{-1} = J_{K-1} ... J_0     (``carry``)
            ev_out[j] = sum_k Phi_k V[j, k] + phi ev_in[j]

        (``ev_in`` taken as zero without ``has_ev``; ``V[j]`` taken as ones, and not read, where
        ``ones[j]``: a bias's partial). The sums run in float64."""
        K, B, N = J.shape
        m = V.shape[0]
        for j in range(m):
            for n in range(N):
                Gv[j, n] = 0.0
        if use_g:
            for b in range(B):
                for n in range(N):
                    gh[K - 1, b, n] = G[K - 1, b, n]
            for k in range(K - 2, -1, -1):
                for b in range(B):
                    for n in range(N):
                        gh[k, b, n] = G[k, b, n] + J[k + 1, b, n] * gh[k + 1, b, n]
            for b in range(B):
                for n in range(N):
                    b0[b, n] = J[0, b, n] * gh[0, b, n]
            for j in range(m):
                if ones[j]:
                    for k in range(K):
                        for b in range(B):
                            for n in range(N):
                                Gv[j, n] += gh[k, b, n]
                else:
                    for k in range(K):
                        for b in range(B):
                            for n in range(N):
                                Gv[j, n] += gh[k, b, n] * V[j, k, b, n]
                if has_ev:
                    for b in range(B):
                        for n in range(N):
                            Gv[j, n] += b0[b, n] * ev_in[j, b, n]
        if carry:
            for b in range(B):
                for n in range(N):
                    P0[b, K - 1, n] = 1.0
                for k in range(K - 2, -1, -1):
                    for n in range(N):
                        P0[b, k, n] = P0[b, k + 1, n] * J[k + 1, b, n]
                for n in range(N):
                    phi[b, n] = P0[b, 0, n] * J[0, b, n]
            for j in range(m):
                for b in range(B):
                    for n in range(N):
                        ev_out[j, b, n] = phi[b, n] * ev_in[j, b, n] if has_ev else 0.0
                    if ones[j]:
                        for k in range(K):
                            for n in range(N):
                                ev_out[j, b, n] += P0[b, k, n]
                    else:
                        for k in range(K):
                            for n in range(N):
                                ev_out[j, b, n] += P0[b, k, n] * V[j, k, b, n]


if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _lif_block_vec(Vp, G, use_g, cn, rd, has_rd, mode, detach_reset, sur, p1, p2, cols, ev_in, has_ev, carry,
                       need_zp, J, V, zp_out, gh, Gv, ev_out, P0, phi, b0, Gacc):  # pragma: no cover - compiled
        """The partials of :meth:`.traces_lif.LIFTrace.partials` on a block's previous membranes
        ``Vp [K, B, N]`` (:func:`_lif_coefs` per sample and neuron, the surrogate derivative of
        ``v - thr`` inline: ``sur`` 1 fast sigmoid, 2 arc-tangent), written as ``J [K, B, N]``,
        the traced columns ``V [m, K, B, N]`` (``cols``: 0 ``log_tau_mem``, 1 ``threshold``,
        2 ``bias``: its column of ones is not written) and, with ``need_zp``, the previous spikes ``zp_out`` (the lateral weights'
        presynaptic term); then :func:`_chunk1` on them, and (``use_g``) its per-neuron sums
        added to the accumulator rows ``Gacc[cols[j]]``. ``cn [3, N]``: ``alpha``,
        ``d alpha / d log_tau_mem``, ``thr``; ``rd`` the lateral self-weights (``has_rd``);
        ``G [K, B, N]`` the spatial error (read with ``use_g``); ``ev_in [m, B, N]`` the carried
        traces (``has_ev``) and ``ev_out`` the new ones (written with ``carry``); ``J, V, zp_out,
        gh, Gv, P0, phi, b0`` the arrays of :func:`lif_block_workspace`, the last four as
        :func:`_chunk1` writes them."""
        K, B, N = Vp.shape
        R = K * B
        dt = Vp.dtype.type
        zero, one = dt(0), dt(1)
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2 = dt(s1), dt(s2)
        v2, J2, zp2 = Vp.reshape(R, N), J.reshape(R, N), zp_out.reshape(-1, zp_out.shape[-1])
        psi = np.empty((R, N), dtype=Vp.dtype)
        # the partials of _lif_coefs, one pass per array written (the reset mode outside the loops)
        co = np.empty((5, N), dtype=Vp.dtype)
        m0, m1 = _lif_coefs(cn, rd, has_rd, mode, detach_reset, co)
        thr = cn[2]
        alpha = cn[0]
        dal = cn[1]
        if sur == 1:
            for i in range(R):
                for n in range(N):
                    d = one + sg1 * abs(v2[i, n] - thr[n])
                    psi[i, n] = sg2 / (d * d)
        else:
            for i in range(R):
                for n in range(N):
                    u = sg1 * (v2[i, n] - thr[n])
                    psi[i, n] = sg2 / (one + u * u)
        for i in range(R):
            for n in range(N):
                v0 = v2[i, n]
                J2[i, n] = _lif_jac(alpha[n], co, n, one if v0 - thr[n] > zero else zero, psi[i, n], v0)
        for j in range(cols.shape[0]):
            c = cols[j]
            Vj = V[j].reshape(R, N)
            if c == 0:
                for i in range(R):
                    for n in range(N):
                        v0 = v2[i, n]
                        Vj[i, n] = _lif_dtau(dal[n], m1, one if v0 - thr[n] > zero else zero, v0, one)
            elif c == 1:
                for i in range(R):
                    for n in range(N):
                        v0 = v2[i, n]
                        Vj[i, n] = _lif_dthr(co, n, m0, one if v0 - thr[n] > zero else zero, psi[i, n], v0)
            # c == 2 (the bias): a column of ones, not written (_chunk1 reads it as ones)
        if need_zp:
            for i in range(R):
                for n in range(N):
                    zp2[i, n] = one if v2[i, n] - thr[n] > zero else zero
        ones = np.empty(max(cols.shape[0], 1), np.bool_)
        ones[:] = False
        for j in range(cols.shape[0]):
            ones[j] = cols[j] == 2
        _chunk1(J, V, G, use_g, ev_in, has_ev, carry, gh, Gv, ev_out, P0, phi, b0, ones)
        if use_g:
            for j in range(cols.shape[0]):
                r = cols[j]
                for n in range(N):
                    Gacc[r, n] += dt(Gv[j, n])

    @_nb.njit(cache=True, nogil=True)
    def _lif_block_mat(e, has_e, use_g, b0, Gm, carry, q, phi):  # pragma: no cover - compiled
        """The carried matrix trace ``e [N, B, 1, H]`` of a block: ``Gm[n] += sum_b b0[b, n] e[n, b]``
        (``use_g``, with the trace before the block), then ``e[n, b] <- phi[b, n] e[n, b] + q[b, n]``
        (``carry``; ``q [B, N, H] = sum_k Phi_k pre_k``, ``e`` taken as zero without ``has_e``)."""
        N, B, _, H = e.shape
        if use_g and has_e:
            for n in range(N):
                for b in range(B):
                    s = b0[b, n]
                    for h in range(H):
                        Gm[n, h] += s * e[n, b, 0, h]
        if carry:
            for n in range(N):
                for b in range(B):
                    if has_e:
                        f = phi[b, n]
                        for h in range(H):
                            e[n, b, 0, h] = f * e[n, b, 0, h] + q[b, n, h]
                    else:
                        for h in range(H):
                            e[n, b, 0, h] = q[b, n, h]


def lif_block_workspace(K: int, B: int, N: int, m: int, dtype) -> dict:
    """The scratch arrays of the chunked LIF block's compiled per-neuron pass
    (:func:`_lif_block_vec`) for blocks of ``K`` steps, batch ``B``, ``N`` neurons and ``m`` traced
    per-neuron parameters (made once per sequence and block size)."""
    npdt = numpy_dtype(dtype)
    t = lambda *shape: torch.empty(shape, dtype=dtype)  # noqa: E731
    ws = {"J": t(K, B, N), "V": t(m, K, B, N), "zp": t(K, B, N), "gh": t(K, B, N), "P0": t(B, K, N), "phi": t(B, N),
          "b0": t(B, N), "Gv": np.empty((max(m, 1), N), dtype=np.float64), "none3": np.zeros((max(m, 1), 1, 1), npdt),
          "z2": np.zeros((1, 1), npdt), "z3": np.zeros((1, 1, 1), npdt), "no_ones": np.zeros(max(m, 1), np.bool_)}
    ws["np"] = {k: v.numpy() for k, v in ws.items() if isinstance(v, torch.Tensor)}
    ws["gh2"], ws["P0T"] = ws["gh"].view(K * B, N), ws["P0"].transpose(1, 2)  # the views the GEMMs take
    return ws


def lif_block_mat_numba(e, has_e: bool, b0, Gm, carry: bool, q, phi, ws: dict) -> None:
    """:func:`_lif_block_mat` on torch tensors: ``e`` (contiguous)
    updated in place, read as zero without ``has_e``; ``Gm`` added to when ``b0`` is given; ``q``,
    ``phi`` used with ``carry``; ``ws`` a :func:`lif_block_workspace` (its placeholders)."""
    z2 = ws["z2"]
    _lif_block_mat(e.numpy(), has_e, b0 is not None, z2 if b0 is None else b0.numpy(),
                   z2 if b0 is None else Gm.numpy(), carry, q.numpy() if carry else ws["z3"],
                   phi.numpy() if carry else z2)


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
    c = _arr
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
    Gn = _arr(G)
    gh = np.empty(Gn.shape, dtype=Gn.dtype)
    _lru_reverse_filter(Gn, _arr(lr), _arr(li), gh)
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
    c = _arr
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
    c = _arr
    un = c(u)
    out = np.empty((4, K, B, N), dtype=un.dtype)
    _lru_block_scan(un, c(lr), c(li), c(h0r), c(h0i), out[0], out[1], out[2], out[3])
    return tuple(torch.from_numpy(out).unbind(0))



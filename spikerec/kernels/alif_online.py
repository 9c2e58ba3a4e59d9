"""Compiled CPU kernels (numba) of the exact online learning of an ALIF layer (the adaptive threshold of
Bellec et al. 2018, eq. 2-3: ``a_t = rho a_{t-1} + (1 - rho) z_{t-1}``, ``v_t = alpha v_{t-1} + I_t
- theta_t z_{t-1}``, ``theta_t = b + beta a_t``): the partials of the 2x2 Jacobian of ``(v, a)``
(``_alif_partials``, the compiled form of :meth:`spikerec.hardware.online.traces_lif.ALIFTrace.partials`),
the whole stream-mode trace step (:func:`alif_trace_step_numba`), the chunked block
(:func:`alif_block_numba`, :func:`alif_matrix_carry_numba`) and the spatial backward of the spikes
(:func:`alif_spatial_numba`), each tested against the torch form.
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
from ..surrogate import heaviside
from .lif_sequence_numba import surrogate_code
from .lif_online import _step_operands
from .trace_numba import as_numpy, placeholders

__all__ = ["alif_trace_step_numba", "alif_block_numba", "alif_matrix_carry_numba", "alif_spatial_numba",
           "alif_partials_numba", "alif_step_numba"]

if _HAVE_NUMBA:
    from .surrogate_numba import sd_consts, sd_typed
    from .trace_numba import _mat_nest

    @_nb.njit(cache=True, fastmath=False, nogil=True, inline="always")
    def _alif_partials(v, a, ps, z, alpha, rho, omr, bb, beta, rd, has_rd, detach_reset, zero):
        """The partials of :meth:`spikerec.hardware.online.traces_lif.ALIFTrace.partials` for one neuron and sample, from
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
    c = as_numpy
    vn = c(v)
    gp = np.empty((R, N), dtype=vn.dtype)
    gl = np.empty((R, N, 2), dtype=vn.dtype)
    sums = np.zeros((2, N), dtype=np.float64)
    _alif_spatial(c(gout), vn, c(a), c(bb.expand(N)), c(beta.expand(N)), code, p1, p2, gp, gl, sums)
    s = torch.from_numpy(sums.astype(vn.dtype))
    return torch.from_numpy(gp), torch.from_numpy(gl), s[0], s[1]


neurons.register_backend("alif", "kernels.alif_online (compiled spatial backward of the spikes)", alif_spatial_numba,
                         test="tests/test_online_partials.py::test_compiled_spatial_backward_equals_the_output_gradient")


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
    v0n, a0n = as_numpy(v0), as_numpy(a0)
    npdt = v0n.dtype
    if code:
        psi, zp = np.empty((K, B, N), dtype=npdt), np.empty((K, B, N), dtype=npdt)
    else:
        cnt = torch.as_tensor(cn)
        u = v0 - (cnt[5] + cnt[6] * a0)
        psi, zp = as_numpy(sur.derivative(u)), as_numpy(heaviside(u))
    GHv = np.empty((K, B, N), dtype=npdt)
    P0 = np.empty((B, K, 2, N), dtype=npdt)
    Phi = np.empty((B, N, 4), dtype=npdt)
    Gvec = np.zeros((max(m, 1), N), dtype=np.float64)
    b0 = np.empty((B, N, 2), dtype=npdt)
    ev_out = np.empty((max(m, 1), B, N, 2), dtype=npdt)
    dummy = np.zeros((1, 1, 1, 2), dtype=npdt)
    _alif_block(v0n, a0n, psi, zp, code, p1, p2, as_numpy(cn), cols,
                np.zeros(1, dtype=npdt) if Rd is None else as_numpy(Rd), Rd is not None, bool(detach_reset),
                dummy if G is None else as_numpy(G), G is not None, bool(carry),
                dummy if ev_in is None else as_numpy(ev_in), ev_in is not None, GHv, P0, Phi, Gvec, b0, ev_out)
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
    P0n = as_numpy(P0)
    npdt = P0n.dtype
    do_b = b0 is not None and e is not None
    if not carry and not do_b:
        return None, None
    out = e if e is not None else torch.from_numpy(np.empty((N, B, 2, H), dtype=npdt))
    outn = out.numpy()
    bnd = np.empty((N, H) if do_b else (1, 1), dtype=npdt)
    pb = np.empty((K, H) if carry else (1, 1), dtype=npdt)
    tmp = np.empty((B, 2 * N, H) if carry else (1, 2, 1), dtype=npdt)
    _alif_matrix_carry(P0n.reshape(B, K, 2 * N), as_numpy(pre), as_numpy(Phi), outn, e is not None,
                       as_numpy(b0) if do_b else np.zeros((1, 1, 2), dtype=npdt), do_b, bool(carry), outn,
                       bnd, pb, tmp)
    return (out if carry else None), (torch.from_numpy(bnd) if do_b else None)


def alif_trace_step_numba(v0, a0, psi, zp, x, g, cn, cols, ev, ew, er, G_vec, G_w, G_r, Rd, detach_reset):
    """The whole stream-mode trace step of one ALIF layer (``full``/``snap1`` rule) in one pass:
    the partials of :meth:`spikerec.hardware.online.traces_lif.ALIFTrace.partials` (the 2x2 Jacobian ``J`` of ``(v, a)``
    and the immediate partials, from ``v_{t-1}, a_{t-1}``, the surrogate derivative ``psi`` and the
    previous spikes ``zp``), the trace advance ``eps <- J eps + imm`` of the stacked per-neuron
    traces ``ev [B, N, 2, m]`` (``cols[j]``: 0 ``log_tau_mem``, 1 ``log_tau_adapt``, 2 ``b``,
    3 ``beta``, 4 ``bias``) and of the matrix traces ``ew [N, B, 2, H]`` (pre-synaptic ``x``),
    ``er [N, B, 2, N]`` (pre-synaptic ``zp``), and ``G += sum_b g . eps`` into ``G_vec [5, N]``,
    ``G_w``, ``G_r`` (in place). ``cn [7, N]``: ``alpha, d alpha / d log tau_mem, rho,
    d rho / d log tau_adapt, 1 - rho, b, beta``; ``Rd [N]``: the lateral self-weights or ``None``."""
    z2, z1 = placeholders(ev.dtype)
    use_g = g is not None
    gn = g.numpy() if use_g else ev[:0, :, :, 0].numpy()
    dummy4 = ev[:1, :1, :1, :1].numpy()
    _alif_trace(v0.numpy(), a0.numpy(), psi.numpy(), zp.numpy(), x.numpy(), gn, use_g, cn.numpy(), cols, ev.numpy(),
                dummy4 if ew is None else ew.numpy(), dummy4 if er is None else er.numpy(), ew is not None,
                er is not None, G_vec.numpy(), z2 if G_w is None else G_w.numpy(), z2 if G_r is None else G_r.numpy(),
                z1 if Rd is None else Rd.numpy(), Rd is not None, bool(detach_reset))


neurons.register_backend("alif", "kernels.alif_online (compiled trace step of online learning)", alif_trace_step_numba,
                         test="tests/test_online_partials.py::test_compiled_alif_trace_step_equals_derived_partials")


def alif_partials_numba(v0, a0, psi, zp, cn, cols, Rd, detach_reset):
    """The partials of an ALIF layer as the compiled stream step computes them (``_alif_vec_step``
    from zero traces without a loss; the chunked block takes the same ``_alif_partials``): ``(J
    [B, N, 2, 2], imm [B, N, 2, m])``, the Jacobian of ``(v_t, a_t)`` in ``(v_{t-1}, a_{t-1})`` and
    the immediate partials of the traced columns ``cols`` (0 ``log_tau_mem``, 1 ``log_tau_adapt``,
    2 ``b``, 3 ``beta``, 4 ``bias``). The operands are those of :func:`alif_trace_step_numba`."""
    B, N = v0.shape
    z2, z1 = placeholders(v0.dtype)
    ev = torch.zeros((B, N, 2, len(cols)), dtype=v0.dtype)
    Jc = np.empty((N, B, 4), dtype=z1.dtype)
    _alif_vec_step(as_numpy(v0), as_numpy(a0), as_numpy(psi), as_numpy(zp), ev[:0, :, :, 0].numpy(), False,
                   as_numpy(cn), cols, ev.numpy(), np.zeros((5, N), dtype=z1.dtype), z1 if Rd is None else as_numpy(Rd),
                   Rd is not None, bool(detach_reset), Jc)
    return torch.from_numpy(Jc).transpose(0, 1).reshape(B, N, 2, 2), ev


# --- the whole-stack stream step's forward and backward of one layer (whole_stack) ---------

if _HAVE_NUMBA:

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _alif_fwd(x, v, a, pv, pa, zp, psi, Wt, bias, has_bias, Rt, has_r, alpha, rho, omr, bb, beta, sur,
                  p1, p2, cur, z):  # pragma: no cover - compiled
        """One ALIF step in place (the equations of :meth:`spikerec.hardware.online.traces_lif.ALIFTrace.step`): keeps the
        previous state in ``pv, pa``, the previous spikes in ``zp`` and their surrogate derivative
        in ``psi`` (for the trace step), writes the new spikes ``z = H(v - b - beta a)``. The input
        current ``x W^T`` and the lateral one ``z_{t-1} R^T`` are GEMMs (``cur [B, N]`` scratch)."""
        B, N = v.shape
        zero, one = v.dtype.type(0), v.dtype.type(1)
        s1, s2 = sd_consts(sur, p1, p2)
        sg1, sg2 = v.dtype.type(s1), v.dtype.type(s2)  # the surrogate in the state's dtype (vectorised)
        # each loop writes one array, with that array's bounds (so the compiler vectorises it;
        # a value two arrays need is computed in both loops, by the same expression)
        for b in range(B):
            for n in range(pv.shape[1]):
                pv[b, n] = v[b, n]
            for n in range(pa.shape[1]):
                pa[b, n] = a[b, n]
            for n in range(zp.shape[1]):
                zp[b, n] = one if v[b, n] - (bb[n] + beta[n] * a[b, n]) > zero else zero
            for n in range(psi.shape[1]):
                psi[b, n] = sd_typed(v[b, n] - (bb[n] + beta[n] * a[b, n]), sur, sg1, sg2, one)
        if has_r:
            np.dot(zp, Rt, z)  # z: scratch until the spikes are written below
            np.dot(x, Wt, cur)
            for b in range(B):
                for n in range(cur.shape[1]):
                    cur[b, n] += z[b, n]
        else:
            np.dot(x, Wt, cur)
        if has_bias:
            for b in range(B):
                for n in range(cur.shape[1]):
                    cur[b, n] = cur[b, n] + bias[n]
        for b in range(B):
            for n in range(a.shape[1]):
                a[b, n] = rho[n] * pa[b, n] + omr[n] * zp[b, n]
            for n in range(v.shape[1]):
                v[b, n] = (alpha[n] * pv[b, n] + cur[b, n]) - (bb[n] + beta[n] * a[b, n]) * zp[b, n]
            for n in range(z.shape[1]):
                z[b, n] = one if v[b, n] - (bb[n] + beta[n] * a[b, n]) > zero else zero

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _alif_bwd(gout, use_g, x, v, a, bb, beta, sur, p1, p2, W, acc_b, acc_beta, has_b, has_beta, gp, g, gin,
                  need_gin, pv, pa, psi, zp, cn, cols, ev, ew, er, has_w, has_r, G_vec, G_w, G_r, Rd, has_rd,
                  detach_reset):  # pragma: no cover - compiled
        """The spatial backward of an ALIF layer's output map ``z = H(v - b - beta a)`` (the error
        ``g = (gp, -beta gp)`` on ``(v, a)`` with ``gp = gout sigma'(v - theta)``; ``db -= sum gp``,
        ``dbeta -= sum gp a``; ``gin = gp W``, one GEMM), then the layer's trace step
        (:func:`_alif_trace`)."""
        B, N = v.shape
        if use_g:
            s1, s2 = sd_consts(sur, p1, p2)
            sg1, sg2, one = v.dtype.type(s1), v.dtype.type(s2), v.dtype.type(1)
            for b in range(B):
                _alif_spatial_error(gout, v, a, bb, beta, sur, sg1, sg2, one, gp, g, b)
                if has_b:
                    for n in range(acc_b.shape[0]):
                        acc_b[n] -= gp[b, n]
                if has_beta:
                    for n in range(acc_beta.shape[0]):
                        acc_beta[n] -= gp[b, n] * a[b, n]
            if need_gin:
                np.dot(gp, W, gin)
        _alif_trace(pv, pa, psi, zp, x, g, use_g, cn, cols, ev, ew, er, has_w, has_r, G_vec, G_w, G_r, Rd, has_rd,
                    detach_reset)


neurons.register_backend("alif", "kernels.alif_online (compiled partials of the online stream step and block)",
                         alif_partials_numba, test="tests/test_online_partials.py::test_compiled_partials_equal_derived_ones")


def alif_step_numba(params, state, x_t, options):
    """One ALIF step (:func:`spikerec.neurons.alif.step` in float arithmetic, ``1 - rho`` as the
    adaptation gain, the bias into the current) by the compiled forward of the whole-stack stream
    step (``_alif_fwd``); returns ``(z_t, ALIFState(v_t, a_t))`` as new tensors."""
    from ..neurons import alif as _alif

    if params.adapt_gain is not None or options.bias_into != "current":
        raise ValueError("alif_step_numba: expected adapt_gain=None and bias_into='current'")
    as_np, B, N, x, Wt, bias, has_b, Rt, has_r = _step_operands(params, state.v, x_t)
    alpha, rho = (as_np(d.expand(N)) for d in _alif.decays(params, options))
    v, a = state.v.detach().clone().contiguous(), state.a.detach().clone().contiguous()
    pv, pa, zp, psi, cur, z = (np.empty((B, N), dtype=x.dtype) for _ in range(6))
    code, p1, p2 = surrogate_code(options.surrogate)
    _alif_fwd(x, v.numpy(), a.numpy(), pv, pa, zp, psi, Wt, bias, has_b, Rt, has_r, alpha, rho, 1 - rho,
              as_np(params.b.expand(N)), as_np(params.beta.expand(N)), code, p1, p2, cur, z)
    return torch.from_numpy(z), _alif.ALIFState(v, a)


neurons.register_backend("alif", "kernels.alif_online (compiled forward of the online stream step)", alif_step_numba,
                         test="tests/test_online_partials.py::test_compiled_forward_steps_equal_the_neuron_steps")

"""Triton kernels of the ALIF time loop and its reverse pass, feed-forward or recurrent (CUDA; on
the CPU under ``TRITON_INTERPRET=1`` for tests).

The same recurrence as :mod:`spikerec.kernels.alif_sequence` (whose docstring gives the
equations, from Herranz-Celotti & Rouat 2024, App. H, and Bellec et al. 2018, eq. 2-3). One
program holds a block of ``BB`` samples and runs them through all ``T`` steps:

* a recurrent layer is one persistent launch per pass: at each step the program forms
  ``W_rec z_{t-1}`` for its samples from tiles of the weight (``tl.dot`` on tensor cores in IEEE
  float32, or a broadcast sum in float64), then updates ``a``, ``theta``, ``v`` and the spikes of
  every column tile; a barrier separates the steps, the previous step's spikes are read back from
  the output. The backward runs the reverse recurrence the same way, its carry into ``z_{t-1}``
  (``(1 - rho) dL/da_t + dL/dv_t W_rec``, and ``-theta_t dL/dv_t`` when the reset is not
  detached) formed from the step's ``dL/dv_t`` after a barrier;
* a feed-forward layer has no product between neurons, so each program takes one column tile and
  the grid covers the columns too.

Saved for the backward: ``v_t`` and ``a_t`` in the state's dtype, and the spikes, which are the
layer's output. The backward writes ``dL/dv_t`` (the gradient of the input currents) and each
element's share of the gradients of ``alpha``, ``rho``, ``b`` and ``beta``; the recurrent weight's
gradient ``sum_t dL/dv_t^T z_{t-1}`` is one GEMM afterwards.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .surrogate_triton import surrogate_constants, surrogate_derivative

__all__ = ["alif_forward", "alif_backward"]

ROWS = 16  # samples per program (16: the smallest tile of tl.dot)
COLS_MAX = 64  # the column tile
DOT_F32 = True  # float32 products on tl.dot in IEEE float32; else (and always in float64) a broadcast sum
WARPS = 4


@triton.jit
def _prev(cur_ptr, init_ptr, idx, m2, t, M):
    """The state before step t: the value saved at step t - 1 (``cur_ptr`` points at step t), or
    the initial state at t = 0."""
    old = tl.load(cur_ptr - M + idx, mask=m2 & (t > 0), other=0.0)
    ini = tl.load(init_ptr + idx, mask=m2 & (t == 0), other=0.0)
    return tl.where(t == 0, ini.to(old.dtype), old)


@triton.jit
def _params(alpha_ptr, rho_ptr, b_ptr, beta_ptr, cols, cmask, state_ptr):
    """The per-neuron ``alpha, rho, b, beta`` of a column tile, as ``[1, BN]`` rows in the state dtype
    (the element type of ``state_ptr``)."""
    sd = state_ptr.dtype.element_ty
    alpha = tl.load(alpha_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
    rho = tl.load(rho_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
    b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
    beta = tl.load(beta_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
    return alpha, rho, b, beta


@triton.jit
def _rec_product(z_ptr, W_ptr, rows, rmask, cols, cmask, N, BB: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, USE_DOT: tl.constexpr, TRANS: tl.constexpr):
    """``sum_k z[rows, k] W[cols, k]`` (``TRANS``: ``sum_k z[rows, k] W[k, cols]``) as ``[BB, BN]``."""
    if USE_DOT:
        acc = tl.zeros([BB, BN], dtype=tl.float32)
    else:
        acc = tl.zeros([BB, BN], dtype=tl.float64)
    for k0 in range(0, N, BK):
        ks = k0 + tl.arange(0, BK)
        kmask = ks < N
        zk = tl.load(z_ptr + rows[:, None] * N + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if TRANS:
            wk = tl.load(W_ptr + ks[:, None] * N + cols[None, :], mask=kmask[:, None] & cmask[None, :], other=0.0)
        else:
            wk = tl.load(W_ptr + cols[None, :] * N + ks[:, None], mask=kmask[:, None] & cmask[None, :], other=0.0)
        if USE_DOT:
            acc += tl.dot(zk.to(wk.dtype), wk, input_precision="ieee")
        else:
            acc += tl.sum(zk.to(tl.float64)[:, :, None] * wk.to(tl.float64)[None, :, :], axis=1)
    return acc


@triton.jit
def _alif_fwd(I_ptr, v0_ptr, a0_ptr, z0_ptr, alpha_ptr, rho_ptr, b_ptr, beta_ptr, W_ptr,
              Z_ptr, V_ptr, A_ptr, T, B, N, COLS,
              HAS_W: tl.constexpr, USE_DOT: tl.constexpr, BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rows < B
    c_begin = tl.program_id(1) * COLS
    sd = V_ptr.dtype.element_ty
    M = B * N
    Zc = Z_ptr
    Vc = V_ptr
    Ac = A_ptr
    Ic = I_ptr
    for t in range(0, T):
        for c0 in range(c_begin, c_begin + COLS, BN):
            cols = c0 + tl.arange(0, BN)
            cmask = cols < N
            m2 = rmask[:, None] & cmask[None, :]
            idx = rows[:, None] * N + cols[None, :]
            alpha, rho, b, beta = _params(alpha_ptr, rho_ptr, b_ptr, beta_ptr, cols, cmask, V_ptr)
            v = _prev(Vc, v0_ptr, idx, m2, t, M).to(sd)
            a = _prev(Ac, a0_ptr, idx, m2, t, M).to(sd)
            zp = _prev(Zc, z0_ptr, idx, m2, t, M).to(sd)
            a = rho * a + (1.0 - rho) * zp
            theta = b + beta * a
            x = tl.load(Ic + idx, mask=m2, other=0.0).to(sd)
            if HAS_W:
                if t == 0:
                    src = z0_ptr
                else:
                    src = Zc - M
                x = x + _rec_product(src, W_ptr, rows, rmask, cols, cmask, N, BB, BN, BK, USE_DOT, False).to(sd)
            v = (x + alpha * v) - theta * zp
            z = (v > theta).to(sd)
            tl.store(Vc + idx, v, mask=m2)
            tl.store(Ac + idx, a, mask=m2)
            tl.store(Zc + idx, z.to(Z_ptr.dtype.element_ty), mask=m2)
        if HAS_W:
            tl.debug_barrier()
        Zc += M
        Vc += M
        Ac += M
        Ic += M


@triton.jit
def _alif_bwd(gZ_ptr, Z_ptr, V_ptr, A_ptr, v0_ptr, a0_ptr, z0_ptr, alpha_ptr, rho_ptr, b_ptr, beta_ptr, W_ptr,
              gvT_ptr, gaT_ptr, G_ptr, GA_ptr, C_ptr, acc_ptr, gv0_ptr, ga0_ptr, T, B, N, COLS, sur_ptr,
              HAS_W: tl.constexpr, USE_DOT: tl.constexpr, DETACH: tl.constexpr, HAS_GZ: tl.constexpr,
              HAS_GVT: tl.constexpr, HAS_GAT: tl.constexpr, SUR: tl.constexpr, BB: tl.constexpr,
              BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    rmask = rows < B
    c_begin = tl.program_id(1) * COLS
    sd = V_ptr.dtype.element_ty
    M = B * N
    last = (T - 1).to(tl.int64) * M  # offset of step T - 1, in 64 bits
    Zc = Z_ptr + last
    Vc = V_ptr + last
    Ac = A_ptr + last
    Gc = G_ptr + last
    gZc = gZ_ptr + last
    for s in range(0, T):
        t = T - 1 - s
        top = t == T - 1
        below = t < T - 1
        for c0 in range(c_begin, c_begin + COLS, BN):
            cols = c0 + tl.arange(0, BN)
            cmask = cols < N
            m2 = rmask[:, None] & cmask[None, :]
            idx = rows[:, None] * N + cols[None, :]
            alpha, rho, b, beta = _params(alpha_ptr, rho_ptr, b_ptr, beta_ptr, cols, cmask, V_ptr)
            v = tl.load(Vc + idx, mask=m2, other=0.0)
            a = tl.load(Ac + idx, mask=m2, other=0.0)
            vp = _prev(Vc, v0_ptr, idx, m2, t, M).to(sd)
            ap = _prev(Ac, a0_ptr, idx, m2, t, M).to(sd)
            zp = _prev(Zc, z0_ptr, idx, m2, t, M).to(sd)
            theta = b + beta * a
            gz = tl.load(C_ptr + idx, mask=m2 & below, other=0.0)
            if HAS_GZ:
                gz += tl.load(gZc + idx, mask=m2, other=0.0).to(sd)
            gu = gz * surrogate_derivative(v - theta, sur_ptr, SUR)
            gv_next = tl.load(Gc + M + idx, mask=m2 & below, other=0.0)
            ga_next = tl.load(GA_ptr + idx, mask=m2 & below, other=0.0)
            if HAS_GVT:
                gv_next = tl.where(top, tl.load(gvT_ptr + idx, mask=m2, other=0.0).to(sd), gv_next)
            if HAS_GAT:
                ga_next = tl.where(top, tl.load(gaT_ptr + idx, mask=m2, other=0.0).to(sd), ga_next)
            # at t = T - 1 the next step's terms are dL/dv_T and dL/da_T themselves, not decayed
            gv = gu + tl.where(top, gv_next, alpha * gv_next)
            ga = tl.where(top, ga_next, rho * ga_next) - beta * gu
            if not DETACH:
                ga = ga - gv * (zp * beta)
            tl.store(Gc + idx, gv, mask=m2)
            tl.store(GA_ptr + idx, ga, mask=m2)
            if DETACH:
                gth = -gu
            else:
                gth = -(gu + gv * zp)
            p = acc_ptr + idx
            tl.store(p, tl.load(p, mask=m2, other=0.0) + gv * vp, mask=m2)
            p += M
            tl.store(p, tl.load(p, mask=m2, other=0.0) + ga * (ap - zp), mask=m2)
            p += M
            tl.store(p, tl.load(p, mask=m2, other=0.0) + gth, mask=m2)
            p += M
            tl.store(p, tl.load(p, mask=m2, other=0.0) + gth * a, mask=m2)
        if HAS_W:
            tl.debug_barrier()
        # the carry into z_{t-1}: (1 - rho) dL/da_t [+ dL/dv_t W_rec] [- theta_t dL/dv_t]
        for c0 in range(c_begin, c_begin + COLS, BN):
            cols = c0 + tl.arange(0, BN)
            cmask = cols < N
            m2 = rmask[:, None] & cmask[None, :]
            idx = rows[:, None] * N + cols[None, :]
            rho = tl.load(rho_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
            carry = (1.0 - rho) * tl.load(GA_ptr + idx, mask=m2, other=0.0)
            if HAS_W:
                carry += _rec_product(Gc, W_ptr, rows, rmask, cols, cmask, N, BB, BN, BK, USE_DOT, True).to(sd)
            if not DETACH:
                b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
                beta = tl.load(beta_ptr + cols, mask=cmask, other=0.0).to(sd)[None, :]
                theta = b + beta * tl.load(Ac + idx, mask=m2, other=0.0)
                carry -= theta * tl.load(Gc + idx, mask=m2, other=0.0)
            tl.store(C_ptr + idx, carry, mask=m2)
        if HAS_W:
            tl.debug_barrier()
        Zc -= M
        Vc -= M
        Ac -= M
        Gc -= M
        gZc -= M
    # the initial state: dL/dv_0 = alpha dL/dv_0', dL/da_0 = rho dL/da_0', and z_{-1} = H(v0 - theta_{-1})
    for c0 in range(c_begin, c_begin + COLS, BN):
        cols = c0 + tl.arange(0, BN)
        cmask = cols < N
        m2 = rmask[:, None] & cmask[None, :]
        idx = rows[:, None] * N + cols[None, :]
        alpha, rho, b, beta = _params(alpha_ptr, rho_ptr, b_ptr, beta_ptr, cols, cmask, V_ptr)
        v0 = tl.load(v0_ptr + idx, mask=m2, other=0.0).to(sd)
        a0 = tl.load(a0_ptr + idx, mask=m2, other=0.0).to(sd)
        gu0 = tl.load(C_ptr + idx, mask=m2, other=0.0) * surrogate_derivative(v0 - (b + beta * a0), sur_ptr, SUR)
        gv0 = alpha * tl.load(G_ptr + idx, mask=m2, other=0.0) + gu0
        ga0 = rho * tl.load(GA_ptr + idx, mask=m2, other=0.0) - beta * gu0
        tl.store(gv0_ptr + idx, gv0.to(gv0_ptr.dtype.element_ty), mask=m2)
        tl.store(ga0_ptr + idx, ga0.to(ga0_ptr.dtype.element_ty), mask=m2)
        p = acc_ptr + 2 * M + idx
        tl.store(p, tl.load(p, mask=m2, other=0.0) - gu0, mask=m2)
        p += M
        tl.store(p, tl.load(p, mask=m2, other=0.0) - gu0 * a0, mask=m2)


def _tiles(N: int, B: int, recurrent: bool, use_dot: bool):
    """``(grid, COLS, BB, BN, BK)``: a recurrent layer's program runs every column tile of its samples.
    Without ``tl.dot`` the product is a ``[BB, BK, BN]`` broadcast, kept small."""
    BN = min(COLS_MAX, max(16, triton.next_power_of_2(N)))
    if use_dot:
        BB, BK = 16, BN
    else:
        BB, BK = (ROWS if ROWS < 16 or not DOT_F32 else 8), 8
        BN = min(BN, 32) if BB >= 8 else BN
    rows = triton.cdiv(B, BB)
    if recurrent:
        return (rows, 1), triton.cdiv(N, BN) * BN, BB, BN, BK
    return (rows, triton.cdiv(N, BN)), BN, BB, BN, BK


def _vec(p, N):
    return p.detach().reshape(-1).expand(N).contiguous() if p.numel() == 1 else p.detach().reshape(N).contiguous()


def alif_forward(I, v0, a0, alpha, rho, b, beta, w_rec):
    """``(Z, V, A)``: spikes in ``I``'s dtype, membranes and adaptation variables in the state dtype
    (float64 for float64 inputs, else float32)."""
    T, B, N = I.shape
    sdt = torch.float64 if I.dtype == torch.float64 else torch.float32
    I = I.contiguous()
    Z = torch.empty_like(I)
    V = torch.empty(I.shape, dtype=sdt, device=I.device)
    A = torch.empty_like(V)
    z0 = torch.gt(v0, b + beta * a0).to(I.dtype).contiguous()
    rec = w_rec is not None
    use_dot = sdt == torch.float32 and DOT_F32 and ROWS >= 16
    grid, cols, BB, BN, BK = _tiles(N, B, rec, use_dot)
    W = w_rec.detach().contiguous() if rec else V
    _alif_fwd[grid](I, v0.contiguous(), a0.contiguous(), z0, _vec(alpha, N), _vec(rho, N), _vec(b, N), _vec(beta, N),
                    W, Z, V, A, T, B, N, cols, HAS_W=rec, USE_DOT=use_dot, BB=BB, BN=BN, BK=BK, num_warps=WARPS)
    return Z, V, A


def alif_backward(gZ, form, Z, V, A, v0, a0, alpha, rho, b, beta, w_rec, detach: bool, gvT, gaT):
    """``(G, dL/dv0, dL/da0, [N] sums of dL/dalpha, dL/drho, dL/db, dL/dbeta)``, with ``G = dL/dv_t``
    (the gradient of the input currents) in the state dtype."""
    T, B, N = V.shape
    sdt = V.dtype
    dev = V.device
    G = torch.empty_like(V)
    GA = torch.empty((B, N), dtype=sdt, device=dev)
    C = torch.empty((B, N), dtype=sdt, device=dev)
    acc = torch.zeros((4, B, N), dtype=sdt, device=dev)
    gv0 = torch.empty_like(v0)
    ga0 = torch.empty_like(a0)
    z0 = torch.gt(v0, b + beta * a0).to(Z.dtype).contiguous()
    rec = w_rec is not None
    use_dot = sdt == torch.float32 and DOT_F32 and ROWS >= 16
    grid, cols, BB, BN, BK = _tiles(N, B, rec, use_dot)
    W = w_rec.detach().contiguous() if rec else V
    code = form[0]
    sur_c = surrogate_constants(form, sdt, dev)
    _alif_bwd[grid](gZ.contiguous() if gZ is not None else V, Z, V, A, v0.contiguous(), a0.contiguous(), z0,
                    _vec(alpha, N), _vec(rho, N), _vec(b, N), _vec(beta, N), W,
                    gvT.contiguous() if gvT is not None else v0, gaT.contiguous() if gaT is not None else a0,
                    G, GA, C, acc, gv0, ga0, T, B, N, cols, sur_c,
                    HAS_W=rec, USE_DOT=use_dot, DETACH=bool(detach), HAS_GZ=gZ is not None,
                    HAS_GVT=gvT is not None, HAS_GAT=gaT is not None, SUR=code, BB=BB, BN=BN, BK=BK,
                    num_warps=WARPS)
    sums = acc.sum(1)
    return G, gv0, ga0, sums[0], sums[1], sums[2], sums[3]

"""Triton forms of online learning's trace arithmetic: the matrix eligibility trace of one layer
in the stream step (:func:`mat_trace_step`; its CPU form and torch reference are in
:mod:`.trace_numba`) and the chunked block's reverse filter with its Jacobian products
(:func:`block_filter`).

Per step and layer, for every (neuron n, presynaptic input h), with k = 1 (LIF, readout) or
k = 2 (ALIF ``(v, a)``, CUBA ``(i, v)``, LRU ``(Re h, Im h)`` where ``J`` is multiplication by
``lam`` on split Re/Im):

    eps[n, b, :, h] <- J[b, n] eps[n, b, :, h] + c[b, n, :] x[b, h]          (trace advance)
    G_r[n, h]        = sum_b sum_f g_r[b, n, f] eps[n, b, f, h]              (contraction, r = 1, 2)

(traces are stored neuron-major, ``eps [N, B, k, H]``).

fused in one pass over ``eps`` (read once, written once): the operation is bandwidth-bound
and this halves the traffic of the separate torch ops. ``g_2`` serves a second parameter
that shares the trace (the LRU's ``B_im``, whose trace is ``i * eps[B_re]``). One program
owns a tile of ``(n, h)`` and loops over the batch, so the batch reduction needs no
atomics. The state update itself stays in the autograd graph (the spatial backward needs
it); per-neuron traces are ``[B, N, k]`` and stay in torch.

On the CPU the kernels run under ``TRITON_INTERPRET=1`` (set before ``triton`` is imported) for
the tests: :func:`mat_trace_step` against :func:`mat_trace_step_torch` and, through the stream
step, against the trace recursion on the partials derived from each kind's step;
:func:`block_filter` against the torch forms in :mod:`spikerec.hardware.online.traces_base`.
"""
from __future__ import annotations

import os

import torch

from .. import neurons
from .trace_numba import mat_trace_step_torch

__all__ = ["triton_available", "mat_trace_step", "block_filter"]

try:  # triton is optional
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_TRITON = False


def triton_available(x: torch.Tensor | None = None) -> bool:
    """True if the kernel can run on ``x``'s device (CUDA, or any device under the interpreter)."""
    if not _HAVE_TRITON:
        return False
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return True
    return x is not None and x.is_cuda


if _HAVE_TRITON:

    @triton.jit
    def _mat_trace_kernel(eps_ptr, J_ptr, c_ptr, x_ptr, g1_ptr, g2_ptr, G1_ptr, G2_ptr,
                          B, N, H, sJb,
                          K: tl.constexpr, USE_G: tl.constexpr, TWO: tl.constexpr,
                          BN: tl.constexpr, BH: tl.constexpr):
        pn = tl.program_id(0)
        ph = tl.program_id(1)
        n = pn * BN + tl.arange(0, BN)
        h = ph * BH + tl.arange(0, BH)
        mn = n < N
        mh = h < H
        m2 = mn[:, None] & mh[None, :]
        acc1 = tl.zeros((BN, BH), dtype=G1_ptr.dtype.element_ty)
        acc2 = tl.zeros((BN, BH), dtype=G1_ptr.dtype.element_ty)
        for b in range(B):
            xv = tl.load(x_ptr + b * H + h, mask=mh, other=0.0)
            row = b * N + n  # [BN] index into [B, N] arrays
            erow = n * B + b  # [BN] index into the neuron-major trace
            if K == 1:
                off = erow[:, None] * H + h[None, :]
                e0 = tl.load(eps_ptr + off, mask=m2, other=0.0)
                j00 = tl.load(J_ptr + b * sJb + n, mask=mn, other=0.0)
                c0 = tl.load(c_ptr + row, mask=mn, other=0.0)
                e0 = j00[:, None] * e0 + c0[:, None] * xv[None, :]
                tl.store(eps_ptr + off, e0, mask=m2)
                if USE_G:
                    g0 = tl.load(g1_ptr + row, mask=mn, other=0.0)
                    acc1 += g0[:, None] * e0
                    if TWO:
                        q0 = tl.load(g2_ptr + row, mask=mn, other=0.0)
                        acc2 += q0[:, None] * e0
            else:
                off0 = (erow * 2)[:, None] * H + h[None, :]
                off1 = off0 + H
                e0 = tl.load(eps_ptr + off0, mask=m2, other=0.0)
                e1 = tl.load(eps_ptr + off1, mask=m2, other=0.0)
                jb = J_ptr + b * sJb + n * 4
                j00 = tl.load(jb, mask=mn, other=0.0)
                j01 = tl.load(jb + 1, mask=mn, other=0.0)
                j10 = tl.load(jb + 2, mask=mn, other=0.0)
                j11 = tl.load(jb + 3, mask=mn, other=0.0)
                c0 = tl.load(c_ptr + row * 2, mask=mn, other=0.0)
                c1 = tl.load(c_ptr + row * 2 + 1, mask=mn, other=0.0)
                f0 = j00[:, None] * e0 + j01[:, None] * e1 + c0[:, None] * xv[None, :]
                f1 = j10[:, None] * e0 + j11[:, None] * e1 + c1[:, None] * xv[None, :]
                tl.store(eps_ptr + off0, f0, mask=m2)
                tl.store(eps_ptr + off1, f1, mask=m2)
                if USE_G:
                    g0 = tl.load(g1_ptr + row * 2, mask=mn, other=0.0)
                    g1 = tl.load(g1_ptr + row * 2 + 1, mask=mn, other=0.0)
                    acc1 += g0[:, None] * f0 + g1[:, None] * f1
                    if TWO:
                        q0 = tl.load(g2_ptr + row * 2, mask=mn, other=0.0)
                        q1 = tl.load(g2_ptr + row * 2 + 1, mask=mn, other=0.0)
                        acc2 += q0[:, None] * f0 + q1[:, None] * f1
        if USE_G:
            offG = n[:, None] * H + h[None, :]
            tl.store(G1_ptr + offG, acc1, mask=m2)
            if TWO:
                tl.store(G2_ptr + offG, acc2, mask=m2)


def mat_trace_step(eps, J, c, x, gs):
    """Fused Triton version of :func:`mat_trace_step_torch` (``k`` in {1, 2}, at most two ``g``)."""
    N, Bsz, k, H = eps.shape
    if not _HAVE_TRITON or k not in (1, 2) or len(gs) > 2 or not eps.is_contiguous():
        return mat_trace_step_torch(eps, J, c, x, gs)
    Jx = J.expand(Bsz, -1, -1, -1)
    if Jx.stride(0) != 0:
        Jx = Jx.contiguous()
    elif not J[0].is_contiguous():
        Jx = J[0].contiguous().unsqueeze(0).expand(Bsz, -1, -1, -1)
    sJb = Jx.stride(0)
    c = c.contiguous()
    x = x.contiguous()
    use_g = gs[0] is not None
    two = use_g and len(gs) == 2
    g1 = gs[0].contiguous() if use_g else c
    g2 = gs[1].contiguous() if two else g1
    G1 = torch.empty(N, H, dtype=eps.dtype, device=eps.device)
    G2 = torch.empty(N, H, dtype=eps.dtype, device=eps.device) if two else G1
    BN, BH = 16, 32
    grid = (triton.cdiv(N, BN), triton.cdiv(H, BH))
    _mat_trace_kernel[grid](eps, Jx, c, x, g1, g2, G1, G2, Bsz, N, H, sJb,
                            K=k, USE_G=use_g, TWO=two, BN=BN, BH=BH)
    if not use_g:
        return [None] * len(gs)
    return [G1, G2] if two else [G1]


if _HAVE_TRITON:

    @triton.jit
    def _block_filter_kernel(J_ptr, G_ptr, GH_ptr, PH_ptr, phi_ptr, K, M, N, sJk, sJb,
                             TWO: tl.constexpr, HAS_G: tl.constexpr, POWERS: tl.constexpr, BLOCK: tl.constexpr):
        # one lane per (b, n); the K steps of the block in reverse, the lane's k x k Jacobians in registers
        m = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = m < M
        jb = J_ptr + (m // N) * sJb + (m % N) * (4 if TWO else 1)
        zero = tl.zeros((BLOCK,), dtype=GH_ptr.dtype.element_ty)
        n00, n01, n10, n11 = zero, zero, zero, zero  # J_{t+1} (zero past the block's end)
        h0, h1 = zero, zero  # gh_{t+1}
        p00, p01, p10, p11 = zero + 1.0, zero, zero, zero + 1.0  # Phi_t = J_{K-1} ... J_{t+1}
        for s in range(0, K):
            t = K - 1 - s
            jt = jb + t * sJk
            if TWO:
                j00 = tl.load(jt, mask=mask, other=0.0)
                j01 = tl.load(jt + 1, mask=mask, other=0.0)
                j10 = tl.load(jt + 2, mask=mask, other=0.0)
                j11 = tl.load(jt + 3, mask=mask, other=0.0)
            else:
                j00 = tl.load(jt, mask=mask, other=0.0)
            if HAS_G:  # gh_t = g_t + J_{t+1}^T gh_{t+1}
                if TWO:
                    off = (t * M + m) * 2
                    g0 = tl.load(G_ptr + off, mask=mask, other=0.0) + n00 * h0 + n10 * h1
                    g1 = tl.load(G_ptr + off + 1, mask=mask, other=0.0) + n01 * h0 + n11 * h1
                    tl.store(GH_ptr + off, g0, mask=mask)
                    tl.store(GH_ptr + off + 1, g1, mask=mask)
                    h0, h1 = g0, g1
                else:
                    off = t * M + m
                    g0 = tl.load(G_ptr + off, mask=mask, other=0.0) + n00 * h0
                    tl.store(GH_ptr + off, g0, mask=mask)
                    h0 = g0
            if POWERS:  # PH[t] = Phi_t, then Phi_{t-1} = Phi_t J_t
                if TWO:
                    off = (t * M + m) * 4
                    tl.store(PH_ptr + off, p00, mask=mask)
                    tl.store(PH_ptr + off + 1, p01, mask=mask)
                    tl.store(PH_ptr + off + 2, p10, mask=mask)
                    tl.store(PH_ptr + off + 3, p11, mask=mask)
                    p00, p01, p10, p11 = (p00 * j00 + p01 * j10, p00 * j01 + p01 * j11,
                                          p10 * j00 + p11 * j10, p10 * j01 + p11 * j11)
                else:
                    tl.store(PH_ptr + t * M + m, p00, mask=mask)
                    p00 = p00 * j00
            if TWO:
                n00, n01, n10, n11 = j00, j01, j10, j11
            else:
                n00 = j00
        if POWERS:
            if TWO:
                tl.store(phi_ptr + m * 4, p00, mask=mask)
                tl.store(phi_ptr + m * 4 + 1, p01, mask=mask)
                tl.store(phi_ptr + m * 4 + 2, p10, mask=mask)
                tl.store(phi_ptr + m * 4 + 3, p11, mask=mask)
            else:
                tl.store(phi_ptr + m, p00, mask=mask)


def block_filter(J, G, powers: bool):
    """The chunked block's reverse filter and Jacobian products in one Triton launch (``k`` in {1, 2}),
    with ``J [K or 1, B or 1, N, k, k]`` and ``G [K, B, N, k]`` (or ``None``; then ``J`` has all ``K``
    steps): ``gh_t = g_t + J_{t+1}^T gh_{t+1}`` (``gh_{K-1} = g_{K-1}``), and with ``powers``
    ``Phi_t = J_{K-1} ... J_{t+1}`` ``[K, B, N, k, k]`` and ``phi = Phi_0 J_0`` ``[B, N, k, k]``.
    Returns ``(GH | None, PH | None, phi | None)``. Each lane ``(b, n)`` walks the block's steps in
    reverse with its Jacobians in registers: one launch per block instead of a few small torch ops
    per step. The torch forms it equals: :func:`spikerec.hardware.online.traces_base.reverse_filter`
    and :func:`~spikerec.hardware.online.traces_base.jacobian_powers`."""
    k = J.shape[-1]
    K = G.shape[0] if G is not None else J.shape[0]
    B, N = (G.shape[1], G.shape[2]) if G is not None else (J.shape[1], J.shape[2])
    Jc = J.contiguous()
    sJk = 0 if J.shape[0] == 1 else Jc.stride(0)
    sJb = 0 if J.shape[1] == 1 else Jc.stride(1)
    M = B * N
    dt = J.dtype if G is None else G.dtype
    GH = torch.empty((K, B, N, k), dtype=dt, device=J.device) if G is not None else None
    PH = torch.empty((K, B, N, k, k), dtype=dt, device=J.device) if powers else None
    phi = torch.empty((B, N, k, k), dtype=dt, device=J.device) if powers else None
    BLOCK = 128
    _block_filter_kernel[(triton.cdiv(M, BLOCK),)](
        Jc, G.contiguous() if G is not None else Jc, GH if GH is not None else Jc, PH if powers else Jc,
        phi if powers else Jc, K, M, N, sJk, sJb, TWO=k == 2, HAS_G=G is not None, POWERS=powers, BLOCK=BLOCK)
    return GH, PH, phi


for _kind in ("lif", "alif", "readout", "lru"):  # the matrix trace of every kind with one or two states per neuron
    neurons.register_backend(_kind, "kernels.trace_triton (Triton matrix trace of the online stream step, CUDA)",
                             mat_trace_step,
                             test="tests/test_online_triton.py::test_triton_kernel_matches_torch_under_interpreter")

for _kind in ("lif", "alif"):  # the chunked block's reverse filter and Jacobian products of the per-neuron kinds
    neurons.register_backend(_kind, "kernels.trace_triton (Triton reverse filter of the chunked block, CUDA)",
                             block_filter,
                             test="tests/test_online_triton.py::test_block_filter_matches_torch_under_interpreter")

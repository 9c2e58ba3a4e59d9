"""The Triton form (CUDA) of the block's sequential part in online learning: the reverse filter ``gh_t = g_t +
J_{t+1}^T gh_{t+1}`` and the Jacobian products ``Phi_t = J_{K-1} ... J_{t+1}`` of every lane ``(b, n)`` with
``k`` in {1, 2} states (:func:`block_filter`; the CPU form is :mod:`.trace_numba`). The tests run it on the
CPU under ``TRITON_INTERPRET=1`` against :func:`spikerec.hardware.online.traces.lanes_torch`.
"""
from __future__ import annotations

import os

import torch

from .. import neurons

__all__ = ["triton_available", "block_filter"]

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
    """The reverse filter and Jacobian products in one launch (a lane ``(b, n)`` per thread, its Jacobians in
    registers): with ``J [K or 1, B or 1, N, k, k]``, ``G [K, B, N, k]`` or ``None`` (``J`` then has ``K`` steps),
    ``gh_t = g_t + J_{t+1}^T gh_{t+1}`` and with ``powers`` ``Phi_t = J_{K-1} ... J_{t+1}`` ``[K, B, N, k, k]``,
    ``phi = Phi_0 J_0`` ``[B, N, k, k]``. Returns ``(GH | None, PH | None, phi | None)``."""
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


for _kind in ("lif", "alif", "lru", "readout"):  # the chunked block's reverse filter and Jacobian products
    neurons.register_backend(_kind, "kernels.trace_triton (Triton reverse filter of the chunked block, CUDA)",
                             block_filter,
                             test="tests/test_online_triton.py::test_block_filter_matches_torch_under_interpreter")

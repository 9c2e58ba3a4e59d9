"""Triton blocked scan for ``x_t = a_t x_{t-1} + b_t`` (real, or complex as split Re/Im).

Same three phases as the torch version in :mod:`spikerec.scan`, with time cut into
``K`` chunks of ``L`` steps and the channels ``M = prod(b.shape[1:])`` in blocks:

1. ``_chunk_summary``: grid ``(M / BLOCK, K)``; each program runs its chunk from a
   zero state and stores the end state ``E_k`` and the product ``P_k`` of the ``a``;
2. the carries ``c_k = P_k c_{k-1} + E_k`` are one ``_chunk_scan`` launch with a
   single chunk of length ``K`` (coefficients ``P``, inputs ``E``);
3. ``_chunk_scan``: grid ``(M / BLOCK, K)``; each program re-runs its chunk from its
   carry and writes ``x``.

Complex tensors are read through ``torch.view_as_real`` (interleaved Re/Im, no copy).
``a`` is either constant in time (``[M]``) or ``[T, M]``. ``REVERSE`` runs
``y_t = a_t y_{t+1} + b_t`` (used by the backward pass). Tested on the CPU under
``TRITON_INTERPRET=1`` against the torch scan.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["scan_triton"]


@triton.jit
def _cmul(ar, ai, xr, xi, IS_COMPLEX: tl.constexpr):
    if IS_COMPLEX:
        return ar * xr - ai * xi, ar * xi + ai * xr
    else:
        return ar * xr, xi


@triton.jit
def _chunk_summary(a_ptr, b_ptr, e_ptr, p_ptr, T, M, L,
                   A_CONST: tl.constexpr, IS_COMPLEX: tl.constexpr, REVERSE: tl.constexpr, BLOCK: tl.constexpr):
    pid_m = tl.program_id(0)
    k = tl.program_id(1)
    W: tl.constexpr = 2 if IS_COMPLEX else 1
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    xr = tl.zeros([BLOCK], dtype=e_ptr.dtype.element_ty)
    xi = tl.zeros([BLOCK], dtype=e_ptr.dtype.element_ty)
    pr = xr + 1.0
    pi = tl.zeros([BLOCK], dtype=e_ptr.dtype.element_ty)
    if A_CONST:
        car = tl.load(a_ptr + offs * W, mask=mask, other=1.0)
        cai = xi
        if IS_COMPLEX:
            cai = tl.load(a_ptr + offs * W + 1, mask=mask, other=0.0)
    for l in range(0, L):
        s = k * L + l
        if REVERSE:
            t = T - 1 - s
        else:
            t = s
        valid = mask & (s < T)
        base = (t.to(tl.int64) * M + offs) * W
        br = tl.load(b_ptr + base, mask=valid, other=0.0)
        bi = xi
        if IS_COMPLEX:
            bi = tl.load(b_ptr + base + 1, mask=valid, other=0.0)
        if A_CONST:
            ar = tl.where(valid, car, 1.0)
            ai = tl.where(valid, cai, 0.0)
        else:
            ar = tl.load(a_ptr + base, mask=valid, other=1.0)
            ai = xi
            if IS_COMPLEX:
                ai = tl.load(a_ptr + base + 1, mask=valid, other=0.0)
        nr, ni = _cmul(ar, ai, xr, xi, IS_COMPLEX)
        xr = nr + br
        xi = ni + bi
        pr, pi = _cmul(ar, ai, pr, pi, IS_COMPLEX)
    obase = (k.to(tl.int64) * M + offs) * W
    tl.store(e_ptr + obase, xr, mask=mask)
    tl.store(p_ptr + obase, pr, mask=mask)
    if IS_COMPLEX:
        tl.store(e_ptr + obase + 1, xi, mask=mask)
        tl.store(p_ptr + obase + 1, pi, mask=mask)


@triton.jit
def _chunk_scan(a_ptr, b_ptr, c_ptr, out_ptr, T, M, L,
                HAS_C: tl.constexpr, A_CONST: tl.constexpr, IS_COMPLEX: tl.constexpr, REVERSE: tl.constexpr,
                BLOCK: tl.constexpr):
    pid_m = tl.program_id(0)
    k = tl.program_id(1)
    W: tl.constexpr = 2 if IS_COMPLEX else 1
    offs = pid_m * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    zero = tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty)
    xr = zero
    xi = zero
    if HAS_C:
        cbase = (k.to(tl.int64) * M + offs) * W
        xr = tl.load(c_ptr + cbase, mask=mask, other=0.0)
        if IS_COMPLEX:
            xi = tl.load(c_ptr + cbase + 1, mask=mask, other=0.0)
    if A_CONST:
        car = tl.load(a_ptr + offs * W, mask=mask, other=1.0)
        cai = zero
        if IS_COMPLEX:
            cai = tl.load(a_ptr + offs * W + 1, mask=mask, other=0.0)
    for l in range(0, L):
        s = k * L + l
        if REVERSE:
            t = T - 1 - s
        else:
            t = s
        valid = mask & (s < T)
        base = (t.to(tl.int64) * M + offs) * W
        br = tl.load(b_ptr + base, mask=valid, other=0.0)
        bi = zero
        if IS_COMPLEX:
            bi = tl.load(b_ptr + base + 1, mask=valid, other=0.0)
        if A_CONST:
            ar = car
            ai = cai
        else:
            ar = tl.load(a_ptr + base, mask=valid, other=1.0)
            ai = zero
            if IS_COMPLEX:
                ai = tl.load(a_ptr + base + 1, mask=valid, other=0.0)
        nr, ni = _cmul(ar, ai, xr, xi, IS_COMPLEX)
        xr = nr + br
        xi = ni + bi
        tl.store(out_ptr + base, xr, mask=valid)
        if IS_COMPLEX:
            tl.store(out_ptr + base + 1, xi, mask=valid)


def _real_view(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _launch_scan(a, b, carry, out, T, M, L, K, const, reverse, block):
    cplx = b.is_complex()
    grid = (triton.cdiv(M, block), K)
    c = _real_view(carry) if carry is not None else _real_view(b)  # placeholder pointer when HAS_C is False
    _chunk_scan[grid](_real_view(a), _real_view(b), c, _real_view(out), T, M, L, HAS_C=carry is not None, A_CONST=const, IS_COMPLEX=cplx,
                      REVERSE=reverse, BLOCK=block)


def scan_triton(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None, reverse: bool = False,
                chunk: int = 64, block: int = 256) -> torch.Tensor:
    """Blocked scan with Triton; same contract as ``spikerec.scan._scan_torch``.

    ``a``: ``b.dim()`` dims, ``a.shape[0]`` in ``(1, T)``; ``x0``: ``b.shape[1:]`` or None.
    """
    T = b.shape[0]
    M = b[0].numel()
    const = a.shape[0] == 1
    b2 = b.reshape(T, M).contiguous()
    a2 = (a.expand(1, *b.shape[1:]).reshape(M) if const else a.expand(b.shape).reshape(T, M)).contiguous()
    a2 = a2.resolve_conj()
    b2 = b2.resolve_conj()
    out = torch.empty_like(b2)
    if M == 0:
        return out.view(b.shape)
    L = max(1, min(chunk, T))
    K = triton.cdiv(T, L)
    x0f = None if x0 is None else x0.reshape(1, M).contiguous().resolve_conj()
    if K == 1:
        _launch_scan(a2, b2, x0f, out, T, M, T, 1, const, reverse, block)
        return out.view(b.shape)
    E = torch.empty(K, M, dtype=b2.dtype, device=b2.device)
    P = torch.empty_like(E)
    _chunk_summary[(triton.cdiv(M, block), K)](_real_view(a2), _real_view(b2), _real_view(E), _real_view(P), T, M, L,
                                               A_CONST=const, IS_COMPLEX=b2.is_complex(), REVERSE=reverse,
                                               BLOCK=block)
    # carries in processing order: c_k = P_k c_{k-1} + E_k, c_{-1} = x0 (K steps, one chunk)
    C = torch.empty_like(E)
    _launch_scan(P, E, x0f, C, K, M, K, 1, False, False, block)
    carry = torch.empty_like(E)
    if x0f is None:
        carry[0].zero_()
    else:
        carry[0].copy_(x0f[0])
    carry[1:].copy_(C[:-1])
    _launch_scan(a2, b2, carry, out, T, M, L, K, const, reverse, block)
    return out.view(b.shape)

"""Triton kernels of the feed-forward LIF time loop and its reverse pass (CUDA; on the CPU under
``TRITON_INTERPRET=1`` for tests).

The same recurrence as :mod:`spikerec.kernels.lif_sequence` (whose docstring gives the equations:
plain or current-based, resets "subtract" / "zero" / "none", the reset term detached or not).
Without recurrent weights every neuron of every sample is an independent scalar recurrence, so
one program runs ``BLOCK`` of them through all ``T`` steps with the state in registers:

* forward: reads ``I_t``, writes the spikes ``z_t`` (in the input's dtype) and what the backward
  reads, the membranes ``v_t`` (and the synaptic currents ``i_t`` of a CUBA layer), in the state's
  dtype (float32 for float16/bfloat16/float32 inputs, float64 for float64);
* backward: one reverse pass that recomputes the spikes from the saved membranes, evaluates the
  surrogate derivative in registers (:mod:`spikerec.kernels.surrogate_triton`), writes
  ``dL/dI_t`` and accumulates each element's share of the parameter gradients, which are summed
  over the batch afterwards.

The per-neuron parameters (``alpha``, ``alpha_s``, ``thr``) are ``[N]`` vectors; a shared (scalar)
one is expanded to ``[N]`` by the caller and its gradient summed back.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .surrogate_triton import surrogate_constants, surrogate_derivative

__all__ = ["lif_forward", "lif_backward", "RESET_CODES", "BLOCK"]

RESET_CODES = {"subtract": 0, "zero": 1, "none": 2}
BLOCK = 512  # elements per program: with WARPS warps and 16-byte accesses, each thread holds whole columns
STEPS = 4  # time steps per load and store (U): loads in flight per element
WARPS = 4


@triton.jit
def _row(tile, sel):
    """Row ``u`` of a ``[U, BLOCK]`` tile (``sel = arange(U)[:, None] == u``), exactly."""
    return tl.sum(tl.where(sel, tile, 0.0), axis=0)


@triton.jit
def _lif_fwd(I_ptr, v0_ptr, i0_ptr, alpha_ptr, alpha_s_ptr, thr_ptr,
             Z_ptr, V_ptr, S_ptr, vT_ptr, iT_ptr, T, M, N,
             SYN: tl.constexpr, RESET: tl.constexpr, BLOCK: tl.constexpr, U: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    n = offs % N
    sd = V_ptr.dtype.element_ty
    alpha = tl.load(alpha_ptr + n, mask=mask, other=0.0).to(sd)
    thr = tl.load(thr_ptr + n, mask=mask, other=1.0).to(sd)
    v = tl.load(v0_ptr + offs, mask=mask, other=0.0).to(sd)
    z = (v > thr).to(sd)
    if SYN:
        alpha_s = tl.load(alpha_s_ptr + n, mask=mask, other=0.0).to(sd)
        i = tl.load(i0_ptr + offs, mask=mask, other=0.0).to(sd)
    us = tl.arange(0, U)[:, None]
    cols = offs.to(tl.int64)[None, :]
    # U steps at a time: their inputs are loaded (and outputs stored) as one [U, BLOCK] tile, so
    # that U loads per element are in flight instead of one
    for t0 in range(0, T, U):
        steps = t0 + us
        m2 = (steps < T) & mask[None, :]
        ptrs = steps.to(tl.int64) * M + cols
        X = tl.load(I_ptr + ptrs, mask=m2, other=0.0).to(sd)
        Vt = tl.zeros([U, BLOCK], dtype=sd)
        Zt = tl.zeros([U, BLOCK], dtype=sd)
        if SYN:
            St = tl.zeros([U, BLOCK], dtype=sd)
        for u in tl.static_range(U):
            sel = us == u
            valid = t0 + u < T
            x = _row(X, sel)
            if SYN:
                i = tl.where(valid, x + alpha_s * i, i)
                St = tl.where(sel, i[None, :], St)
                x = i
            if RESET == 0:
                vn = (x + alpha * v) - thr * z
            elif RESET == 1:
                vn = x + (alpha * (1.0 - z)) * v
            else:
                vn = x + alpha * v
            v = tl.where(valid, vn, v)
            z = (v > thr).to(sd)
            Vt = tl.where(sel, v[None, :], Vt)
            Zt = tl.where(sel, z[None, :], Zt)
        tl.store(V_ptr + ptrs, Vt, mask=m2)
        tl.store(Z_ptr + ptrs, Zt.to(Z_ptr.dtype.element_ty), mask=m2)
        if SYN:
            tl.store(S_ptr + ptrs, St, mask=m2)
    tl.store(vT_ptr + offs, v.to(vT_ptr.dtype.element_ty), mask=mask)
    if SYN:
        tl.store(iT_ptr + offs, i.to(iT_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _lif_bwd(gZ_ptr, V_ptr, S_ptr, v0_ptr, i0_ptr, alpha_ptr, alpha_s_ptr, thr_ptr, gvT_ptr, giT_ptr,
             DJ_ptr, gv0_ptr, gi0_ptr, ga_ptr, gas_ptr, gth_ptr, T, M, N, sur_ptr,
             SYN: tl.constexpr, RESET: tl.constexpr, DETACH: tl.constexpr, HAS_GZ: tl.constexpr,
             HAS_GVT: tl.constexpr, HAS_GIT: tl.constexpr, SUR: tl.constexpr, NEED_PARAMS: tl.constexpr,
             NEED_STATE: tl.constexpr, BLOCK: tl.constexpr, U: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    n = offs % N
    sd = V_ptr.dtype.element_ty
    alpha = tl.load(alpha_ptr + n, mask=mask, other=0.0).to(sd)
    thr = tl.load(thr_ptr + n, mask=mask, other=1.0).to(sd)
    v0 = tl.load(v0_ptr + offs, mask=mask, other=0.0).to(sd)
    zero = tl.zeros([BLOCK], dtype=sd)
    gv = zero
    if HAS_GVT:
        gv = tl.load(gvT_ptr + offs, mask=mask, other=0.0).to(sd)
    if SYN:
        alpha_s = tl.load(alpha_s_ptr + n, mask=mask, other=0.0).to(sd)
        i0 = tl.load(i0_ptr + offs, mask=mask, other=0.0).to(sd)
        gi = zero
        if HAS_GIT:
            gi = tl.load(giT_ptr + offs, mask=mask, other=0.0).to(sd)
    carry = zero
    acc_a = zero
    acc_as = zero
    acc_th = zero
    us = tl.arange(0, U)[:, None]
    cols = offs.to(tl.int64)[None, :]
    n_chunks = tl.cdiv(T, U)
    for c in range(0, n_chunks):
        t0 = (n_chunks - 1 - c) * U
        steps = t0 + us
        m2 = (steps < T) & mask[None, :]
        ptrs = steps.to(tl.int64) * M + cols
        Vt = tl.load(V_ptr + ptrs, mask=m2, other=0.0)
        if HAS_GZ:
            GZt = tl.load(gZ_ptr + ptrs, mask=m2, other=0.0).to(sd)
        # the state before the chunk: saved at t0 - 1, or the initial state
        before = offs.to(tl.int64) + (t0 - 1).to(tl.int64) * M  # (unused where t0 = 0: masked)
        v_in = tl.where(t0 > 0, tl.load(V_ptr + before, mask=mask & (t0 > 0), other=0.0), v0)
        if SYN:
            St = tl.load(S_ptr + ptrs, mask=m2, other=0.0)
            s_in = tl.where(t0 > 0, tl.load(S_ptr + before, mask=mask & (t0 > 0), other=0.0), i0)
        DJt = tl.zeros([U, BLOCK], dtype=sd)
        for uu in tl.static_range(U):
            u = U - 1 - uu
            sel = us == u
            valid = t0 + u < T
            v = _row(Vt, sel)
            if u > 0:
                vp = _row(Vt, us == u - 1)
            else:
                vp = v_in
            zp = (vp > thr).to(sd)
            gz = carry
            if HAS_GZ:
                gz += _row(GZt, sel)
            gu = gz * surrogate_derivative(v - thr, sur_ptr, SUR)
            gu = tl.where(valid, gu, 0.0)
            acc_th -= gu
            gvn = gv + gu  # dL/dv_t
            if SYN:
                if u > 0:
                    sprev = _row(St, us == u - 1)
                else:
                    sprev = s_in
                gin = gi + gvn  # dL/dJ_t = dL/di_t
                DJt = tl.where(sel, gin[None, :], DJt)
                acc_as += tl.where(valid, gin * sprev, 0.0)
                gi = tl.where(valid, alpha_s * gin, gi)
            else:
                DJt = tl.where(sel, gvn[None, :], DJt)
            if RESET == 1:
                acc_a += tl.where(valid, gvn * ((1.0 - zp) * vp), 0.0)
            else:
                acc_a += tl.where(valid, gvn * vp, 0.0)
            if RESET == 0:
                acc_th -= tl.where(valid, gvn * zp, 0.0)
            if not DETACH:
                if RESET == 0:
                    carry = tl.where(valid, -thr * gvn, carry)
                elif RESET == 1:
                    carry = tl.where(valid, -(alpha * vp) * gvn, carry)
            if RESET == 1:
                gv = tl.where(valid, (alpha * (1.0 - zp)) * gvn, gv)
            else:
                gv = tl.where(valid, alpha * gvn, gv)
        tl.store(DJ_ptr + ptrs, DJt.to(DJ_ptr.dtype.element_ty), mask=m2)
    if not DETACH:
        if RESET != 2:  # z_{-1} = H(v0 - thr) receives the last carry
            gu0 = carry * surrogate_derivative(v0 - thr, sur_ptr, SUR)
            gv += gu0
            acc_th -= gu0
    if NEED_STATE:
        tl.store(gv0_ptr + offs, gv.to(gv0_ptr.dtype.element_ty), mask=mask)
    if NEED_PARAMS:
        tl.store(ga_ptr + offs, acc_a, mask=mask)
        tl.store(gth_ptr + offs, acc_th, mask=mask)
    if SYN:
        if NEED_STATE:
            tl.store(gi0_ptr + offs, gi.to(gi0_ptr.dtype.element_ty), mask=mask)
        if NEED_PARAMS:
            tl.store(gas_ptr + offs, acc_as, mask=mask)


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels keep the state in: float64 for float64 inputs, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def per_neuron(p: torch.Tensor, N: int) -> torch.Tensor:
    """A parameter of ``N`` or one element as a contiguous ``[N]`` vector (no copy when it is one)."""
    return p.detach().reshape(-1).expand(N).contiguous() if p.numel() == 1 else p.detach().reshape(N).contiguous()


def lif_forward(I, v0, i0, alpha, alpha_s, thr, reset: str):
    """``(Z, V, S|None, v_T, i_T|None)`` of the LIF recurrence over ``I[T, B, N]`` (module docstring):
    spikes in ``I``'s dtype; membranes ``V`` and currents ``S`` (CUBA) in the state dtype."""
    T, B, N = I.shape
    M = B * N
    syn = i0 is not None
    sdt = state_dtype(I.dtype)
    I = I.contiguous()
    Z = torch.empty_like(I)
    V = torch.empty(I.shape, dtype=sdt, device=I.device)
    S = torch.empty_like(V) if syn else V
    vT = torch.empty_like(v0)
    iT = torch.empty_like(i0) if syn else vT
    a = per_neuron(alpha, N)
    a_s = per_neuron(alpha_s, N) if syn else a
    th = per_neuron(thr, N)
    if T > 0:
        _lif_fwd[(triton.cdiv(M, BLOCK),)](
            I, v0.contiguous(), (i0 if syn else v0).contiguous(), a, a_s, th, Z, V, S, vT, iT, T, M, N,
            SYN=syn, RESET=RESET_CODES[reset], BLOCK=BLOCK, U=STEPS, num_warps=WARPS)
    else:
        vT.copy_(v0)
        if syn:
            iT.copy_(i0)
    return Z, V, (S if syn else None), vT, (iT if syn else None)


def lif_backward(gZ, form, V, S, v0, i0, alpha, alpha_s, thr, reset: str, detach: bool, gvT, giT, I_dtype,
                 need_params: bool = True, into_saved: bool = False, need_state: bool = True):
    """The reverse pass: ``(dL/dI, dL/dv0, dL/di0|None, dL/dalpha, dL/dalpha_s|None, dL/dthr)``, the
    parameter gradients as ``[N]`` sums over the batch (the caller sums them to the parameters'
    shapes; all None unless ``need_params``; the initial state's gradients None unless ``need_state``). ``form``: the surrogate's Triton form
    (:func:`surrogate_triton.triton_form`). ``into_saved``: write ``dL/dI`` over the saved membranes
    ``V`` where the dtypes agree (each step's membranes are read before its gradient is written), so
    the backward allocates no second ``[T, B, N]`` tensor; ``V`` is then spent."""
    T, B, N = V.shape
    M = B * N
    syn = S is not None
    sdt = V.dtype
    dev = V.device
    DJ = V if (into_saved and I_dtype == sdt) else torch.empty(V.shape, dtype=I_dtype, device=dev)
    gv0 = torch.empty_like(v0) if need_state else v0
    gi0 = torch.empty_like(i0) if (syn and need_state) else gv0
    acc = torch.empty((3, B, N), dtype=sdt, device=dev) if need_params else V
    a = per_neuron(alpha, N)
    a_s = per_neuron(alpha_s, N) if syn else a
    th = per_neuron(thr, N)
    code = form[0]
    sur_c = surrogate_constants(form, sdt, dev)
    gz = gZ.contiguous() if gZ is not None else V
    _lif_bwd[(triton.cdiv(M, BLOCK),)](
        gz, V, S if syn else V, v0.contiguous(), (i0 if syn else v0).contiguous(), a, a_s, th,
        gvT.contiguous() if gvT is not None else v0, giT.contiguous() if giT is not None else v0,
        DJ, gv0, gi0, acc[0], acc[1], acc[2], T, M, N, sur_c,
        SYN=syn, RESET=RESET_CODES[reset], DETACH=bool(detach), HAS_GZ=gZ is not None,
        HAS_GVT=gvT is not None, HAS_GIT=(syn and giT is not None), SUR=code, NEED_PARAMS=need_params,
        NEED_STATE=need_state, BLOCK=BLOCK, U=STEPS, num_warps=WARPS)
    if not need_state:
        gv0 = gi0 = None
    if not need_params:
        return DJ, gv0, (gi0 if syn else None), None, None, None
    sums = acc.sum(1)
    return DJ, gv0, (gi0 if syn else None), sums[0], (sums[1] if syn else None), sums[2]

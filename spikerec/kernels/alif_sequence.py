"""Fused time loop of the adaptive LIF (ALIF) neuron with a hand-written backward.

The recurrence, in the form of the official code of the LSC paper (Herranz-Celotti &
Rouat, 2024, Sec. 4 and App. H; the adaptive threshold of Bellec et al. 2018, eq. 2-3):

    z_{t-1} = H(v_{t-1} - b - beta a_{t-1})
    a_t     = rho a_{t-1} + (1 - rho) z_{t-1}
    theta_t = b + beta a_t
    v_t     = alpha v_{t-1} + I_t + W_rec z_{t-1} - theta_t z_{t-1}
    z_t     = H(v_t - theta_t)

with the reset term stop-gradient when ``detach_reset`` (as the official code). The input
currents ``I`` come from one matmul outside.

Saved for the backward: ``v_t``, ``a_t`` and the spikes as booleans (one byte); never
the input currents. Each forward step is five torch calls (``a``, ``theta``, the recurrent
``addmm``, the membrane, the comparison), each backward step four (the surrogate
product, ``dL/dv``, ``dL/da``, and one ``addmm`` for the carry into ``z_{t-1}``); the
surrogate derivatives and all parameter reductions are vectorised outside the loops.
It equals autograd through :meth:`ALIF.step` (tests check values and gradients in float64).

Three implementations:

* on the CPU (float32/float64), the compiled kernel of
  :mod:`spikerec.kernels.alif_sequence_numba` (compiled steps; the recurrent products by torch
  matmuls between them, or summed inside one compiled loop for layers of up to 128 neurons;
  surrogate derivative and parameter gradients inside the loop), when numba is installed;
* on CUDA, the Triton kernels of :mod:`spikerec.kernels.alif_triton` (one persistent launch per
  pass, the recurrent product inside it; float16/bfloat16 inputs run with a float32 state), when
  Triton is installed and the surrogate has a Triton form;
* otherwise the torch loop below.

``impl`` picks one: ``"auto"`` (the default), ``"torch"``, ``"numba"`` or ``"triton"`` (also on CPU
tensors under ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import os

import torch

from . import alif_sequence_numba as _nb

__all__ = ["ALIFSequence", "alif_sequence", "IMPLS"]

IMPLS = ("auto", "torch", "numba", "triton")


def _use_numba(impl: str, I: torch.Tensor) -> bool:
    if impl == "numba":
        if I.device.type != "cpu":
            raise ValueError(f"ALIF kernel impl='numba': needs CPU tensors, got {I.device}")
        if not _nb.available():
            raise RuntimeError("ALIF kernel impl='numba': the 'numba' package is not importable; use impl='torch'")
        return True
    return (impl == "auto" and I.device.type == "cpu" and I.dtype in (torch.float32, torch.float64)
            and os.environ.get("SPIKEREC_NUMBA", "1") != "0" and _nb.available())


def _triton_form(impl: str, I: torch.Tensor, surrogate, params):
    """The surrogate's Triton form when the Triton kernels run this call, else None."""
    from . import triton_available

    if impl == "triton":
        if not triton_available():
            raise RuntimeError("ALIF kernel impl='triton': the 'triton' package is not importable; use impl='torch'")
        if not I.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("ALIF kernel impl='triton': needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                             f"importing triton); got {I.device}")
    elif not (impl == "auto" and I.is_cuda and triton_available()):
        return None
    if I.shape[0] == 0:  # an empty sequence: the torch loop returns the initial state
        return None
    ok = (I.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
          and all(p.numel() in (1, I.shape[-1]) for p in params))
    if not ok:
        if impl == "triton":
            raise ValueError("ALIF kernel impl='triton': needs float16/bfloat16/float32/float64 inputs and "
                             "per-neuron or shared parameters")
        return None
    from .surrogate_triton import triton_form

    form = triton_form(surrogate)
    if form is None and impl == "triton":
        raise ValueError(f"ALIF kernel impl='triton': surrogate {surrogate.name!r} has no Triton form")
    return form


def _like_param(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A ``[N]`` gradient summed to the shape and dtype of the parameter ``p`` (shared or per neuron)."""
    return (g.sum() if p.numel() == 1 else g).reshape(p.shape).to(p.dtype)


class ALIFSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, I, v0, a0, alpha, rho, b, beta, w_rec, surrogate, detach_reset, impl="auto"):
        ctx.surrogate, ctx.detach_reset = surrogate, detach_reset
        if impl not in IMPLS:
            raise ValueError(f"ALIF kernel: impl must be one of {IMPLS}, got {impl!r}")
        ctx.triton = _triton_form(impl, I, surrogate, (alpha, rho, b, beta))
        if ctx.triton is not None:
            from .alif_triton import alif_forward

            Z, V, A = alif_forward(I, v0, a0, alpha, rho, b, beta, w_rec)
            ctx.save_for_backward(v0, a0, alpha, rho, b, beta, w_rec, V, A, Z)
            ctx.I_dtype = I.dtype
            return Z, V[-1].to(v0.dtype), A[-1].to(a0.dtype)
        ctx.numba = _use_numba(impl, I)
        if ctx.numba:
            z0 = torch.gt(v0, b + beta * a0)
            Z, Zb, V, A, vT, aT = _nb.alif_forward(I, v0, a0, alpha, rho, b, beta, w_rec)
            ctx.save_for_backward(v0, a0, alpha, rho, b, beta, w_rec, V, A, Zb, z0)
            return Z, vT, aT
        T = I.shape[0]
        V = torch.empty_like(I)
        A = torch.empty_like(I)
        Z = torch.empty_like(I)
        z0 = torch.gt(v0, b + beta * a0)
        z = z0.to(I.dtype)
        v, a = v0, a0
        one_m_rho = 1.0 - rho
        w_t = w_rec.t() if w_rec is not None else None
        theta = torch.empty_like(v0)  # one buffer for every step (no allocation in the loop)
        for t in range(T):
            a = torch.mul(a, rho, out=A[t]).addcmul_(one_m_rho, z)  # rho a + (1 - rho) z
            torch.addcmul(b, beta, a, out=theta)
            if w_t is None:
                vt = torch.addcmul(I[t], alpha, v, out=V[t])
            else:  # the recurrent product written straight into V[t], then the leak
                vt = torch.addmm(I[t], z, w_t, out=V[t]).addcmul_(alpha, v)
            v = vt.addcmul_(theta, z, value=-1.0)
            z = torch.gt(v, theta, out=Z[t])
        ctx.save_for_backward(v0, a0, alpha, rho, b, beta, w_rec, V, A, Z.to(torch.bool), z0)
        return Z, v.clone(), a.clone()

    @staticmethod
    def backward(ctx, gZ, gvT, gaT):
        if ctx.triton is not None:
            from .alif_triton import alif_backward

            v0, a0, alpha, rho, b, beta, w_rec, V, A, Z = ctx.saved_tensors
            need = ctx.needs_input_grad
            G, gv, ga, g_alpha, g_rho, g_b, g_beta = alif_backward(
                gZ, ctx.triton, Z, V, A, v0, a0, alpha, rho, b, beta, w_rec, ctx.detach_reset, gvT, gaT)
            g_w = None
            if w_rec is not None and need[7]:  # sum_t dL/dv_t^T z_{t-1}
                N = V.shape[-1]
                z0 = torch.gt(v0, b + beta * a0).to(G.dtype)
                g_w = torch.mm(G[0].t(), z0)
                if V.shape[0] > 1:
                    g_w.addmm_(G[1:].reshape(-1, N).t(), Z[:-1].reshape(-1, N).to(G.dtype))
                g_w = g_w.to(w_rec.dtype)
            pick = lambda g, k, p: _like_param(g, p) if need[k] else None  # noqa: E731
            return (G.to(ctx.I_dtype), gv, ga, pick(g_alpha, 3, alpha), pick(g_rho, 4, rho), pick(g_b, 5, b),
                    pick(g_beta, 6, beta), g_w, None, None, None)
        v0, a0, alpha, rho, b, beta, w_rec, V, A, Zb, z0 = ctx.saved_tensors
        sur, detach = ctx.surrogate, ctx.detach_reset
        need = ctx.needs_input_grad
        T = V.shape[0]
        dtype = V.dtype
        if gZ is None:
            gZ = torch.zeros_like(V)
        if ctx.numba:
            G, gv, ga, g_alpha, g_rho, g_b, g_beta = _nb.alif_backward(
                gZ, sur, V, A, Zb, v0, a0, z0, alpha, rho, b, beta, w_rec, detach, gvT, gaT)
            g_w = None
            if w_rec is not None and need[7]:  # sum_t dL/dv_t^T z_{t-1}
                N = V.shape[-1]
                g_w = torch.mm(G[0].t(), z0.to(dtype))
                if T > 1:
                    g_w.addmm_(G[1:].reshape(-1, N).t(), Zb[:-1].reshape(-1, N).to(dtype))
            pick = lambda g, k: g if need[k] else None  # noqa: E731
            return (G, gv, ga, pick(g_alpha, 3), pick(g_rho, 4), pick(g_b, 5), pick(g_beta, 6), g_w,
                    None, None, None)
        THETA = torch.addcmul(b, beta, A)
        Zprev = torch.cat([z0.unsqueeze(0), Zb[:-1]], 0).to(dtype)
        GU = sur.derivative(V - THETA)  # overwritten in place by dL/dz * sigma'
        del THETA
        G = torch.empty_like(V)  # dL/dv_t
        GA = torch.empty_like(V)  # dL/da_t
        one_m_rho = 1.0 - rho
        w_b = w_rec.contiguous() if w_rec is not None else None
        gv = gvT if gvT is not None else torch.zeros_like(v0)
        ga = gaT if gaT is not None else torch.zeros_like(v0)
        neg_beta = -beta
        cbuf = torch.empty_like(v0)  # the carry into z_{t-1}, one buffer for every step
        carry = None
        for t in range(T - 1, -1, -1):
            gu = GU[t]
            if carry is None:
                gu.mul_(gZ[t])
            else:
                gu.mul_(carry.add_(gZ[t]))
            if t == T - 1:
                gv = torch.add(gv, gu, out=G[t])
                ga = torch.addcmul(ga, neg_beta, gu, out=GA[t])
            else:
                gv = torch.addcmul(gu, alpha, gv, out=G[t])  # alpha dL/dv_{t+1} + gu
                ga = torch.mul(ga, rho, out=GA[t]).addcmul_(neg_beta, gu)
            if not detach:
                ga.addcmul_(gv, Zprev[t] * beta, value=-1.0)  # theta_t z_{t-1} depends on a_t
            carry = torch.mul(ga, one_m_rho, out=cbuf)
            if w_b is not None:
                carry.addmm_(gv, w_b)
            if not detach:
                carry.addcmul_(gv, b + beta * A[t], value=-1.0)
        gv = alpha * gv
        ga = rho * ga
        # z_{-1} = H(v0 - b - beta a0)
        gu0 = carry * sur.derivative(v0 - (b + beta * a0))
        gv = gv + gu0
        ga = ga - beta * gu0
        # dL/dtheta_t = -gu_t (- dL/dv_t z_{t-1} without detach)
        GTH = GU.neg_() if detach else torch.addcmul(GU, G, Zprev).neg_()
        g_alpha = g_rho = g_b = g_beta = g_w = None
        if need[3]:
            Vprev = torch.cat([v0.unsqueeze(0), V[:-1]], 0)
            g_alpha = (G * Vprev).sum((0, 1))
        if need[4]:
            Aprev = torch.cat([a0.unsqueeze(0), A[:-1]], 0)
            g_rho = (GA * (Aprev - Zprev)).sum((0, 1))
        if need[5]:
            g_b = GTH.sum((0, 1)) - gu0.sum(0)
        if need[6]:
            g_beta = (GTH * A).sum((0, 1)) - (gu0 * a0).sum(0)
        if w_rec is not None and need[7]:
            N = V.shape[-1]
            g_w = G.reshape(-1, N).t() @ Zprev.reshape(-1, N)
        return (G, gv, ga, g_alpha, g_rho, g_b, g_beta, g_w, None, None, None)


def alif_sequence(I, v0, a0, alpha, rho, b, beta, w_rec, surrogate, detach_reset, impl="auto"):
    """``(Z, v_T, a_T)`` of the ALIF recurrence over ``I[T, B, N]`` (module docstring)."""
    return ALIFSequence.apply(I, v0, a0, alpha, rho, b, beta, w_rec, surrogate, detach_reset, impl)

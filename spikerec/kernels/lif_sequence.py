"""Fused time loop of the LIF neuron with a hand-written backward.

The input currents of all T steps are computed outside (one matmul); this function
runs the recurrence

    J_t   = I_t + W_rec z_{t-1}                       (recurrent layers only)
    i_t   = alpha_s i_{t-1} + J_t                     (current-based synapse, optional)
    v_t   = alpha v_{t-1} + i_t - thr z_{t-1}         (reset "subtract")
          = alpha (1 - z_{t-1}) v_{t-1} + i_t         (reset "zero")
          = alpha v_{t-1} + i_t                       (reset "none")
    z_t   = H(v_t - thr)

with ``z_{-1} = H(v_{-1} - thr)``, and its exact surrogate-gradient backward
(backpropagation through time of these equations; Neftci, Mostafa & Zenke 2019, eq. 7
and Sec. III for the surrogate). It equals autograd through :meth:`LIF.step` (tests check
values and gradients in float64).

What is saved for the backward is what it reads: the membranes ``v_t`` (the surrogate
derivative and the decay gradient need them) and the synaptic currents ``i_t`` of a CUBA
layer; never the input currents, and not the spikes either: ``z_t = [v_t > thr]`` is
recomputed exactly from the saved membrane (4 bytes per neuron and step in all, the
same as a plain autograd loop, which saves the surrogate's argument). The backward
evaluates all surrogate derivatives in one vectorised call and then runs the reverse
recurrence

    dL/dv_t = dL/dz_t sigma'(v_t - thr) + alpha dL/dv_{t+1}   (+ the reset and recurrent carries)

Three implementations:

* feed-forward layers on the CPU: the compiled kernel of
  :mod:`spikerec.kernels.lif_sequence_numba` (one pass per block of neurons, parameter
  gradients accumulated inside the reverse loop), when numba is installed;
* feed-forward layers on CUDA: the Triton kernels of :mod:`spikerec.kernels.lif_triton` (one
  launch for the forward and one for the backward; float16/bfloat16 inputs run with a float32
  state), when Triton is installed and the surrogate has a Triton form;
* otherwise (recurrent layers, no compiled form) a torch loop of a few in-place ops per step;
  the recurrent matmul of the backward uses the weight's transpose laid out once before the loop.

``impl`` picks one: ``"auto"`` (the default), ``"torch"``, ``"numba"`` or ``"triton"`` (also on CPU
tensors under ``TRITON_INTERPRET=1``).
"""
from __future__ import annotations

import os

import torch

from . import lif_sequence_numba as _nb

__all__ = ["LIFSequence", "lif_sequence", "IMPLS"]

IMPLS = ("auto", "torch", "numba", "triton")


def _use_numba(impl: str, I: torch.Tensor, w_rec) -> bool:
    if impl == "numba":
        if w_rec is not None:
            raise ValueError("LIF kernel impl='numba': only feed-forward layers (no recurrent weight)")
        if I.device.type != "cpu":
            raise ValueError(f"LIF kernel impl='numba': needs CPU tensors, got {I.device}")
        if not _nb.available():
            raise RuntimeError("LIF kernel impl='numba': the 'numba' package is not importable; use impl='torch'")
        return True
    if impl != "auto":
        return False
    return (w_rec is None and I.device.type == "cpu" and I.dtype in (torch.float32, torch.float64)
            and os.environ.get("SPIKEREC_NUMBA", "1") != "0" and _nb.available())


def _triton_form(impl: str, I: torch.Tensor, w_rec, surrogate, params):
    """The surrogate's Triton form when the Triton kernels run this call, else None."""
    from . import triton_available

    if impl == "triton":
        if w_rec is not None:
            raise ValueError("LIF kernel impl='triton': only feed-forward layers (no recurrent weight)")
        if not triton_available():
            raise RuntimeError("LIF kernel impl='triton': the 'triton' package is not importable; use impl='torch'")
        if not I.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("LIF kernel impl='triton': needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                             f"importing triton); got {I.device}")
    elif not (impl == "auto" and I.is_cuda and w_rec is None and triton_available()):
        return None
    if I.shape[0] == 0:  # an empty sequence: the torch loop returns the initial state
        return None
    if I.dtype not in _TRITON_DTYPES or any(p is not None and p.numel() not in (1, I.shape[-1]) for p in params):
        if impl == "triton":
            raise ValueError("LIF kernel impl='triton': needs float16/bfloat16/float32/float64 inputs and "
                             "per-neuron or shared parameters")
        return None
    from .surrogate_triton import triton_form

    form = triton_form(surrogate)
    if form is None and impl == "triton":
        raise ValueError(f"LIF kernel impl='triton': surrogate {surrogate.name!r} has no Triton form")
    return form


_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _like_param(g: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A ``[N]`` gradient summed to the shape and dtype of the parameter ``p`` (shared or per neuron)."""
    return (g.sum() if p.numel() == 1 else g).reshape(p.shape).to(p.dtype)


class LIFSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, I, v0, i0, alpha, alpha_s, thr, w_rec, surrogate, reset, detach_reset, impl="auto"):
        if impl not in IMPLS:
            raise ValueError(f"LIF kernel: impl must be one of {IMPLS}, got {impl!r}")
        form = _triton_form(impl, I, w_rec, surrogate, (alpha, alpha_s, thr))
        ctx.triton = form
        ctx.numba = False
        if form is not None:
            from .lif_triton import lif_forward

            Z, V, S, vT, iT = lif_forward(I, v0, i0, alpha, alpha_s, thr, reset)
            ctx.save_for_backward(v0, i0, alpha, alpha_s, thr, V, S)
            ctx.reset, ctx.detach_reset, ctx.I_dtype, ctx.spent = reset, detach_reset, I.dtype, False
            return Z, vT, iT
        z0 = torch.gt(v0, thr)
        if _use_numba(impl, I, w_rec):
            Z, V, Iseq, vT, iT = _nb.lif_forward(I, v0, i0, alpha, alpha_s, thr, reset)
            ctx.numba = True
        else:
            Z, V, Iseq, vT, iT = _torch_forward(I, v0, i0, alpha, alpha_s, thr, w_rec, reset, z0)
            ctx.numba = False
        # v0 itself only where the backward reads it (the gradient of alpha, the zero reset,
        # a carry into z_{-1}); otherwise the initial spikes alone, as bool, and nothing when
        # there are none (checked on the CPU only: no device sync)
        keep_v0 = (ctx.needs_input_grad[3] or reset == "zero" or w_rec is not None
                   or (not detach_reset and reset != "none"))
        ctx.v0_shape = tuple(v0.shape)
        z0_saved = None if keep_v0 or (v0.device.type == "cpu" and not bool(z0.any())) else z0
        ctx.save_for_backward(v0 if keep_v0 else None, z0_saved, i0, alpha, alpha_s, thr, w_rec, V, Iseq)
        ctx.surrogate, ctx.reset, ctx.detach_reset = surrogate, reset, detach_reset
        return Z, vT, iT

    @staticmethod
    def backward(ctx, gZ, gvT, giT):
        if ctx.triton is not None:
            from .lif_triton import lif_backward

            if ctx.spent:
                raise RuntimeError("LIF kernel (Triton): the backward reuses the saved membranes for the gradient, "
                                   "so it runs once per forward; for a second backward (retain_graph) use impl='torch'")
            v0, i0, alpha, alpha_s, thr, V, S = ctx.saved_tensors
            need = ctx.needs_input_grad
            need_params = need[3] or need[4] or need[5]
            DJ, gv, gi, ga, gas, gth = lif_backward(gZ, ctx.triton, V, S, v0, i0, alpha, alpha_s, thr, ctx.reset,
                                                    ctx.detach_reset, gvT, giT, ctx.I_dtype, need_params,
                                                    into_saved=True, need_state=need[1] or need[2])
            ctx.spent = DJ is V
            return (DJ, gv, gi, _like_param(ga, alpha) if need[3] else None,
                    _like_param(gas, alpha_s) if (gas is not None and need[4]) else None,
                    _like_param(gth, thr) if need[5] else None, None, None, None, None, None)
        v0, z0, i0, alpha, alpha_s, thr, w_rec, V, Iseq = ctx.saved_tensors
        if v0 is not None:
            z0 = torch.gt(v0, thr)
        else:  # not read below except through z0 (and a zero-weighted term of the compiled kernel)
            v0 = V.new_zeros(ctx.v0_shape)
            z0 = torch.zeros(ctx.v0_shape, dtype=torch.bool) if z0 is None else z0
        sur, reset, detach = ctx.surrogate, ctx.reset, ctx.detach_reset
        need = ctx.needs_input_grad
        if gZ is None:
            gZ = torch.zeros_like(V)
        if ctx.numba:
            DJ, gv, gi, ga, gas, gth = _nb.lif_backward(gZ, sur, V, v0, z0, i0, Iseq, alpha, alpha_s, thr,
                                                       reset, detach, gvT, giT)
            g_alpha = ga.sum(0) if need[3] else None
            g_alpha_s = gas.sum(0) if (i0 is not None and need[4]) else None
            g_thr = gth.sum(0) if need[5] else None
            return (DJ, gv, gi, g_alpha, g_alpha_s, g_thr, None, None, None, None, None)
        SD = sur.derivative(V - thr)  # all surrogate derivatives at once
        return _torch_backward(ctx, gZ, gvT, giT, SD, v0, i0, alpha, alpha_s, thr, w_rec, V, Iseq, z0,
                               sur, reset, detach) + (None,)


def lif_sequence(I, v0, i0, alpha, alpha_s, thr, w_rec, surrogate, reset, detach_reset, impl="auto"):
    """``(Z, v_T, i_T)`` of the LIF recurrence over ``I[T, B, N]`` (module docstring)."""
    return LIFSequence.apply(I, v0, i0, alpha, alpha_s, thr, w_rec, surrogate, reset, detach_reset, impl)


def _torch_forward(I, v0, i0, alpha, alpha_s, thr, w_rec, reset, z0):
    T = I.shape[0]
    V = torch.empty_like(I)
    Z = torch.empty_like(I)
    syn = i0 is not None
    Iseq = torch.empty_like(I) if syn else None
    v = v0
    i = i0
    z = z0.to(I.dtype)
    w_t = w_rec.t() if w_rec is not None else None
    neg_thr = -thr
    for t in range(T):
        J = I[t] if w_t is None else torch.addmm(I[t], z, w_t)
        if syn:
            torch.addcmul(J, alpha_s, i, out=Iseq[t])
            i = J = Iseq[t]
        if reset == "subtract":
            torch.addcmul(J, alpha, v, out=V[t])
            V[t].addcmul_(z, neg_thr)
        elif reset == "zero":
            torch.addcmul(J, alpha * (1.0 - z), v, out=V[t])
        else:
            torch.addcmul(J, alpha, v, out=V[t])
        v = V[t]
        torch.gt(v, thr, out=Z[t])
        z = Z[t]
    return Z, V, Iseq, v.clone(), (i.clone() if syn else None)


def _torch_backward(ctx, gZ, gvT, giT, SD, v0, i0, alpha, alpha_s, thr, w_rec, V, Iseq, z0, sur, reset, detach):
    T = V.shape[0]
    dtype = V.dtype
    syn = i0 is not None
    need = ctx.needs_input_grad
    Zprev = torch.cat([z0.unsqueeze(0), torch.gt(V[:-1], thr)], 0).to(dtype)
    Vprev = torch.cat([v0.unsqueeze(0), V[:-1]], 0) if (need[3] or reset == "zero") else None
    carries = (w_rec is not None) or (not detach and reset != "none")
    gv = gvT.clone() if gvT is not None else torch.zeros_like(v0)
    gi = (giT.clone() if giT is not None else torch.zeros_like(v0)) if syn else None
    G = torch.empty_like(V)  # dL/dv_t (total)
    DJ = torch.empty_like(V) if syn else G  # dL/dJ_t
    GZ = torch.empty_like(V) if carries else gZ  # dL/dz_t (total)
    decay = alpha * (1.0 - Zprev) if reset == "zero" else None
    w_b = w_rec.contiguous() if w_rec is not None else None  # dL/dz_{t-1} += DJ_t W_rec, row-major once
    carry = None
    if not carries and not syn and reset != "zero":
        # pure reverse linear recurrence: G_t = gZ_t SD_t + alpha G_{t+1}
        GU = gZ * SD
        torch.add(GU[T - 1], gv, out=G[T - 1])
        for t in range(T - 2, -1, -1):
            torch.addcmul(GU[t], alpha, G[t + 1], out=G[t])
        gv = alpha * G[0]
        T_loop = -1
    else:
        T_loop = T - 1
    for t in range(T_loop, -1, -1):
        gz = gZ[t] if carry is None else gZ[t] + carry
        if carries:
            GZ[t] = gz
        gv = torch.addcmul(gv, gz, SD[t])
        G[t] = gv
        if syn:
            gi = gi + gv
            DJ[t] = gi
        if carries:
            carry = None
            if not detach and reset == "subtract":
                carry = -thr * gv
            elif not detach and reset == "zero":
                carry = -alpha * Vprev[t] * gv
            if w_b is not None:
                carry = torch.mm(DJ[t], w_b) if carry is None else torch.addmm(carry, DJ[t], w_b)
        if syn:
            gi = alpha_s * gi
        gv = decay[t] * gv if decay is not None else alpha * gv
    # z_{-1} = H(v0 - thr) receives `carry`; parameter reductions only where needed
    g_thr = -(GZ * SD).sum((0, 1)) if need[5] else None
    if carry is not None:
        gu0 = carry * sur.derivative(v0 - thr)
        gv = gv + gu0
        if need[5]:
            g_thr = g_thr - gu0.sum(0)
    g_alpha = None
    if need[3]:
        if reset == "zero":
            g_alpha = (G * (1.0 - Zprev) * Vprev).sum((0, 1))
        else:
            g_alpha = (G * Vprev).sum((0, 1))
    if reset == "subtract" and need[5]:
        g_thr = g_thr - (G * Zprev).sum((0, 1))
    g_alpha_s = None
    if syn and need[4]:
        Iprev = torch.cat([i0.unsqueeze(0), Iseq[:-1]], 0)
        g_alpha_s = (DJ * Iprev).sum((0, 1))  # dL/di_t equals dL/dJ_t
    g_w = None
    if w_rec is not None and need[6]:
        N = V.shape[-1]
        g_w = DJ.reshape(-1, N).t() @ Zprev.reshape(-1, N)
    return (DJ, gv, gi, g_alpha, g_alpha_s, g_thr, g_w, None, None, None)

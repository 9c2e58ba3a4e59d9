"""Compiled CPU kernel (numba) of the ALIF time loop and its reverse pass.

Runs the recurrence of :mod:`spikerec.kernels.alif_sequence` (whose docstring gives the
equations) as compiled steps: per step one pass over the ``[B, N]`` state; a recurrent
layer adds one torch matmul per step (the recurrent input ``W_rec z_{t-1}`` forward, the
carry ``dL/dv_t W_rec`` into ``z_{t-1}`` backward) between single-step calls, and a
feed-forward layer runs all steps in one call. The surrogate derivative is evaluated inline (fast sigmoid,
arc-tangent; other surrogates are evaluated by torch before the loop) and the per-neuron
parameter gradients are accumulated inside the reverse loop (in float64), so the backward
writes nothing of size ``T`` besides ``dL/dI``. Saved for the backward, as in the torch
loop: ``v_t``, ``a_t`` and the spikes as booleans.

The products stay in torch (its BLAS and thread pool): BLAS called from inside the
compiled loop (numpy's OpenBLAS) ran as fast alone but its threads competed with torch's
for the cores in a training step, and the whole layer was slower.
``numba`` is imported lazily (on the first call); compilation is cached on disk.
"""
from __future__ import annotations

import numpy as np
import torch

from . import as_numpy as _np, numba_available
from .lif_sequence_numba import surrogate_code

__all__ = ["available", "forward_consts", "alif_forward", "alif_backward"]


def _kernels():
    from . import alif_sequence_numba_kernels as k  # serial kernels: numba's thread pool is not started

    return k


def available() -> bool:
    """True when numba imports and this process may use it (:func:`spikerec.kernels.numba_available`)."""
    return numba_available()


def _vec(p: torch.Tensor, N: int, dtype):
    """A per-neuron parameter ``[N]`` (or a scalar) as a contiguous ``[N]`` array."""
    return p.detach().to(dtype).expand(N).contiguous().numpy()


INLINE_MAX_N = 128  # up to this many neurons the recurrent input is summed inside the compiled loop


def forward_consts(alpha, rho, b, beta, w_rec, N: int, dtype, rec_inline=None) -> tuple:
    """The per-neuron constants of :func:`alif_forward` as the kernel takes them (contiguous
    ``[N]`` arrays of ``dtype``; ``W_rec^T`` when the recurrent input is summed inside the loop):
    ``(alpha, rho, b, beta, w_rec, Rt, rec_inline)``. A caller that runs many short calls with the
    same parameters (the online learner's chunked blocks) makes them once."""
    if rec_inline is None:
        rec_inline = N <= INLINE_MAX_N
    Rt = None
    if w_rec is not None and rec_inline:
        Rt = w_rec.detach().t().to(dtype).contiguous().numpy()
    return (_vec(alpha, N, dtype), _vec(rho, N, dtype), _vec(b, N, dtype), _vec(beta, N, dtype),
            None if w_rec is None else w_rec.detach(), Rt, bool(rec_inline))


def alif_forward(I, v0, a0, alpha, rho, b, beta, w_rec, rec_inline=None, V=None, A=None, consts=None):
    """Forward loop: returns ``(Z, Z as bool, V, A, v_T, a_T)``. ``rec_inline``: compute the
    recurrent input inside the compiled loop (sums of the spiking neurons' weight rows; one call
    for all steps) instead of a torch matmul between single-step calls; ``None``: for layers of at
    most ``INLINE_MAX_N`` neurons. ``V``, ``A``: contiguous ``[T, B, N]`` tensors (or views) to
    write the states into (new ones by default). ``consts``: the result of
    :func:`forward_consts` for these parameters (then ``alpha .. rec_inline`` are not read)."""
    k = _kernels()
    T, B, N = I.shape
    dt = I.dtype
    if consts is None:
        consts = forward_consts(alpha, rho, b, beta, w_rec, N, dt, rec_inline)
    al, ro, bb, be, w, Rt, inline = consts
    V = torch.empty_like(I) if V is None else V
    A = torch.empty_like(I) if A is None else A
    Z = torch.empty_like(I)
    Zb = torch.empty(T, B, N, dtype=torch.bool)
    v, a = v0.detach().clone(), a0.detach().clone()
    z = torch.from_numpy(np.greater(v.numpy(), bb + be * a.numpy()).astype(al.dtype))  # the spikes of the initial state
    R = torch.zeros(B, N, dtype=dt)
    args = [_np(I), R.numpy(), v.numpy(), a.numpy(), z.numpy(), al, ro, bb, be]
    outs = (V.numpy(), A.numpy(), Z.numpy(), Zb.view(torch.uint8).numpy())
    if w is None:
        k.fwd_steps(*args, 0, T, *outs, R.numpy(), False)
    elif inline:
        k.fwd_steps(*args, 0, T, *outs, Rt, True)
    else:
        w_t = w.t()
        for t in range(T):
            torch.mm(z, w_t, out=R)  # W_rec z_{t-1}
            k.fwd_steps(*args, t, t + 1, *outs, R.numpy(), False)
    return Z, Zb, V, A, v, a


def alif_backward(gZ, sur, V, A, Zb, v0, a0, z0, alpha, rho, b, beta, w_rec, detach: bool, gvT, gaT):
    """Reverse pass: ``(dL/dI, dL/dv0, dL/da0, dL/dalpha, dL/drho, dL/db, dL/dbeta)``, the last four
    per neuron ``[N]`` (summed over the batch and time, in float64, then cast)."""
    k = _kernels()
    T, B, N = V.shape
    dt = V.dtype
    code, p1, p2 = surrogate_code(sur)
    if code == 0:  # derivatives at every step and at the initial state, by torch
        SD = _np(sur.derivative(V - torch.addcmul(b, beta, A)))
        SD0 = _np(sur.derivative(v0 - (b + beta * a0)))
    else:
        SD = torch.zeros(1, 1, 1, dtype=dt).numpy()
        SD0 = torch.zeros(1, 1, dtype=dt).numpy()
    G = torch.empty_like(V)
    gv = gvT.detach().clone() if gvT is not None else torch.zeros(B, N, dtype=dt)
    ga = gaT.detach().clone() if gaT is not None else torch.zeros(B, N, dtype=dt)
    carry = torch.zeros(B, N, dtype=dt)
    acc = [np.zeros((B, N), dtype=gv.numpy().dtype) for _ in range(4)]
    pv = [_vec(p, N, dt) for p in (alpha, rho, b, beta)]
    args = [_np(gZ), SD, code, p1, p2, _np(V), _np(A), _np(Zb.view(torch.uint8)), _np(v0), _np(a0),
            _np(z0.to(torch.uint8)), *pv, bool(detach)]
    state = (gv.numpy(), ga.numpy(), carry.numpy(), *acc, G.numpy())
    if w_rec is None:
        k.bwd_steps(*args, 0, T, *state)
    else:
        w_b = w_rec.detach().contiguous()
        for t in range(T - 1, -1, -1):
            k.bwd_steps(*args, t, t + 1, *state)
            carry.addmm_(gv, w_b)  # dL/dz_{t-1} += dL/dv_t W_rec
    gv0, ga0 = torch.empty_like(v0), torch.empty_like(v0)
    sums = [torch.empty(N, dtype=torch.float64) for _ in range(4)]
    k.bwd_initial(SD0, code, p1, p2, _np(v0), _np(a0), *pv, gv.numpy(), ga.numpy(), carry.numpy(), *acc,
                  gv0.numpy(), ga0.numpy(), *[x.numpy() for x in sums])
    return (G, gv0, ga0) + tuple(x.to(dt) for x in sums)

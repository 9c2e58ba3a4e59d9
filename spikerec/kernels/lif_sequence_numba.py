"""Compiled CPU kernels (numba) of the feed-forward LIF time loop and its reverse pass.

They run the same recurrence as :mod:`spikerec.kernels.lif_sequence` (whose docstring
gives the equations) for layers without recurrent weights, where every neuron is an
independent scalar recurrence: one pass over time per block of neurons, the state kept
in registers; the backward recomputes the spikes from the saved membranes. The reverse pass accumulates the per-neuron parameter gradients inside the loop, so
nothing of size ``T`` is written besides the input-current gradient.

``numba`` is imported lazily (on the first call): ``import spikerec`` never pays for it.
Compilation is cached on disk (``cache=True``).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from . import LIF_BLOCK as BLOCK, as_numpy as _np, numba_available, numpy_dtype

__all__ = ["BLOCK", "RESET_CODES", "available", "forward_consts", "forward_kernel", "lif_forward", "lif_backward"]

RESET_CODES = {"subtract": 0, "zero": 1, "none": 2}


def _kernels():
    from . import lif_sequence_numba_kernels as k, numba_for_kernels

    numba_for_kernels()
    return k.fwd, k.bwd


def forward_kernel(serial: bool = False):
    """The compiled forward loop (the kernel :func:`lif_forward` calls), with numba's thread count
    set as for every call of it; for callers that keep its operands and constants themselves.
    ``serial``: the same loop on the calling thread, for arrays of one block of neurons
    (:data:`BLOCK`)."""
    if serial:  # no thread pool: numba's thread count is left as it is
        global _FWD_SERIAL
        if _FWD_SERIAL is None:
            from .lif_sequence_numba_kernels import fwd_serial as _FWD_SERIAL
        return _FWD_SERIAL
    return _kernels()[0]


_FWD_SERIAL = None


def available() -> bool:
    """True when numba imports and this process may use its thread pool
    (:func:`spikerec.kernels.numba_available`)."""
    return numba_available()


def _flat(p: torch.Tensor, B: int, N: int) -> torch.Tensor:
    """A per-neuron parameter ``[N]`` (or scalar) broadcast to the flattened ``[B*N]``."""
    return p.detach().expand(B, N).reshape(-1).contiguous()


def forward_consts(alpha, alpha_s, thr, B: int, N: int, dtype) -> tuple:
    """The forward kernel's per-element constants for a batch of ``B``: ``alpha``, ``alpha_s``
    (zeros without a synapse) and ``thr`` flattened to ``[B*N]`` numpy arrays of ``dtype``, and a
    ``[B*N]`` zero state; made once per sequence by callers that run the kernel on many blocks
    (:meth:`spikerec.hardware.online.traces_lif.LIFTrace.scan_block`)."""
    npdt = numpy_dtype(dtype)
    zeros = np.zeros(B * N, dtype=npdt)

    def flat(p):
        out = np.empty(B * N, dtype=npdt)
        out.reshape(B, N)[:] = p.detach().to(dtype).numpy()
        return out

    return flat(alpha), (zeros if alpha_s is None else flat(alpha_s)), flat(thr), zeros


def lif_forward(I, v0, i0, alpha, alpha_s, thr, reset: str, consts=None, V=None):
    """Forward loop: returns ``(Z, V, Iseq|None, v_T, i_T|None)`` (all ``[T, B, N]`` / ``[B, N]``);
    ``consts``: :func:`forward_consts` of the same parameters and batch (else made here); ``V``: a C-contiguous
    ``[T, B*N]`` numpy array the membranes are written to (else a new one). One block of neurons
    (:data:`BLOCK`) runs on the calling thread."""
    T, B, N = I.shape
    fwd = forward_kernel(serial=B * N <= BLOCK)
    syn = i0 is not None
    a, a_s, th, zeros = consts if consts is not None else forward_consts(alpha, alpha_s, thr, B, N, I.dtype)
    # separate buffers: autograd keeps V (and the synaptic currents) for the backward, not Z
    V = np.empty((T, B * N), dtype=a.dtype) if V is None else V
    Zf = np.empty((T, B * N), dtype=a.dtype)
    Iseq = np.empty((T, B * N) if syn else (1, 1), dtype=a.dtype)
    vT, iT = (np.empty(B * N, dtype=a.dtype) for _ in range(2))
    fwd(_np(I.reshape(T, B * N)), _np(v0.reshape(-1)), _np(i0.reshape(-1)) if syn else zeros, a, a_s, th,
        RESET_CODES[reset], syn, V, Zf, Iseq, vT, iT)
    t = lambda a_, *shape: torch.from_numpy(a_).view(*shape)  # noqa: E731
    return (t(Zf, T, B, N), t(V, T, B, N), (t(Iseq, T, B, N) if syn else None), t(vT, B, N),
            (t(iT, B, N) if syn else None))


_WARNED: set = set()  # surrogates already named in the one-time warning


def surrogate_code(sur) -> tuple[int, float, float]:
    """``(code, slope, scale)`` of the surrogate's compiled form (:meth:`spikerec.surrogate.Surrogate.compiled_form`:
    the formula the compiled kernels evaluate inline); ``(0, 0, 0)`` for a surrogate without one, whose
    derivatives are then computed by torch (a warning names it once per process)."""
    form = sur.compiled_form() if callable(getattr(sur, "compiled_form", None)) else None
    if form is not None and form[0] in (1, 2):  # the formulas of sd_consts
        return form
    name = getattr(sur, "name", None) or type(sur).__name__
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(f"surrogate '{name}' has no compiled CPU form: its derivative is computed by torch on the "
                      f"compiled paths (slower); the fast sigmoid and arc-tangent have one", stacklevel=2)
    return 0, 0.0, 0.0


def lif_backward(gZ, sur, V, v0, z0, i0, Iseq, alpha, alpha_s, thr, reset: str, detach: bool, gvT, giT):
    """Reverse pass: returns ``(dL/dI, dL/dv0, dL/di0|None, per-element dL/dalpha, dL/dalpha_s, dL/dthr)``;
    the last three are ``[B, N]`` (sum over the batch for per-neuron parameters)."""
    _, bwd = _kernels()
    T, B, N = V.shape
    M = B * N
    syn = i0 is not None
    dt = V.dtype
    DJ = torch.empty_like(V)
    out = [torch.empty(M, dtype=dt) for _ in range(5)]
    zeros = torch.zeros(M, dtype=dt)
    dummy = torch.empty(1, 1, dtype=dt)
    code, p1, p2 = surrogate_code(sur)
    SD = dummy if code else sur.derivative(V - thr)
    sd0 = sur.derivative(v0 - thr)
    bwd(_np(gZ.reshape(T, M)), _np(SD.reshape(-1, M) if code == 0 else SD), code, p1, p2, _np(sd0.reshape(-1)),
        _np(V.reshape(T, M)),
        _np(v0.reshape(-1)), _np(z0.reshape(-1).to(torch.uint8)), _np(i0.reshape(-1)) if syn else zeros.numpy(),
        _np(Iseq.reshape(T, M)) if (syn and Iseq is not None) else dummy.numpy(),
        _flat(alpha, B, N).numpy(), _flat(alpha_s, B, N).numpy() if syn else zeros.numpy(), _flat(thr, B, N).numpy(),
        RESET_CODES[reset], syn, bool(detach),
        _np(gvT.reshape(-1)) if gvT is not None else zeros.numpy(),
        _np(giT.reshape(-1)) if (syn and giT is not None) else zeros.numpy(),
        DJ.view(T, M).numpy(), *[o.numpy() for o in out])
    gv0, gi0, ga, gas, gth = (o.view(B, N) for o in out)
    return DJ, gv0, (gi0 if syn else None), ga, gas, gth

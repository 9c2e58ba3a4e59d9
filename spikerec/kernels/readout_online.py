"""Compiled CPU kernels (numba) of a linear readout ``y = W h + b`` in the whole-stack stream step of
online learning (:mod:`spikerec.hardware.online.whole_stack`): the forward, the package's MSE step
loss ``0.5 sum (y - target)^2`` with its gradient, the backward (``dW += gy^T h``, ``db += sum_b
gy``, ``gh = gy W``) and the stream's input check for NaN.
"""
from __future__ import annotations

try:  # numba is optional
    import numba as _nb

    _HAVE_NUMBA = True
except Exception:  # pragma: no cover - depends on the install
    _HAVE_NUMBA = False

import torch

from .. import neurons
from .trace_numba import FASTMATH

__all__ = ["readout_step_numba"]

if _HAVE_NUMBA:

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _mse(y, target, gy):  # pragma: no cover - compiled
        """``gy = y - target`` and ``0.5 * sum gy^2`` (the package's MSE step loss, in place)."""
        B, K = y.shape
        total = 0.0
        for b in range(B):
            for k in range(K):
                d = y[b, k] - target[b, k]
                gy[b, k] = d
                total += d * d
        return 0.5 * total

    @_nb.njit(cache=True, nogil=True)
    def _any_nan(u):  # pragma: no cover - compiled
        """Whether the 2-d array ``u`` holds a NaN (the stream step's input check, without a torch
        reduction and its host round trip)."""
        B, H = u.shape
        for b in range(B):
            for h in range(H):
                if u[b, h] != u[b, h]:
                    return True
        return False

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _readout_mse(u, W, bias, has_b, y, target, gy, dW, db, has_w, has_db, gh):  # pragma: no cover - compiled
        """The linear readout's forward, the package's MSE step loss with its gradient and the
        readout's backward in one call (:func:`_linear_fwd`, :func:`_mse`, :func:`_linear_bwd`);
        returns the loss."""
        _linear_fwd(u, W, bias, has_b, y)
        loss = _mse(y, target, gy)
        _linear_bwd(gy, u, W, dW, db, has_w, has_db, gh)
        return loss


    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _linear_fwd(h, W, bias, has_b, y):  # pragma: no cover - compiled
        B, H = h.shape
        K = y.shape[1]
        for b in range(B):
            for k in range(K):
                acc = y.dtype.type(0)  # of the arrays' dtype (a float64 literal would promote)
                wk = W[k]
                for j in range(H):
                    acc += wk[j] * h[b, j]
                if has_b:
                    acc += bias[k]
                y[b, k] = acc

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _linear_bwd(gy, h, W, dW, db, has_w, has_b, gh):  # pragma: no cover - compiled
        B, H = h.shape
        K = gy.shape[1]
        for k in range(K):
            for b in range(B):
                q = gy[b, k]
                if has_w:
                    row = dW[k]
                    for j in range(H):
                        row[j] += q * h[b, j]
                if has_b:
                    db[k] += q
        for b in range(B):
            for j in range(H):
                gh[b, j] = 0.0
            for k in range(K):
                q = gy[b, k]
                wk = W[k]
                for j in range(H):
                    gh[b, j] += q * wk[j]


def readout_step_numba(params, state, x_t, options=None):
    """One step of the plain linear readout (:func:`spikerec.neurons.readout.step` without a leak,
    ``log_tau=None``) by the compiled forward of the whole-stack stream step (``_linear_fwd``);
    returns ``(y_t, ReadoutState(y_t))``."""
    from ..neurons import readout as _readout

    if params.log_tau is not None:
        raise ValueError("readout_step_numba: expected the linear readout (log_tau=None)")
    dt = x_t.dtype
    as_np = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    has_b = params.bias is not None
    y = torch.empty((x_t.shape[0], params.weight.shape[0]), dtype=dt)
    _linear_fwd(as_np(x_t), as_np(params.weight), as_np(params.bias) if has_b else y[0].numpy(), has_b, y.numpy())
    return y, _readout.ReadoutState(y)


neurons.register_backend("readout", "kernels.readout_online (compiled forward of the online stream step)",
                         readout_step_numba,
                         test="tests/test_online_partials.py::test_compiled_forward_steps_equal_the_neuron_steps")

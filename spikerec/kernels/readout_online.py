"""Compiled CPU kernels (numba) of the readout in the whole-stack stream step of online learning
(:mod:`spikerec.hardware.online.whole_stack`): for a linear readout ``y = W h + b`` the forward, the
package's MSE step loss ``0.5 sum (y - target)^2`` with its gradient and the backward (``dW += gy^T
h``, ``db += sum_b gy``, ``gh = gy W``); for a leaky readout ``y_t = alpha y_{t-1} + W h_t + b``
(:mod:`spikerec.neurons.readout`) the forward and the trace step of its parameters; the stream's
input check for NaN.
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
        _input_error(gy, W, gh)

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _input_error(gy, W, gh):  # pragma: no cover - compiled
        """The error at a readout's input, ``gh = gy W``."""
        B, H = gh.shape
        K = gy.shape[1]
        for b in range(B):
            for j in range(H):
                gh[b, j] = 0.0
            for k in range(K):
                q = gy[b, k]
                wk = W[k]
                for j in range(H):
                    gh[b, j] += q * wk[j]


    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _leaky_fwd(h, W, bias, has_b, alpha, y, y0):  # pragma: no cover - compiled
        """The leaky readout's step ``y <- alpha y + W h + b`` in place, the previous ``y`` kept in ``y0``."""
        B, H = h.shape
        K = y.shape[1]
        for b in range(B):
            for k in range(K):
                acc = y.dtype.type(0)
                wk = W[k]
                for j in range(H):
                    acc += wk[j] * h[b, j]
                if has_b:
                    acc += bias[k]
                y0[b, k] = y[b, k]
                y[b, k] = alpha[k] * y[b, k] + acc

    @_nb.njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _leaky_bwd(gy, use_g, h, W, alpha, dalpha, y0, ev, c_tau, c_b, em, has_w, Gv, GW, gh):  # pragma: no cover
        """The leaky readout's trace step and contraction (the recursions of
        :func:`spikerec.hardware.online.traces_base.stream_step` on the partials of
        :meth:`spikerec.hardware.online.traces_lif.ReadoutTrace.partials`, ``J = alpha``):

            log_tau: e <- alpha e + dalpha y_{t-1}     bias: e <- alpha e + 1      (ev [B, K, 1, m], columns c_tau, c_b)
            weight:  e[k, b, :] <- alpha_k e[k, b, :] + h_b                          (em [K, B, 1, H])

        with ``G += sum_b gy . e`` (``Gv`` rows 0 = log_tau, 1 = bias; ``GW``) and the error at the
        readout's input ``gh = gy W`` when ``use_g``."""
        B, K = y0.shape
        H = h.shape[1]
        for b in range(B):
            for k in range(K):
                a = alpha[k]
                q = 0.0
                if use_g:
                    q = gy[b, k]
                if c_tau >= 0:
                    e = a * ev[b, k, 0, c_tau] + y0[b, k] * dalpha[k]
                    ev[b, k, 0, c_tau] = e
                    if use_g:
                        Gv[0, k] += q * e
                if c_b >= 0:
                    e = a * ev[b, k, 0, c_b] + 1.0
                    ev[b, k, 0, c_b] = e
                    if use_g:
                        Gv[1, k] += q * e
        if has_w:
            for k in range(K):
                a = alpha[k]
                row = GW[k]
                for b in range(B):
                    er = em[k, b, 0]
                    q = 0.0
                    if use_g:
                        q = gy[b, k]
                    for j in range(H):
                        e = a * er[j] + h[b, j]
                        er[j] = e
                        if use_g:
                            row[j] += q * e
        if use_g:
            _input_error(gy, W, gh)


def readout_step_numba(params, state, x_t, options=None):
    """One step of the readout (:func:`spikerec.neurons.readout.step`, bias into the current) by the
    compiled forwards of the whole-stack stream step: ``_linear_fwd`` (``log_tau=None``) or
    ``_leaky_fwd``; returns ``(y_t, ReadoutState(y_t))``."""
    from ..neurons import readout as _readout

    options = _readout.ReadoutOptions() if options is None else options
    dt = x_t.dtype
    as_np = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    has_b = params.bias is not None
    K = params.weight.shape[0]
    y = torch.empty((x_t.shape[0], K), dtype=dt)
    b = as_np(params.bias) if has_b else y[0].numpy()
    if params.log_tau is None:
        _linear_fwd(as_np(x_t), as_np(params.weight), b, has_b, y.numpy())
    else:
        alpha = _readout.decay(params, options).detach().to(dt).expand(K).contiguous()
        y.copy_(state.y)
        _leaky_fwd(as_np(x_t), as_np(params.weight), b, has_b, alpha.numpy(), y.numpy(), torch.empty_like(y).numpy())
    return y, _readout.ReadoutState(y)


neurons.register_backend("readout", "kernels.readout_online (compiled forward of the online stream step)",
                         readout_step_numba,
                         test="tests/test_online_partials.py::test_compiled_forward_steps_equal_the_neuron_steps")

"""The compiled step and partials (numba) of an LRU layer for online learning: one step of
:func:`spikerec.neurons.lru.step` (Orvieto et al. 2023, Sec. 3, eq. 1) on rows of the stream's window
(:func:`lru_rows`)::

    h_t = lam h_{t-1} + gamma B u_t      (on (Re, Im) pairs)        y_t = Re(C h_t) + D u_t

and the immediate partials of a block's rows (:func:`lru_block_partials`, the compiled
:meth:`spikerec.hardware.online.traces_lru.LRUTrace.partials`), planar for :mod:`.trace_numba`.
"""
from __future__ import annotations

import torch

from .. import neurons

from .trace_numba import _nb  # numba is optional: None without it

__all__ = ["lru_rows", "lru_consts", "lru_block_partials"]

if _nb is not None:
    from .readout_online import events

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def lru_rows(j, X, HR, HI, Y, Bg, lr, li, Cre, Cim, D, dvec, w, y, y2, y3):  # pragma: no cover - compiled
        """Step ``j`` of a window: reads ``X[j] [B, H]`` and ``HR[j], HI[j] [B, N]``, writes ``HR[j + 1]``, ``HI[j +
        1]`` and ``Y[j]``. ``Bg = [gamma B_re^T | gamma B_im^T]`` ``[H, 2N]``, ``Cre = C_re^T``, ``Cim = -C_im^T``
        ``[N, O]``, ``D`` ``[1, O]`` (``dvec``) or ``D^T [H, O]``; ``w [B, 2N]``, ``y, y2, y3 [B, O]``: scratch."""
        B, N = HR.shape[1], HR.shape[2]
        events(X[j], Bg, w)  # (products as loops, no BLAS: its threads would compete with torch's)
        for b in range(B):
            for n in range(N):
                p0, p1 = HR[j, b, n], HI[j, b, n]
                HR[j + 1, b, n] = (lr[n] * p0 - li[n] * p1) + w[b, n]
                HI[j + 1, b, n] = (li[n] * p0 + lr[n] * p1) + w[b, N + n]
        events(HR[j + 1], Cre, y)
        events(HI[j + 1], Cim, y2)
        if dvec:
            for b in range(B):
                for o in range(y.shape[1]):
                    Y[j, b, o] = (y[b, o] + y2[b, o]) + D[0, o] * X[j, b, o]
        else:
            events(X[j], D, y3)
            for b in range(B):
                for o in range(y.shape[1]):
                    Y[j, b, o] = (y[b, o] + y2[b, o]) + y3[b, o]

    @_nb.njit(cache=True, nogil=True, error_model="numpy")
    def _partials(hr, hi, nr, ni, lr, li, W, kinds, V):  # pragma: no cover - compiled
        """``V [m, K, B, 2, N]``: per column ``q`` the immediate partial on (Re, Im): ``w h_{t-1}`` with
        ``w = W[kinds[q]]`` (``d lam / d nu_log``, ``d lam / d theta_log``: ``kinds`` 0, 1) or ``h_t -
        lam h_{t-1}`` (``gamma_log``: ``kinds`` 2), from ``hr, hi, nr, ni [K, B, N]``."""
        K, B, N = hr.shape
        for q in range(kinds.shape[0]):
            c = kinds[q]
            for t in range(K):
                for b in range(B):
                    if c == 2:
                        for n in range(N):
                            V[q, t, b, 0, n] = nr[t, b, n] - (lr[n] * hr[t, b, n] - li[n] * hi[t, b, n])
                        for n in range(N):
                            V[q, t, b, 1, n] = ni[t, b, n] - (lr[n] * hi[t, b, n] + li[n] * hr[t, b, n])
                    else:
                        for n in range(N):
                            V[q, t, b, 0, n] = W[c, 0, n] * hr[t, b, n] - W[c, 1, n] * hi[t, b, n]
                        for n in range(N):
                            V[q, t, b, 1, n] = W[c, 0, n] * hi[t, b, n] + W[c, 1, n] * hr[t, b, n]
else:
    lru_rows = None


def lru_block_partials(prev, new, lr, li, W, kinds, K: int, B: int):
    """:func:`_partials` on the block's ``[K*B, N]`` state rows: ``V [m, K, B, 2, N]``."""
    N = lr.shape[0]
    V = torch.empty((len(kinds), K, B, 2, N), dtype=lr.dtype)
    f = lambda t: t.reshape(K, B, N).numpy()  # noqa: E731 (strided views of the block's states read as they are)
    _partials(f(prev.x_re), f(prev.x_im), f(new.x_re), f(new.x_im), lr.numpy(), li.numpy(), W.numpy(), kinds,
              V.numpy())
    return V


def lru_consts(params, dt):
    """The operands of :func:`lru_rows` after ``j, X, HR, HI, Y`` (without the scratch ``w``)."""
    from ..neurons import lru as _lru

    f = lambda t: t.detach().to(dt).contiguous().numpy()  # noqa: E731
    lr, li = _lru.lam_parts(params)
    g = _lru.gamma(params)[:, None]
    dvec = params.D.dim() == 1
    return (f(torch.cat([(params.B_re * g).t(), (params.B_im * g).t()], 1)), f(lr), f(li), f(params.C_re.t()),
            f(-params.C_im.t()), f(params.D[None] if dvec else params.D.t()), dvec)


neurons.register_backend("lru", "kernels.lru_online (compiled block partials, lru_block_partials)", lru_block_partials,
                         test="tests/test_online_partials.py::test_compiled_partials_equal_derived_ones")

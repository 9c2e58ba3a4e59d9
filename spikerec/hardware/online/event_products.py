"""Event-driven products with a spike matrix: the chunked LIF block's three products with its
presynaptic input, skipping the input's zeros.

A plain LIF layer's presynaptic input ``pre [K*B, H]`` (the spikes of the layer below, or spike
input) is mostly zeros, and the block multiplies it three times (the e-prop gradient
``sum_t L_t e_t`` of Bellec et al. 2020, Methods, in the chunked form of :mod:`.block`):

    I    = pre Wt + b                       (the input currents, ``Wt [H, N]``)
    dW  += gh^T pre                         (the gradient, ``gh [K*B, N]``)
    q_b  = sum_k Phi_{k,b} pre_{k,b}        (the carried trace's new part, ``Phi [B, K, N]``)

With the package's MSE loss, the readout of the top layer's spikes, the loss and the readout's
parameter gradients are one call on the spikes' events too (:func:`event_readout_mse`).

With ``pre`` listed as events (per row: the columns that are non-zero and their values) each
product costs one ``N``-wide multiply-add per event instead of ``H`` per row, so the cost follows
the spike count. Below :data:`EVENT_DENSITY` non-zeros per entry the event form is used. On the
2-core CPU of BENCHMARKS.md, for blocks of 64 steps, batch 8 and 64 inputs and neurons, the three
products took 67 µs from events at 5 % density and 105 µs at 10 %, against 149 µs for the three
GEMMs; at 20 % the events would cost more than the GEMMs. Inside a whole block, where the arrays
also pass through the caches for the other passes, the gain on a 2-layer LIF stack was smaller:
13.9 -> 13.3 ms per sequence of 1024 steps. Both forms give the same sums, up to the order of the
additions; the choice depends on the block's data only, so a resumed stream makes the same choices
as an uninterrupted one.
"""
from __future__ import annotations

import numpy as np
import torch

from ...kernels import numpy_dtype
from .numba_kernels import _HAVE_NUMBA

__all__ = ["EVENT_DENSITY", "event_limit", "event_workspace", "spike_events", "event_words", "list_events",
           "event_current", "event_grads", "event_readout_mse"]

EVENT_DENSITY = 0.12  # the fraction of non-zero entries below which the event form is used

if _HAVE_NUMBA:
    import numba as _nb

    @_nb.njit(cache=True, nogil=True)
    def _count(pre):  # pragma: no cover - compiled
        """The number of non-zero entries of ``pre [R, H]`` (a vectorised pass)."""
        R, H = pre.shape
        c = 0
        for r in range(R):
            for h in range(H):
                c += pre[r, h] != 0
        return c

    @_nb.njit(cache=True, nogil=True)
    def _events(pre, words, per_word, idx, val, ptr):  # pragma: no cover - compiled
        """The non-zero entries of ``pre [R, H]`` row by row: columns ``idx``, values ``val``,
        row ``r``'s events at ``ptr[r]:ptr[r+1]``; returns their count. ``words [R, H / per_word]``
        is ``pre`` read as words of ``per_word`` entries (2: float32 pairs as 64-bit words; 1: one
        entry per word): a zero word is skipped whole."""
        R = pre.shape[0]
        W = words.shape[1]
        c = 0
        for r in range(R):
            ptr[r] = c
            wr = words[r]
            pr = pre[r]
            for w in range(W):
                if wr[w] != 0:
                    if per_word == 2:  # (the two entries written out: a loop over them is ~60 % slower)
                        h = 2 * w
                        v = pr[h]
                        if v != 0:
                            idx[c] = h
                            val[c] = v
                            c += 1
                        v = pr[h + 1]
                        if v != 0:
                            idx[c] = h + 1
                            val[c] = v
                            c += 1
                    else:
                        v = pr[w]
                        if v != 0:
                            idx[c] = w
                            val[c] = v
                            c += 1
        ptr[R] = c
        return c

    @_nb.njit(cache=True, nogil=True)
    def _current(ptr, idx, val, Wt, bias, has_bias, out):  # pragma: no cover - compiled
        """``out[r] = b + sum_j val_j Wt[idx_j]`` over row ``r``'s events."""
        R, N = out.shape
        zero = out.dtype.type(0)
        for r in range(R):
            o = out[r]
            if has_bias:
                for n in range(N):
                    o[n] = bias[n]
            else:
                for n in range(N):
                    o[n] = zero
            for j in range(ptr[r], ptr[r + 1]):
                w = Wt[idx[j]]
                v = val[j]
                for n in range(N):
                    o[n] += v * w[n]

    @_nb.njit(cache=True, nogil=True)
    def _grads(ptr, idx, val, gh, use_g, P0, carry, B, accT, qT):  # pragma: no cover - compiled
        """``accT[h] = sum gh[r] val`` (``use_g``) and ``qT[b, h] = sum_k P0[b, k] val``
        (``carry``) over the events ``(r = k B + b, h, val)``."""
        R = ptr.shape[0] - 1
        N = accT.shape[1]
        if use_g:
            accT[:] = 0
        if carry:
            qT[:] = 0
        for r in range(R):
            k = r // B
            b = r - k * B
            g = gh[r] if use_g else gh[0]
            p = P0[b, k] if carry else P0[0, 0]
            for j in range(ptr[r], ptr[r + 1]):
                h = idx[j]
                v = val[j]
                if use_g:
                    a = accT[h]
                    for n in range(N):
                        a[n] += v * g[n]
                if carry:
                    q = qT[b, h]
                    for n in range(N):
                        q[n] += v * p[n]

    @_nb.njit(cache=True, nogil=True)
    def _readout_mse(ptr, idx, val, WT, bias, has_b, y, target, gy, dWT, db, has_w, has_db):  # pragma: no cover
        """A linear readout of spikes listed as events, the package's MSE and the readout's
        parameter gradients, over ``R`` rows: ``y[r] = b + sum_j val_j WT[idx_j]``, ``gy = y -
        target``, ``loss = 0.5 sum gy^2`` (returned, summed in float64), ``dWT[h] += sum val gy[r]``
        (the weight's gradient transposed, ``has_w``) and ``db += sum_r gy[r]`` (``has_db``)."""
        R, O = y.shape
        total = 0.0
        for r in range(R):
            yr = y[r]
            for o in range(O):
                yr[o] = bias[o] if has_b else 0.0
            for j in range(ptr[r], ptr[r + 1]):
                w = WT[idx[j]]
                v = val[j]
                for o in range(O):
                    yr[o] += v * w[o]
            gr = gy[r]
            for o in range(O):
                d = yr[o] - target[r, o]
                gr[o] = d
                total += d * d
            if has_w:
                for j in range(ptr[r], ptr[r + 1]):
                    a = dWT[idx[j]]
                    v = val[j]
                    for o in range(O):
                        a[o] += v * gr[o]
            if has_db:
                for o in range(O):
                    db[o] += gr[o]
        return 0.5 * total


def event_limit(size: int) -> int:
    """The number of non-zero entries, of ``size``, from which the GEMMs are used."""
    return int(EVENT_DENSITY * size)


def event_workspace(R: int, H: int, N: int, B: int, dtype) -> dict:
    """The scratch arrays of the event products for up to ``R`` rows of ``H`` inputs, ``N``
    neurons and batch ``B`` (made once per sequence and block size)."""
    npdt = numpy_dtype(dtype)
    return {"idx": np.empty(R * H, np.int32), "val": np.empty(R * H, npdt), "ptr": np.empty(R + 1, np.int64),
            "accT": np.empty((H, N), npdt), "qT": np.empty((B, H, N), npdt), "rows": R}


def spike_events(pre: torch.Tensor, ws: dict) -> bool:
    """List the events of ``pre [R, H]`` (contiguous, CPU; ``R`` at most the workspace's rows)
    into ``ws`` when fewer than :data:`EVENT_DENSITY` of its entries are non-zero; returns whether
    it did (else use GEMMs)."""
    a = pre.numpy()
    if a.shape[0] + 1 > ws["ptr"].shape[0] or a.size > ws["idx"].shape[0]:
        raise ValueError(f"spike_events: {tuple(a.shape)} rows do not fit the workspace")
    return list_events(a, *event_words(a), ws, event_limit(a.size))


def event_words(a: np.ndarray) -> tuple:
    """``(words, per_word)``: the contiguous array ``a [R, H]`` read as the words that
    :func:`list_events` skips whole when zero (float32 rows of even width as 64-bit words of two
    entries, else one entry per word)."""
    if a.itemsize == 4 and a.shape[1] % 2 == 0:
        return a.view(np.uint64), 2
    return a.view(np.uint32 if a.itemsize == 4 else np.uint64), 1


def list_events(a: np.ndarray, words, per_word: int, ws: dict, limit: int) -> bool:
    """:func:`spike_events` on the numpy array ``a`` and its :func:`event_words`, with the
    workspace's fit checked by the caller: lists the events when ``a`` has fewer than ``limit``
    non-zero entries; returns whether it did."""
    if _count(a) >= limit:
        return False
    ws["rows"] = a.shape[0]
    _events(a, words, per_word, ws["idx"], ws["val"], ws["ptr"])
    return True


def event_current(ws: dict, Wt: torch.Tensor, bias, out: torch.Tensor) -> None:
    """``out [R, N] = pre Wt + bias`` from the events in ``ws`` (``Wt [H, N]`` contiguous)."""
    _current(ws["ptr"], ws["idx"], ws["val"], Wt.numpy(), Wt.numpy()[0] if bias is None else bias.numpy(),
             bias is not None, out.numpy())


def event_readout_mse(ws: dict, W: torch.Tensor, WT, bias, y, target, gy, dW, db, gz) -> float:
    """The linear readout ``y = z W^T + b`` of the spikes ``z`` listed in ``ws``, the package's
    MSE against ``target`` (``0.5 sum (y - target)^2``, returned) and the readout's backward:
    ``dW += gy^T z`` and ``db += sum gy`` into the accumulators (contiguous; ``None``: not trained), in one
    compiled call on the events, and the error at the spikes ``gz = gy W`` (one GEMM: with few
    outputs, a compiled loop over the rows took twice as long); all ``[R, ...]`` contiguous CPU
    tensors of one dtype (``WT``: ``W^T`` as a contiguous numpy array, made once by the caller)."""
    bn = WT[0] if bias is None else bias.numpy()
    # the weight's accumulator is added to in place through its transposed view
    loss = _readout_mse(ws["ptr"], ws["idx"], ws["val"], WT, bn, bias is not None, y.numpy(), target.numpy(),
                        gy.numpy(), WT if dW is None else dW.numpy().T, bn if db is None else db.numpy(),
                        dW is not None, db is not None)
    torch.mm(gy, W, out=gz)
    return loss


def event_grads(ws: dict, gh, P0, B: int, carry: bool):
    """``gh^T pre`` as ``accT [H, N]`` (its transpose; ``gh [R, N]`` ``None``: skipped) and, with
    ``carry``, ``qT [B, H, N]`` with ``qT[b] = (Phi_b^T pre_b)^T`` (``P0 [B, K, N]``), from the
    events in ``ws``; ``gh``, ``P0``: contiguous numpy arrays. Returns the two numpy arrays
    (workspace, valid until the next call)."""
    use_g = gh is not None
    _grads(ws["ptr"][: ws["rows"] + 1], ws["idx"], ws["val"], gh if use_g else ws["accT"], use_g,
           P0 if carry else ws["qT"], carry, B, ws["accT"], ws["qT"])
    return ws["accT"], ws["qT"]

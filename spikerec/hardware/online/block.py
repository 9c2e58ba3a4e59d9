"""A chunked block of K steps with no autograd call (the chunked mode's compiled path).

Within a block the online rule needs, for every traced layer and step ``t``, the spatial error
``g_t = d l_t / d s_t`` and the direct gradients of the output-map parameters (Zucchet et al.
2023, Sec. 3; thesis Zucchet 2025, Sec. 4.3.2), then the layer-local reverse filter
``gh_k = g_k + J_{k+1}^T gh_{k+1}`` and its contraction with the immediate partials (the adjoint
form of the trace recursion). With the recurrent edges cut, the steps of a block are
independent rows once the states are known, so:

* forward: the states before each step by the layer's block scan (the LRU's parallel scan of
  ``h_t = lam h_{t-1} + gamma B u_t``, Orvieto et al. 2023, Sec. 3), then every step's output
  map on ``[K*B]`` rows at once;
* loss: the loss's closed-form ``value_and_grad`` per step (no autograd);
* spatial backward: the hand-written per-cell chain of :mod:`.spatial` on ``[K*B]`` rows, so
  each output-map gradient (``dC += gy^T h``, ``dW += gy^T u``, ...) is one matrix product over
  the whole block;
* reverse filter and contractions: :func:`.traces_base.chunk_contract` (a reverse linear scan
  for the LRU; the input-matrix contraction as one GEMM).

Under a leaky readout with readout-filtered traces (:mod:`.readout_filter`) the layer below it
takes the readout's errors of every later step of the block (``gbar``, a reverse filter of the
block's output errors) and the filtered traces carried across blocks (:meth:`.ReadoutFilter.block`).
It applies when every layer has a hand-written spatial backward (LRU, ALIF, plain LIF, leaky or
linear readout; no active dropout) and the loss carries ``value_and_grad``; the result equals the
autograd block of :meth:`OnlineLearner._block_batched` (tests/test_online_block.py, float64).
"""
from __future__ import annotations

import torch

from .readout_filter import reverse_readout_filter
from .spatial import _lru_out, _output, _spatial_backward, compiled_kinds, filter_forms, layer_errors, supported
from .traces_base import stack_partials

__all__ = ["block_supported", "compiled_chunk_block"]


def block_supported(learner) -> bool:
    """Whether :func:`compiled_chunk_block` applies to ``learner``'s stack (the losses aside)."""
    return supported(learner)


def compiled_chunk_block(learner, x: torch.Tensor, vgs: list, carry: bool, block_vg=None):
    """The gradient work of one block ``x [K, B, C]`` (states start at ``learner.states``, which
    are advanced to the block's end). ``vgs[k](y_k) -> (loss, d loss / d y_k) | None`` per step
    (``None`` entry: no loss at that step), or ``block_vg(Y [K, B, ...]) -> (summed loss,
    d loss / d Y)`` for the whole block in one call. Returns the block's summed loss (detached)
    or ``None``."""
    K, B = x.shape[0], x.shape[1]
    tracers = learner.tracers
    kinds = compiled_kinds(learner)
    recs = []
    with torch.no_grad():
        h = x.reshape(K * B, *x.shape[2:])
        for l, (tr, kind) in enumerate(zip(tracers, kinds)):
            s = learner.states[l]
            if kind == "readout":
                c = tr.cell
                y = readout_rows(h, c.weight.detach(), c.bias)
                prev = None
                new = (y,)
                learner.states[l] = type(s)(y[(K - 1) * B:])
                out = y
            else:
                hk = h.reshape(K, B, *h.shape[1:])
                out = None
                # the states before and after each step (and the outputs) from one scan
                scan = tr.scan_block if hasattr(tr, "scan_block") else tr.scan_loop
                prev, last, new, out = scan(hk, s, with_new=True, with_out=True)
                learner.states[l] = last
                if out is None:
                    out = _lru_out(tr.cell, h, new) if kind == "lru" else _output(tr, kind, new)
            recs.append((h, prev, new, out))
            h = out
        y = h.reshape(K, B, *h.shape[1:])
        total, gy = block_loss(learner, y, vgs, block_vg)
        filt = learner._filter
        fl = len(tracers) - 2 if filt is not None else None  # the layer under the leaky readout
        gs = _spatial_backward(learner, kinds, recs, None if gy is None else gy.reshape(K * B, *gy.shape[2:]), fl)
        gbar = None
        if filt is not None and gy is not None:  # its errors: the readout's of the block's later steps
            gbar = reverse_readout_filter(filt.readout.alpha().detach().to(gy.dtype), gy)
            g_in = gbar.reshape(K * B, -1) @ filt.readout.weight.detach()
            gs[fl] = layer_errors(learner, fl, kinds[fl], recs[fl], g_in, learner.spatial, below=False)[0]
        for l, (tr, kind) in enumerate(zip(tracers, kinds)):
            if kind == "readout" or not tr.traced:
                continue
            h_in, prev, new, _ = recs[l]
            if l == fl:  # before the traces are carried: the filtered traces meet them
                P = stack_partials(tr.partials(h_in, prev, new), K, B)
                with torch.enable_grad():
                    filt.block(learner.traces[l], P, h_in, new, gbar, K, B, **filter_forms(learner, l, kind, recs[l]))
            G = None if gs[l] is None else gs[l].reshape(K, B, *gs[l].shape[1:])
            tr.block_contract(learner.traces[l], h_in, prev, new, G, carry, K, B)
    return None if total is None else total.detach()


def block_loss(learner, y, vgs, block_vg):
    """The block's summed loss and ``d loss / d y [K, B, ...]`` (``(None, None)`` without a loss
    in the block): ``block_vg(y)`` in one call, else ``vgs[k](y_k)`` per step."""
    if block_vg is not None:
        return block_vg(y)
    total = gy = None
    for k in range(y.shape[0]):
        lg = vgs[k](y[k]) if vgs[k] is not None else None
        if lg is None:
            continue
        loss, g = lg
        if loss.dim() != 0:
            raise ValueError(f"loss must return a scalar at step {learner.steps + k}, got shape {tuple(loss.shape)}")
        total = loss if total is None else total + loss
        if gy is None:
            gy = torch.zeros((y.shape[0], *g.shape), dtype=y.dtype, device=y.device)
        gy[k] = g
    return total, gy


def readout_rows(h, W, b):
    """A linear readout ``y = h W^T + b`` of a block's ``[K*B, N]`` rows (one ``addmm``)."""
    return h @ W.t() if b is None else torch.addmm(b.detach(), h, W.t())

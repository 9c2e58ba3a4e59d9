"""A chunked block of K steps with no autograd call (the chunked mode's fast path).

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

It applies when every layer has a hand-written spatial backward (LRU, ALIF, plain LIF, leaky or
linear readout; no active dropout) and the loss carries ``value_and_grad``; the result equals the
autograd block of :meth:`OnlineLearner._block_batched` (tests/test_online_block.py, float64).
"""
from __future__ import annotations

import torch

from .block_lif import block_loss, lif_stack_block, readout_rows
from .spatial import _lru_out, _output, _spatial_backward, fast_kinds, supported
from .traces_base import chunk_contract, stack_partials

__all__ = ["block_supported", "closed_form_block"]


def block_supported(learner) -> bool:
    """Whether :func:`closed_form_block` applies to ``learner``'s stack (the losses aside)."""
    return supported(learner)


def closed_form_block(learner, x: torch.Tensor, vgs: list, carry: bool, block_vg=None, mse_target=None):
    """The gradient work of one block ``x [K, B, C]`` (states start at ``learner.states``, which
    are advanced to the block's end). ``vgs[k](y_k) -> (loss, d loss / d y_k) | None`` per step
    (``None`` entry: no loss at that step), or ``block_vg(Y [K, B, ...]) -> (summed loss,
    d loss / d Y)`` for the whole block in one call; ``mse_target [K, B, O]`` (with ``block_vg``,
    a contiguous tensor of the block's dtype) says that the loss is the package's MSE against it,
    which a stack of plain LIF layers computes in one compiled call with its readout. Returns the
    block's summed loss (detached) or ``None``."""
    lif_stack = lif_stack_block(learner, x)
    if lif_stack is not None:  # a stack of plain LIF layers: the prepared block
        return lif_stack.run(learner, x, vgs, carry, block_vg, mse_target)
    K, B = x.shape[0], x.shape[1]
    tracers = learner.tracers
    kinds = fast_kinds(learner)
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
        gs = _spatial_backward(learner, kinds, recs, None if gy is None else gy.reshape(K * B, *gy.shape[2:]))
        for l, (tr, kind) in enumerate(zip(tracers, kinds)):
            if kind == "readout" or not tr.traced:
                continue
            h_in, prev, new, _ = recs[l]
            G = None if gs[l] is None else gs[l].reshape(K, B, *gs[l].shape[1:])
            if kind in ("lru", "alif", "lif") and learner.block_closed_traces:
                tr.block_contract(learner.traces[l], h_in, prev, new, G, carry, K, B)
            else:
                chunk_contract(learner.traces[l], stack_partials(tr.partials(h_in, prev, new), K, B), G, carry)
    return None if total is None else total.detach()

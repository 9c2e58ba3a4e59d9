"""The gradient work of a block of K steps (Zucchet et al. 2023, Sec. 3; thesis Zucchet 2025,
Sec. 4.3.2), from the rows of every layer: its input, state before and after each step, and
output (``[K*B, ..]``), as the layers' block scans or the stream's window give them.

Every step starts from the detached previous state, so the steps of a block are independent rows:

* the loss's error ``gy_t = d l_t / d y_t`` of every step (closed form where the loss has one);
* the spatial backward ``g^l_t = d l_t / d s^l_t``: per layer its hand-written form
  (:meth:`~.traces.LayerTrace` ``errors``, one matrix product per output map for the whole block;
  :func:`compiled_block`) or one autograd call over the block's graph (:func:`autograd_block`, the
  reference);
* under a leaky readout with readout-filtered traces the layer below it takes the readout's
  errors of every later step of the block (``gbar``) and the filtered traces carried across blocks;
* per traced layer the block contraction (:func:`.traces.chunk_contract`) of its partials.
"""
from __future__ import annotations

import torch

from .readout_filter import reverse_readout_filter
from .traces import GenericTrace, chunk_contract
from .traces_readout import LinearReadoutTrace, ReadoutTrace

__all__ = ["scan_rows", "compiled_block", "autograd_block", "loss_errors", "compiled_supported"]


def compiled_supported(learner) -> bool:
    """Whether every layer has a hand-written spatial backward (LIF, ALIF, LRU; a readout last) and
    no dropout is active: the stack's blocks then run :func:`compiled_block`."""
    drop = getattr(learner.model, "dropout", None)
    trs = learner.tracers
    return (not (drop is not None and drop.training) and all(hasattr(tr, "errors") for tr in trs)
            and isinstance(trs[-1], (ReadoutTrace, LinearReadoutTrace))
            and not any(isinstance(tr, (ReadoutTrace, LinearReadoutTrace)) for tr in trs[:-1]))


def scan_rows(learner, x: torch.Tensor, compiled: bool):
    """The rows of a block ``x [K, B, C]`` by every layer's block scan (``compiled``: the layers'
    own kernels; else the step loop), the learner's states advanced to its end; returns ``(recs,
    y [K, B, outputs])`` with ``recs[l] = (input, prev, new, output)``."""
    K, B = x.shape[0], x.shape[1]
    h, recs = x, []
    for l, tr in enumerate(learner.tracers):
        s = learner.states[l]
        if compiled and hasattr(tr, "scan_block"):
            prev, last, new, out = tr.scan_block(h, s)
        elif isinstance(tr, GenericTrace):
            prevs, outs = [], []
            for t in range(K):
                prevs.append(s)
                out_t, s = tr.cell.step(h[t], s)
                outs.append(out_t)
            prev = type(s)(*(torch.cat([p[f] for p in prevs]) for f in range(len(s))))
            new = type(s)(*(torch.cat([p[f] for p in prevs[1:]] + [s[f]]) for f in range(len(s))))
            last, out = s, torch.cat(outs)
        else:
            prev, last, new = tr.scan_loop(h, s)
            out = tr.output(h.reshape(K * B, -1), new)
        learner.states[l] = type(last)(*(f.detach() for f in last))
        recs.append((h.reshape(K * B, -1), prev, new, out))
        h = out.reshape(K, B, -1)
    return recs, h


def loss_errors(y: torch.Tensor, losses: list, block_vg=None):
    """The summed loss (detached) and ``gy [K, B, outputs]`` (``None`` without a loss) of a block's
    outputs ``y``: ``block_vg(y)`` in one call, or per step ``losses[k]`` ``(fn, value_and_grad)``
    (the closed form where given, else one autograd call on the step's output)."""
    if block_vg is not None:
        total, gy = block_vg(y)
        return total.detach(), gy
    total = gy = None
    for k, (fn, vg) in enumerate(losses):
        if fn is None:
            continue
        if vg is not None:
            lg = vg(y[k])
            if lg is None:
                continue
            loss, g = lg
        else:
            yl = y[k].detach().requires_grad_()
            with torch.enable_grad():
                loss = fn(yl)
            if loss is None:
                continue
            if loss.dim() != 0:
                raise ValueError(f"loss must return a scalar, got shape {tuple(loss.shape)}")
            g = torch.autograd.grad(loss, yl, allow_unused=True)[0] if loss.requires_grad else None
            if g is None:
                g = torch.zeros_like(yl)
        total = loss.detach() if total is None else total + loss.detach()
        if gy is None:
            gy = torch.zeros_like(y)
        gy[k] = g
    return total, gy


def _filtered_errors(learner, gy, K: int, B: int):
    """``gbar``: the leaky readout's errors of every later step of the block (``None`` without the
    filter or a loss)."""
    filt = learner._filter
    if filt is None or gy is None:
        return None
    return reverse_readout_filter(filt.readout.alpha().detach().to(gy.dtype), gy)


def _contract(learner, recs, gs, gbar, carry: bool, K: int, B: int) -> None:
    """Per traced layer: the readout filter's block (the layer under a leaky readout), then the
    block contraction of its partials with its errors ``gs[l] [K*B, N, k]``."""
    fl = len(learner.tracers) - 2 if learner._filter is not None else None
    for l, tr in enumerate(learner.tracers):
        if not tr.traced:
            continue
        x_in, prev, new, _ = recs[l]
        new = type(new)(*(f.detach() for f in new))
        P = tr.block_partials(x_in, prev, new, K, B)
        if l == fl:  # before the traces are carried: the filtered traces meet them
            learner._filter.block(learner._trace_states[l], P, x_in, new, gbar, K, B)
        G = None if gs[l] is None else gs[l].reshape(K, B, *gs[l].shape[1:])
        chunk_contract(learner._trace_states[l], P, G, carry)


def compiled_block(learner, recs, gy, carry: bool, K: int, B: int) -> None:
    """The gradient work of a block of ``K`` steps from its rows and the loss errors ``gy [K, B,
    outputs]`` (or ``None``) with the layers' hand-written spatial backwards (no autograd call but
    the readout filter's spike partials)."""
    trs = learner.tracers
    fl = len(trs) - 2 if learner._filter is not None else None
    gs = [None] * len(trs)
    with torch.no_grad():
        gbar = _filtered_errors(learner, gy, K, B)
        if gy is not None:
            g_out = gy.reshape(K * B, -1)
            for l in range(len(trs) - 1, -1, -1):
                g, g_out = trs[l].errors(recs[l], g_out, None if l == fl else learner.spatial, l > 0)
                gs[l] = None if l == fl else g
            if gbar is not None:  # the filtered layer's errors: the readout's of every later step
                g_in = gbar.reshape(K * B, -1) @ learner._filter.readout.weight.detach()
                gs[fl] = trs[fl].errors(recs[fl], g_in, learner.spatial, False)[0]
        _contract(learner, recs, gs, gbar, carry, K, B)


def autograd_block(learner, recs, gy, carry: bool, K: int, B: int) -> None:
    """:func:`compiled_block` with the spatial backward by autograd over the block's graph (every
    layer re-advanced from its detached previous rows with the graph to its input): the reference."""
    with torch.enable_grad():  # (the traces property works a window under no_grad)
        _autograd_block(learner, recs, gy, carry, K, B)


def _autograd_block(learner, recs, gy, carry: bool, K: int, B: int) -> None:
    trs = learner.tracers
    h, news = recs[0][0], []
    for l, tr in enumerate(trs):
        prev = recs[l][1]
        if isinstance(tr, GenericTrace):
            out, new = tr.cell.step(h, prev)
        else:
            new = tr.step(h, prev)
            new = type(new)(*(f.view_as(f) if f.requires_grad else f.detach().requires_grad_() for f in new))
            out = tr.output(h, new)
        news.append(new)
        h = out
    traced = [l for l, tr in enumerate(trs) if tr.traced]
    gs = [None] * len(trs)
    fl = len(trs) - 2 if learner._filter is not None else None
    gbar = _filtered_errors(learner, gy, K, B)
    if gy is not None:
        total = (h * gy.reshape(h.shape).detach()).sum()  # d total / d y_t = gy_t: the loss's gradient
        inputs = [f for l in traced for f in news[l]]
        grads = torch.autograd.grad(total, inputs + learner.params, allow_unused=True, retain_graph=fl is not None)
        learner._add_spatial(grads[len(inputs):])
        it = iter(grads[: len(inputs)])
        for l in traced:
            fields = [(next(it), f) for f in news[l]]
            if any(g is not None for g, _ in fields):
                gs[l] = torch.stack([g if g is not None else torch.zeros_like(f) for g, f in fields], -1)
        if fl is not None:  # the layer under the leaky readout: the readout's errors of every later step
            c = trs[fl].cell
            params = {n: p for n, p in c.named_parameters() if p.requires_grad}
            ys = news[fl + 1][0]
            grads = torch.autograd.grad(ys, list(news[fl]) + list(params.values()), gbar.reshape(K * B, -1),
                                        allow_unused=True)
            for n, g in zip(params, grads[len(news[fl]):]):
                if g is not None:
                    learner._trace_states[fl].add(n, g)
            gs[fl] = torch.stack([g if g is not None else torch.zeros_like(f)
                                  for g, f in zip(grads, news[fl])], -1)
    with torch.no_grad():
        _contract(learner, [(r[0], r[1], n, r[3]) for r, n in zip(recs, news)], gs, gbar, carry, K, B)

"""The gradient work of a block of K steps (Zucchet et al. 2023, Sec. 3; thesis Zucchet 2025, Sec. 4.3.2) from the
rows ``[K*B, ..]`` of every layer (input, state before and after each step, output), as the layers' block scans or the
stream's window give them. Every step starts from the detached previous state, so the steps are independent rows: the
loss's errors ``gy_t = d l_t / d y_t``; the spatial backward ``g^l_t = d l_t / d s^l_t`` by each layer's hand-written
``errors`` (:func:`compiled_block`) or one autograd call over the block's graph (:func:`autograd_block`, the
reference); under a leaky readout with readout-filtered traces, the readout's errors of every later step (``gbar``)
for the layer below it; per traced layer the block contraction (:func:`.traces.chunk_contract`) of its partials.
"""
from __future__ import annotations

import torch

from .readout_filter import reverse_readout_filter
from .traces import GenericTrace, advance, chunk_contract, stack_grads
from .traces_readout import LinearReadoutTrace, ReadoutTrace

__all__ = ["scan_rows", "compiled_block", "autograd_block", "loss_errors", "step_loss", "compiled_supported"]


def compiled_supported(learner) -> bool:
    """Whether every layer has a hand-written spatial backward (a readout last) and no dropout is active."""
    drop = getattr(learner.model, "dropout", None)
    trs = learner.tracers
    return (not (drop is not None and drop.training) and all(hasattr(tr, "errors") for tr in trs)
            and isinstance(trs[-1], (ReadoutTrace, LinearReadoutTrace))
            and not any(isinstance(tr, (ReadoutTrace, LinearReadoutTrace)) for tr in trs[:-1]))


def scan_rows(learner, x: torch.Tensor, compiled: bool):
    """The rows of a block ``x [K, B, C]`` by each layer's block scan (``compiled``) or step loop, the states
    advanced to its end: ``(recs, y [K, B, outputs])``, ``recs[l] = (input, prev, new, output)``."""
    K, B = x.shape[0], x.shape[1]
    h, recs = x, []
    for l, tr in enumerate(learner.tracers):
        s = learner.states[l]
        if compiled and hasattr(tr, "scan_block"):
            prev, last, new, out = tr.scan_block(h, s)
        elif isinstance(tr, GenericTrace):
            outs = []
            prev, last, new = tr.scan_loop(h, s, outs)
            out = torch.cat(outs)
        else:
            prev, last, new = tr.scan_loop(h, s)
            out = tr.output(h.reshape(K * B, -1), new)
        learner.states[l] = type(last)(*(f.detach() for f in last))
        recs.append((h.reshape(K * B, -1), prev, new, out))
        h = out.reshape(K, B, -1)
    return recs, h


def loss_errors(y: torch.Tensor, losses: list, block_vg=None):
    """The summed loss (detached) and ``gy [K, B, outputs]`` (``None`` without a loss) of a block's outputs
    ``y``: ``block_vg(y)``, or per step :func:`step_loss` of ``losses[k] = (fn, value_and_grad)``."""
    if block_vg is not None:
        total, gy = block_vg(y)
        return total.detach(), gy
    total = gy = None
    for k, (fn, vg) in enumerate(losses):
        loss, g = (None, None) if fn is None else step_loss(fn, vg, y[k])
        if loss is None:
            continue
        total = loss.detach() if total is None else total + loss.detach()
        if gy is None:
            gy = torch.zeros_like(y)
        gy[k] = g
    return total, gy


def step_loss(fn, vg, y: torch.Tensor, step: int | None = None):
    """``(loss, d loss / d y)`` of one step's output (``(None, None)`` without a loss): ``vg(y)``, else one autograd
    call on ``fn(y)``, a 0-d tensor (zero gradient where unused; ``step`` named in the error of a non-scalar)."""
    if vg is not None:
        lg = vg(y)
        return (None, None) if lg is None else lg
    yl = y.detach().requires_grad_()
    with torch.enable_grad():
        loss = fn(yl)
    if loss is None:
        return None, None
    if loss.dim() != 0:
        at = "" if step is None else f" at step {step}"
        raise ValueError(f"loss must return a scalar{at}, got shape {tuple(loss.shape)}")
    g = torch.autograd.grad(loss, yl, allow_unused=True)[0] if loss.requires_grad else None
    return loss.detach(), (torch.zeros_like(yl) if g is None else g)


def _filtered_errors(learner, gy, K: int, B: int):
    """``gbar``: the leaky readout's errors of every later step (``None`` without the filter or a loss)."""
    filt = learner._filter
    if filt is None or gy is None:
        return None
    return reverse_readout_filter(filt.readout.alpha().detach().to(gy.dtype), gy)


def _contract(learner, recs, gs, gbar, carry: bool, K: int, B: int) -> None:
    """Per traced layer the readout filter's block (under a leaky readout), then the block contraction."""
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
    """The gradient work of a block of ``K`` steps from its rows and the loss errors ``gy [K, B, outputs]`` (or
    ``None``) by the layers' hand-written spatial backwards (autograd: only the filter's spike partials)."""
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
    """:func:`compiled_block` with the spatial backward by autograd over the block's graph: the reference."""
    with torch.enable_grad():  # (the traces property works a window under no_grad)
        _autograd_block(learner, recs, gy, carry, K, B)


def _autograd_block(learner, recs, gy, carry: bool, K: int, B: int) -> None:
    trs = learner.tracers
    h, news = recs[0][0], []
    for l, tr in enumerate(trs):
        h, new = advance(tr, h, recs[l][1], fresh=True)
        news.append(new)
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
            g = [next(it) for _ in news[l]]
            if any(x is not None for x in g):
                gs[l] = stack_grads(g, news[l])
        if fl is not None:  # the layer under the leaky readout: the readout's errors of every later step
            c = trs[fl].cell
            params = {n: p for n, p in c.named_parameters() if p.requires_grad}
            ys = news[fl + 1][0]
            grads = torch.autograd.grad(ys, list(news[fl]) + list(params.values()), gbar.reshape(K * B, -1),
                                        allow_unused=True)
            for n, g in zip(params, grads[len(news[fl]):]):
                if g is not None:
                    learner._trace_states[fl].add(n, g)
            gs[fl] = stack_grads(grads, news[fl])
    with torch.no_grad():
        _contract(learner, [(r[0], r[1], n, r[3]) for r, n in zip(recs, news)], gs, gbar, carry, K, B)

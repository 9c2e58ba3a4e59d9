"""Online gradient estimation for a :class:`~spikerec.models.RecurrentStack` (Zucchet 2025,
"Artificial models of biological learning", ETH Diss. 31520, ch. 4, §4.3.1-4.3.2).

Per time step ``t`` (Fig. 4.2 of the thesis):

1. every layer is advanced from its *detached* previous state (recurrent edges cut) with
   its parameters detached inside the state update, so the step's autograd graph only
   carries the spatial path input -> state -> output -> next layer -> loss;
2. the instantaneous loss ``l_t = loss_fn(y_t, target, t)`` is backpropagated *spatially*,
   giving ``g^l_t = d l_t / d s^l_t`` for every layer and ``d l_t / d theta`` through the output
   maps (readout weights, LRU ``C``/``D``, LIF thresholds in the spike read-out, ...);
3. each traced layer contracts ``g^l_t`` with its eligibility traces (:mod:`.traces_base`).

The estimate is ``sum_t`` of these terms; :meth:`OnlineLearner.backward` adds it to ``.grad``
like ``loss.backward()`` would (the optimiser steps outside, once per batch, as in the
thesis). With ``per_step_update`` the accumulated gradient is flushed into ``.grad`` and the
callable is invoked after every step (``stream``) or block (``chunked``): truly online
learning, whose traces then mix parameter versions (not evaluated in the thesis).

Loss convention: the total loss is ``L = sum_t loss_fn(y_t, target, t)`` over the readout
outputs ``y_t [B, K]``; ``loss_fn`` returns ``None`` at steps without a loss. For
classification use :func:`classification_loss`: ``mean`` readout -> per-step cross-entropy
of the label at every step, averaged over T (the thesis's LRA adaptation; at inference
average the logits over time, i.e. ``readout_mode="mean"``); ``last`` -> cross-entropy at the
last step only; ``per_step`` -> one label per step. A loss on the time-*mean* of the readout
is not a per-step loss and cannot be learned online; ``rule="bptt"`` handles any loss.

Exactness (float64): one recurrent layer with a memoryless readout -> every parameter
equals BPTT except those upstream of the recurrent layer; several layers -> the last
recurrent layer and everything downstream are exact, earlier layers are biased (only
their future error terms are missing). A *leaky* readout is itself a traced recurrent layer,
so it becomes the exact "last" layer and the cells below it are biased (spikerec's extension of
the thesis's multi-layer rule, §4.3.2, to spiking layers).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ...layers.base import check_sequence
from .traces_base import LayerTrace, TraceState, chunk_contract, stack_partials, stream_step

__all__ = ["OnlineLearner", "RULES", "MODES", "classification_loss", "mse_loss", "tracer_for", "bptt_loss"]

RULES = ("full", "spatial", "trunc1", "snap1", "bptt")
MODES = ("stream", "chunked", "parallel")


class GenericTrace(LayerTrace):
    """A layer without traces: advanced with live parameters from the detached previous state.

    Its parameters get ``d l_t / d theta`` through the instantaneous graph, which for
    recurrent parameters is the immediate partial of 1-step truncation (``trunc1``). Exact
    for stateless layers (a non-leaky readout)."""

    def __init__(self, cell, rule, stateless: bool):
        self.cell, self.rule, self.params = cell, rule, dict(cell.named_parameters())
        self.traced, self.mask, self.stateless = [], {}, stateless
        self.kind = type(cell).__name__


def tracer_for(cell, rule: str, index: int) -> LayerTrace:
    """The online form of ``cell`` under ``rule``; a clear error for unsupported pairs."""
    from ...layers.alif import ALIF
    from ...layers.lif import LIF
    from ...layers.lru import LRU
    from ...layers.readout import LeakyReadout

    if isinstance(cell, LIF):
        from .traces_lif import LIFTrace

        return LIFTrace(cell, rule)
    if isinstance(cell, ALIF):
        from .traces_lif import ALIFTrace

        return ALIFTrace(cell, rule)
    if isinstance(cell, LeakyReadout):
        if cell.leaky:
            from .traces_lif import ReadoutTrace

            return ReadoutTrace(cell, rule)
        return GenericTrace(cell, rule, stateless=True)
    if isinstance(cell, LRU):
        from .traces_lru import LRUTrace

        return LRUTrace(cell, rule)
    supported = ("trunc1", "bptt")
    if rule not in supported:
        raise ValueError(
            f"OnlineLearner: layer {index} ({type(cell).__name__}) has no eligibility traces, so rule "
            f"'{rule}' cannot train it; rules supported for {type(cell).__name__}: {', '.join(supported)} "
            f"(traced kinds: LIF, ALIF, LRU, leaky readout)")
    return GenericTrace(cell, rule, stateless=False)


# --- losses ---------------------------------------------------------------------------------


def classification_loss(readout_mode: str, steps: int) -> Callable:
    """Per-step cross-entropy for ``target [B]`` (or ``[T, B]`` with ``per_step``).

    * ``mean``: ``l_t = CE(y_t, target) / T`` at every step;
    * ``last``: ``l_{T-1} = CE(y_{T-1}, target)``, no loss elsewhere;
    * ``per_step``: ``l_t = CE(y_t, target[t]) / T``.
    """
    T = int(steps)
    if readout_mode == "mean":
        return lambda y, target, t: F.cross_entropy(y, target) / T
    if readout_mode == "last":
        return lambda y, target, t: F.cross_entropy(y, target) if t == T - 1 else None
    if readout_mode == "per_step":
        return lambda y, target, t: F.cross_entropy(y, target[t]) / T
    raise ValueError(f"classification_loss: readout mode '{readout_mode}' has no per-step form; "
                     f"use 'mean', 'last' or 'per_step' (or rule='bptt')")


def mse_loss(y, target, t):
    """``l_t = 0.5 * sum over batch and features of (y_t - target[t])^2`` for ``target [T, B, K]``."""
    return 0.5 * ((y - target[t]) ** 2).sum()


def bptt_loss(model, x, target, loss_fn):
    """``sum_t loss_fn(y_t, target, t)`` through the model's fast sequence path (graph kept)."""
    y, _ = model(x)
    total = None
    for t in range(y.shape[0]):
        l = loss_fn(y[t], target, t)
        if l is not None:
            total = l if total is None else total + l
    if total is None:
        raise ValueError("loss_fn returned None at every step: no loss to differentiate")
    return total


# --- the learner ----------------------------------------------------------------------------


class OnlineLearner:
    """Online (eligibility-trace) gradients for a ``RecurrentStack``.

    Args:
        model: a :class:`~spikerec.models.RecurrentStack` (LIF, ALIF, LRU cells; any readout).
        rule: ``full`` (exact in-layer RTRL + spatial errors), ``snap1`` (extended SnAp-1;
            identical to ``full`` on these independent-module layers), ``trunc1``, ``spatial``
            or ``bptt`` (autograd through time, the reference).
        mode: ``stream`` (one step at a time; memory independent of T), ``chunked`` (blocks of
            ``chunk`` steps, one spatial backward and a reverse filter per block: the same
            estimator), ``parallel`` (one block of the whole sequence: the offline reference).
        chunk: block length for ``chunked``.
        per_step_update: optional callable invoked after each step/block with the gradient
            accumulated so far written into ``.grad`` (e.g. ``lambda: (opt.step(), opt.zero_grad())``).
        use_triton: ``None`` = the Triton kernels on CUDA tensors, torch elsewhere; ``True``
            forces them (CPU works under ``TRITON_INTERPRET=1``); ``False`` = torch only.
    """

    def __init__(self, model, rule: str = "full", mode: str = "stream", chunk: int | None = None,
                 per_step_update: Callable | None = None, use_triton: bool | None = None):
        if rule not in RULES:
            raise ValueError(f"OnlineLearner: rule must be one of {RULES}, got {rule!r}")
        if mode not in MODES:
            raise ValueError(f"OnlineLearner: mode must be one of {MODES}, got {mode!r}")
        if mode == "chunked":
            if chunk is None or int(chunk) < 1:
                raise ValueError(f"OnlineLearner: mode 'chunked' needs chunk >= 1, got {chunk!r}")
        elif chunk is not None and mode != "chunked":
            raise ValueError(f"OnlineLearner: chunk is only used with mode 'chunked' (got mode {mode!r})")
        if per_step_update is not None and mode == "parallel":
            raise ValueError("OnlineLearner: per_step_update needs mode 'stream' or 'chunked'")
        if not hasattr(model, "layers") or not hasattr(model, "initial_state"):
            raise TypeError(f"OnlineLearner: model must be a RecurrentStack, got {type(model).__name__}")
        self.model, self.rule, self.mode = model, rule, mode
        self.chunk = int(chunk) if chunk is not None else None
        self.per_step_update = per_step_update
        self.use_triton = use_triton
        self.tracers = [] if rule == "bptt" else [tracer_for(c, rule, i) for i, c in enumerate(model.layers)]

    # --- public -------------------------------------------------------------------------------
    def _add_spatial(self, grads) -> None:
        """Accumulate the immediate (spatial) partials of the parameters, one per ``self.params``."""
        for p, gp in zip(self.params, grads):
            if gp is not None:
                if p in self.spatial:
                    self.spatial[p] += gp
                else:
                    self.spatial[p] = gp.clone()

    def backward(self, x: torch.Tensor, target, loss_fn: Callable) -> float:
        """Accumulate the rule's gradient estimate of ``L = sum_t loss_fn(y_t, target, t)`` into
        ``.grad``; returns ``L`` as a float."""
        check_sequence(x, self.model.input_size, "OnlineLearner input x")
        if self.rule == "bptt":
            total = bptt_loss(self.model, x, target, loss_fn)
            total.backward()
            if self.per_step_update is not None:
                self.per_step_update()
            return float(total.detach())
        T = x.shape[0]
        K = 1 if self.mode == "stream" else (T if self.mode == "parallel" else self.chunk)
        self._begin(x)
        total = 0.0
        for t0 in range(0, T, K):
            total += self._block(x, target, loss_fn, t0, min(T, t0 + K), carry=t0 + K < T)
            if self.per_step_update is not None:
                self._flush()
                self.per_step_update()
                self._prepare()  # the parameters may have changed
        self._flush()
        return total

    # --- internals ------------------------------------------------------------------------------
    def _begin(self, x):
        self.states = list(self.model.initial_state(x.shape[1], x.device, x.dtype))
        self._prepare()
        self.traces = [TraceState(tr) for tr in self.tracers]
        self.spatial = {}
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.kernel = None
        if self.use_triton or (self.use_triton is None and x.is_cuda):
            from .triton_kernels import mat_trace_step, triton_available

            if self.use_triton is None and not triton_available(x):
                self.kernel = None
            else:
                self.kernel = mat_trace_step

    def _prepare(self):
        for tr in self.tracers:
            if not isinstance(tr, GenericTrace):
                tr.prepare()

    def _forward_step(self, x_t):
        """One step of every layer; returns (y_t, per-layer (input, prev, new) records)."""
        model = self.model
        h = x_t
        recs = []
        n_cells = len(model.cells)
        for l, tr in enumerate(self.tracers):
            prev = self.states[l]
            if not isinstance(tr, GenericTrace):
                new = tr.step(h, prev)
                # fresh nodes per field: g_f is then the partial d l_t / d s_t[f] with the other fields
                # held (a field computed from another inside the step, CUBA's v from i, is reached
                # through the traces, not twice); the graph to the layer input is kept
                new = type(new)(*(s.view_as(s) if s.requires_grad else s.detach().requires_grad_() for s in new))
                out = tr.output(h, new)
            else:
                out, new = tr.cell.step(h, prev)
            recs.append((h.detach(), prev, new))
            self.states[l] = type(new)(*(s.detach() for s in new))
            h = out
            if l < n_cells and model.dropout is not None:
                h = model.dropout(h)
        return h, recs

    def _block(self, x, target, loss_fn, t0, t1, carry):
        drop = self.model.dropout
        if self.mode != "stream" and (drop is None or not drop.training):
            return self._block_batched(x, target, loss_fn, t0, t1, carry)
        total = None
        all_recs = []
        for t in range(t0, t1):
            y, recs = self._forward_step(x[t])
            all_recs.append(recs)
            l = loss_fn(y, target, t)
            if l is not None:
                if l.dim() != 0:
                    raise ValueError(f"loss_fn must return a scalar at step {t}, got shape {tuple(l.shape)}")
                total = l if total is None else total + l
        traced = [i for i, tr in enumerate(self.tracers) if not isinstance(tr, GenericTrace)]
        gs = {i: [None] * (t1 - t0) for i in traced}
        loss_value = 0.0
        if total is not None and total.requires_grad:
            inputs, index = [], []
            for k, recs in enumerate(all_recs):
                for i in traced:
                    for f, s in enumerate(recs[i][2]):
                        inputs.append(s)
                        index.append((k, i, f))
            grads = torch.autograd.grad(total, inputs + self.params, allow_unused=True)
            n = len(inputs)
            self._add_spatial(grads[n:])
            fields: dict[tuple[int, int], list] = {}
            for (k, i, f), gsf in zip(index, grads[:n]):
                fields.setdefault((k, i), []).append(gsf)
            for (k, i), lst in fields.items():
                if all(v is None for v in lst):
                    continue
                ref = next(v for v in lst if v is not None)
                gs[i][k] = torch.stack([v if v is not None else torch.zeros_like(ref) for v in lst], -1)
        if total is not None:
            loss_value = float(total.detach())
        with torch.no_grad():
            for i in traced:
                tr, ts = self.tracers[i], self.traces[i]
                if not tr.traced:
                    continue
                if self.mode == "stream":
                    for recs, g in zip(all_recs, gs[i]):
                        x_in, prev, new = recs[i]
                        P = tr.partials(x_in, prev, type(new)(*(v.detach() for v in new)))
                        stream_step(ts, P, g, self.kernel)
                else:  # one vectorised partials call for the whole block: inputs stacked as [K*B, ...]
                    K, B = len(all_recs), x.shape[1]
                    cat = lambda j: torch.cat([r[i][j] for r in all_recs])  # noqa: E731
                    x_in = cat(0)
                    prev = type(all_recs[0][i][1])(*(torch.cat([r[i][1][f] for r in all_recs]) for f in range(len(all_recs[0][i][1]))))
                    new = type(all_recs[0][i][2])(*(torch.cat([r[i][2][f].detach() for r in all_recs]) for f in range(len(all_recs[0][i][2]))))
                    P = stack_partials(tr.partials(x_in, prev, new), K, B)
                    G = None
                    if any(g is not None for g in gs[i]):
                        ref = next(g for g in gs[i] if g is not None)
                        G = torch.stack([g if g is not None else torch.zeros_like(ref) for g in gs[i]])
                    chunk_contract(ts, P, G, carry)
        return loss_value

    def _block_batched(self, x, target, loss_fn, t0, t1, carry):
        """A block of K steps with whole-block tensor ops (chunked / parallel modes, no active
        dropout). Within the block every step starts from the *detached* previous state, so once
        the states are known (one cheap pass without autograd) the steps of a layer are
        independent rows: each layer is advanced for all K steps in one ``[K*B, ...]`` call with
        the spatial graph, and one backward gives ``g_t`` for every step. Same estimator as the
        step-by-step form (:meth:`_block` for ``stream``)."""
        model = self.model
        K, B = t1 - t0, x.shape[1]
        h = x[t0:t1]
        recs = []
        n_cells = len(model.cells)
        for l, tr in enumerate(self.tracers):
            generic = isinstance(tr, GenericTrace)
            hd = h.detach()
            s = self.states[l]
            hf = h.reshape(K * B, *h.shape[2:])
            if generic and tr.stateless:  # the state is not read: no sequential pass
                prev = tr.cell.initial_state(K * B, x.device, x.dtype)
                out, new = tr.cell.step(hf, prev)
                self.states[l] = type(new)(*(f.detach()[(K - 1) * B:] for f in new))
            elif generic:
                prevs = []
                with torch.no_grad():  # the previous states of the block's steps
                    for t in range(K):
                        prevs.append(s)
                        s = tr.cell.step(hd[t], s)[1]
                self.states[l] = type(s)(*(f.detach() for f in s))
                prev = type(s)(*(torch.cat([p[f] for p in prevs]) for f in range(len(s))))
                out, new = tr.cell.step(hf, prev)
            else:
                with torch.no_grad():  # the previous states of the block's steps
                    prevs, s = tr.scan_states(hd, s)
                self.states[l] = type(s)(*(f.detach() for f in s))
                prev = type(s)(*(torch.cat([p[f] for p in prevs]) for f in range(len(s))))
                new = tr.step(hf, prev)
                new = type(new)(*(f.view_as(f) if f.requires_grad else f.detach().requires_grad_() for f in new))
                out = tr.output(hf, new)
            recs.append((hd.reshape(K * B, *hd.shape[2:]), prev, new))
            h = out.reshape(K, B, *out.shape[1:])
            if l < n_cells and model.dropout is not None:
                h = model.dropout(h)
        total = None
        for k in range(K):
            l_ = loss_fn(h[k], target, t0 + k)
            if l_ is not None:
                if l_.dim() != 0:
                    raise ValueError(f"loss_fn must return a scalar at step {t0 + k}, got shape {tuple(l_.shape)}")
                total = l_ if total is None else total + l_
        traced = [i for i, tr in enumerate(self.tracers) if not isinstance(tr, GenericTrace) and tr.traced]
        gs: dict[int, torch.Tensor | None] = {i: None for i in traced}
        if total is not None and total.requires_grad:
            inputs, index = [], []
            for i in traced:
                for f, v in enumerate(recs[i][2]):
                    inputs.append(v)
                    index.append(i)
            grads = torch.autograd.grad(total, inputs + self.params, allow_unused=True)
            n = len(inputs)
            self._add_spatial(grads[n:])
            for i in traced:
                lst = [g for g, j in zip(grads[:n], index) if j == i]
                if all(v is None for v in lst):
                    continue
                fields = [v if v is not None else torch.zeros_like(f) for v, f in zip(lst, recs[i][2])]
                G = torch.stack(fields, -1)
                gs[i] = G.reshape(K, B, *G.shape[1:])
        loss_value = float(total.detach()) if total is not None else 0.0
        with torch.no_grad():
            for i in traced:
                tr = self.tracers[i]
                x_in, prev, new = recs[i]
                P = stack_partials(tr.partials(x_in, prev, type(new)(*(v.detach() for v in new))), K, B)
                chunk_contract(self.traces[i], P, gs[i], carry)
        return loss_value

    def _flush(self):
        """Add the accumulated estimate to ``.grad`` and reset the accumulators."""
        with torch.no_grad():
            extra: dict = {}
            for ts in self.traces:
                for name, G in ts.take().items():
                    p = ts.tr.params[name]
                    extra[p] = extra[p] + G if p in extra else G
            for p in self.params:
                g = None
                if p in self.spatial:
                    g = self.spatial[p]
                if p in extra:
                    g = extra[p] if g is None else g + extra[p]
                if g is None:
                    continue
                if p.grad is None:
                    p.grad = g.detach().clone()
                else:
                    p.grad += g
            self.spatial = {}

"""The chunked block of a stack of plain LIF layers under a linear readout, as one prepared run
of kernel calls (the chunked mode's fast path for such stacks).

The arithmetic is that of :func:`.block.closed_form_block` (the e-prop rule of Bellec et al.
2020, Methods, in the chunked form of Zucchet et al. 2023, Sec. 3):

* forward, per layer: the input currents ``I = W x + b`` of the block's ``K*B`` rows in one
  matmul, then the layer's compiled time loop (:mod:`spikerec.kernels.lif_sequence_numba`);
* readout ``y = W_o z + b_o`` and the loss's closed-form ``value_and_grad``;
* spatial backward, per layer from the top: ``gp = g_z sigma'(v - thr)`` (one compiled pass),
  ``g_z <- gp W`` for the layer below;
* the layer's contraction (:meth:`.traces_lif.LIFTrace._block_contract_compiled`).

What :func:`.block.closed_form_block` derives again at every block (the layers' kinds, the
kernels' flattened constants, the numpy views of the scratch arrays) is derived here once per
sequence, block size and batch size, and the scratch arrays (input currents, membranes, spikes,
the spatial error) are reused from block to block; the compiled functions are called with
argument tuples made once per sequence. On a 2-layer stack of 64 units, batch 8, blocks of 64
steps, a sequence of 1024 steps took 14.3 ms against 17.4 ms for the general block, then 11.9-12.3
ms with the prepared calls (the CPU of BENCHMARKS.md). A sparse input takes the event-driven
products of :mod:`.event_products`, listed once per layer and block for both the forward and the
contraction. The result is bit-identical to the general block (tests/test_online_events.py).
"""
from __future__ import annotations

import numpy as np
import torch

from ...kernels import lif_sequence, lif_sequence_numba, numpy_dtype
from ...neurons import lif as _lif
from . import event_products as _ep
from . import numba_kernels as _nk
from .event_products import event_limit, event_readout_mse, event_words, event_workspace, list_events
from .numba_kernels import compiled_cpu, surrogate_code
from .spatial import _acc, _acc_mm, accumulator, fast_kinds

__all__ = ["LIFStackBlock", "lif_stack_block", "block_loss", "readout_rows"]


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


def _stack_fits(learner, dtype) -> bool:
    """Whether every layer but the last is a plain LIF whose block takes the compiled path (its
    own forward loop, the compiled contraction) and the last a linear readout."""
    kinds = fast_kinds(learner)
    if len(kinds) < 2 or kinds[-1] != "readout" or any(k != "lif" for k in kinds[:-1]):
        return False
    if not learner.block_closed_traces:
        return False
    for tr in learner.tracers[:-1]:
        c = tr.cell
        if not (tr.use_J() and c.weight.dtype == dtype and c.weight.device.type == "cpu"
                and surrogate_code(c.surrogate)[0] in (1, 2) and c.recurrent_weight is None and not c.cuba):
            return False
    return True


def _layer_scratch(K: int, B: int, N: int, dtype) -> tuple:
    """A layer's block scratch: the forward kernel's two, the input currents, the spikes, the
    spatial error at the spikes and its product with the surrogate, the membranes ``[v before
    the block, v_1 .. v_K]`` as their first row and the ``[K*B, N]`` rows after each step, and
    numpy views (the kernel's ``[K, B*N]`` operands, the membranes before each step ``[K, B, N]``,
    the spatial error ``[K, B, N]`` and ``[K*B, N]``, the spikes ``[K*B, N]``)."""
    npdt = numpy_dtype(dtype)
    I = torch.empty((K * B, N), dtype=dtype)
    Vb = torch.empty((K + 1, B, N), dtype=dtype)
    Z = torch.empty((K * B, N), dtype=dtype)
    gz = torch.empty((K * B, N), dtype=dtype)
    gp = torch.empty((K * B, N), dtype=dtype)
    views = (I.view(K, B * N).numpy(), Vb[0].view(-1).numpy(), Vb[1:].view(K, B * N).numpy(),
             Z.view(K, B * N).numpy(), Vb[:-1].numpy(), gp.view(K, B, N).numpy(), gp.numpy(), Z.numpy())
    return np.empty(B * N, npdt), np.empty((1, 1), npdt), I, Z, gz, gp, Vb[0], Vb[1:].view(K * B, N), views


class _Layer:
    """One LIF layer's per-sequence data: the tracer, its constants, and the arguments of the
    block's compiled calls (the forward loop, the event-driven input current, the spikes'
    spatial backward) made once, with the scratch arrays they write."""

    def __init__(self, tr, K: int, B: int, dtype):
        c = tr.cell
        self.tr = tr
        k = tr.consts(dtype)
        self.Wt, self.bias = k["Wt"], k["bias"]
        self.W = c.weight.detach()
        N = self.N = c.hidden_size
        H = c.input_size
        a, a_s, th, zeros = lif_sequence_numba.forward_consts(k["alpha"], None, k["thr"], B, N, dtype)
        (self.i_scratch, no_syn, self.I, self.Z, self.gz, self.gp, self.v0, new_v,
         views) = tr.scratch(("stack block", K, B, dtype), lambda: _layer_scratch(K, B, N, dtype))
        I_np, v0_np, V_np, Z_np, self.vp_np, self.gp_np, gp_rows, self.Z_np = views
        # forward: fwd(*fwd_args, vT, i_scratch)
        self.fwd_args = (I_np, v0_np, zeros, a, a_s, th, lif_sequence_numba.RESET_CODES[c.reset], False, V_np, Z_np,
                         no_syn)
        self.Z_words = event_words(self.Z_np)  # the spikes as the next layer's (or the readout's) event input
        # the spatial backward: _lif_spatial(gz, *spatial_args)
        self.learn_thr = c.threshold.requires_grad
        self.thr_sums = np.zeros(N, np.float64)
        code, p1, p2 = surrogate_code(c.surrogate)
        self.spatial_args = (new_v.numpy(), k["thr"].expand(N).contiguous().numpy(), code, p1, p2, gp_rows,
                             self.learn_thr, self.thr_sums)
        self.gz_np = self.gz.numpy()
        tr._block_plan(dtype, K, B)  # the contraction's constants and workspace, made now
        ev = self.ev_ws = tr._event_workspace(K, B, dtype)  # where its input's events are listed
        self.ev_limit = event_limit(K * B * H)
        Wt = self.Wt.numpy()
        self.current_args = (ev["ptr"], ev["idx"], ev["val"], Wt, Wt[0] if self.bias is None else self.bias.numpy(),
                             self.bias is not None, self.I.numpy())


class LIFStackBlock:
    """The prepared block of one learner's LIF stack for blocks of ``K`` steps and batch ``B``
    (made by :func:`lif_stack_block`, valid while the learner's constants are)."""

    def __init__(self, learner, K: int, B: int, dtype):
        self.K, self.B, self.dtype = K, B, dtype
        self.np_dtype = numpy_dtype(dtype)
        self.layers = [_Layer(tr, K, B, dtype) for tr in learner.tracers[:-1]]
        # the forward loop on the calling thread where each layer is one block of neurons
        self.fwd = lif_sequence_numba.forward_kernel(
            serial=max(B * L.N for L in self.layers) <= lif_sequence_numba.BLOCK)
        ro = self.readout = learner.tracers[-1].cell
        self.Wo = ro.weight.detach()
        self.bo = None if ro.bias is None else ro.bias.detach()
        # the readout of sparse spikes, the package's MSE and the readout's gradients in one call
        O, N = self.Wo.shape
        self.mse_ok = self.Wo.dtype == dtype
        self.mse_W = self.Wo.contiguous()
        self.mse_WT = np.ascontiguousarray(self.mse_W.numpy().T)
        self.mse_ws = learner.tracers[-1].scratch(
            ("readout mse", K, B, dtype),
            lambda: (event_workspace(K * B, N, O, B, dtype), torch.empty((K * B, O), dtype=dtype),
                     torch.empty((K * B, O), dtype=dtype)))
        self.mse_limit = event_limit(K * B * N)

    def run(self, learner, x, vgs, carry: bool, block_vg=None, mse_target=None):
        """The gradient work of one block ``x [K, B, C]`` (as :func:`.block.closed_form_block`);
        returns the block's summed loss (detached) or ``None``. ``mse_target [K, B, O]`` (a
        contiguous CPU tensor of the block's dtype): the loss is the package's MSE against it;
        when the top layer's spikes are sparse, the readout, the loss and the readout's parameter
        gradients are one compiled call on their events (:func:`.event_products.event_readout_mse`)."""
        K, B = self.K, self.B
        states = learner.states
        fwd = self.fwd
        h = x.reshape(K * B, x.shape[-1])
        a = h.numpy()
        words = event_words(a)
        ins = []
        with torch.no_grad():
            for l, L in enumerate(self.layers):
                ev = list_events(a, *words, L.ev_ws, L.ev_limit)  # a sparse input: the event-driven products
                if ev:
                    _ep._current(*L.current_args)
                elif L.bias is not None:
                    torch.addmm(L.bias, h, L.Wt, out=L.I)
                else:
                    torch.mm(h, L.Wt, out=L.I)
                L.v0.copy_(states[l].v)
                vT = torch.empty((B, L.N), dtype=self.dtype)
                fwd(*L.fwd_args, vT.view(-1).numpy(), L.i_scratch)
                states[l] = _lif.LIFState(vT)
                ins.append((h, L.ev_ws if ev else None))
                h, a, words = L.Z, L.Z_np, L.Z_words
            top = self.layers[-1]
            if mse_target is not None and self.mse_ok and list_events(a, *words, self.mse_ws[0], self.mse_limit):
                ws, y, gy = self.mse_ws
                sp = learner.spatial
                ro = self.readout
                loss = event_readout_mse(ws, self.mse_W, self.mse_WT, self.bo, y, mse_target.view(K * B, -1), gy,
                                         accumulator(sp, ro.weight), accumulator(sp, ro.bias) if self.bo is not None
                                         else None, top.gz)
                states[-1] = type(states[-1])(y[(K - 1) * B:].clone())
                return self._backward(learner, ins, carry, torch.from_numpy(np.array(loss, self.np_dtype)))
            y = readout_rows(h, self.Wo, self.bo)
            states[-1] = type(states[-1])(y[(K - 1) * B:])
            total, gy = block_loss(learner, y.view(K, B, -1), vgs, block_vg)
            if gy is None:  # no loss in this block: the traces are only carried
                for l, L in enumerate(self.layers):
                    if L.tr.traced:
                        L.tr._contract_rows(learner.traces[l], ins[l][0], L.vp_np, None, carry, K, B, ins[l][1])
                return None
            g = gy.reshape(K * B, -1)
            sp = learner.spatial
            ro = self.readout
            _acc_mm(sp, ro.weight, g.t(), h)
            if ro.bias is not None:
                _acc(sp, ro.bias, g.sum(0))
            torch.mm(g, self.Wo, out=top.gz)
            return self._backward(learner, ins, carry, total)

    def _backward(self, learner, ins, carry: bool, total):
        """From the error at the top layer's spikes (its ``gz``): each layer's spatial backward
        and contraction, from the top; returns the block's loss."""
        K, B = self.K, self.B
        sp = learner.spatial
        layers = self.layers
        with torch.no_grad():
            for l in range(len(layers) - 1, -1, -1):
                L = layers[l]
                if L.learn_thr:
                    L.thr_sums[:] = 0.0
                _nk._lif_spatial(L.gz_np, *L.spatial_args)  # gp = gz sigma'(v - thr)
                if L.learn_thr:
                    _acc(sp, L.tr.cell.threshold, torch.from_numpy(L.thr_sums).to(self.dtype), -1.0)
                if l > 0:
                    torch.mm(L.gp, L.W, out=layers[l - 1].gz)
                if L.tr.traced:
                    L.tr._contract_rows(learner.traces[l], ins[l][0], L.vp_np, L.gp_np, carry, K, B, ins[l][1])
        return None if total is None else total.detach()


def lif_stack_block(learner, x) -> LIFStackBlock | None:
    """The learner's prepared LIF-stack block for ``x [K, B, C]``, made on first use and again
    when the learner's constants change; ``None`` where the stack or the input does not fit it."""
    K, B = x.shape[0], x.shape[1]
    cache = learner.__dict__.setdefault("_lif_stack_blocks", {})
    key = (K, B, x.dtype)
    hit = cache.get(key)
    if hit is not None and hit[0] == learner._gen:
        return hit[1]
    fits = (compiled_cpu(x) and not x.requires_grad and x.is_contiguous() and _stack_fits(learner, x.dtype)
            and lif_sequence._use_numba("auto", x, None))  # the layers' own forward backend is the compiled loop
    for k in [k for k, v in cache.items() if v[0] != learner._gen]:  # made from older constants
        del cache[k]
    blk = LIFStackBlock(learner, K, B, x.dtype) if fits else None
    cache[key] = (learner._gen, blk)
    return blk

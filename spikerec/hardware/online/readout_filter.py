"""Readout-filtered eligibility traces: exact online gradients of the LIF, ALIF or LRU layer
under a leaky readout (Bellec et al. 2020, "A solution to the learning dilemma for recurrent
networks of spiking neurons", Nat. Commun. 11:3625, Methods: the learning signal of leaky
output neurons and the filtered eligibility trace).

A leaky readout ``y_t = alpha y_{t-1} + W z_t + b`` is a linear diagonal filter, so a hidden
spike ``z_s`` reaches every later output: ``d y_t / d z_s = alpha^(t-s) W``. With ``delta_t =
d l_t / d y_t`` the gradient of a parameter ``p`` of the hidden layer is

    dL/dp = sum_t sum_k delta_t[k] * d y_t[k] / dp = sum_t sum_d u^d_t . zbar^d_t
    u^d_t = (delta_t * m_d) W          zbar^d_t = alpha_d zbar^d_{t-1} + d z_t / dp

for the distinct readout decays ``alpha_d`` (``m_d``: the outputs with that decay), where
``d z_t / dp = psi_t . eps^p_t + d z_t / dp |immediate`` (``psi_t = d z_t / d s_t``, ``eps``: the
layer's own eligibility trace, :mod:`.traces_base`; the immediate term: parameters read by the
spike map, the threshold and ALIF's adaptation strength). Exact wherever the layer's own traces
are (no lateral weights); memory per distinct decay: ``B x N`` per per-neuron parameter and
``B x N x H`` per weight matrix, independent of T.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from .traces_base import _STACK, Partials, TraceState, _mat_contract_g

__all__ = ["ReadoutFilter"]


class _Output(nn.Module):
    """The layer's spike map ``z = output(x, s)`` as a module call, so that its parameters can be
    replaced by per-sample copies (``functional_call``)."""

    def __init__(self, tr):
        super().__init__()
        self.cell = tr.cell
        self._tr = [tr]

    def forward(self, x, state):
        return self._tr[0].output(x, state)


class ReadoutFilter:
    """The filtered traces ``zbar^d`` of the traced layer ``tr`` directly under the leaky
    ``readout`` (kept in ``TraceState.filt``, batch-first) and their contraction with the
    readout's learning signal."""

    def __init__(self, tr, readout):
        self.tr, self.readout = tr, readout
        self._out = _Output(tr)

    def groups(self, dtype):
        """``[(alpha_d, m_d [K])]``: the distinct decays of the readout and their outputs."""
        alpha = self.readout.alpha().detach().to(dtype)
        return [(a, (alpha == a).to(dtype)) for a in torch.unique(alpha)]

    def spike_partials(self, x_in, new):
        """``psi [B, N, k] = d z / d s`` and ``{name: d z / d p [B, N]}`` for the parameters the
        spike map reads (each per-neuron or scalar parameter replaced by a ``[B, N]`` copy)."""
        fields = [f.detach().requires_grad_() for f in new]
        B, N = fields[0].shape[0], fields[0].shape[1]
        copies = {n: p.detach().expand(B, N).clone().requires_grad_()
                  for n, p in self.tr.cell.named_parameters()
                  if p.requires_grad and p.numel() in (1, N) and p.dim() <= 1}
        z = functional_call(self._out, {f"cell.{n}": c for n, c in copies.items()}, (x_in, type(new)(*fields)))
        grads = torch.autograd.grad(z.sum(), fields + list(copies.values()), allow_unused=True)
        psi = torch.stack([g if g is not None else torch.zeros_like(f) for g, f in zip(grads, fields)], -1)
        direct = {n: g for n, g in zip(copies, grads[len(fields):]) if g is not None}
        return psi, direct

    def step(self, ts: TraceState, P: Partials, x_in, new, delta) -> None:
        """One step, after the layer's traces have advanced to ``eps_t``: ``zbar <- alpha zbar +
        d z_t / dp`` and (``delta [B, K]``, ``None`` without a loss) ``G += u . zbar``."""
        tr = self.tr
        psi, direct = self.spike_partials(x_in, new)
        dz: dict[str, torch.Tensor] = {}
        names = tr.vec_names(P)
        e = ts.vec.get(_STACK)
        if names and e is not None:  # [B, N, k, m]
            dzv = (psi.unsqueeze(-1) * e).sum(2)
            for j, n in enumerate(names):
                dz[n] = dzv[..., j]
        for base, r, M in tr.mat_readers(P):
            em = ts.mat.get(base)
            if em is not None:  # [N, B, k, H]
                dz[r] = torch.einsum("bnf,nbfh->bnh", _mat_contract_g(psi, M), em)
        for n, g in direct.items():
            dz[n] = dz[n] + g if n in dz else g
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(psi.dtype)):
            u = None if delta is None else (delta * m) @ W  # [B, N]
            for n, v in dz.items():
                key = f"{j}/{n}"
                old = ts.filt.get(key)
                zbar = v if old is None else old * a + v
                ts.filt[key] = zbar
                if u is None:
                    continue
                if zbar.dim() == 3:  # a weight matrix [B, N, H]
                    ts.add(n, torch.einsum("bn,bnh->nh", u, zbar))
                else:
                    G = (u * zbar).sum(0)
                    ts.add(n, G if tr.params[n].numel() == G.numel() else G.sum())


class LinearOutputFilter(ReadoutFilter):
    """The same sums for a layer whose output map is linear in its input and state (the LRU,
    ``o = Re(C h) + D x``): ``psi`` is then constant, so the layer's traces themselves are filtered,
    ``ebar^d_t = alpha_d ebar^d_{t-1} + eps_t``, and ``G += (d o / d s)^T u^d_t . ebar^d_t``; the
    output map's own parameters get ``d (u^d_t . o(xbar^d_t, sbar^d_t)) / d theta`` with the filtered
    input and state. Memory per distinct decay: one copy of the layer's traces, state and input."""

    def step(self, ts: TraceState, P: Partials, x_in, new, delta) -> None:
        tr = self.tr
        names = tr.vec_names(P)
        readers = tr.mat_readers(P)
        cur = {"x": x_in, **{f"s{f}": v for f, v in enumerate(new)}}
        if names and ts.vec.get(_STACK) is not None:
            cur["vec"] = ts.vec[_STACK]  # [B, N, k, m]
        for base in {b for b, _, _ in readers}:
            if base in ts.mat:
                cur[f"mat/{base}"] = ts.mat[base]  # [N, B, k, H]
        out_params = {n: p for n, p in tr.cell.named_parameters() if p.requires_grad and n not in tr.traced}
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(x_in.dtype)):
            bars = {}
            for key, v in cur.items():  # the stored traces are updated in place by the next step: copy
                old = ts.filt.get(f"{j}/{key}")
                bars[key] = ts.filt[f"{j}/{key}"] = v.clone() if old is None else old * a + v
            if delta is None:
                continue
            u = (delta * m) @ W  # [B, layer outputs]
            fields = [bars[f"s{f}"].detach().requires_grad_() for f in range(len(new))]
            o = tr.output(bars["x"], type(new)(*fields))
            grads = torch.autograd.grad(o, fields + list(out_params.values()), u, allow_unused=True)
            gbar = torch.stack([g if g is not None else torch.zeros_like(f) for g, f in zip(grads, fields)], -1)
            if "vec" in bars:
                Gv = (gbar.unsqueeze(-1) * bars["vec"]).sum(dim=(0, 2))
                for i, n in enumerate(names):
                    ts.add(n, Gv[:, i])
            for base, r, M in readers:
                if f"mat/{base}" in bars:
                    ts.add(r, torch.einsum("bnf,nbfh->nh", _mat_contract_g(gbar, M), bars[f"mat/{base}"]))
            for n, g in zip(out_params, grads[len(fields):]):
                if g is not None:
                    ts.add(n, g)

"""Readout-filtered eligibility traces: exact online gradients of the LIF, ALIF or LRU layer under a leaky readout
(Bellec et al. 2020, "A solution to the learning dilemma for recurrent networks of spiking neurons", Nat. Commun.
11:3625, Methods: the learning signal of leaky output neurons and the filtered eligibility trace). A leaky readout
``y_t = alpha y_{t-1} + W z_t + b`` is a linear diagonal filter, ``d y_t / d z_s = alpha^(t-s) W``, so with
``delta_t = d l_t / d y_t`` a parameter ``p`` of the hidden layer gets

    dL/dp = sum_t sum_k delta_t[k] * d y_t[k] / dp = sum_t sum_d u^d_t . zbar^d_t
    u^d_t = (delta_t * m_d) W          zbar^d_t = alpha_d zbar^d_{t-1} + d z_t / dp

per distinct readout decay ``alpha_d`` (``m_d``: its outputs), where ``d z_t / dp = psi_t . eps^p_t`` plus the
immediate term of the spike map's own parameters (``psi_t = d z_t / d s_t``; ``eps``: the layer's traces,
:mod:`.traces`). Exact wherever the layer's own traces are; memory per decay: ``B x N`` per per-neuron parameter,
``B x N x H`` per weight matrix.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from ... import neurons
from ...scan import linear_scan
from .traces import BlockPartials, Partials, TraceState, _read, planar, stack_grads, weighted_sums

__all__ = ["ReadoutFilter", "LinearOutputFilter", "reverse_readout_filter"]


def reverse_readout_filter(alpha: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """``gbar_t = gy_t + alpha gbar_{t+1}`` over a block ``gy [K, B, outputs]`` (``gbar_{K-1} = gy_{K-1}``), per
    output: the errors of the block's later steps that reach the readout's state at ``t`` (a reversed linear scan)."""
    return linear_scan(alpha, gy.flip(0)).flip(0)


def _decay_into(filt: dict, j: int, sums: dict, a, K: int | None = None) -> None:
    """``zbar <- a zbar + v`` in place for each ``v`` of ``sums`` (group ``j``; a copy of ``v`` where none yet);
    with ``K``, a block's sums: ``a^K zbar + v``."""
    for n, v in sums.items():
        old = filt.get(f"{j}/{n}")
        if old is None:
            filt[f"{j}/{n}"] = v.clone() if K is None else v
        else:
            filt[f"{j}/{n}"] = old.mul_(a).add_(v) if K is None else old * a ** K + v


def _powers(a, K):
    """``a^(K-1-s)`` for ``s = 0 .. K-1``: the weight of step ``s`` in the block's filtered sum."""
    return a ** torch.arange(K - 1, -1, -1, dtype=a.dtype, device=a.device)


class _Output(nn.Module):
    """The layer's spike map ``z = output(x, s)`` as a module, its parameters replaceable (``functional_call``)."""

    def __init__(self, tr):
        super().__init__()
        self.cell = tr.cell
        self._tr = [tr]

    def forward(self, x, state):
        return self._tr[0].output(x, state)


class ReadoutFilter:
    """The filtered traces ``zbar^d`` of the traced layer ``tr`` under the leaky ``readout`` (``TraceState.filt``:
    per-neuron ``[B, N]``, weight matrices' ``[N, B, H]`` under ``mat/``) and their contraction with its errors."""

    def __init__(self, tr, readout):
        self.tr, self.readout = tr, readout
        self._out = _Output(tr)

    def groups(self, dtype):
        """``[(alpha_d, m_d [K])]``: the readout's distinct decays and their outputs (cached per time constants)."""
        tau = self.readout.log_tau
        key = (id(tau), tau._version, dtype, tau.device)
        cached = self.__dict__.get("_groups")
        if cached is None or cached[0] != key:
            alpha = self.readout.alpha().detach().to(dtype)
            cached = self._groups = (key, [(a, (alpha == a).to(dtype)) for a in torch.unique(alpha)])
        return cached[1]

    def spike_partials(self, x_in, new):
        """``psi [B, N, k] = d z / d s`` and ``{name: d z / d p [B, N]}`` of the spike map's per-neuron or
        scalar parameters."""
        fields = [f.detach().requires_grad_() for f in new]
        B, N = fields[0].shape[0], fields[0].shape[1]
        copies = {n: p.detach().expand(B, N).clone().requires_grad_()
                  for n, p in self.tr.cell.named_parameters()
                  if p.requires_grad and p.numel() in (1, N) and p.dim() <= 1}
        with torch.enable_grad():
            z = functional_call(self._out, {f"cell.{n}": c for n, c in copies.items()}, (x_in, type(new)(*fields)))
            grads = torch.autograd.grad(z.sum(), fields + list(copies.values()), allow_unused=True)
        psi = stack_grads(grads, fields)
        direct = {n: g for n, g in zip(copies, grads[len(fields):]) if g is not None}
        return psi, direct

    def step(self, ts: TraceState, P: Partials, x_in, new, delta) -> None:
        """One step, after the layer's traces have advanced to ``eps_t``: ``zbar <- alpha zbar +
        d z_t / dp`` and (``delta [B, K]``, ``None`` without a loss) ``G += u . zbar``."""
        tr = self.tr
        psi, direct = self.spike_partials(x_in, new)
        dz = {} if ts.ev is None else dict(zip(ts.names, (planar(psi) * ts.ev).sum(2)))  # ev [m, B, k, N]
        for base, r, M in tr.mat_readers(P.mat):
            em = ts.mat.get(base)
            if em is not None:  # [N, B, k, H] -> [N, B, H]
                dz[f"mat/{r}"] = (_read(psi, M).transpose(0, 1).unsqueeze(-1) * em).sum(2)
        for n, g in direct.items():
            dz[n] = dz[n] + g if n in dz else g
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(psi.dtype)):
            _decay_into(ts.filt, j, dz, a)
            if delta is not None:
                self._contract(ts, j, (delta * m) @ W)

    def _contract(self, ts: TraceState, j: int, u) -> None:
        """``G += u . zbar^j`` for every filtered trace of decay group ``j`` (``u [B, N]``)."""
        prefix = f"{j}/"
        for key, zbar in ts.filt.items():
            if not key.startswith(prefix):
                continue
            n = key[len(prefix):]
            if n.startswith("mat/"):  # [N, B, H]
                ts.add(n[4:], torch.bmm(u.t().unsqueeze(1), zbar).squeeze(1))
            else:
                G = (u * zbar).sum(0)
                ts.add(n, G if self.tr.params[n].numel() == G.numel() else G.sum())

    def block(self, ts: TraceState, P: BlockPartials, x_rows, new_rows, gbar, K: int, B: int) -> None:
        """A block of ``K`` steps, before the layer's traces are carried to its end: the block's errors
        meet the filtered traces carried into it, ``G += (alpha_d gbar_0 m_d) W . zbar^d_{t0-1}``
        (``gbar [K, B, outputs]`` from :func:`reverse_readout_filter`, ``None`` without a loss), then
        ``zbar^d`` advances to the block's end, ``alpha_d^K zbar^d_{t0-1} + sum_s alpha_d^(t1-s) dz_s``.
        The errors inside the block reach the layer through its own block contraction."""
        W = self.readout.weight.detach()
        groups = self.groups(x_rows.dtype)
        if gbar is not None:
            for j, (a, m) in enumerate(groups):
                self._contract(ts, j, ((a * gbar[0]) * m) @ W)
        psi, direct = self.spike_partials(x_rows, new_rows)
        psi = psi.reshape(K, B, *psi.shape[1:])
        for j, (a, m) in enumerate(groups):
            cw = _powers(a, K)
            vec, mat = weighted_sums(ts, P, cw.view(K, 1, 1, 1) * psi)
            sums = {**vec, **{f"mat/{r}": v for r, v in mat.items()}}
            for n, g in direct.items():
                d = (cw.view(K, 1, 1) * g.reshape(K, B, -1)).sum(0)
                sums[n] = sums[n] + d if n in sums else d
            _decay_into(ts.filt, j, sums, a, K)


class LinearOutputFilter(ReadoutFilter):
    """The same sums for a layer whose output map is linear in its input and state (the LRU, ``o = Re(C h) + D x``):
    ``psi`` is constant, so the traces themselves are filtered, ``ebar^d_t = alpha_d ebar^d_{t-1} + eps_t``, ``G +=
    (d o / d s)^T u^d_t . ebar^d_t``; the output map's parameters get ``d (u^d_t . o(xbar^d_t, sbar^d_t)) / d theta``.
    Memory per distinct decay: one copy of the layer's traces, state and input."""

    def step(self, ts: TraceState, P: Partials, x_in, new, delta) -> None:
        cur = {"x": x_in, **{f"s{f}": v for f, v in enumerate(new)}}
        if ts.ev is not None:
            cur["vec"] = ts.ev  # [m, B, k, N]
        for base in {b for b, _, _ in self.tr.mat_readers(P.mat)}:
            if base in ts.mat:
                cur[f"mat/{base}"] = ts.mat[base]  # [N, B, k, H]
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(x_in.dtype)):
            _decay_into(ts.filt, j, cur, a)
            if delta is not None:
                self._contract(ts, j, (delta * m) @ W, P, type(new), len(new))

    def _contract(self, ts: TraceState, j: int, u, P=None, state_type=None, n_fields=0) -> None:
        """``G += (d o / d s)^T u . ebar^j`` and the output map's gradient at group ``j``'s filtered input
        and state (``u [B, layer outputs]``)."""
        tr = self.tr
        bars = {key[len(f"{j}/"):]: v for key, v in ts.filt.items() if key.startswith(f"{j}/")}
        if "x" not in bars:
            return
        sbar = state_type(*(bars[f"s{f}"] for f in range(n_fields)))
        out_params = {n: p for n, p in tr.cell.named_parameters() if p.requires_grad and n not in tr.traced}
        fields = [f.detach().requires_grad_() for f in sbar]
        with torch.enable_grad():
            o = tr.output(bars["x"], state_type(*fields))
            grads = torch.autograd.grad(o, fields + list(out_params.values()), u, allow_unused=True)
        gbar = stack_grads(grads, fields)
        if "vec" in bars:
            for n, G in zip(ts.names, (planar(gbar) * bars["vec"]).sum(dim=(1, 2))):
                ts.add(n, G)
        for base, r, M in tr.mat_readers(P.mat if isinstance(P, Partials) else P.pre):
            e = bars.get(f"mat/{base}")  # [N, B, k, H]
            if e is not None:
                ts.add(r, torch.einsum("bnf,nbfh->nh", _read(gbar, M), e))
        for n, g in zip(out_params, grads[len(fields):]):
            if g is not None:
                ts.add(n, g)

    def block(self, ts: TraceState, P: BlockPartials, x_rows, new_rows, gbar, K: int, B: int) -> None:
        """:meth:`ReadoutFilter.block` for the linear output map (each trace field by the adjoint)."""
        W = self.readout.weight.detach()
        groups = self.groups(x_rows.dtype)
        state_type, n_fields = type(new_rows), len(new_rows)
        if gbar is not None:
            for j, (a, m) in enumerate(groups):
                self._contract(ts, j, ((a * gbar[0]) * m) @ W, P, state_type, n_fields)
        k = self.tr.k
        for j, (a, m) in enumerate(groups):
            cw = _powers(a, K)
            cur = {"x": (cw.view(K, 1, 1) * x_rows.reshape(K, B, -1)).sum(0)}
            for f, v in enumerate(new_rows):
                cur[f"s{f}"] = (cw.view(K, 1, 1) * v.reshape(K, B, -1)).sum(0)
            per_field = []
            bases = [(b, b, None) for b in dict.fromkeys(b for b, _, _ in self.tr.mat_readers(P.pre))]
            for f in range(k):
                w = torch.zeros((K, B, P.c.shape[-1], k), dtype=x_rows.dtype, device=x_rows.device)
                w[..., f] = cw.view(K, 1, 1)
                per_field.append(weighted_sums(ts, P, w, bases))
            names = list(per_field[0][0])
            if names:  # [m, B, k, N]
                cur["vec"] = torch.stack([torch.stack([vec[n] for vec, _ in per_field], 1) for n in names])
            for base, _, _ in bases:  # the base's own trace (a shared reader reads it through M)
                cur[f"mat/{base}"] = torch.stack([mat[base] for _, mat in per_field], 2)
            _decay_into(ts.filt, j, cur, a, K)


neurons.register_backend("readout", "online_readout_filter (the leaky readout's filter of the layer below, "
                         "ReadoutFilter.step/block)", ReadoutFilter.block,
                         test="tests/test_online_readout_filter.py::test_chunked_and_parallel_modes_equal_bptt")
neurons.register_backend("readout", "online_readout_filter (the leaky readout's filter of a linear output map, "
                         "LinearOutputFilter.step/block)", LinearOutputFilter.block,
                         test="tests/test_online_readout_filter.py::test_lru_under_a_leaky_readout_equals_bptt")

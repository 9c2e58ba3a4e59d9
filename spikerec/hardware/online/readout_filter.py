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

from ... import neurons
from ...scan import linear_scan
from .traces_base import _STACK, Partials, TraceState, _mat_contract_g, _mtv, reverse_filter

__all__ = ["ReadoutFilter", "LinearOutputFilter", "reverse_readout_filter"]


def reverse_readout_filter(alpha: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """``gbar_t = gy_t + alpha gbar_{t+1}`` over a block ``gy [K, B, outputs]`` (``gbar_{K-1} =
    gy_{K-1}``), per output with its own decay: the errors of the block's later steps that reach
    the readout's state at step ``t``: the linear scan :func:`spikerec.scan.linear_scan` run backwards
    in time (compiled on the CPU, Triton on CUDA)."""
    return linear_scan(alpha, gy.flip(0)).flip(0)


def _powers(a, K):
    """``a^(K-1-s)`` for ``s = 0 .. K-1`` (``[K]``): the weight of step ``s`` in the block's
    filtered sum at its last step."""
    return a ** torch.arange(K - 1, -1, -1, dtype=a.dtype, device=a.device)


def _weighted_traces(ts, P: Partials, names, readers, w):
    """Per sample, ``sum_s w_s . eps_s`` over a block for the traces of a layer, without forming
    them (the adjoint of the trace recursion, as :func:`.traces_base.chunk_contract`):
    ``wt_s = w_s + J_{s+1}^T wt_{s+1}``, then ``sum_s wt_s . imm_s + (J_0^T wt_0) . eps_{t0-1}``.
    ``w [K, B, N, k]``; returns ``({name: [B, N]}, {reader: [N, B, H]})``; the traces
    before the block are read from ``ts`` (block layout: ``vec[name] [B, N, k]``, ``mat[base] [N,
    B, k, H]``)."""
    J = P.J
    wt = reverse_filter(J, w)
    b0 = _mtv(J[0], wt[0])  # [B, N, k]: J_0^T wt_0
    vec = {}
    for n in names:
        v = (wt * P.vec[n]).sum(dim=(0, 3))  # [B, N]
        e = ts.vec.get(n)
        vec[n] = v if e is None else v + (b0 * e).sum(-1)
    mat = {}
    for base, r, M in readers:
        c, pre = P.mat[base]
        a = (_mat_contract_g(wt, M) * c).sum(-1)  # [K, B, N]
        v = torch.einsum("kbn,kbh->nbh", a, pre)
        e = ts.mat.get(base)
        mat[r] = v if e is None else v + torch.einsum("bnf,nbfh->nbh", _mat_contract_g(b0, M), e)
    return vec, mat


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
    ``readout`` (kept in ``TraceState.filt``: batch-first, a weight matrix's neuron-major ``[N, B,
    H]`` under ``mat/``) and their contraction with the
    readout's learning signal."""

    def __init__(self, tr, readout):
        self.tr, self.readout = tr, readout
        self._out = _Output(tr)

    def groups(self, dtype):
        """``[(alpha_d, m_d [K])]``: the distinct decays of the readout and their outputs (kept
        until the readout's time constants change)."""
        tau = self.readout.log_tau
        key = (id(tau), tau._version, dtype, tau.device)
        cached = self.__dict__.get("_groups")
        if cached is None or cached[0] != key:
            alpha = self.readout.alpha().detach().to(dtype)
            cached = self._groups = (key, [(a, (alpha == a).to(dtype)) for a in torch.unique(alpha)])
        return cached[1]

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

    def step(self, ts: TraceState, P: Partials, x_in, new, delta, partials=None, mat_kernel=None) -> None:
        """One step, after the layer's traces have advanced to ``eps_t``: ``zbar <- alpha zbar +
        d z_t / dp`` and (``delta [B, K]``, ``None`` without a loss) ``G += u . zbar``.
        ``partials``: ``(psi, direct)`` when the caller has them (:func:`.spatial.spike_partials`),
        else :meth:`spike_partials`. ``mat_kernel``: a compiled form of a weight matrix's update and
        contraction in one pass (:func:`spikerec.kernels.trace_numba.filter_mat_step_numba`)."""
        tr = self.tr
        psi, direct = self.spike_partials(x_in, new) if partials is None else partials
        dz: dict[str, torch.Tensor] = {}
        compiled = []  # (reader, trace) of the weight matrices the kernel takes
        names = tr.vec_names(P)
        e = ts.vec.get(_STACK)
        if names and e is not None:  # [B, N, k, m]
            dzv = (psi.unsqueeze(-1) * e).sum(2)
            for j, n in enumerate(names):
                dz[n] = dzv[..., j]
        for base, r, M in tr.mat_readers(P):
            em = ts.mat.get(base)
            if em is not None and mat_kernel is not None and M is None and r not in direct:
                compiled.append((r, em))
            elif em is not None:  # [N, B, k, H] -> neuron-major [N, B, H], elementwise
                pn = _mat_contract_g(psi, M).transpose(0, 1).unsqueeze(-1)  # [N, B, k, 1]
                dz[f"mat/{r}"] = pn[:, :, 0] * em[:, :, 0] if em.shape[2] == 1 else (pn * em).sum(2)
        for n, g in direct.items():
            dz[n] = dz[n] + g if n in dz else g
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(psi.dtype)):
            u = None if delta is None else (delta * m) @ W  # [B, N]
            for n, v in dz.items():
                key = f"{j}/{n}"
                old = ts.filt.get(key)
                ts.filt[key] = v.clone() if old is None else old.mul_(a).add_(v)
            done = set()
            for r, em in compiled:  # update and contraction in one compiled pass
                key = f"{j}/mat/{r}"
                zbar = ts.filt.get(key)
                if zbar is None:
                    zbar = ts.filt[key] = torch.zeros((em.shape[0], em.shape[1], em.shape[3]), dtype=em.dtype)
                G = None
                if u is not None:
                    G = ts.G.get(r)
                    if G is None or not G.is_contiguous() or G.dtype != em.dtype:
                        G = ts.G[r] = (torch.zeros(em.shape[0], em.shape[3], dtype=em.dtype) if G is None
                                       else G.to(em.dtype).contiguous())
                mat_kernel(zbar, psi, em, a, u, G)
                done.add(key)
            if u is not None:
                self._contract(ts, j, u, done)

    def _contract(self, ts: TraceState, j: int, u, done=()) -> None:
        """``G += u . zbar^j`` for every filtered trace of decay group ``j`` (``u [B, N]``) but
        those in ``done``."""
        prefix = f"{j}/"
        for key, zbar in ts.filt.items():
            if not key.startswith(prefix) or key in done:
                continue
            n = key[len(prefix):]
            if n.startswith("mat/"):  # a weight matrix, neuron-major [N, B, H]
                ts.add(n[4:], torch.bmm(u.t().unsqueeze(1), zbar).squeeze(1))  # sum_b u[b, n] zbar[n, b, :]
            else:
                G = (u * zbar).sum(0)
                ts.add(n, G if self.tr.params[n].numel() == G.numel() else G.sum())

    def block(self, ts: TraceState, P: Partials, x_rows, new_rows, gbar, K: int, B: int, partials=None) -> None:
        """A block of ``K`` steps (chunked and parallel modes), before the layer's traces are
        carried to its end: the errors of the block reach the filtered traces carried into it,
        ``G += (alpha_d gbar_0 m_d) W . zbar^d_{t0-1}`` (``gbar [K, B, outputs]`` from
        :func:`reverse_readout_filter`, ``None`` without a loss), then ``zbar^d`` advances to the
        block's end, ``zbar^d_{t1} = alpha_d^K zbar^d_{t0-1} + sum_s alpha_d^(t1-s) dz_s``. The
        errors inside the block reach the layer through its ordinary block contraction with
        ``gbar`` as the readout's error."""
        tr = self.tr
        W = self.readout.weight.detach()
        groups = self.groups(x_rows.dtype)
        if gbar is not None:
            for j, (a, m) in enumerate(groups):
                self._contract(ts, j, ((a * gbar[0]) * m) @ W)
        psi, direct = self.spike_partials(x_rows, new_rows) if partials is None else partials
        psi = psi.reshape(K, B, *psi.shape[1:])
        names, readers = tr.vec_names(P), tr.mat_readers(P)
        for j, (a, m) in enumerate(groups):
            cw = _powers(a, K)
            vec, mat = _weighted_traces(ts, P, names, readers, cw.view(K, 1, 1, 1) * psi)
            sums = {**vec, **{f"mat/{r}": v for r, v in mat.items()}}
            for n, g in direct.items():
                d = (cw.view(K, 1, 1) * g.reshape(K, B, -1)).sum(0)
                sums[n] = sums[n] + d if n in sums else d
            for n, v in sums.items():
                key = f"{j}/{n}"
                old = ts.filt.get(key)
                ts.filt[key] = v if old is None else old * a ** K + v


class LinearOutputFilter(ReadoutFilter):
    """The same sums for a layer whose output map is linear in its input and state (the LRU,
    ``o = Re(C h) + D x``): ``psi`` is then constant, so the layer's traces themselves are filtered,
    ``ebar^d_t = alpha_d ebar^d_{t-1} + eps_t``, and ``G += (d o / d s)^T u^d_t . ebar^d_t``; the
    output map's own parameters get ``d (u^d_t . o(xbar^d_t, sbar^d_t)) / d theta`` with the filtered
    input and state. Memory per distinct decay: one copy of the layer's traces, state and input."""

    def step(self, ts: TraceState, P: Partials, x_in, new, delta, output_errors=None) -> None:
        """One step (as :meth:`ReadoutFilter.step`). ``output_errors(x, s, u)``: ``(d o / d s)^T u``
        ``[B, N, k]`` with the output map's gradients added, when the caller has it in closed form
        (:func:`.spatial.layer_errors`); else autograd."""
        tr = self.tr
        names = tr.vec_names(P)
        readers = tr.mat_readers(P)
        cur = {"x": x_in, **{f"s{f}": v for f, v in enumerate(new)}}
        if names and ts.vec.get(_STACK) is not None:
            cur["vec"] = ts.vec[_STACK]  # [B, N, k, m]
        for base in {b for b, _, _ in readers}:
            if base in ts.mat:
                cur[f"mat/{base}"] = ts.mat[base]  # [N, B, k, H]
        W = self.readout.weight.detach()
        for j, (a, m) in enumerate(self.groups(x_in.dtype)):
            for key, v in cur.items():  # the stored traces are updated in place by the next step: copy
                old = ts.filt.get(f"{j}/{key}")
                ts.filt[f"{j}/{key}"] = v.clone() if old is None else old.mul_(a).add_(v)
            if delta is not None:
                self._contract(ts, j, (delta * m) @ W, names, readers, type(new), len(new), output_errors)

    def _contract(self, ts: TraceState, j: int, u, names, readers, state_type, n_fields, output_errors=None) -> None:
        """``G += (d o / d s)^T u . ebar^j`` and the output map's gradient at the filtered input and
        state of decay group ``j`` (``u [B, layer outputs]``)."""
        tr = self.tr
        bars = {key[len(f"{j}/"):]: v for key, v in ts.filt.items() if key.startswith(f"{j}/")}
        if "x" not in bars:
            return
        sbar = state_type(*(bars[f"s{f}"] for f in range(n_fields)))
        if output_errors is not None:
            gbar, grads = output_errors(bars["x"], sbar, u), ()
        else:
            out_params = {n: p for n, p in tr.cell.named_parameters() if p.requires_grad and n not in tr.traced}
            fields = [f.detach().requires_grad_() for f in sbar]
            with torch.enable_grad():
                o = tr.output(bars["x"], state_type(*fields))
                grads = torch.autograd.grad(o, fields + list(out_params.values()), u, allow_unused=True)
            gbar = torch.stack([g if g is not None else torch.zeros_like(f) for g, f in zip(grads, fields)], -1)
            grads = zip(out_params, grads[len(fields):])
        if "vec" in bars:
            Gv = (gbar.unsqueeze(-1) * bars["vec"]).sum(dim=(0, 2))
            for i, n in enumerate(names):
                ts.add(n, Gv[:, i])
        for base, r, M in readers:
            if f"mat/{base}" in bars:  # [N, B, k, H]: the batch+field reduction is one bmm per neuron
                e = bars[f"mat/{base}"]
                N_, B_, k_, H_ = e.shape
                gn = _mat_contract_g(gbar, M).transpose(0, 1).reshape(N_, 1, B_ * k_)
                ts.add(r, torch.bmm(gn, e.reshape(N_, B_ * k_, H_)).squeeze(1))
        for n, g in grads:
            if g is not None:
                ts.add(n, g)

    def block(self, ts: TraceState, P: Partials, x_rows, new_rows, gbar, K: int, B: int, output_errors=None) -> None:
        """:meth:`ReadoutFilter.block` for the linear output map: the carried-in filtered input,
        state and traces meet the block's errors, then advance to the block's end, each trace
        field by the adjoint of the trace recursion (one reverse filter per field)."""
        tr = self.tr
        names, readers = tr.vec_names(P), tr.mat_readers(P)
        W = self.readout.weight.detach()
        groups = self.groups(x_rows.dtype)
        state_type, n_fields = type(new_rows), len(new_rows)
        if gbar is not None:
            for j, (a, m) in enumerate(groups):
                self._contract(ts, j, ((a * gbar[0]) * m) @ W, names, readers, state_type, n_fields, output_errors)
        k = tr.k
        for j, (a, m) in enumerate(groups):
            cw = _powers(a, K)
            cur = {"x": (cw.view(K, 1, 1) * x_rows.reshape(K, B, -1)).sum(0)}
            for f, v in enumerate(new_rows):
                cur[f"s{f}"] = (cw.view(K, 1, 1) * v.reshape(K, B, -1)).sum(0)
            per_field = []
            for f in range(k):
                w = torch.zeros((K, B, *P.J.shape[2:-1]), dtype=x_rows.dtype, device=x_rows.device)
                w[..., f] = cw.view(K, 1, 1)
                per_field.append(_weighted_traces(ts, P, names, [(b, b, None) for b in {b for b, _, _ in readers}], w))
            if names:
                cur["vec"] = torch.stack([torch.stack([vec[n] for n in names], -1) for vec, _ in per_field], 2)
            for base in {b for b, _, _ in readers}:
                cur[f"mat/{base}"] = torch.stack([mat[base] for _, mat in per_field], 2)
            for key, v in cur.items():
                old = ts.filt.get(f"{j}/{key}")
                ts.filt[f"{j}/{key}"] = v if old is None else old * a ** K + v


neurons.register_backend("readout", "online_readout_filter (the leaky readout's filter of the layer below, "
                         "ReadoutFilter.step/block)", ReadoutFilter.block,
                         test="tests/test_online_readout_filter.py::test_chunked_and_parallel_modes_equal_bptt")
neurons.register_backend("readout", "online_readout_filter (the leaky readout's filter of a linear output map, "
                         "LinearOutputFilter.step/block)", LinearOutputFilter.block,
                         test="tests/test_online_readout_filter.py::test_lru_under_a_leaky_readout_equals_bptt")

"""Eligibility traces of independent recurrent modules: the engine every kind shares. A layer of independent
modules has per neuron ``n`` a state of ``k`` numbers (LIF: ``v``; CUBA: ``(i, v)``; ALIF: ``(v, a)``; LRU: ``(Re
h, Im h)``) and every parameter acts on one neuron, so RTRL is cheap (Zucchet et al. 2023; thesis Zucchet 2025,
Sec. 4.2.2 and 4.3.1)::

    eps^p_t = J_t eps^p_{t-1} + d s_t / d p |immediate      J_t = d s_t[n] / d s_{t-1}[n]   (k x k)
    dL/dp  += sum_t g_t . eps^p_t                           g_t = d l_t / d s_t  (spatial backward)

A kind gives one step's :class:`Partials`; :func:`stream_step` runs the recursion forward (the reference),
:func:`chunk_contract` takes the sums over a block by the adjoint (``gh_t = g_t + J_{t+1}^T gh_{t+1}``,
docs/decisions.md, Online learning 1) and carries the traces with products of the J's (numba on the CPU, Triton
on CUDA). Rules (thesis Sec. 4.4): ``full``/``snap1`` use the recursion; ``trunc1`` sets ``J = 0``; ``spatial``
also keeps only the input parameters.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ... import neurons
from ...kernels import as_numpy
from ...kernels.lif_sequence_numba import surrogate_code
from ...kernels.trace_numba import block_lanes_numba, compiled_cpu, mat_carry_numba
from ...kernels.trace_triton import block_filter, triton_available
from ...neurons.roles import Role, parameters_by_role

__all__ = ["Partials", "BlockPartials", "TraceState", "LayerTrace", "GenericTrace", "advance", "stack_grads",
           "stream_step", "chunk_contract", "lanes_torch", "planar", "acc_add", "acc_mm", "spike_grad"]


def _surrogate_numba():
    """:mod:`spikerec.kernels.surrogate_numba` (imports numba: on first use only)."""
    global _SN
    if _SN is None:
        from ...kernels import surrogate_numba as _SN
    return _SN


_SN = None
_SD_CONSTS: dict = {}  # (code, slope, scale, numpy dtype) -> the compiled form's constants (c1, c2) in that dtype


def spike_grad(g: torch.Tensor, u: torch.Tensor, surrogate, shift: torch.Tensor | None = None) -> torch.Tensor:
    """``g * sigma'(u - shift)``: the error through a spike map ``z = H(u - shift)`` (``shift [N]``, per neuron, or
    ``None``), compiled on the CPU where the surrogate has a compiled form."""
    if compiled_cpu(u) and u.dim() == 2 and g.dtype == u.dtype:
        code, p1, p2 = surrogate_code(surrogate)
        if code:
            surrogate_numba = _surrogate_numba()
            out = torch.empty_like(u)
            o = out.numpy()
            key = (code, p1, p2, o.dtype)
            c = _SD_CONSTS.get(key)
            if c is None:
                c = _SD_CONSTS[key] = tuple(o.dtype.type(v) for v in surrogate_numba.sd_consts(code, p1, p2))
            s = np.zeros(u.shape[1], dtype=o.dtype) if shift is None else as_numpy(shift.to(u.dtype))
            surrogate_numba.scaled_derivative(as_numpy(g), as_numpy(u), s, code, c[0], c[1], o)
            return out
    return g * surrogate.derivative(u if shift is None else u - shift)


def acc_add(sp: dict | None, p, g, alpha: float = 1.0) -> None:
    """``sp[p] += alpha g`` (skipped without ``sp`` or for a parameter that is not trained)."""
    if sp is not None and p.requires_grad:
        sp[p] = sp[p].add_(g, alpha=alpha) if p in sp else g * alpha


def acc_mm(sp: dict | None, p, a, b, alpha: float = 1.0) -> None:
    """``sp[p] += alpha a @ b`` (skipped as :func:`acc_add`)."""
    if sp is not None and p.requires_grad:
        sp[p] = sp[p].addmm_(a, b, alpha=alpha) if p in sp else torch.mm(a, b).mul_(alpha)


@dataclass
class Partials:
    """One step's Jacobian and immediate partials of a layer: ``J [B or 1, N, k, k]`` (``None``: zero), ``vec[name]
    [B, N, k]``, ``mat[name] = (c [B, N, k], pre [B, H])`` (a matrix parameter's immediate partial: ``c (x) pre``)."""

    J: torch.Tensor | None
    vec: dict[str, torch.Tensor] = field(default_factory=dict)
    mat: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass
class BlockPartials:
    """A block's partials, planar (neurons last): ``J [K or 1, B or 1, k*k, N]`` (``None``: zero), ``V [m, K, B, k,
    N]`` of the traced per-neuron parameters ``names``, ``c [K, B, k, N]`` (the immediate coefficient the kind's
    matrix parameters share; ``None``: the unit vector ``e_0``), ``pre[base] [K, B, H]``; ``Cr``: the readers'
    coefficients ``M c`` (:func:`chunk_contract`) where the kind keeps them."""

    J: torch.Tensor | None
    V: torch.Tensor
    names: tuple[str, ...]
    c: torch.Tensor | None
    pre: dict[str, torch.Tensor]
    Cr: torch.Tensor | None = None


def planar(x: torch.Tensor) -> torch.Tensor:
    """``[.., B, N, k]`` as ``[.., B, k, N]`` (the neurons last, as the compiled passes read them)."""
    return x.transpose(-1, -2)


planar_inv = planar  # [.., B, k, N] as [.., B, N, k]: the same transpose


def stack_grads(grads, fields) -> torch.Tensor:
    """The gradients of a state's ``fields`` stacked on a last axis (zeros where ``None``)."""
    return torch.stack([g if g is not None else torch.zeros_like(f) for g, f in zip(grads, fields)], -1)


class LayerTrace:
    """The online form of one cell kind: :meth:`step` (with detached parameters), :meth:`partials`, ``output``
    (live parameters); ``shared``: ``{name: (base, M)}``, a trace ``M @ eps[base]``; ``mask``: gradient masks."""

    kind = "?"
    compiled = False  # set by the learner: the compiled forms may run
    k = 1
    input_params: tuple[str, ...] = ()
    shared: dict[str, tuple[str, torch.Tensor]] = {}

    def __init__(self, cell, rule: str):
        self.cell, self.rule = cell, rule
        self.params = dict(cell.named_parameters())
        traced = [n for n in self.state_params() if self.params.get(n) is not None and self.params[n].requires_grad]
        self.traced = [n for n in traced if n in self.input_params] if rule == "spatial" else traced
        self.mask: dict[str, torch.Tensor] = {}

    def prepare(self) -> None:
        """Forget the constants derived from the parameters (after they change)."""
        self._consts = {}

    def consts(self, dtype) -> dict:
        """:meth:`make_consts` for ``dtype``, made once per parameter version (:meth:`prepare`)."""
        cache = self.__dict__.setdefault("_consts", {})
        out = cache.get(dtype)
        if out is None:
            with torch.no_grad():
                out = cache[dtype] = self.make_consts(dtype)
        return out

    def make_consts(self, dtype) -> dict:
        return {}

    def state_params(self) -> tuple[str, ...]:
        raise NotImplementedError

    def step(self, x_t, prev):
        raise NotImplementedError

    def partials(self, x_t, prev, new) -> Partials:
        raise NotImplementedError

    def block_partials(self, x, prev, new, K: int, B: int) -> BlockPartials:
        """The partials of a block's ``[K*B]`` rows, planar (a kind may give a compiled form)."""
        P = self.partials(x, prev, new)
        kb = lambda v: v.reshape(K, B, *v.shape[1:])  # noqa: E731
        names = tuple(self.vec_names(P))
        ref = kb(P.vec[names[0]] if names else next(iter(P.mat.values()))[0])
        _, _, N, k = ref.shape
        J = P.J
        if J is not None:
            J = planar((kb(J) if J.shape[0] == K * B else J.unsqueeze(0)).flatten(-2)).contiguous()
        V = torch.stack([planar(kb(P.vec[n])) for n in names]) if names else ref.new_zeros((0, K, B, k, N))
        c = planar(kb(next(iter(P.mat.values()))[0]).expand(K, B, N, k)).contiguous() if P.mat else None
        return BlockPartials(J, V, names, c, {b: kb(pre) for b, (_, pre) in P.mat.items()})

    def output(self, x_t, new):
        return self.cell.output(x_t, new)

    def scan_loop(self, x, state, outs: list | None = None):
        """``(prev, last, new)`` of a block ``x [K, B, ..]`` by a loop of :meth:`step` (``prev``, ``new``: ``[K*B]``
        rows); with ``outs``, by the cell's own step, its outputs appended to ``outs``."""
        prevs = []
        for t in range(x.shape[0]):
            prevs.append(state)
            if outs is None:
                state = self.step(x[t], state)
            else:
                out, state = self.cell.step(x[t], state)
                outs.append(out)
        prev = type(state)(*(torch.cat([p[f] for p in prevs]) for f in range(len(state))))
        new = type(state)(*(torch.cat([p[f] for p in prevs[1:]] + [state[f]]) for f in range(len(state))))
        return prev, state, new

    def scan_block(self, x, state):
        return self.scan_loop(x, state)

    def use_J(self) -> bool:
        return self.rule in ("full", "snap1")

    def vec_names(self, P: Partials) -> list[str]:
        return [n for n in P.vec if n in self.traced]

    def mat_readers(self, bases) -> list[tuple[str, str, torch.Tensor | None]]:
        """``(base, reader, M or None)`` for every traced matrix parameter of the matrix ``bases``."""
        out = []
        for base in bases:
            if base in self.traced:
                out.append((base, base, None))
            out += [(base, n, M) for n, (b, M) in self.shared.items() if b == base and n in self.traced]
        return out


class GenericTrace(LayerTrace):
    """A cell without traces, advanced with live parameters from the detached previous state (1-step truncation;
    exact if stateless); under ``spatial`` only its input parameters (role ``INPUT``, else ``depth``) are trained."""

    def __init__(self, cell, rule, stateless: bool):
        self.cell, self.rule, self.params = cell, rule, dict(cell.named_parameters())
        self.traced, self.mask, self.stateless = [], {}, stateless
        self.kind = type(cell).__name__
        self.frozen: set = set()
        if rule == "spatial" and not stateless:
            if callable(getattr(cell, "param_specs", None)) and cell.param_specs():
                keep = {id(p) for _, p in parameters_by_role(cell, Role.INPUT)}
            elif hasattr(cell, "stability_groups"):
                keep = {id(p) for p in cell.stability_groups().get("depth", [])}
            else:
                keep = None
            if keep is not None:
                self.frozen = {id(p) for p in cell.parameters() if id(p) not in keep}


def advance(tr: LayerTrace, x, prev, fresh: bool = False):
    """One step of layer ``tr``: ``(output, new)``; ``fresh``: each field of ``new`` a fresh autograd node
    (its gradient ``d l / d s[f]`` with the other fields held)."""
    if isinstance(tr, GenericTrace):
        return tr.cell.step(x, prev)
    new = tr.step(x, prev)
    if fresh:
        new = type(new)(*(f.view_as(f) if f.requires_grad else f.detach().requires_grad_() for f in new))
    return tr.output(x, new), new


class TraceState:
    """One layer's traces and accumulators: ``ev [m, B, k, N]`` (rows ``names``), ``mat[base] [N, B, k, H]``, ``G``
    (``gv [m, 1, N]``: the compiled pass's float64 sums of ``gv_names``), the readout filter's ``filt``."""

    def __init__(self, tr: LayerTrace):
        self.tr = tr
        self.ev: torch.Tensor | None = None
        self.gv: torch.Tensor | None = None
        self.names: tuple[str, ...] = ()
        self.gv_names: tuple[str, ...] = ()
        self.mat, self.G, self.filt = {}, {}, {}  # dict[str, torch.Tensor] each

    @property
    def vec(self) -> dict[str, torch.Tensor]:
        """The per-neuron traces by name, ``[B, k, N]`` views of :attr:`ev`."""
        return {} if self.ev is None else dict(zip(self.names, self.ev.unbind(0)))

    def clear(self) -> None:
        self.ev, self.names = None, ()
        self.mat.clear()
        self.filt.clear()

    def add(self, name: str, value) -> None:
        """``G[name] += value`` (the fixed mask ``tr.mask`` is applied when read, :meth:`take`)."""
        p = self.tr.params[name]
        value = value.reshape(p.shape).to(p.dtype)
        self.G[name] = self.G[name].add_(value) if name in self.G else value.clone()

    def acc(self, name: str) -> torch.Tensor:
        """``G[name]``, made (zeros) where there is none yet."""
        G = self.G.get(name)
        if G is None:
            p = self.tr.params[name]
            G = self.G[name] = torch.zeros(p.shape, dtype=p.dtype, device=p.device)
        return G

    def vec_acc(self, names: tuple[str, ...], N: int) -> torch.Tensor:
        """:attr:`gv` for the per-neuron parameters ``names`` (another set's sums first moved to ``G``)."""
        if self.gv is None or self.gv_names != names:
            self.fold()
            self.gv, self.gv_names = torch.zeros((len(names), 1, N), dtype=torch.float64), names
        return self.gv

    def fold(self) -> None:
        """Move :attr:`gv` into ``G``."""
        if self.gv is not None:
            for n, v in zip(self.gv_names, self.gv[:, 0]):
                self.add(n, v)
        self.gv, self.gv_names = None, ()

    def take(self) -> dict[str, torch.Tensor]:
        """The accumulated gradients (masked) by name; the accumulators restart."""
        self.fold()
        out = {n: (G * self.tr.mask[n] if n in self.tr.mask else G) for n, G in self.G.items()}
        self.G = {}
        return out


def _mv(J, v):
    """``J @ v`` over the last axis, ``[.., k, k] x [.., k]`` (written out for k = 1, 2)."""
    if J.shape[-1] == 1:
        return J[..., 0] * v
    v0, v1 = v[..., 0], v[..., 1]
    return torch.stack([J[..., 0, 0] * v0 + J[..., 0, 1] * v1, J[..., 1, 0] * v0 + J[..., 1, 1] * v1], -1)


def _mtv(J, v):
    return _mv(J.transpose(-1, -2), v)


def _read(g, M):
    """The error seen by a reader ``M`` of a shared trace: ``M^T g``."""
    return g if M is None else _mtv(M, g)


def stream_step(ts: TraceState, P: Partials, g: torch.Tensor | None) -> None:
    """One step of a layer's traces (``P`` of ``[B]`` rows), adding ``g_t . eps_t`` (``g [B, N, k]`` or ``None``)."""
    tr = ts.tr
    J = P.J if tr.use_J() else None
    names = tr.vec_names(P)
    if names:
        imm = torch.stack([planar(P.vec[n]) for n in names])  # [m, B, k, N]
        e = imm if (J is None or ts.ev is None) else planar(_mv(J, planar_inv(ts.ev))) + imm
        if J is not None:
            ts.ev, ts.names = e, tuple(names)
        if g is not None:
            Gv = (planar(g) * e).sum(dim=(1, 2))  # [m, N]
            for j, n in enumerate(names):
                ts.add(n, Gv[j])
    for base, (c, pre) in P.mat.items():
        readers = [(r, M) for b, r, M in tr.mat_readers(P.mat) if b == base]
        if not readers:
            continue
        if J is None:  # no memory: the immediate partial is the trace
            if g is not None:
                for r, M in readers:
                    ts.add(r, (_read(g, M) * c).sum(-1).t() @ pre)
            continue
        e = ts.mat.get(base)
        if e is None:
            e = ts.mat[base] = torch.zeros((c.shape[1], c.shape[0], c.shape[2], pre.shape[-1]), dtype=c.dtype,
                                           device=c.device)
        # e[n, b] <- J[b, n] e[n, b] + c[b, n] pre[b]; G += sum_{b, f} g[b, n, f] e[n, b, f]
        e.copy_(torch.einsum("bnij,nbjh->nbih", J.expand(c.shape[0], -1, -1, -1), e)
                + (c.unsqueeze(-1) * pre[:, None, None, :]).transpose(0, 1))
        if g is not None:
            for r, M in readers:
                ts.add(r, torch.einsum("bnf,nbfh->nh", _read(g, M), e))


def lanes_torch(J, V, G, c, e_in, use_J: bool, carry: bool, per_lane: bool = False, fused: bool = False, Cr=None,
                need_P: bool = False):
    """The torch form of :func:`spikerec.kernels.trace_numba.block_lanes_numba` (same arguments and results);
    ``fused``: the reverse filter and Jacobian products by :func:`spikerec.kernels.trace_triton.block_filter`."""
    m, K, B, k, N = V.shape
    J = J.expand(K, B, k * k, N)
    Jm = planar_inv(J).unflatten(-1, (k, k))  # [K, B, N, k, k]
    Gi = None if G is None else planar_inv(G)  # [K, B, N, k]
    carry = carry and use_J
    GH = PH = phim = None
    if fused and use_J and (G is not None or carry):
        GH, PH, phim = block_filter(Jm, Gi, carry)
    if Gi is not None and GH is None:
        GH = Gi.clone()
        for t in range(K - 2, -1, -1) if use_J else ():
            GH[t] += _mtv(Jm[t + 1], GH[t + 1])
    out_GH = A = Gv = b0 = P = phi = e_out = None
    if GH is not None:
        out_GH = planar(GH)
        if Cr is not None:
            A = (out_GH.unsqueeze(0) * Cr).sum(3)
        Gv = torch.einsum("tbfn,jtbfn->jbn" if per_lane else "tbfn,jtbfn->jn", out_GH, V).double()
        if use_J:
            b0 = planar(_mtv(Jm[0], GH[0]))
            if e_in is not None:
                Gv = Gv + (b0 * e_in).sum(2 if per_lane else (1, 2)).double()
    if carry:
        if PH is None:  # Phi_t = J_{K-1} ... J_{t+1}
            phim = torch.eye(k, dtype=J.dtype, device=J.device).expand(B, N, k, k)
            PH = torch.empty((K, B, N, k, k), dtype=J.dtype, device=J.device)
            for t in range(K - 1, -1, -1):
                PH[t] = phim
                phim = phim @ Jm[t]
        e_out = planar(torch.einsum("tbnij,mtbnj->mbni", PH, planar_inv(V)))
        if e_in is not None:
            e_out = e_out + planar(_mv(phim, planar_inv(e_in)))
        if need_P:  # Phi_t c_t (c None: the unit vector, the first column)
            P = (PH[..., 0] if c is None else _mv(PH, planar_inv(c))).permute(1, 0, 3, 2)  # [B, K, k, N]
        phi = planar(phim.flatten(-2))
    return out_GH, A, Gv, b0, P, phi, e_out


def _run_lanes(ts: TraceState, bp: BlockPartials, G, carry: bool, per_lane: bool = False, readers=()):
    """The block's per-lane work: :func:`spikerec.kernels.trace_numba.block_lanes_numba`'s ``(GH, A, Gv, b0, P, phi,
    e_out)`` and whether compiled (numpy; else torch); ``A[r] = gh . M c`` of ``readers[r] = (base, reader, M)``."""
    tr = ts.tr
    use_J = tr.use_J()
    K, B, k, N = bp.V.shape[1:]
    J = bp.J if bp.J is not None else bp.V.new_zeros((1, 1, k * k, N))
    Gp = None if G is None else planar(G if G.dtype == bp.V.dtype else G.to(bp.V.dtype)).contiguous()
    e_in = ts.ev if (ts.ev is not None and ts.names == bp.names) else None
    Cr = None
    if readers and G is not None and bp.c is not None:  # M c for each reader, planar
        Cr = bp.Cr if bp.Cr is not None else torch.stack([bp.c if M is None else M.to(bp.c.dtype) @ bp.c
                                                           for _, _, M in readers])
    need_P = carry and bool(bp.pre)
    if tr.compiled and compiled_cpu(J):
        acc = None if (per_lane or Gp is None) else ts.vec_acc(bp.names, N)
        out = block_lanes_numba(J, bp.V, Gp, bp.c, e_in, use_J, carry, per_lane, Cr, need_P, acc)
        return tuple(None if a is None else torch.from_numpy(a) for a in out) + (True,)
    fused = tr.compiled and J.is_cuda and triton_available(J)
    return lanes_torch(J, bp.V, Gp, bp.c, e_in, use_J, carry, per_lane, fused, Cr, need_P) + (False,)


def weighted_sums(ts: TraceState, bp: BlockPartials, w: torch.Tensor, readers=None):
    """Per sample, ``sum_t w_t . eps_t`` over a block (``w [K, B, N, k]``) of every trace of a layer (the traces
    before it from ``ts``; ``readers``: ``(base, reader, M)``): ``({name: [B, N]}, {reader: [N, B, H]})``."""
    readers = ts.tr.mat_readers(bp.pre) if readers is None else readers
    GH, A, Gv, b0, _, _, _, _ = _run_lanes(ts, bp, w, False, per_lane=True, readers=readers)
    vec = {n: Gv[j].to(w.dtype) for j, n in enumerate(bp.names)}
    mat = {}
    for q, (base, r, M) in enumerate(readers):
        a = GH[:, :, 0] if A is None else A[q]  # the reader's error at the matrix parameter, [K, B, N]
        v = torch.bmm(a.permute(1, 2, 0), bp.pre[base].transpose(0, 1)).transpose(0, 1)  # [N, B, H]
        e = ts.mat.get(base)
        if e is not None and b0 is not None:
            v = v + torch.einsum("bnf,nbfh->nbh", _read(planar_inv(b0), M), e)
        mat[r] = v
    return vec, mat


def chunk_contract(ts: TraceState, bp: BlockPartials, G: torch.Tensor | None, carry: bool) -> None:
    """Add ``sum_t g_t . eps_t`` over a block (``G [K, B, N, k]`` or ``None``); ``carry``: traces to its end."""
    tr = ts.tr
    carry = carry and tr.use_J()
    readers = tr.mat_readers(bp.pre)
    if (G is None and not carry) or not (bp.names or readers):
        return
    GH, A, Gv, b0, Pc, phi, e_out, cpu = _run_lanes(ts, bp, G, carry, readers=readers)
    if Gv is not None:
        for j, n in enumerate(bp.names):
            ts.add(n, Gv[j])
    if carry and bp.names:
        ts.ev, ts.names = e_out, bp.names
    for base, pre in bp.pre.items():
        mine = [(q, r, M) for q, (b_, r, M) in enumerate(readers) if b_ == base]
        if not mine:
            continue
        K, B, H = pre.shape
        N, k = bp.V.shape[-1], bp.V.shape[3]
        e = ts.mat.get(base)
        if GH is not None:  # sum_t (gh_t . M c_t)^T pre_t: one GEMM per reader
            for q, r, _ in mine:
                ts.acc(r).addmm_((GH[:, :, 0] if A is None else A[q]).reshape(K * B, N).t(), pre.reshape(K * B, H))
        bbs = [] if (e is None or b0 is None) else [(r, b0 if M is None else M.T.to(b0.dtype) @ b0) for _, r, M in mine]
        Q = None
        if carry and Pc.shape[0] == 1:  # Phi_t c_t the same for every sample: one GEMM, [B, k*N, H]
            Q = (Pc[0].reshape(K, k * N).t() @ pre.reshape(K, B * H)).view(k * N, B, H).transpose(0, 1)
        elif carry:
            Q = torch.bmm(Pc.reshape(B, K, k * N).transpose(1, 2), pre.transpose(0, 1))
        if cpu and e is not None:  # the boundary terms and the carry in one compiled pass over the trace
            e = e if e.is_contiguous() else e.contiguous()
            for j, (r, bb) in enumerate(bbs):
                mat_carry_numba(e, Q if j == len(bbs) - 1 else None, phi, bb, ts.acc(r))
            if carry and not bbs:
                mat_carry_numba(e, Q, phi, None, None)
            if carry:
                ts.mat[base] = e
            continue
        for r, bb in bbs:
            ts.add(r, torch.einsum("bfn,nbfh->nh", bb, e))
        if carry:  # e <- sum_t Phi_t c_t (x) pre_t + phi e
            new = Q.reshape(B, k, N, H).permute(2, 0, 1, 3)
            if e is not None:
                new = new + torch.einsum("bnij,nbjh->nbih", planar_inv(phi).unflatten(-1, (k, k)).expand(B, -1, -1, -1),
                                         e)
            ts.mat[base] = new.contiguous()

for _kind in ("lif", "alif", "lru", "readout"):
    neurons.register_backend(_kind, "online_block (the block contraction, chunk_contract: the compiled per-lane pass and "
                             "the matrix traces' pass)", chunk_contract,
                             test="tests/test_online_partials.py::test_compiled_block_equals_the_derived_recursion")

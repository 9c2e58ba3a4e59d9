"""Eligibility traces of independent recurrent modules (the shared engine).

A layer of independent modules has, per neuron ``n``, a small state ``s_t[n]`` of ``k``
real numbers (LIF: ``v``; CUBA: ``(i, v)``; ALIF: ``(v, a)``; LRU: ``(Re h, Im h)``), and
every parameter acts on one neuron only. Then RTRL (Williams & Zipser 1989) is cheap
(Zucchet et al. 2023; thesis Zucchet 2025, Sec. 4.2.2 and 4.3.1):

    eps^p_t = J_t eps^p_{t-1} + d s_t / d p |immediate          J_t = d s_t[n] / d s_{t-1}[n]  (k x k)
    dL/dp  += sum_t g_t . eps^p_t                                g_t = d l_t / d s_t  (spatial backward at t)

Per-neuron parameters ``p[N]`` keep ``eps[B, N, k]``; matrix parameters ``P[N, H]`` whose
immediate partial factorises as ``c_t[b, n, :] * pre_t[b, h]`` keep ``eps[B, N, k, H]``.

``stream_*`` run these recursions forward (memory independent of T). ``chunk_*`` compute
the *same* sums over a block of K steps with the layer-local reverse filter (the adjoint
of the trace recursion; docs/decisions.md, Online learning 1): ``gh_k = g_k + J_{k+1}^T gh_{k+1}``, then
``sum_t g_t . eps_t = sum_k gh_k . imm_k + (J_{t0}^T gh_{t0}) . eps_{t0-1}``, and carry
``eps_{t1}`` to the next block with products of the J's (no per-step trace is stored).

Rules (thesis Zucchet 2025, Sec. 4.4, the baselines): ``full`` / ``snap1`` use the recursion above (on independent
modules extended SnAp-1 *is* this rule); ``trunc1`` sets ``J = 0`` (traces are the
immediate partials); ``spatial`` also cuts every path through ``s_{t-1}``, so only the
input parameters keep their immediate partials (``lambda``, time constants, thresholds,
lateral weights get no state gradient).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...kernels.trace_numba import compiled_cpu
from ...kernels.trace_triton import block_filter, triton_available
from ...neurons.roles import Role, parameters_by_role

__all__ = ["Partials", "TraceState", "LayerTrace", "GenericTrace", "stream_step", "chunk_contract", "stack_partials", "advance_and_contract"]


@dataclass
class Partials:
    """One step's Jacobian and immediate partials of one layer.

    ``J``: ``[B or 1, N, k, k]`` (``None`` means zero); ``vec[name]``: ``[B, N, k]``;
    ``mat[name] = (c [B, N, k], pre [B, H])``; ``c_zero``: fields in which every ``c`` is known
    to be zero (their input term is skipped).
    """

    J: torch.Tensor | None
    vec: dict[str, torch.Tensor] = field(default_factory=dict)
    mat: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    c_zero: tuple[int, ...] = ()


class LayerTrace:
    """Online form of one cell kind. Subclasses implement :meth:`step` (the state update with
    every parameter detached: gradients reach parameters through the traces only, and the
    layer input through the graph) and :meth:`partials`; ``output`` is the cell's own output
    map with live parameters (their spatial gradient comes from autograd).

    ``shared`` maps a matrix parameter to ``(base, M)`` when its trace is ``M @ eps[base]``
    (the LRU's ``B_im`` trace is ``i * eps[B_re]``); ``M`` must commute with every ``J``.
    ``mask`` maps a matrix parameter to a fixed mask of its gradient.
    """

    kind = "?"
    compiled = False  # set by the learner: the compiled block forms (scan_block, reverse_filter; Triton's block_filter)
    rules = ("full", "spatial", "trunc1", "snap1", "bptt")
    k = 1
    input_params: tuple[str, ...] = ()
    shared: dict[str, tuple[str, torch.Tensor]] = {}

    def __init__(self, cell, rule: str):
        self.cell = cell
        self.rule = rule
        self.params = dict(cell.named_parameters())
        traced = [n for n in self.state_params() if self.params.get(n) is not None and self.params[n].requires_grad]
        if rule == "spatial":
            traced = [n for n in traced if n in self.input_params]
        self.traced = traced
        self.mask: dict[str, torch.Tensor] = {}

    # --- per-sequence constants ------------------------------------------------------------
    def prepare(self) -> None:
        """Forget cached parameter-derived constants (decays, eigenvalues, transposed weights).

        They are derived once from the current parameters and reused at every step; call this
        whenever the parameters may have changed (start of a sequence, after an optimiser step)."""
        self._consts = {}

    def consts(self, dtype) -> dict:
        """The constants of :meth:`make_consts` for ``dtype``, computed on first use."""
        cache = self.__dict__.setdefault("_consts", {})
        out = cache.get(dtype)
        if out is None:
            with torch.no_grad():
                out = self.make_consts(dtype)
            cache[dtype] = out
        return out

    def make_consts(self, dtype) -> dict:
        return {}

    def scratch(self, key, make):
        """Scratch arrays kept by ``key`` (shapes and dtype) across sequences: they hold nothing
        from one block to the next and do not depend on the parameters, so :meth:`prepare`
        keeps them (new arrays at every sequence would also be new pages to fault in)."""
        cache = self.__dict__.setdefault("_scratch", {})
        out = cache.get(key)
        if out is None:
            if len(cache) >= 8:  # a few block and batch sizes
                cache.clear()
            out = cache[key] = make()
        return out

    # --- per kind ---------------------------------------------------------------------------
    def state_params(self) -> tuple[str, ...]:
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, prev):
        raise NotImplementedError

    def partials(self, x_t: torch.Tensor, prev, new) -> Partials:
        raise NotImplementedError

    def output(self, x_t, new):
        return self.cell.output(x_t, new)

    def scan_states(self, x: torch.Tensor, state):
        """States before each of the K steps of ``x [K, B, ...]`` and the final state (no autograd
        needed: the block form only needs the values)."""
        prevs = []
        for t in range(x.shape[0]):
            prevs.append(state)
            state = self.step(x[t], state)
        return prevs, state

    def scan_loop(self, x: torch.Tensor, state, with_new: bool = False, with_out: bool = False):
        """:meth:`scan_states` in the form of a cell's ``scan_block``: the states before each step
        as one state with ``[K*B, ...]`` fields, the final state and, with ``with_new``, the states
        after each step (one :meth:`step` on the block's rows); ``with_out`` adds ``None``."""
        K, B = x.shape[0], x.shape[1]
        prevs, last = self.scan_states(x, state)
        prev = type(state)(*(torch.cat([p[f] for p in prevs]) for f in range(len(state))))
        if not with_new:
            return prev, last
        new = self.step(x.reshape(K * B, *x.shape[2:]), prev)
        return (prev, last, new, None) if with_out else (prev, last, new)

    def block_contract(self, ts, x, prev, new, G, carry: bool, K: int, B: int) -> None:
        """The chunked block's contraction on the block's ``[K*B]`` rows: :func:`chunk_contract`
        of the torch :meth:`partials` (a kind may override it with a compiled form)."""
        chunk_contract(ts, stack_partials(self.partials(x, prev, new), K, B), G, carry)

    # --- helpers ------------------------------------------------------------------------------
    def use_J(self) -> bool:
        return self.rule in ("full", "snap1")

    def vec_names(self, P: Partials):
        return [n for n in P.vec if n in self.traced]

    def mat_readers(self, P: Partials):
        """``(base, reader, M or None)`` for every traced matrix parameter."""
        out = []
        for base in P.mat:
            if base in self.traced:
                out.append((base, base, None))
            for name, (b, M) in self.shared.items():
                if b == base and name in self.traced:
                    out.append((base, name, M))
        return out


class GenericTrace(LayerTrace):
    """A layer without eligibility traces: advanced with live parameters from the detached
    previous state.

    Its parameters get ``d l_t / d theta`` through the instantaneous graph, which for
    recurrent parameters is the immediate partial of 1-step truncation (``trunc1``). Exact for stateless layers (a non-leaky readout), an approximation for
    recurrent ones (a GRU). Under ``spatial`` only the cell's input parameters (role ``INPUT`` in
    its ``param_specs``: input weights and biases; else its ``stability_groups()["depth"]``) keep
    their gradient."""

    def __init__(self, cell, rule, stateless: bool):
        self.cell, self.rule, self.params = cell, rule, dict(cell.named_parameters())
        self.traced, self.mask, self.stateless = [], {}, stateless
        self.kind = type(cell).__name__
        self.frozen: set = set()
        if rule == "spatial" and not stateless:
            specs = cell.param_specs() if callable(getattr(cell, "param_specs", None)) else None
            if specs:  # the input parameters (role INPUT: weights and biases) keep their gradient
                keep = {id(p) for _, p in parameters_by_role(cell, Role.INPUT)}
            elif hasattr(cell, "stability_groups"):
                keep = {id(p) for p in cell.stability_groups().get("depth", [])}
            else:
                keep = None
            if keep is not None:
                self.frozen = {id(p) for p in cell.parameters() if id(p) not in keep}


class TraceState:
    """Traces and gradient accumulators of one layer."""

    def __init__(self, tr: LayerTrace):
        self.tr = tr
        self.vec: dict[str, torch.Tensor] = {}
        self.mat: dict[str, torch.Tensor] = {}
        self.G: dict[str, torch.Tensor] = {}
        self._stacked = None  # (array, its rows): the per-neuron traces as rows of one array
        self.filt: dict[str, torch.Tensor] = {}  # readout-filtered traces ("mat/...": [N, B, ...], else batch-first; :mod:`.readout_filter`)

    def set_carried(self, names, E: torch.Tensor) -> None:
        """Store the traces ``vec[names[j]] = E[j]`` (``E [m, ...]``, written by one compiled
        block) and remember that they are rows of ``E``, so that the next block can take ``E``
        as it is (:meth:`carried`)."""
        rows = E.unbind(0)
        for n, r in zip(names, rows):
            self.vec[n] = r
        self._stacked = (E, rows)

    def carried(self, names):
        """The carried traces of ``names``: the array they are the rows of, in this order, when
        :meth:`set_carried` stored them and none has been replaced since (checked by identity);
        else a list of tensors (``None`` where absent)."""
        st = self._stacked
        if st is not None and len(st[1]) == len(names) and all(self.vec.get(n) is r for n, r in zip(names, st[1])):
            return st[0]
        return [self.vec.get(n) for n in names]

    def add(self, name: str, value: torch.Tensor) -> None:
        """Accumulate into ``G[name]``; the fixed gradient mask (``tr.mask``) is linear, so it is
        applied once when the accumulator is read (:meth:`take`)."""
        p = self.tr.params[name]
        if value.shape != p.shape:
            value = value.reshape(p.shape)
        if value.dtype != p.dtype:
            value = value.to(p.dtype)
        if name in self.G:
            self.G[name] += value
        else:
            self.G[name] = value.clone()

    def take(self) -> dict[str, torch.Tensor]:
        """The accumulated gradients (masked) by parameter name; resets the accumulators."""
        out = {n: (G * self.tr.mask[n] if n in self.tr.mask else G) for n, G in self.G.items()}
        self.G = {}
        return out


def _mv(J, v):
    """``J @ v`` over the last axis: ``[.., k, k] x [.., k]`` (written out for k = 1, 2: far
    cheaper than a batched matmul of tiny matrices)."""
    k = J.shape[-1]
    if k == 1:
        return J[..., 0] * v
    if k == 2:
        v0, v1 = v[..., 0], v[..., 1]
        return torch.stack([J[..., 0, 0] * v0 + J[..., 0, 1] * v1, J[..., 1, 0] * v0 + J[..., 1, 1] * v1], -1)
    return (J @ v.unsqueeze(-1)).squeeze(-1)


def _mv_cols(J, E):
    """``J @ E`` for ``E [.., k, m]`` (m trace columns sharing one Jacobian)."""
    k = J.shape[-1]
    if k == 1:
        return J[..., 0, 0, None, None] * E
    if k == 2:
        e0, e1 = E[..., 0, :], E[..., 1, :]
        J00, J01, J10, J11 = (J[..., i, j, None] for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
        return torch.stack([J00 * e0 + J01 * e1, J10 * e0 + J11 * e1], -2)
    return J @ E


_STACK = "\0stacked"  # key of the stacked per-neuron traces of stream mode in ``TraceState.vec``


def _mtv(J, v):
    """``J^T @ v`` over the last axis."""
    return _mv(J.transpose(-1, -2), v)


def _mat_contract_g(g, M):
    return g if M is None else _mtv(M, g)


def stream_step(ts: TraceState, P: Partials, g: torch.Tensor | None, kernel=None) -> None:
    """Advance the traces of one layer by one step and add ``g_t . eps_t`` to the accumulators.

    ``g``: ``[B, N, k]`` or ``None`` (no loss at this step: traces still advance).
    ``kernel``: optional fused matrix-trace update (see :mod:`spikerec.kernels.trace_triton`).
    """
    tr = ts.tr
    J = P.J if tr.use_J() else None
    names = tr.vec_names(P)
    if J is not None and names:
        # all per-neuron traces of the layer advance together as columns of one [B, N, k, m] tensor
        imm = torch.stack([P.vec[n] for n in names], -1)
        e = ts.vec.get(_STACK)
        e = imm if e is None else _mv_cols(J, e) + imm
        ts.vec[_STACK] = e
        if g is not None:
            Gv = (g.unsqueeze(-1) * e).sum(dim=(0, 2))  # [N, m]
            for j, name in enumerate(names):
                ts.add(name, Gv[:, j])
        names = ()
    for name in names:
        e = P.vec[name]
        if g is not None:
            ts.add(name, (g * e).sum(dim=(0, 2)))
    for base, (c, pre) in P.mat.items():
        readers = [(r, M) for b, r, M in tr.mat_readers(P) if b == base]
        if not readers:
            continue
        if J is None:  # no memory: contract the immediate partial directly
            if g is not None:
                for r, M in readers:
                    a = (_mat_contract_g(g, M) * c).sum(-1)  # [B, N]
                    ts.add(r, a.t() @ pre)
            continue
        e = ts.mat.get(base)
        if e is None:  # neuron-major [N, B, k, H]: the batch+field reduction is one bmm per neuron
            B_, N_, k_ = c.shape
            e = torch.zeros((N_, B_, k_, pre.shape[-1]), dtype=c.dtype, device=c.device)
            ts.mat[base] = e
        gs = [None if g is None else _mat_contract_g(g, M) for _, M in readers]
        outs = kernel(e, J, c, pre, gs) if kernel is not None else advance_and_contract(e, J, c, pre, gs, P.c_zero)
        if g is not None:
            for (r, _), G in zip(readers, outs):
                ts.add(r, G)


def advance_and_contract(e, J, c, pre, gs, c_zero=()):
    """torch path of the matrix trace step, in place on ``e [N, B, k, H]``:
    ``e <- J e + c (x) pre`` and ``G_r = sum_{b,f} g_r[b, n, f] e[n, b, f, h]`` for each ``g_r``.
    ``c_zero``: fields where ``c`` is known to be zero (the input term is skipped there)."""
    N, B, k, H = e.shape
    Jn = J.transpose(0, 1)  # [N, B or 1, k, k]
    cn = c.transpose(0, 1)  # [N, B, k]
    x = pre.unsqueeze(0)  # [1, B, H]
    if k == 1:
        e0 = e[:, :, 0]
        e0.mul_(Jn[..., 0, 0, None])
        e0.addcmul_(cn[..., 0, None], x)
    elif k == 2:
        e0, e1 = e[:, :, 0], e[:, :, 1]
        t0 = e0 * Jn[..., 0, 0, None]
        t0.addcmul_(e1, Jn[..., 0, 1, None])
        if 0 not in c_zero:
            t0.addcmul_(cn[..., 0, None], x)
        e1.mul_(Jn[..., 1, 1, None]).addcmul_(e0, Jn[..., 1, 0, None])
        if 1 not in c_zero:
            e1.addcmul_(cn[..., 1, None], x)
        e0.copy_(t0)
    else:
        e.copy_(torch.einsum("nbij,nbjh->nbih", Jn.expand(N, B, k, k), e) + cn.unsqueeze(-1) * x.unsqueeze(2))
    out = []
    for g in gs:
        if g is None:
            out.append(None)
            continue
        gn = g.transpose(0, 1).reshape(N, 1, B * k)
        out.append(torch.bmm(gn, e.reshape(N, B * k, H)).squeeze(1))
    return out


def stack_partials(P: Partials, K: int, B: int) -> Partials:
    """View the partials of K steps computed in one call on ``[K*B, ...]`` inputs as ``[K, B, ...]``."""
    J = P.J
    if J is not None:
        J = J.reshape(K, B, *J.shape[1:]) if J.shape[0] == K * B else J.unsqueeze(0)
    vec = {n: v.reshape(K, B, *v.shape[1:]) for n, v in P.vec.items()}
    mat = {n: (c.reshape(K, B, *c.shape[1:]), pre.reshape(K, B, *pre.shape[1:])) for n, (c, pre) in P.mat.items()}
    return Partials(J, vec, mat)


def chunk_contract(ts: TraceState, P: Partials, G: torch.Tensor | None, carry: bool) -> None:
    """Add ``sum_t g_t . eps_t`` over a block of K steps with the reverse filter, then (``carry``)
    advance the stored traces to the block's last step.

    ``P``: stacked partials (``J [K, B or 1, N, k, k]`` or ``[1, ...]``, ``vec [K, B, N, k]``,
    ``mat (c [K, B, N, k], pre [K, B, H])``); ``G [K, B, N, k]`` (``None``: no loss in the block).
    """
    tr = ts.tr
    use_J = tr.use_J()
    vnames = tr.vec_names(P)
    readers = tr.mat_readers(P)
    if not vnames and not readers:
        return
    K = (next(iter(P.vec.values())) if P.vec else next(iter(P.mat.values()))[0]).shape[0]
    J = P.J
    Jk = (lambda k: J[k] if J.shape[0] == K else J[0]) if J is not None else None
    ref = next(iter(P.vec.values())) if P.vec else next(iter(P.mat.values()))[0]
    const = J is not None and J.shape[0] == 1 and J.shape[1] == 1  # one Jacobian for every step
    # the Triton form of the reverse filter and the Jacobian products (one launch per block): per-step
    # Jacobians of one or two states per neuron, on a device the compiled CPU kernels do not serve
    fused = (use_J and (G is not None or carry) and getattr(tr, "compiled", False) and J.shape[0] == K
             and J.shape[-1] in (1, 2) and triton_available(ref) and not compiled_cpu(ref))
    PH = phi = None
    if fused:
        GH, PH, phi = block_filter(J, G, carry)
    if G is not None:
        if use_J and not fused:  # reverse filter gh_k = g_k + J_{k+1}^T gh_{k+1}
            rf = getattr(tr, "reverse_filter", None) if getattr(tr, "compiled", False) else None
            GH = reverse_filter(J, G) if rf is None else rf(G)
        elif not use_J:
            GH = G
        if vnames:  # all per-neuron parameters at once: columns of one [K, B, N, k, m] tensor
            V = torch.stack([P.vec[n] for n in vnames], -1)
            Gv = (GH.unsqueeze(-1) * V).sum(dim=(0, 1, 3))  # [N, m]
            for j, name in enumerate(vnames):
                ts.add(name, Gv[:, j])
        for base, r, M in readers:
            c, pre = P.mat[base]
            a = (_mat_contract_g(GH, M) * c).sum(-1)  # [K, B, N]
            ts.add(r, torch.einsum("kbn,kbh->nh", a, pre))
        if use_J:  # boundary term with the traces carried from the previous block
            b0 = _mtv(Jk(0), GH[0])
            for name in vnames:
                e = ts.vec.get(name)
                if e is not None:
                    ts.add(name, (b0 * e).sum(dim=(0, 2)))
            for base, r, M in readers:
                e = ts.mat.get(base)
                if e is not None:
                    ts.add(r, torch.einsum("bnf,nbfh->nh", _mat_contract_g(b0, M), e))
    if not (carry and use_J):
        return
    # eps_{t1} = Phi_{t1,t0-1} eps_{t0-1} + sum_k Phi_{t1,k} imm_k,  Phi_{t1,k} = J_{t1} ... J_{k+1}
    _, Bsz, N, k_ = ref.shape
    if PH is None:
        cache = tr.consts(ref.dtype) if const else {}  # one Jacobian: the powers are per-sequence constants
        PH, phi = cache.get(("powers", K), (None, None))
        if PH is None:
            PH, phi = jacobian_powers(J, K)
            if const:
                cache[("powers", K)] = (PH, phi)
    phi = phi.expand(Bsz, N, k_, k_)
    if vnames:
        if G is None:
            V = torch.stack([P.vec[n] for n in vnames], -1)
        new = _mv_cols(PH, V).sum(0)  # [B, N, k, m]
        for j, name in enumerate(vnames):
            e = ts.vec.get(name)
            ts.vec[name] = new[..., j] if e is None else new[..., j] + _mv(phi, e)
    for base in {b for b, _, _ in readers}:
        c, pre = P.mat[base]
        if PH.shape[1] == 1 and c.stride(1) == 0:  # c and the J's do not depend on the batch (LRU): one GEMM
            Kc, Bc, Nc, kc = c.shape
            pc = _mv(PH[:, 0], c[:, 0]).reshape(Kc, Nc * kc)  # [K, N*k]
            new = (pc.t() @ pre.reshape(Kc, -1)).reshape(Nc, kc, Bc, -1).transpose(1, 2).contiguous()
        else:
            new = torch.einsum("kbnf,kbh->nbfh", _mv(PH, c), pre)
        e = ts.mat.get(base)
        if e is not None:
            new = new + torch.einsum("bnij,nbjh->nbih", phi, e)
        ts.mat[base] = new


def _entries(J, K, k):
    """``J [K or 1, B or 1, N, k, k]`` as ``E[i][j][t]`` (entry ``(i, j)`` of step ``t``'s
    Jacobian, ``[B or 1, N]``): the block loops below then work field by field on small
    tensors, with no tiny batched matmuls or stacks per step."""
    E = [[J[:, :, :, i, j].unbind(0) for j in range(k)] for i in range(k)]
    if J.shape[0] != K:
        E = [[row[0:1] * K for row in Ei] for Ei in E]
    return E


def jacobian_powers(J, K: int):
    """``Phi_t = J_{K-1} ... J_{t+1}`` ``[K, B or 1, N, k, k]`` and ``phi = Phi_0 J_0`` over a block of
    ``K`` steps (``J``: ``[K or 1, B or 1, N, k, k]``)."""
    k_ = J.shape[-1]
    phi = torch.eye(k_, dtype=J.dtype, device=J.device).expand(*J.shape[1:-2], k_, k_)
    PH = torch.empty((K, *phi.shape), dtype=J.dtype, device=J.device)
    for t in range(K - 1, -1, -1):
        PH[t] = phi
        phi = phi @ (J[t] if J.shape[0] == K else J[0])  # becomes Phi_{t-1}
    return PH, phi


def reverse_filter(J, G):
    """``gh_k = g_k + J_{k+1}^T gh_{k+1}`` (``gh_{K-1} = g_{K-1}``) over a block, written into a
    preallocated field-major buffer. ``J``: ``[K or 1, B or 1, N, k, k]``; ``G``: ``[K, B, N, k]``."""
    K, k = G.shape[0], G.shape[-1]
    E = _entries(J, K, k)
    GH = torch.empty((k,) + tuple(G.shape[:-1]), dtype=G.dtype, device=G.device)  # [k, K, B, N]
    GH.copy_(G.movedim(-1, 0))
    out = [GH[i].unbind(0) for i in range(k)]
    for t in range(K - 2, -1, -1):
        for i in range(k):  # gh_t[i] = g_t[i] + sum_j J_{t+1}[j, i] gh_{t+1}[j]
            o = out[i][t]
            for j in range(k):
                o.addcmul_(E[j][i][t + 1], out[j][t + 1])
    return GH.movedim(0, -1)

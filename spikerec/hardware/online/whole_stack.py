"""Whole-stack compiled stream step for LRU, ALIF and plain LIF stacks with a linear or leaky readout
(the stream mode's fastest path).

Per time step, instead of ~40 small torch ops, this path makes one compiled (numba) call per
layer for the forward pass and one per layer for the backward, on numpy views of the learner's
own tensors (states, traces, accumulators), which are bound once and re-bound only when the
learner replaces them (``reset``, ``update``, ``discard``, ``load_state_tensors``, ...):

* forward, LRU (Orvieto et al. 2023, Sec. 3): ``h_t = lam h_{t-1} + gamma B u_t`` (on (Re, Im)
  pairs, ``gamma`` folded into ``B``), ``y_t = C_re Re h_t - C_im Im h_t + D u_t``; linear readout
  ``y = W h + b``; ALIF (:meth:`.traces_lif.ALIFTrace.step`): ``z_{t-1} = H(v_{t-1} - theta_{t-1})``,
  ``a_t = rho a_{t-1} + (1 - rho) z_{t-1}``, ``v_t = alpha v_{t-1} + W x_t + b_in + R z_{t-1}
  - theta_t z_{t-1}``, spikes ``z_t = H(v_t - theta_t)``; plain LIF (:func:`spikerec.neurons.lif.step`):
  ``v_t = alpha v_{t-1} + W x_t + b + R z_{t-1} - thr z_{t-1}`` (or the zero / no reset),
  ``z_t = H(v_t - thr)``; the states are updated in place (the previous state is kept in a
  scratch buffer for the traces); a leaky readout ``y_t = alpha y_{t-1} + W h_t + b``
  (:mod:`spikerec.neurons.readout`);
* the loss gradient ``d l_t / d y_t`` in closed form for the package's own losses (``mse`` and
  ``cross_entropy`` forms, see :func:`.learner.mse_step_loss`; the MSE with the readout's forward
  and backward in one compiled call); other losses use one autograd call on a leaf ``y_t``;
* backward: the hand-written spatial backward of :mod:`.spatial` (readout: ``dW += gy^T h``,
  ``db += sum_b gy``, ``gh = gy W``; LRU: ``g_re = gy C_re``, ``g_im = -gy C_im``,
  ``dC_re += gy^T Re h``, ``dC_im -= gy^T Im h``, ``dD += gy u``,
  ``gu = gy D + (gamma g_re) B_re + (gamma g_im) B_im``; ALIF: ``g_v = gz sigma'(v - theta)``,
  ``g_a = -beta g_v``, ``db -= sum g_v``, ``dbeta -= sum g_v a``, ``gx = g_v W``; LIF: ``g_v = gz
  sigma'(v - thr)``, ``dthr -= sum g_v``, ``gx = g_v W``) and, in the same
  compiled call, the trace step of :func:`spikerec.kernels.lru_online.lru_trace_step_numba` (the RTRL
  recursions of :mod:`.traces_lru`, thesis Zucchet 2025, Sec. 4.3) or of
  :func:`spikerec.kernels.alif_online.alif_trace_step_numba` (:mod:`.traces_lif`) with its contraction
  ``G += g . eps``; a LIF layer's trace step
  (the recursions of :func:`.traces_base.stream_step` on the partials of
  :meth:`.traces_lif.LIFTrace.partials`) runs in its backward call.

Under a leaky readout its parameters learn through their own traces (``_leaky_bwd``: ``e <- alpha e
+ d y_t / d p``, ``G += gy . e``), and the LIF or ALIF layer under it, with the readout-filtered traces
(:mod:`.readout_filter`, Bellec et al. 2020, Methods), passes the error to the layers below but takes
its own gradient from the filtered traces (:meth:`WholeStackStep.filter_step`; its kernels add into
scratch accumulators).

It equals the torch reference (``backend="reference"``) in float64 to rounding
(tests/test_online_whole_stack.py). Used in ``stream`` mode under the ``full``/``snap1`` rules for
CPU float32/float64 tensors with numba installed (an LRU under a filtered leaky readout excepted);
everything else keeps :mod:`.spatial`.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import numpy_dtype
from ...kernels.lif_sequence_numba import surrogate_code
from ...kernels.lif_online import lif_block_mat_numba, lif_block_workspace
from ...kernels.trace_numba import filter_mat_step_numba, mat_trace_step_numba, numba_available
from .spatial import accumulator, spike_partials
from .kinds import compiled_tag
from .traces_base import _STACK, Partials

__all__ = ["whole_stack_supported", "WholeStackStep", "any_nan"]

LIF_DEFER = 64  # steps of the LIF layers' matrix traces applied in closed form at once (WholeStackStep.flush_lif)

try:
    import numba as _nb
except Exception:  # pragma: no cover - optional
    _nb = None

if _nb is not None:
    from ...kernels.alif_online import _alif_bwd, _alif_fwd
    from ...kernels.lif_online import _lif_bwd, _lif_fwd
    from ...kernels.lru_online import _lru_bwd, _lru_fwd
    from ...kernels.readout_online import (_any_nan, _leaky_bwd, _leaky_fwd, _linear_bwd, _linear_fwd, _mse,
                                           _readout_mse)
    from ...kernels.trace_numba import _chunk1


def apply_lif_window(bufs, mats, S: int, use_g: bool) -> None:
    """Apply ``S`` deferred steps of a plain LIF layer's matrix traces at once. With the step
    rows ``J_k``, ``g_k`` (``[B, N]``, ``g`` zero at steps without a loss) and presynaptic rows
    ``pre_k`` (``[B, H]``: the input for ``weight``, the previous spikes for ``recurrent_weight``),
    the per-step recursion ``e_k = J_k e_{k-1} + pre_k``, ``G += g_k . e_k`` sums to

        gh_k = g_k + J_{k+1} gh_{k+1},  Phi_k = J_{S-1} ... J_{k+1},  phi = Phi_0 J_0
        G += gh^T pre + sum_b (J_0 gh_0) e_{-1},   e <- sum_k Phi_k pre_k + phi e_{-1}

    (the chunked block's closed form, :meth:`.traces_lif.LIFTrace.block_contract`): the
    reverse filter and the products in one compiled pass (:func:`spikerec.kernels.trace_numba._chunk1`),
    ``gh^T pre`` as one GEMM, the ``Phi`` sum as one batched product and the rest in one
    compiled pass per trace, in place. ``bufs = (J, g, x, z)``, ``mats`` ``[(pre buffer, trace
    [N, B, 1, H] or None, accumulator or None)]``."""
    Jb, gb = bufs[0][:S], bufs[1][:S]
    _, B, N = Jb.shape
    ws = _window_workspace(max(S, LIF_DEFER), B, N, Jb.dtype)
    w = ws["np"]
    # a shorter window (cut by update, reset, ...) works in the first S rows: no allocation, so the
    # memory of a stream does not depend on where its windows end
    gh, P0, phi, b0 = ws["gh"][:S], ws["P0"][:, :S], ws["phi"], ws["b0"]
    _chunk1(Jb.numpy(), w["V"][:, :S], gb.numpy() if use_g else w["gh"][:S], use_g, ws["z3"], False, True,
            w["gh"][:S], ws["Gv"], ws["z3"], w["P0"][:, :S], w["phi"], w["b0"], ws["no_ones"])
    for pre_buf, e, G in mats:
        if e is None:
            continue
        pre = pre_buf[:S]
        H = pre.shape[-1]
        if use_g:
            G.addmm_(gh.view(S * B, N).t(), pre.reshape(S * B, H))
        q = torch.bmm(P0.transpose(1, 2), pre.transpose(0, 1))  # [B, N, H]: sum_k Phi_k pre_k
        lif_block_mat_numba(e, True, b0 if use_g else None, G, True, q, phi, ws)


def _window_workspace(S: int, B: int, N: int, dtype) -> dict:
    """The scratch arrays of :func:`apply_lif_window` for windows of up to ``S`` steps: a
    :func:`spikerec.kernels.lif_online.lif_block_workspace` without per-neuron columns, kept per shape."""
    key = (S, B, N, dtype)
    ws = _LIF_WS.get(key)
    if ws is None:
        if len(_LIF_WS) > 16:  # one per layer width, batch size and dtype: keep few
            _LIF_WS.clear()
        ws = _LIF_WS[key] = lif_block_workspace(S, B, N, 0, dtype)
    return ws


_LIF_WS: dict = {}  # scratch arrays of apply_lif_window by window shape and dtype


def any_nan(x: torch.Tensor) -> bool | None:
    """Whether the CPU float32/float64 2-d tensor ``x`` holds a NaN, by one compiled pass;
    ``None`` where this check does not apply (no numba, another dtype, layout or device)."""
    if (_nb is None or x.dim() != 2 or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64)
            or not x.is_contiguous()):
        return None
    return bool(_any_nan(x.detach().numpy()))


def whole_stack_supported(learner, dtype, device) -> bool:
    """Whether the whole-stack path applies: every layer but the last an LRU, an ALIF layer
    (:func:`_alif_ok`) or a plain LIF layer with its compiled trace step ready, the last a linear
    or leaky readout (with readout-filtered traces: a LIF or ALIF layer under it), no active
    dropout, ``full``/``snap1``."""
    if _nb is None or learner.kernel is None or not numba_available() or learner.mode != "stream":
        return False
    if learner.rule not in ("full", "snap1") or torch.device(device).type != "cpu":
        return False
    if dtype not in (torch.float32, torch.float64):
        return False
    drop = getattr(learner.model, "dropout", None)
    if drop is not None and drop.training:
        return False
    trs = learner.tracers
    if len(trs) < 2 or compiled_tag(trs[-1]) not in ("readout", "leaky_readout"):
        return False
    if trs[-1].cell.weight.dtype != dtype:
        return False
    if getattr(learner, "_filter", None) is not None and compiled_tag(trs[-2]) not in ("lif", "alif"):
        return False  # the LRU's filtered traces (LinearOutputFilter) keep the per-layer step
    return all(tr.traced and (compiled_tag(tr) in ("lru", "lif") or _alif_ok(tr)) and tr.compiled_trace_ready(dtype, device)
               for tr in trs[:-1])


def _alif_ok(tr) -> bool:
    """An ALIF layer the compiled step runs: a surrogate with an inline formula (fast sigmoid,
    arc-tangent)."""
    return compiled_tag(tr) == "alif" and surrogate_code(tr.cell.surrogate)[0] != 0


def _np(t):
    return t.detach().numpy()


def _spiking_traces(tr, ts, names, B, N, H, k, dt):
    """A spiking layer's stacked per-neuron traces ``[B, N, k, m]`` and its input and lateral
    matrix traces ``[N, B, k, H or N]`` (``None`` where not traced), created as zeros where the
    stream has none yet."""
    ev = ts.vec.get(_STACK)
    if ev is None:
        ev = torch.zeros((B, N, k, len(names)), dtype=dt)
        if names:
            ts.vec[_STACK] = ev
    mats = []
    for name, width in (("weight", H), ("recurrent_weight", N)):
        e = None
        if name in tr.traced:
            e = ts.mat.get(name)
            if e is None:
                e = ts.mat[name] = torch.zeros((N, B, k, width), dtype=dt)
        mats.append(e)
    return ev, mats


class WholeStackStep:
    """Bound numpy views of one learner's tensors and the per-step driver."""

    def __init__(self, learner, dtype):
        self.learner, self.dtype = learner, dtype
        self.np_dtype = numpy_dtype(dtype)  # the loss value's (a 0-d array)
        self.gen = None
        self.gy = None  # the loss gradient buffer of the compiled MSE
        self.lmats = []  # per LIF layer with matrix traces: (step buffers, [(pre buffer, trace, accumulator)])
        self.lbufs = {}  # their step buffers by layer (J, g, x, z [LIF_DEFER, B, .]); kept across rebinds
        self.lfill = 0  # LIF steps deferred since the last closed-form pass (flush_lif)
        self.lslot = np.zeros(1, np.int64)  # lfill as the LIF backward calls read it (their buffers' row)
        self.lany = False  # whether one of them had a loss
        self.restore_lif = None  # deferred LIF steps from a checkpoint, copied in at the next bind

    # --- the deferred matrix-trace steps of the LIF layers ---------------------------------------
    def flush_lif(self) -> None:
        """Apply the ``lfill`` deferred steps of the LIF layers' matrix traces in closed form
        (:func:`apply_lif_window`: two GEMMs and one compiled pass per trace instead of a pass
        over the trace per step). The sum is the per-step recursion's, rounded in another
        order; the windows fall on the same steps in a run resumed from a checkpoint (the
        buffers are saved, :meth:`saved_lif`), so the results are the same bits."""
        S = self.lfill
        if not S:
            return
        for bufs, mats in self.lmats:
            apply_lif_window(bufs, mats, S, self.lany)
        self.lfill = 0
        self.lany = False

    def saved_lif(self) -> tuple[list, bool]:
        """The deferred LIF steps not yet applied: per LIF layer with matrix traces, copies of
        its ``(J, g, x, z)`` step rows (``x``, ``z`` empty where not traced), and whether one of
        the steps had a loss."""
        S = self.lfill
        return [tuple(b[:S].clone() for b in bufs) for bufs, _ in self.lmats], self.lany

    # --- binding ------------------------------------------------------------------------------
    def _bind_lru(self, l, tr, B, dummy1, dummy2):
        """An LRU layer's compiled calls: ``(fwd, fwd args + output, bwd, bwd args, index of the
        input error in the bwd args, tensors kept alive)``."""
        lr_, dt, states = self.learner, self.dtype, self.learner.states
        c, ts = tr.cell, lr_.traces[l]
        k = tr.consts(dt)
        cols, names, wnu, wth, lam, gam = tr.compiled_trace_setup(dt)
        N = k["N"]
        H = c.B_re.shape[1]
        ev = ts.vec.get(_STACK)
        if ev is None:
            ev = torch.zeros((B, N, 2, len(names)), dtype=dt)
            if names:
                ts.vec[_STACK] = ev
        mat = "B_re" in tr.traced or "B_im" in tr.traced
        em = ts.mat.get("B_re") if mat else None
        if mat and em is None:
            em = ts.mat["B_re"] = torch.zeros((N, B, 2, H), dtype=dt)
        G = {}
        for name in names + [n for n in ("B_re", "B_im") if n in tr.traced]:
            a = ts.G.get(name)
            if a is None or not a.is_contiguous():
                a = ts.G[name] = (torch.zeros_like(tr.params[name], memory_format=torch.contiguous_format)
                                  if a is None else a.contiguous())
            G[name] = a
        Bg = k["Bt_gamma"]
        D = c.D.detach().to(dt)
        dvec = D.dim() == 1
        Dm = D.reshape(-1, 1) if dvec else D
        accs = [self._acc(c.C_re), self._acc(c.C_im), self._acc(c.D)]
        st = states[l]
        pr, pi = torch.empty_like(st.x_re), torch.empty_like(st.x_im)
        dD = accs[2]
        C_re, C_im = c.C_re.detach().to(dt), c.C_im.detach().to(dt)
        B_re, B_im = c.B_re.detach().to(dt), c.B_im.detach().to(dt)
        # the stacked operands of the step's GEMMs (a full D rides along; a diagonal one is elementwise)
        Cs = torch.cat([C_re.t(), -C_im.t()] + ([] if dvec else [Dm.t()])).contiguous()  # [2N (+H), K]
        Cst = torch.cat([C_re, -C_im], 1).contiguous()  # [K, 2N]
        Bs = torch.cat([B_re, B_im] + ([] if dvec else [Dm])).contiguous()  # [2N (+K), H]
        w = torch.empty((B, 2 * N), dtype=dt)
        hu = torch.empty((B, Cs.shape[0]), dtype=dt)
        tbuf = torch.empty((B, 2 * N), dtype=dt)
        abuf = torch.empty((B, Bs.shape[0]), dtype=dt)
        gbuf = torch.zeros((B, N, 2), dtype=dt)
        gu = torch.zeros((B, H), dtype=dt)
        y = torch.empty((B, c.C_re.shape[0]), dtype=dt)
        keep = (st, pr, pi, Bg, Dm, ev, em, G, accs, wnu, wth, lam, gam, Cs, Cst, Bs, w, hu, tbuf, abuf,
                gbuf)  # noqa: F841 (the numpy views below)
        Dn = Dm.contiguous().numpy()
        fargs = (_np(st.x_re), _np(st.x_im), pr.numpy(), pi.numpy(), _np(lam[0]), _np(lam[1]), Bg.numpy(),
                 Cs.numpy(), Dn, dvec, w.numpy(), hu.numpy(), y.numpy())
        Gv = [G.get(n) for n in ("nu_log", "theta_log", "gamma_log")]
        bargs = (fargs[0], fargs[1], fargs[2], fargs[3], Cst.numpy(), Dn, dvec, Bs.numpy(), _np(gam), _np(lam[0]),
                 _np(lam[1]), dummy2 if dD is None else dD.view(-1, 1).numpy() if dvec else dD.numpy(),
                 dD is not None, tbuf.numpy(), abuf.numpy(), gbuf.numpy(), gu.numpy(), l > 0,
                 dummy2 if wnu is None else wnu.numpy(), dummy2 if wth is None else wth.numpy(), cols, ev.numpy(),
                 em.numpy() if mat else ev[:1, :1, :1, :1].numpy(), mat,
                 dummy1 if Gv[0] is None else Gv[0].numpy(), dummy1 if Gv[1] is None else Gv[1].numpy(),
                 dummy1 if Gv[2] is None else Gv[2].numpy(),
                 dummy2 if "B_re" not in G else G["B_re"].numpy(), dummy2 if "B_im" not in G else G["B_im"].numpy(),
                 "B_re" in G, "B_im" in G, dummy2 if accs[0] is None else accs[0].numpy(), accs[0] is not None,
                 dummy2 if accs[1] is None else accs[1].numpy(), accs[1] is not None)
        return _lru_fwd, fargs, _lru_bwd, bargs, 16, (keep, y, gu)

    def _bind_alif(self, l, tr, B, dummy1, dummy2):
        """An ALIF layer's compiled calls (as :meth:`_bind_lru`): the step of
        :meth:`.traces_lif.ALIFTrace.step`, the spatial backward of its spikes and its trace step."""
        lr_, dt = self.learner, self.dtype
        c, k, cols, cn, Rd, N, H, ev, mats, Gv, Gw, Gr = self._spiking_layer(l, tr, B, 2)
        vec = lambda t: t.detach().to(dt).expand(N).contiguous()  # noqa: E731
        alpha, rho, omr, bb, beta = (vec(k[n]) for n in ("alpha_s", "rho_s", "one_m_rho_s", "b", "beta"))
        Wt = k["Wt"].contiguous()
        bias = k["bias"].contiguous() if k["bias"] is not None else torch.zeros(1, dtype=dt)
        Rt = k["Rt"].contiguous() if k["Rt"] is not None else torch.zeros((1, 1), dtype=dt)
        W = c.weight.detach().to(dt).contiguous()
        sur, p1, p2 = surrogate_code(c.surrogate)
        st = lr_.states[l]
        pv, pa, zp, psi, z, cur, gp = (torch.empty_like(st.v) for _ in range(7))
        acc_b, acc_beta = (None, None) if l == self.skip else (self._acc(c.b), self._acc(c.beta))
        g = torch.zeros((B, N, 2), dtype=dt)
        gin = torch.zeros((B, H), dtype=dt)
        dummy4 = ev[:1, :1, :1, :1] if ev.numel() else torch.zeros((1, 1, 1, 1), dtype=dt)
        fargs = (_np(st.v), _np(st.a), pv.numpy(), pa.numpy(), zp.numpy(), psi.numpy(), Wt.numpy(), bias.numpy(),
                 k["bias"] is not None, Rt.numpy(), k["Rt"] is not None, alpha.numpy(), rho.numpy(), omr.numpy(),
                 bb.numpy(), beta.numpy(), sur, p1, p2, cur.numpy(), z.numpy())
        bargs = (fargs[0], fargs[1], bb.numpy(), beta.numpy(), sur, p1, p2, W.numpy(),
                 dummy1 if acc_b is None else acc_b.numpy(), dummy1 if acc_beta is None else acc_beta.numpy(),
                 acc_b is not None, acc_beta is not None, gp.numpy(), g.numpy(), gin.numpy(), l > 0,
                 pv.numpy(), pa.numpy(), psi.numpy(), zp.numpy(), cn.numpy(), cols, ev.numpy(),
                 dummy4.numpy() if mats[0] is None else mats[0].numpy(),
                 dummy4.numpy() if mats[1] is None else mats[1].numpy(), mats[0] is not None, mats[1] is not None,
                 Gv.numpy(), dummy2 if Gw is None else Gw.numpy(), dummy2 if Gr is None else Gr.numpy(),
                 dummy1 if Rd is None else Rd.numpy(), Rd is not None, bool(c.detach_reset))
        keep = (st, pv, pa, zp, psi, z, cur, gp, Wt, bias, Rt, W, alpha, rho, omr, bb, beta, g, gin, ev, mats, Gv, Gw, Gr,
                acc_b, acc_beta, cn, Rd, dummy4)
        return _alif_fwd, fargs, _alif_bwd, bargs, 14, keep

    def _bind_lif(self, l, tr, B, dummy1, dummy2):
        """A plain LIF layer's compiled calls (as :meth:`_bind_lru`): the step of
        :func:`spikerec.neurons.lif.step`, the spatial backward of its spikes and its trace step."""
        from ...kernels.lif_sequence_numba import RESET_CODES

        lr_, dt = self.learner, self.dtype
        c, k, cols, cn, Rd, N, H, ev, mats, Gv, Gw, Gr = self._spiking_layer(l, tr, B, 1)
        alpha = k["alpha"].to(dt).expand(N).contiguous()
        thr = k["thr"].to(dt).expand(N).contiguous()
        Wt = k["Wt"].contiguous()
        bias = k["bias"].contiguous() if k["bias"] is not None else torch.zeros(1, dtype=dt)
        Rt = k["w_rec"].t().contiguous() if k["w_rec"] is not None else torch.zeros((1, 1), dtype=dt)
        W = c.weight.detach().to(dt).contiguous()
        sur, p1, p2 = surrogate_code(c.surrogate)
        st = lr_.states[l]
        pv, zp, psi, z, cur, gp = (torch.empty_like(st.v) for _ in range(6))
        co = torch.empty((5, N), dtype=dt)  # the partials' per-neuron coefficients (scratch of _lif_bwd)
        acc_thr = None if l == self.skip else self._acc(c.threshold)
        gin = torch.zeros((B, H), dtype=dt)
        mode = RESET_CODES[c.reset]
        has_w, has_r = mats[0] is not None, mats[1] is not None
        lb = self.lbufs.get(l)  # the deferred steps' J, g and presynaptic rows; kept across rebinds
        D = LIF_DEFER if (has_w or has_r) else 1
        shapes = ((D, B, N), (D, B, N), (D if has_w else 0, B, H), (D if has_r else 0, B, N))
        if lb is None or tuple(t.shape for t in lb) != shapes or lb[0].dtype != dt:
            lb = self.lbufs[l] = tuple(torch.zeros(sh, dtype=dt) for sh in shapes)
        if has_w or has_r:  # the layer under a readout filter advances its traces at every step (filter_step)
            (self.lstep if l == self.skip else self.lmats).append((lb, [(lb[2], mats[0], Gw), (lb[3], mats[1], Gr)]))
        fargs = (_np(st.v), pv.numpy(), zp.numpy(), psi.numpy(), Wt.numpy(), bias.numpy(), k["bias"] is not None,
                 Rt.numpy(), k["w_rec"] is not None, alpha.numpy(), thr.numpy(), mode, sur, p1, p2, cur.numpy(),
                 z.numpy())
        bargs = (fargs[0], thr.numpy(), sur, p1, p2, W.numpy(), dummy1 if acc_thr is None else acc_thr.numpy(),
                 acc_thr is not None, gp.numpy(), gin.numpy(), l > 0, pv.numpy(), psi.numpy(), zp.numpy(),
                 cn.numpy(), cols, ev.numpy(), has_w, has_r, Gv.numpy(),
                 dummy1 if Rd is None else Rd.numpy(), Rd is not None, mode, bool(c.detach_reset),
                 *(t.numpy() for t in lb), co.numpy(), self.lslot)
        keep = (st, pv, zp, psi, z, cur, gp, Wt, bias, Rt, W, alpha, thr, gin, ev, mats, Gv, Gw, Gr, acc_thr, cn,
                Rd, lb, co)
        return _lif_fwd, fargs, _lif_bwd, bargs, 9, keep

    def _spiking_layer(self, l, tr, B, fields):
        """What the ALIF and LIF bindings share: the cell, its constants, its compiled trace step's
        setup ``(cols, cn, Rd)``, its sizes, its traces (created where the stream has none) and
        its accumulators."""
        c, ts, dt = tr.cell, self.learner.traces[l], self.dtype
        names, cols, cn, Rd = tr.compiled_trace_setup(dt)
        N, H = c.hidden_size, c.input_size
        ev, mats = _spiking_traces(tr, ts, names, B, N, H, fields, dt)
        return (c, tr.consts(dt), cols, cn, Rd, N, H, ev, mats, *self._layer_accumulators(l, tr, ts, names, N))

    def _layer_accumulators(self, l, tr, ts, names, N):
        """A spiking layer's trace accumulators: the learner's (rows of ``ts.G``), or for the layer
        under a readout filter scratch ones that nothing reads (its gradient comes through the
        filtered traces, :meth:`filter_step`; its kernels still pass the error to the layer below)."""
        if l != self.skip:
            return tr._accumulators(ts, names, True, self.dtype, N)
        scratch = lambda n: (torch.zeros_like(tr.params[n], dtype=self.dtype, memory_format=torch.contiguous_format)  # noqa: E731
                             if n in tr.traced else None)
        return tr._accumulators(ts, names, False, self.dtype, N)[0], scratch("weight"), scratch("recurrent_weight")

    def _acc(self, p):
        """The spatial accumulator of ``p`` (created as zeros), or ``None`` if ``p`` is not trained."""
        return accumulator(self.learner.spatial, p)

    def _bind_leaky(self, trr, W, bias, has_b, B, Hin):
        """The leaky readout's compiled calls: its step, and its traces with their contraction
        (:func:`spikerec.kernels.readout_online._leaky_bwd`) on the learner's traces and accumulators."""
        dt, ts = self.dtype, self.learner.traces[-1]
        k = trr.consts(dt)
        K = W.shape[0]
        row = lambda t: t.detach().to(dt).expand(K).contiguous()  # noqa: E731
        alpha_s, alpha, dalpha = row(k["alpha_s"]), row(k["alpha"]), row(k["dalpha"])
        names = [n for n in trr._VEC_ORDER if n in trr.traced]  # the order of ReadoutTrace.partials and _leaky_bwd's rows
        ev = ts.vec.get(_STACK)
        if ev is None or not ev.is_contiguous():
            ev = torch.zeros((B, K, 1, len(names)), dtype=dt) if ev is None else ev.contiguous()
            if names:
                ts.vec[_STACK] = ev
        has_w = "weight" in trr.traced
        em = ts.mat.get("weight") if has_w else None
        if has_w and (em is None or not em.is_contiguous()):
            em = ts.mat["weight"] = torch.zeros((K, B, 1, Hin), dtype=dt) if em is None else em.contiguous()
        Gv, GW, _ = trr._accumulators(ts, names, True, dt, K)
        y0 = torch.empty((B, K), dtype=dt)
        col = lambda n: names.index(n) if n in names else -1  # noqa: E731
        em_np = em.numpy() if has_w else np.zeros((1, 1, 1, 1), dtype=numpy_dtype(dt))
        GW_np = GW.numpy() if GW is not None else np.zeros((1, 1), dtype=numpy_dtype(dt))
        self.keep = (W, bias, alpha_s, alpha, dalpha, ev, em, Gv, GW, y0)  # the tensors behind the numpy views
        self.ro_args = (W.numpy(), bias.numpy(), has_b, alpha_s.numpy())
        self.y0_np = y0.numpy()
        self.ro_bwd = (W.numpy(), alpha.numpy(), dalpha.numpy(), self.y0_np, ev.numpy(), col("log_tau"), col("bias"),
                       em_np, has_w, Gv.numpy(), GW_np)

    def filter_step(self, gy) -> None:
        """The readout-filtered traces of the layer under the leaky readout (:mod:`.readout_filter`),
        after its traces have advanced: ``zbar <- alpha zbar + d z_t / d p`` and, with the readout's
        error ``gy [B, K]``, ``G += (gy m_d) W . zbar^d``; the spike map's partials by the hand-written
        spatial backward (:func:`.spatial.spike_partials`), each weight matrix's part in one compiled
        pass (:func:`spikerec.kernels.trace_numba.filter_mat_step_numba`)."""
        lr_, l = self.learner, self.skip
        r = int(self.lslot[0])
        for bufs, mats in self.lstep:  # a LIF layer's matrix traces: e <- J e + pre with this step's row
            J = bufs[0][r][..., None, None]
            for pre_buf, e, _ in mats:
                if e is not None:
                    mat_trace_step_numba(e, J, self.ones_lif(J), pre_buf[r], [None])
        tr = lr_.tracers[l]
        new = lr_.states[l]
        keys = self.filter_keys
        if keys is None:  # which traces the layer has: the keys of its partials, once per binding
            one = type(new)(*(f[:1] for f in new))
            P = tr.partials(torch.zeros((1, tr.cell.input_size), dtype=self.dtype), one, one)
            keys = self.filter_keys = Partials(None, dict.fromkeys(P.vec), dict.fromkeys(P.mat))
        partials = spike_partials(lr_, l, compiled_tag(tr), (None, None, new, None))
        with torch.enable_grad():
            # (the trace states as stored: the traces property would apply the other layers' deferred steps)
            lr_._filter.step(lr_._trace_states[l], keys, None, new, gy, partials=partials,
                             mat_kernel=filter_mat_step_numba)

    def ones_lif(self, J):
        """``c = 1`` ``[B, N, 1]``: the immediate partial of a LIF layer's weights (kept per binding)."""
        c = self.__dict__.get("_ones")
        if c is None or c.shape != J.shape[:-1] or c.dtype != J.dtype:
            c = self._ones = torch.ones(J.shape[:-1], dtype=J.dtype)
        return c

    def bind(self):
        lr_ = self.learner
        dt = self.dtype
        self.flush_lif()  # into the traces bound so far
        restore_lif, self.restore_lif = self.restore_lif, None  # taken first: binding reads the traces
        self.lmats = []
        self.lstep = []  # the LIF layer under a readout filter: its buffered row applied at every step
        self.layers = self.fwd_args = self.bwd_args = None  # the old bindings' buffers go first
        states = lr_.states
        B = states[0][0].shape[0]
        for l, s in enumerate(states):  # own contiguous tensors, updated in place
            states[l] = type(s)(*(f.detach().to(dt).clone(memory_format=torch.contiguous_format) for f in s))
        dummy2 = np.zeros((1, 1), dtype=np.float64 if dt == torch.float64 else np.float32)
        dummy1 = dummy2[0]
        self.skip = len(lr_.tracers) - 2 if lr_._filter is not None else None  # the layer under the filter
        self.layers = []
        for l, tr in enumerate(lr_.tracers[:-1]):
            bind_layer = {"lru": self._bind_lru, "alif": self._bind_alif, "lif": self._bind_lif}[compiled_tag(tr)]
            self.layers.append(bind_layer(l, tr, B, dummy1, dummy2))
        trr = lr_.tracers[-1]
        ro = trr.cell
        W = ro.weight.detach().to(dt).contiguous()
        has_b = ro.bias is not None
        bias = ro.bias.detach().to(dt).contiguous() if has_b else torch.zeros(1, dtype=dt)
        Hin = W.shape[1]
        self.leaky = compiled_tag(trr) == "leaky_readout"
        if self.leaky:  # its parameters learn through their traces (ReadoutTrace), not spatially
            self._bind_leaky(trr, W, bias, has_b, B, Hin)
        else:
            dW, db = self._acc(ro.weight), (self._acc(ro.bias) if has_b else None)
            self.keep = (W, bias, dW, db)  # the tensors behind the numpy views
            self.ro_args = (W.numpy(), bias.numpy(), has_b)
            self.ro_bwd = (W.numpy(), dummy2 if dW is None else dW.numpy(), dummy1 if db is None else db.numpy(),
                           dW is not None, db is not None)
        self.ystate = states[-1]
        self.fwd_args = [(f, fa) for f, fa, _, _, _, _ in self.layers]
        self.bwd_args = [(f, ba, gi) for _, _, f, ba, gi, _ in self.layers]
        self.yout_np = self.ystate[0].numpy()
        self.gh = torch.empty((B, Hin), dtype=dt)  # the error at the readout's input
        self.gh_np = self.gh.numpy()
        if self.gy is None or self.gy.shape != self.ystate[0].shape:
            self.gy = torch.empty_like(self.ystate[0])
        self.filter_keys = None
        self.gen = lr_._gen
        if restore_lif is not None:  # deferred LIF steps of a checkpoint (saved_lif), not yet applied
            saved, any_g = restore_lif
            if len(saved) != len(self.lmats):
                raise ValueError(f"OnlineLearner checkpoint: {len(saved)} deferred LIF trace buffers, this "
                                 f"stack has {len(self.lmats)}")
            for (bufs, _), got in zip(self.lmats, saved):
                for buf, t in zip(bufs, got):
                    if buf.shape[1:] != t.shape[1:] or t.shape[0] > LIF_DEFER:
                        raise ValueError(f"OnlineLearner checkpoint: deferred LIF steps of shape {tuple(t.shape)}, "
                                         f"this stack's are [{LIF_DEFER}, {', '.join(map(str, buf.shape[1:]))}]")
                    buf[: t.shape[0]].copy_(t)
                self.lfill = got[0].shape[0]
            self.lany = bool(any_g)

    # --- one step -------------------------------------------------------------------------------
    def step(self, x_t, closure, value_and_grad=None, mse_target=None, check_nan=False):
        """Forward, loss gradient, spatial backward and trace step of every layer; returns
        ``(y_t, loss_t)`` (``loss_t`` ``None`` without a loss). ``mse_target`` (a contiguous
        tensor of the stack's dtype): the loss is ``mse_step_loss(y_t, mse_target)``, computed
        with its gradient in one compiled call. ``check_nan``: raise for NaN in ``x_t`` (before
        any state changes)."""
        if self.gen != self.learner._gen:
            self.bind()
        x = x_t if x_t.is_contiguous() and x_t.dtype == self.dtype else x_t.contiguous().to(self.dtype)
        u = x.numpy()
        if check_nan and _any_nan(u):  # before any state changes
            raise ValueError(f"OnlineLearner.step (step {self.learner.steps}) x_t: contains NaN values")
        ins = []
        for f, fa in self.fwd_args:
            ins.append(u)
            f(u, *fa)
            u = fa[-1]
        if mse_target is not None and not self.leaky:  # readout, loss, loss gradient and its backward in one call
            loss = torch.scalar_tensor(_readout_mse(u, *self.ro_args, self.yout_np, mse_target.numpy(), self.gy.numpy(),
                                                    *self.ro_bwd[1:], self.gh_np), dtype=self.dtype)
            y_t = self.ystate[0].clone()
            gcur = self.gh_np
            self.lslot[0] = self.lfill
            for l in range(len(self.layers) - 1, -1, -1):
                f, ba, gi = self.bwd_args[l]
                f(gcur, True, ins[l], *ba)
                gcur = ba[gi]
            self._lif_written(True)
            return y_t, loss
        if self.leaky:
            _leaky_fwd(u, *self.ro_args, self.yout_np, self.y0_np)
        else:
            _linear_fwd(u, *self.ro_args, self.yout_np)
        y_t = self.ystate[0].clone()
        loss = gy = None
        if mse_target is not None:  # the package's MSE (leaky readout): its value and gradient in one call
            loss = torch.scalar_tensor(_mse(self.yout_np, mse_target.numpy(), self.gy.numpy()), dtype=self.dtype)
            gy = self.gy
        elif closure is not None:
            if value_and_grad is not None:  # closed form: (loss, d loss / d y) or None (no loss here)
                lg = value_and_grad(y_t)
                if lg is not None:
                    loss, gy = lg
            else:
                yl = y_t.clone().requires_grad_()
                with torch.enable_grad():
                    loss = closure(yl)
                if loss is not None:
                    if loss.dim() != 0:
                        raise ValueError(f"loss must return a scalar at step {self.learner.steps}, "
                                         f"got shape {tuple(loss.shape)}")
                    if loss.requires_grad:
                        (gy,) = torch.autograd.grad(loss, yl, allow_unused=True)
                    loss = loss.detach()
        use_g = gy is not None
        if use_g and (gy.dtype != self.dtype or not gy.is_contiguous()):
            gy = gy.to(self.dtype).contiguous()
        if self.leaky:  # its traces advance at every step
            _leaky_bwd(gy.numpy() if use_g else self.yout_np, use_g, u, *self.ro_bwd, self.gh_np)
            gcur = self.gh_np
        elif use_g:
            _linear_bwd(gy.numpy(), u, *self.ro_bwd, self.gh_np)
            gcur = self.gh_np
        else:
            gcur = self.ro_args[0][:0]  # unused
        self.lslot[0] = self.lfill
        for l in range(len(self.layers) - 1, -1, -1):
            f, ba, gi = self.bwd_args[l]
            f(gcur, use_g, ins[l], *ba)
            gcur = ba[gi]  # the error reaching the layer's input
        self._lif_written(use_g)
        if self.skip is not None:  # the filter reads the layer's traces of this step
            self.filter_step(gy)
        return y_t, loss

    def _lif_written(self, use_g: bool):
        if self.lmats:
            self.lfill += 1
            self.lany = self.lany or use_g
            if self.lfill == LIF_DEFER:
                self.flush_lif()


for _kind in ("lif", "alif", "lru", "readout"):  # the layers and the readout of the whole-stack step
    neurons.register_backend(_kind, "online_whole_stack (compiled whole-stack stream step, WholeStackStep.step)",
                             WholeStackStep.step,
                             test="tests/test_online_whole_stack.py::test_whole_stack_step_equals_bptt_through_the_neuron_steps")

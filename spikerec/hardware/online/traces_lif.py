"""e-prop-style eligibility traces of LIF, ALIF and leaky-readout layers.

Each neuron is a module with state ``s = v`` (LIF), ``(i, v)`` (CUBA LIF), ``(v, a)``
(ALIF) or ``y`` (leaky readout). The 1- or 2-dimensional Jacobian ``J_t = d s_t / d s_{t-1}``
includes the spike path through the surrogate ``psi = sigma'(v_{t-1} - thr)``: the reset
(when ``detach_reset=False``) and the adaptation. Without lateral weights the modules are
independent and the traces give the surrogate-gradient BPTT gradient exactly (e-prop
eligibility vectors of Bellec et al. 2020, Methods; exact on independent modules as the
thesis Zucchet 2025, Sec. 4.3.1 states for e-prop and SnAp-1). Lateral weights ``W_rec`` get
e-prop traces with presynaptic ``z_{t-1}``; the lateral paths between neurons are dropped
(the e-prop approximation), the self-connection (``zero_diagonal=False``) stays in J.

The formulas follow :meth:`spikerec.layers.lif.LIF.step` and
:meth:`spikerec.layers.alif.ALIF.step` term by term (tests compare them with autograd).
"""
from __future__ import annotations

import numpy as np
import torch

from ...kernels import alif_sequence_numba, lif_sequence, lif_sequence_numba
from ...kernels.lif_sequence_numba import RESET_CODES, surrogate_code
from ...layers.alif import ALIFState
from ...layers.readout import ReadoutState
from ... import neurons
from ...neurons import alif as _alif
from ...neurons import lif as _lif
from ...surrogate import heaviside
from ...kernels import lif_online
from ...kernels.alif_online import alif_block_numba, alif_matrix_carry_numba, alif_trace_step_numba
from ...kernels.lif_online import lif_block_workspace
from ...kernels.trace_numba import as_numpy, compiled_cpu, compiled_dtype
from ...kernels.trace_triton import triton_available
from .traces_base import _STACK, LayerTrace, Partials, chunk_contract, stack_partials

__all__ = ["LIFTrace", "ALIFTrace", "ReadoutTrace"]


def _dalpha(log_tau, dt):
    """``alpha = exp(-dt e^{-log tau})`` and ``d alpha / d log tau = alpha dt e^{-log tau}``."""
    r = dt * torch.exp(-log_tau)
    a = torch.exp(-r)
    return a, a * r


def _self_weight(cell):
    """Diagonal of the effective lateral matrix (0 with ``zero_diagonal``)."""
    w = cell.effective_recurrent_weight()
    return None if w is None else torch.diagonal(w.detach())


def _block_current(k, x):
    """The input currents ``W x + b`` of a block ``x [K, B, C]`` in one matmul, ``[K, B, N]``
    (``k``: the layer's constants with the transposed weight ``Wt`` and ``bias``)."""
    K, B = x.shape[0], x.shape[1]
    x2 = x.reshape(K * B, x.shape[-1])
    return (torch.addmm(k["bias"], x2, k["Wt"]) if k["bias"] is not None else x2 @ k["Wt"]).view(K, B, -1)


class _FusedAccumulators:
    """The gradient accumulators the compiled stream steps of the spiking layers add into."""

    def _accumulators(self, ts, names, use_g, dtype, N):
        """The gradient accumulators the kernel adds into: the per-neuron ones are rows of one
        ``[len(_VEC_ORDER), N]`` buffer (shared with ``ts.G``, so they are read and checkpointed as
        usual)."""
        buf = getattr(ts, "_fused_buf", None)
        if use_g and names:
            rows = getattr(ts, "_fused_rows", None)  # the row views handed to ts.G (identity checks are cheap)
            ok = (buf is not None and rows is not None and len(rows) == len(names)
                  and all(ts.G.get(n) is r for n, r in zip(names, rows)))
            if not ok:
                buf = torch.zeros((len(self._VEC_ORDER), N), dtype=dtype)
                for n in names:
                    if n in ts.G:
                        buf[self._VEC_ORDER.index(n)] += ts.G[n]
                    ts.G[n] = buf[self._VEC_ORDER.index(n)]
                ts._fused_buf = buf
                ts._fused_rows = tuple(ts.G[n] for n in names)
        if buf is None or not (use_g and names):
            buf = torch.zeros((len(self._VEC_ORDER), N), dtype=dtype)
        out = [buf]
        for n in ("weight", "recurrent_weight"):
            G = None
            if use_g and n in self.traced:
                G = ts.G.get(n)
                if G is None:
                    G = ts.G[n] = torch.zeros_like(self.params[n], memory_format=torch.contiguous_format)
                elif not G.is_contiguous():
                    G = ts.G[n] = G.contiguous()
            out.append(G)
        return out


class LIFTrace(_FusedAccumulators, LayerTrace):
    kind = "LIF"
    input_params = ("weight", "bias")

    def __init__(self, cell, rule):
        super().__init__(cell, rule)
        self.k = 2 if cell.cuba else 1
        if cell.recurrent_weight is not None and cell.zero_diagonal:
            self.mask["recurrent_weight"] = cell.rec_mask

    def state_params(self):
        return ("weight", "bias", "recurrent_weight", "log_tau_mem", "log_tau_syn", "threshold")

    def step(self, x, prev):
        """The neuron's one step (:func:`spikerec.neurons.lif.step`) with detached parameters."""
        c = self.cell
        p = type(c.params())(*(None if v is None else v.detach() for v in c.params()))
        return _lif.step(p, prev, x, c.options())[1]

    def partials(self, x, prev, new):
        c = self.cell
        thr = c.threshold.detach()
        v0 = prev.v
        u = v0 - thr
        zp = heaviside(u)
        alpha, dalpha = self._decay_partials(v0.dtype)
        Rd = _self_weight(c)
        # d z_reset / d v_{t-1} = psi, or 0 with detach_reset (the terms it multiplies are then left out)
        spike_reset = not c.detach_reset and c.reset != "none"
        psi = c.surrogate.derivative(u) if (spike_reset or Rd is not None) else None
        dI_dv = Rd * psi if Rd is not None else None
        if c.reset == "subtract":
            dA_dv, dA_dthr, dA_da = ((alpha - thr * psi, -zp + thr * psi, v0) if spike_reset
                                     else (alpha.expand_as(v0), -zp, v0))
        elif c.reset == "zero":
            dA_dv = alpha * (1 - zp) - alpha * v0 * psi if spike_reset else alpha * (1 - zp)
            dA_dthr = alpha * v0 * psi if spike_reset else torch.zeros_like(v0)
            dA_da = (1 - zp) * v0
        else:
            dA_dv, dA_dthr, dA_da = alpha.expand_as(v0), torch.zeros_like(v0), v0
        one = torch.ones_like(v0)
        vec: dict[str, torch.Tensor] = {}
        if not c.cuba:
            J = (dA_dv if dI_dv is None else dA_dv + dI_dv)[..., None, None]
            vec["log_tau_mem"] = (dA_da * dalpha)[..., None]
            vec["threshold"] = (dA_dthr if dI_dv is None else dA_dthr - dI_dv)[..., None]
            vec["bias"] = one[..., None]
            cvec = one[..., None]
        else:
            if dI_dv is None:
                dI_dv = torch.zeros_like(v0)
            dI_dthr = -dI_dv
            alpha_s, dalpha_s = _dalpha(c.log_tau_syn.detach(), c.dt)
            a_s = alpha_s.expand_as(v0)
            J = torch.stack([torch.stack([a_s, dI_dv], -1), torch.stack([a_s, dA_dv + dI_dv], -1)], -2)
            zero = torch.zeros_like(v0)
            ds = dalpha_s * prev.i
            vec["log_tau_syn"] = torch.stack([ds, ds], -1)
            vec["log_tau_mem"] = torch.stack([zero, dA_da * dalpha], -1)
            vec["threshold"] = torch.stack([dI_dthr, dI_dthr + dA_dthr], -1)
            vec["bias"] = torch.stack([one, one], -1)
            cvec = torch.stack([one, one], -1)
        mat = {"weight": (cvec, x)}
        if c.recurrent_weight is not None:
            mat["recurrent_weight"] = (cvec, zp)
        vec = {k: v for k, v in vec.items() if self.params.get(k) is not None}
        return Partials(J, vec, mat)

    def _decay_partials(self, dtype):
        """``(alpha, d alpha / d log_tau_mem)`` of :func:`_dalpha`, once per sequence."""
        k = self.consts(dtype)
        out = k.get("dalpha")
        if out is None:
            out = k["dalpha"] = _dalpha(self.cell.log_tau_mem.detach(), self.cell.dt)
        return out

    # --- the whole-stack compiled stream step (plain LIF; .whole_stack) ---------------------------
    _VEC_ORDER = ("log_tau_mem", "threshold", "bias")  # the columns of the compiled steps (partials' order)

    def compiled_trace_ready(self, dtype, device) -> bool:
        """Whether the compiled stream step of :mod:`.whole_stack` applies: a plain LIF, a
        surrogate with an inline formula (fast sigmoid, arc-tangent), the ``full``/``snap1`` rule,
        numba installed, CPU tensors of the parameters' float dtype."""
        p = self.cell.weight
        return (self.block_ready and surrogate_code(self.cell.surrogate)[0] != 0 and compiled_dtype(dtype, device)
                and self.use_J() and p.dtype == dtype and p.device.type == "cpu")

    def compiled_trace_setup(self, dtype):
        """The compiled trace step's per-sequence constants: ``(names, cols, cn, Rd)`` (the traced
        per-neuron parameters, their columns in ``_VEC_ORDER``, the ``[3, N]`` rows ``alpha``,
        ``d alpha / d log_tau_mem``, ``thr`` of :meth:`partials`, the lateral self-weights or
        ``None``)."""
        k = self.consts(dtype)
        f = k.get("fused")
        if f is None:
            c = self.cell
            names = [n for n in self._VEC_ORDER if self.params.get(n) is not None and n in self.traced]
            cols = np.asarray([self._VEC_ORDER.index(n) for n in names], dtype=np.int64)
            alpha, dalpha = self._decay_partials(dtype)
            N = c.hidden_size
            cn = torch.stack([t.to(dtype).expand(N) for t in (alpha, dalpha, k["thr"])]).contiguous()
            Rd = _self_weight(c)
            f = k["fused"] = (names, cols, cn, None if Rd is None else Rd.to(dtype).contiguous())
        return f

    # --- the chunked block (plain LIF) -----------------------------------------------------------
    @property
    def block_ready(self) -> bool:
        """Whether the chunked mode's no-autograd block applies (:mod:`.block`): a plain LIF (one
        state ``v``; a CUBA layer keeps the autograd block)."""
        return not self.cell.cuba

    def make_consts(self, dtype):
        """Per-sequence constants of the block scan: the detached, transposed input and lateral
        weights, the bias, ``alpha`` and the threshold."""
        c = self.cell
        p = c.params()
        alpha, _ = _lif.decays(p, c.options())
        w = p.recurrent_weight
        # the transposed weight stored contiguous: the block's input-current GEMM is ~8 % faster on it
        return {"Wt": c.weight.detach().t().to(dtype).contiguous(),
                "bias": None if c.bias is None else c.bias.detach().to(dtype),
                "alpha": alpha.detach().to(dtype), "thr": c.threshold.detach().to(dtype),
                "w_rec": None if w is None else w.detach().to(dtype)}

    def scan_block(self, x, state, with_new: bool = False, with_out: bool = False):
        """The states before each of the K steps of ``x [K, B, C]`` (``[K*B, N]`` fields) and the
        final state; with ``with_new`` the states after each step, with ``with_out`` also the
        spikes ``[K*B, N]``. The input currents of all K steps are one matmul; the time loop is
        the layer's own forward backend without lateral weights (:mod:`spikerec.kernels.lif_sequence`:
        the compiled loop on the CPU, the Triton kernel of :mod:`spikerec.kernels.lif_triton`
        elsewhere), else its torch loop: the same recurrence as :meth:`step`. A CUBA layer runs the
        step loop (:meth:`scan_states`)."""
        K, B = x.shape[0], x.shape[1]
        if self.cell.cuba:  # the step loop (two states)
            return self.scan_loop(x, state, with_new or with_out, with_out)
        k = self.consts(x.dtype)
        I = _block_current(k, x)
        N = I.shape[-1]
        reset, thr, alpha = self.cell.reset, k["thr"], k["alpha"]
        compiled = k.get("compiled")
        if compiled is None:  # the layer's forward backend for this dtype (fixed within a sequence)
            compiled = k["compiled"] = lif_sequence._use_numba("auto", I, k["w_rec"])
        if compiled:
            fp = k.get(("forward", B))  # the kernel and its flattened constants, once per sequence and batch size
            if fp is None:
                fc = lif_sequence_numba.forward_consts(alpha, None, thr, B, N, x.dtype)
                fp = k[("forward", B)] = (lif_sequence_numba.RESET_CODES[reset], fc, np.empty(B * N, fc[0].dtype),
                                          np.empty((1, 1), fc[0].dtype),
                                          lif_sequence_numba.forward_kernel(serial=B * N <= lif_sequence_numba.BLOCK))
            # the layer's forward loop without lif_forward's wrapper (its constants and kernel kept per
            # sequence; a block is one work item of the kernel, so numba's thread count is not reset)
            mode, (a, a_s, th, zeros), i_scratch, no_syn, fwd = fp
            Vb = torch.empty((K + 1, B, N), dtype=x.dtype)  # [v_before, v_1 .. v_K]: prev and new are views
            Vb[0] = state.v
            Z, vT = torch.empty((K, B, N), dtype=x.dtype), torch.empty((B, N), dtype=x.dtype)
            fwd(I.view(K, B * N).numpy(), Vb[0].view(-1).numpy(), zeros, a, a_s, th, mode, False,
                Vb[1:].view(K, B * N).numpy(), Z.view(K, B * N).numpy(), no_syn, vT.view(-1).numpy(), i_scratch)
            V = Vb[1:]
            prev = _lif.LIFState(Vb[:-1].view(K * B, N))
        elif k["w_rec"] is None and K > 0 and triton_available(I):  # one launch for the block
            from ...kernels.lif_triton import lif_forward

            Z, V, _, vT, _ = lif_forward(I, state.v, None, alpha, None, thr, reset)
            prev = _lif.LIFState(torch.cat([state.v[None], V[:-1]]).view(K * B, N))
        else:
            Z, V, _, vT, _ = lif_sequence._torch_forward(I, state.v, None, alpha, None, thr, k["w_rec"], reset,
                                                         torch.gt(state.v, thr))
            prev = _lif.LIFState(torch.cat([state.v[None], V[:-1]]).view(K * B, N))
        last = _lif.LIFState(vT)
        if not (with_new or with_out):
            return prev, last
        new = _lif.LIFState(V.view(K * B, N))
        return (prev, last, new, Z.view(K * B, N)) if with_out else (prev, last, new)

    def block_contract(self, ts, x, prev, new, G, carry: bool, K: int, B: int) -> None:
        """The chunked block's contraction (the sums of :func:`.traces_base.chunk_contract`) for a
        plain LIF, computed in one compiled per-neuron pass with the partials inside it
        (:func:`spikerec.kernels.lif_online._lif_block_vec`: reverse filter ``gh_k = g_k + J_{k+1} gh_{k+1}``,
        ``Phi_k = J_{K-1} ... J_{k+1}``, the per-neuron sums and carried traces). The immediate
        partial of an input or lateral weight is ``pre`` (``c = 1``), so with ``e`` the carried
        matrix trace ``[N, B, 1, H]`` and ``b0 = J_0 gh_0``:

            dW += gh^T pre + sum_b b0 e                   (one GEMM and one compiled pass)
            e  <- sum_k Phi_k pre_k + Phi_{K-1,-1} e      (one GEMM per sample)

        The torch form (:func:`.traces_base.chunk_contract`) runs where the compiled one does not
        (no numba, not the CPU, a rule without ``J``, a surrogate without a compiled form)."""
        if not (self.use_J() and compiled_cpu(x) and self.cell.weight.dtype == x.dtype
                and surrogate_code(self.cell.surrogate)[0] != 0):
            super().block_contract(ts, x, prev, new, G, carry, K, B)
            return
        if G is None and not carry:
            return
        N = prev.v.shape[-1]
        Vp, G = as_numpy(prev.v.view(K, B, N)), None if G is None else as_numpy(G.reshape(K, B, N))
        dt = x.dtype
        plan = self._block_plan(dt, K, B)
        names, m, ws = plan["names"], plan["m"], plan["ws"]
        use_g = G is not None
        accs = self._accumulators(ts, names, use_g, dt, N)
        E, has_ev = ws["none3"], False
        if m:
            old = ts.carried(names)
            if isinstance(old, torch.Tensor):  # [m, B, N, 1]: the rows of the last block's traces
                E, has_ev = old.numpy().reshape(m, B, N), True
            elif any(e is not None for e in old):
                E, has_ev = np.zeros((m, B, N), dtype=Vp.dtype), True
                for j, e in enumerate(old):
                    if e is not None:
                        E[j] = as_numpy(e[..., 0])
        ev_new = torch.empty((m, B, N, 1), dtype=dt) if (carry and m) else None  # the new traces, in their kept shape
        w = ws["np"]
        P0, phi, b0 = plan["outs"]
        lif_online._lif_block_vec(Vp, G if use_g else w["gh"], use_g, *plan["consts"], E, has_ev, carry, plan["need_zp"],
                           *plan["work"], ws["z3"] if ev_new is None else ev_new.numpy().reshape(m, B, N), P0, phi,
                           b0, accs[0].numpy())
        z2 = ws["z2"]
        for name in plan["mats"]:
            pre = x if name == "weight" else ws["zp"]
            e = ts.mat.get(name)  # [N, B, 1, H]
            has_e = e is not None
            if has_e and not (e.is_contiguous() and e.dtype == dt):
                e = e.contiguous().to(dt)
            Gm = accs[1] if name == "weight" else accs[2]  # dW += gh^T pre
            H = pre.shape[-1]
            if use_g:
                Gm.addmm_(ws["gh2"].t(), pre.reshape(K * B, H))
            q = torch.bmm(ws["P0T"], pre.reshape(K, B, H).transpose(0, 1)).numpy() if carry else ws["z3"]
            if carry and not has_e:
                e = torch.empty((N, B, 1, H), dtype=dt)
            if e is not None:
                lif_online._lif_block_mat(e.numpy(), has_e, use_g, b0 if use_g else z2, Gm.numpy() if use_g else z2, carry,
                                   q, phi if carry else z2)
                if carry:
                    ts.mat[name] = e
        if ev_new is not None:
            ts.set_carried(names, ev_new)

    def _block_plan(self, dt, K: int, B: int) -> dict:
        """What the compiled block contraction fixes per sequence (and block size): the traced
        per-neuron and matrix parameters, the compiled pass's constants as numpy arrays, the
        reset, surrogate and workspace (its numpy views made once, so that a block's calls take
        them as they are)."""
        k = self.consts(dt)
        plan = k.get(("block_plan", K, B))
        if plan is None:
            c = self.cell
            names, cols, cn, Rd = self.compiled_trace_setup(dt)
            mats = tuple(n for n in ("weight", "recurrent_weight") if self.params.get(n) is not None and n in self.traced)
            N = c.hidden_size
            ws = self.scratch(("block", K, B, len(names), dt), lambda: lif_block_workspace(K, B, N, len(names), dt))
            w = ws["np"]
            cn_np = cn.numpy()
            sur = surrogate_code(c.surrogate)
            # the per-neuron pass's arguments before and after those of a block (``Vp, G, use_g``;
            # ``E, has_ev, carry``; ``ev_out``; ``Gacc``): see :func:`spikerec.kernels.lif_online._lif_block_vec`
            rd = Rd.numpy() if Rd is not None else np.zeros(1, dtype=cn_np.dtype)
            plan = k[("block_plan", K, B)] = {
                "names": names, "cols": cols, "mats": mats, "ws": ws, "m": len(names),
                "consts": (cn_np, rd, Rd is not None, RESET_CODES[c.reset], bool(c.detach_reset), sur[0], sur[1], sur[2],
                           cols),
                "work": (w["J"], w["V"], w["zp"], w["gh"], ws["Gv"]), "outs": (w["P0"], w["phi"], w["b0"]),
                "need_zp": "recurrent_weight" in mats, "gh_rows": w["gh"].reshape(K * B, N)}
        return plan


class ALIFTrace(_FusedAccumulators, LayerTrace):
    kind = "ALIF"
    k = 2
    input_params = ("weight", "bias")

    def __init__(self, cell, rule):
        super().__init__(cell, rule)
        if cell.recurrent_weight is not None and cell.zero_diagonal:
            self.mask["recurrent_weight"] = cell.rec_mask

    def state_params(self):
        return ("weight", "bias", "recurrent_weight", "log_tau_mem", "log_tau_adapt", "b", "beta")

    def make_consts(self, dtype):
        """Per-sequence constants: decays and their log-tau derivatives, detached and transposed
        weights, the self-connection of the lateral matrix."""
        c = self.cell
        alpha_s, rho_s = (d.detach().to(dtype) for d in c.decays())
        alpha, dalpha = _dalpha(c.log_tau_mem.detach(), c.dt)
        rho, drho = _dalpha(c.log_tau_adapt.detach(), c.dt)
        w = c.effective_recurrent_weight()
        return {
            "alpha_s": alpha_s, "rho_s": rho_s, "one_m_rho_s": 1.0 - rho_s,
            "alpha": alpha.to(dtype), "dalpha": dalpha.to(dtype), "rho": rho.to(dtype), "drho": drho.to(dtype),
            "one_m_rho": (1 - rho).to(dtype),
            "b": c.b.detach().to(dtype), "beta": c.beta.detach().to(dtype),
            "Wt": c.weight.detach().t().to(dtype).contiguous(),
            "bias": None if c.bias is None else c.bias.detach().to(dtype),
            "Rt": None if w is None else w.detach().t().to(dtype),
            "Rd": None if w is None else torch.diagonal(w.detach()).to(dtype),
        }

    def step(self, x, prev):
        """The neuron's one step (:func:`spikerec.neurons.alif.step`) with detached parameters."""
        c = self.cell
        p = type(c.params())(*(None if v is None else v.detach() for v in c.params()))
        return _alif.step(p, prev, x, c.options())[1]

    def scan_block(self, x, state, with_new: bool = False, with_out: bool = False):
        """The states before each of the K steps of ``x [K, B, C]`` (``[K*B, N]`` fields) and the
        final state; with ``with_new`` also the states after each step, and with ``with_out`` (and
        ``with_new``) the layer's output after each step, ``[K*B, N]`` spikes (``None`` where this
        scan did not make them). On the CPU the layer's compiled sequence kernel
        (:mod:`spikerec.kernels.alif_sequence_numba`: the same recurrence as :meth:`step`, the input
        currents of all K steps in one matmul, the spikes as the model's forward makes them),
        elsewhere the layer's Triton kernel (:mod:`spikerec.kernels.alif_triton`), else the step
        loop (:meth:`scan_states`)."""
        K, B = x.shape[0], x.shape[1]
        if not (alif_sequence_numba.available() and x.device.type == "cpu"
                and x.dtype in (torch.float32, torch.float64)):
            if K > 0 and x.dtype in (torch.float32, torch.float64) and triton_available(x):
                return self._scan_block_triton(x, state, with_new, with_out)
            return self.scan_loop(x, state, with_new, with_out)
        k = self.consts(x.dtype)
        I = _block_current(k, x)
        N = I.shape[-1]
        fc = k.get("forward_np")  # the kernel's constants, made once per sequence
        if fc is None:
            w_rec = None if k["Rt"] is None else k["Rt"].t()
            fc = k["forward_np"] = alif_sequence_numba.forward_consts(k["alpha_s"], k["rho_s"], k["b"], k["beta"],
                                                                       w_rec, N, x.dtype)
        # the states before and after every step as views of one [K + 1] buffer per field (no copies)
        Vf, Af = torch.empty((K + 1, B, N), dtype=x.dtype), torch.empty((K + 1, B, N), dtype=x.dtype)
        Vf[0], Af[0] = state.v, state.a
        Z, _, _, _, vT, aT = alif_sequence_numba.alif_forward(I, state.v, state.a, None, None, None, None, None,
                                                               V=Vf[1:], A=Af[1:], consts=fc)
        prev = ALIFState(Vf[:K].view(K * B, N), Af[:K].view(K * B, N))
        if not with_new:
            return prev, ALIFState(vT, aT)
        new = ALIFState(Vf[1:].view(K * B, N), Af[1:].view(K * B, N))
        return (prev, ALIFState(vT, aT), new, Z.view(K * B, N)) if with_out else (prev, ALIFState(vT, aT), new)

    def _scan_block_triton(self, x, state, with_new: bool, with_out: bool):
        """:meth:`scan_block` by the layer's Triton forward kernel (one launch for the block)."""
        from ...kernels.alif_triton import alif_forward

        K, B = x.shape[0], x.shape[1]
        k = self.consts(x.dtype)
        I = _block_current(k, x)
        N = I.shape[-1]
        w_rec = None if k["Rt"] is None else k["Rt"].t()
        Z, V, A = alif_forward(I, state.v, state.a, k["alpha_s"], k["rho_s"], k["b"], k["beta"], w_rec)
        prev = ALIFState(torch.cat([state.v[None], V[:-1]]).view(K * B, N),
                         torch.cat([state.a[None], A[:-1]]).view(K * B, N))
        last = ALIFState(V[-1], A[-1])
        if not with_new:
            return prev, last
        new = ALIFState(V.view(K * B, N), A.view(K * B, N))
        return (prev, last, new, Z.view(K * B, N)) if with_out else (prev, last, new)

    def partials(self, x, prev, new):
        c = self.cell
        k = self.consts(x.dtype)
        b, beta, alpha, dalpha, rho, drho = k["b"], k["beta"], k["alpha"], k["dalpha"], k["rho"], k["drho"]
        omr = k["one_m_rho"]
        v0, a0 = prev.v, prev.a
        u = v0 - (b + beta * a0)
        zp = heaviside(u)
        psi = c.surrogate.derivative(u)
        # z_{t-1} = H(v - b - beta a): derivatives w.r.t. v, a, b, beta are psi * (1, -beta, -1, -a0)
        dz_a, dz_beta = -beta * psi, -a0 * psi
        # a_t = rho a + (1 - rho) z
        da_v, da_a, da_b, da_beta = omr * psi, omr * dz_a + rho, -(omr * psi), omr * dz_beta
        da_rho = a0 - zp
        Rd = k["Rd"]
        if c.detach_reset:
            # v_t = alpha v + I(z) - stopgrad(theta z): only the lateral self-connection depends on z
            if Rd is None:
                dv_v, dv_a, dv_b, dv_beta = alpha.expand_as(v0), torch.zeros_like(v0), torch.zeros_like(v0), torch.zeros_like(v0)
            else:
                dv_v = Rd * psi + alpha
                dv_a, dv_b, dv_beta = Rd * dz_a, -(Rd * psi), Rd * dz_beta
            dR_rho = None
        else:
            a1 = rho * a0 + omr * zp
            theta = b + beta * a1
            # dR = theta dz + z dtheta, dtheta = beta da (+1 for b, + a1 for beta)
            dR_v = theta * psi + zp * (beta * da_v)
            dR_a = theta * dz_a + zp * (beta * da_a)
            dR_b = -(theta * psi) + zp * (beta * da_b + 1)
            dR_beta = theta * dz_beta + zp * (beta * da_beta + a1)
            dR_rho = zp * (beta * da_rho)
            if Rd is None:
                dv_v, dv_a, dv_b, dv_beta = alpha - dR_v, -dR_a, -dR_b, -dR_beta
            else:
                dv_v = (Rd * psi - dR_v) + alpha
                dv_a, dv_b, dv_beta = Rd * dz_a - dR_a, -(Rd * psi) - dR_b, Rd * dz_beta - dR_beta
        J = torch.stack([dv_v, dv_a, da_v, da_a], -1).unflatten(-1, (2, 2))
        zero = torch.zeros_like(v0)
        one = torch.ones_like(v0)
        vec = {
            "log_tau_mem": torch.stack([v0 * dalpha, zero], -1),
            "log_tau_adapt": torch.stack([zero if dR_rho is None else -dR_rho * drho, da_rho * drho], -1),
            "b": torch.stack([dv_b, da_b], -1),
            "beta": torch.stack([dv_beta, da_beta], -1),
            "bias": torch.stack([one, zero], -1),
        }
        vec = {n: v for n, v in vec.items() if self.params.get(n) is not None}
        cvec = torch.stack([one, zero], -1)
        mat = {"weight": (cvec, x)}
        if c.recurrent_weight is not None:
            mat["recurrent_weight"] = (cvec, zp)
        return Partials(J, vec, mat, c_zero=(1,))

    # --- the compiled stream step -------------------------------------------------------------
    _VEC_ORDER = ("log_tau_mem", "log_tau_adapt", "b", "beta", "bias")

    def compiled_trace_ready(self, dtype, device) -> bool:
        """Whether :meth:`compiled_trace_step` applies: the ``full``/``snap1`` rule, numba
        installed, CPU tensors of the parameters' float dtype."""
        p = self.cell.weight
        return compiled_dtype(dtype, device) and self.use_J() and p.dtype == dtype and p.device.type == "cpu"

    def compiled_trace_setup(self, dtype):
        """The compiled trace step's per-sequence constants: ``(names, cols, cn, Rd)`` (the traced
        per-neuron parameters, their columns in ``_VEC_ORDER``, the ``[7, N]`` constants of
        :func:`spikerec.kernels.alif_online.alif_trace_step_numba` and the lateral self-weights or ``None``)."""
        k = self.consts(dtype)
        f = k.get("fused")
        if f is None:
            names = [n for n in self._VEC_ORDER if self.params.get(n) is not None and n in self.traced]
            cols = np.asarray([self._VEC_ORDER.index(n) for n in names], dtype=np.int64)
            cn = torch.stack([t.expand(k["b"].shape) for t in (k["alpha"], k["dalpha"], k["rho"], k["drho"],
                                                                k["one_m_rho"], k["b"], k["beta"])]).contiguous()
            Rd = None if k["Rd"] is None else k["Rd"].contiguous()
            f = k["fused"] = (names, cols, cn, Rd)
        return f

    def compiled_trace_step(self, ts, x, prev, new, g) -> None:
        """One stream step of every trace of this layer and its contraction with ``g [B, N, 2]``
        (or ``None``) as one compiled pass (:func:`spikerec.kernels.alif_online.alif_trace_step_numba`); the
        same result as ``stream_step(ts, self.partials(x, prev, new), g)``."""
        c = self.cell
        k = self.consts(x.dtype)
        names, cols, cn, Rd = self.compiled_trace_setup(x.dtype)
        v0, a0 = prev.v, prev.a
        u = v0 - (k["b"] + k["beta"] * a0)
        zp = heaviside(u)
        psi = c.surrogate.derivative(u)
        B, N = v0.shape
        ev = ts.vec.get(_STACK)
        if ev is None:
            ev = ts.vec[_STACK] = torch.zeros((B, N, 2, len(names)), dtype=x.dtype)
        mats = []
        for name, H in (("weight", x.shape[1]), ("recurrent_weight", N)):
            e = None
            if name in self.traced:
                e = ts.mat.get(name)
                if e is None:
                    e = ts.mat[name] = torch.zeros((N, B, 2, H), dtype=x.dtype)
            mats.append(e)
        Gv, Gw, Gr = self._accumulators(ts, names, g is not None, x.dtype, N)
        cg = lambda t: t if t.is_contiguous() else t.contiguous()  # noqa: E731
        alif_trace_step_numba(cg(v0), cg(a0), cg(psi), zp, cg(x), None if g is None else cg(g), cn, cols, ev,
                              mats[0], mats[1], Gv, Gw, Gr, Rd, c.detach_reset)

    def block_contract(self, ts, x, prev, new, G, carry: bool, K: int, B: int) -> None:
        """The chunked block's contraction (the sums of :func:`.traces_base.chunk_contract` on
        :meth:`partials`) with the per-step work in one compiled pass
        (:func:`spikerec.kernels.alif_online.alif_block_numba`: the previous spikes and their surrogate
        derivative, partials, reverse filter, per-neuron sums, the carried per-neuron traces), the
        weights' first sum below as one GEMM on the filtered error's ``v`` row, and the boundary term
        and the carry of each matrix trace in one compiled pass (:func:`spikerec.kernels.alif_online.alif_matrix_carry_numba`,
        one GEMM per sample, the trace advanced in place). The immediate partial of an input
        or lateral weight is ``(pre, 0)``, so with ``gh`` the reverse-filtered error, ``pre`` the
        block's inputs (or previous spikes), ``e`` the carried matrix trace ``[N, B, 2, H]``,
        ``b0 = J_0^T gh_0`` and ``p_k`` the first column of ``Phi_{K-1,k} = J_{K-1} ... J_{k+1}``:

            dW += sum_{k,b} gh_k[v] pre_k^T + sum_b b0 . e
            e  <- sum_k p_k pre_k^T + Phi_{K-1,-1} e

        ``x``, ``prev`` hold ``[K*B]`` rows; ``G [K, B, N, 2]`` or ``None``. The torch form runs
        where the compiled one does not apply (no numba, not CPU, a rule without ``J``)."""
        dt = x.dtype
        if not (self.use_J() and compiled_cpu(x)):
            chunk_contract(ts, stack_partials(self.partials(x, prev, new), K, B), G, carry)
            return
        c = self.cell
        names, cols, cn, Rd = self.compiled_trace_setup(dt)
        N = prev.v.shape[-1]
        v0, a0 = prev.v.reshape(K, B, N).contiguous(), prev.a.reshape(K, B, N).contiguous()
        olds = ts.carried(names)  # the array the last block wrote, or a list
        if isinstance(olds, torch.Tensor):
            ev_in = olds
        else:
            ev_in = torch.stack(olds).contiguous() if names and all(e is not None for e in olds) else None
            if ev_in is None and any(e is not None for e in olds):  # some carried, some not (never by this path)
                ev_in = torch.stack([torch.zeros((B, N, 2), dtype=dt) if e is None else e for e in olds]).contiguous()
        Gc = None if G is None else G.reshape(K, B, N, 2).to(dt).contiguous()
        zp, GHv, P0, Phi, Gvec, b0, ev_out = alif_block_numba(v0, a0, c.surrogate, cn, cols, Rd, c.detach_reset, Gc,
                                                              carry, ev_in)
        if G is not None:
            Gv = Gvec.to(dt)  # the float64 sums, converted once
            for j, n in enumerate(names):
                ts.add(n, Gv[j])
        pres = {"weight": x.reshape(K, B, -1), "recurrent_weight": zp}
        for name in ("weight", "recurrent_weight"):
            if name not in self.traced:
                continue
            pre = pres[name]
            e = ts.mat.get(name)
            if G is not None:
                ts.add(name, GHv.reshape(K * B, N).t() @ pre.reshape(K * B, -1))
            # the boundary term and the carry in one compiled pass (the trace advanced in place)
            new_e, bnd = alif_matrix_carry_numba(P0, pre, Phi, e, b0 if G is not None else None, carry)
            if bnd is not None:
                ts.add(name, bnd)
            if new_e is not None:
                ts.mat[name] = new_e
        if carry and names:
            ts.set_carried(names, ev_out)


class ReadoutTrace(_FusedAccumulators, LayerTrace):
    """Leaky-integrator readout ``y_t = alpha y_{t-1} + W x_t + b``: a layer of 1-d linear modules."""

    kind = "LeakyReadout"
    input_params = ("weight", "bias")
    _VEC_ORDER = ("log_tau", "bias")  # the rows of the whole-stack step's per-output accumulators

    def state_params(self):
        return ("weight", "bias", "log_tau")

    def make_consts(self, dtype):
        c = self.cell
        alpha, dalpha = _dalpha(c.log_tau.detach(), c.dt)
        return {"alpha_s": c.alpha().detach().to(dtype), "alpha": alpha.to(dtype), "dalpha": dalpha.to(dtype),
                "Wt": c.weight.detach().t().to(dtype), "bias": None if c.bias is None else c.bias.detach().to(dtype)}

    def step(self, x, prev):
        k = self.consts(x.dtype)
        y = x @ k["Wt"]
        if k["bias"] is not None:
            y = y + k["bias"]
        return ReadoutState(k["alpha_s"] * prev.y + y)

    def partials(self, x, prev, new):
        k = self.consts(x.dtype)
        y0 = prev.y
        one = torch.ones_like(y0)
        vec = {"log_tau": (y0 * k["dalpha"])[..., None]}
        if self.cell.bias is not None:
            vec["bias"] = one[..., None]
        J = k["alpha"].expand_as(y0)[..., None, None]
        return Partials(J, vec, {"weight": (one[..., None], x)})


_TEST = "tests/test_online_partials.py::test_hand_written_partials_equal_derived_ones"
neurons.register_backend("lif", "online_partials", LIFTrace.partials, test=_TEST)
neurons.register_backend("alif", "online_partials", ALIFTrace.partials, test=_TEST)
neurons.register_backend("readout", "online_partials", ReadoutTrace.partials, test=_TEST)
_BLOCK_TEST = "tests/test_online_partials.py::test_compiled_block_equals_the_derived_recursion"
neurons.register_backend("lif", "online_block (compiled chunked block, LIFTrace.block_contract)", LIFTrace.block_contract,
                         test=_BLOCK_TEST)
neurons.register_backend("alif", "online_block (compiled chunked block, ALIFTrace.block_contract)",
                         ALIFTrace.block_contract, test=_BLOCK_TEST)
neurons.register_backend("alif", "online_block_scan (compiled block scan, ALIFTrace.scan_block)", ALIFTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")
neurons.register_backend("lif", "online_block_scan (compiled block scan, LIFTrace.scan_block)", LIFTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")

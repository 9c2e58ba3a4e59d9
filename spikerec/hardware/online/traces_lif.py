"""The online form of a LIF layer, plain (state ``v``) or CUBA (``(i, v)``): e-prop eligibility traces (Bellec et al.
2020, Methods) of :func:`spikerec.neurons.lif.step`, exact without lateral weights. ``J_t = d s_t / d s_{t-1}``
includes the spike path through the surrogate ``psi = sigma'(v_{t-1} - thr)``: the reset (unless detached) and the
lateral self-connection; the lateral paths between neurons are dropped (the e-prop approximation).
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import as_numpy, lif_sequence, lif_sequence_numba, lif_online
from ...kernels.trace_numba import compiled_cpu
from ...kernels.trace_triton import triton_available
from ...neurons import lif as _lif
from ...surrogate import heaviside
from .traces import BlockPartials, LayerTrace, Partials, acc_add, spike_grad

__all__ = ["LIFTrace", "decay_partials", "block_current", "detached"]


def decay_partials(log_tau, dt):
    """``alpha = exp(-dt e^{-log tau})`` and ``d alpha / d log tau = alpha dt e^{-log tau}``."""
    r = dt * torch.exp(-log_tau.detach())
    a = torch.exp(-r)
    return a, a * r


def detached(params):
    """A kind's parameter tuple with every tensor detached."""
    return type(params)(*(None if v is None else v.detach() for v in params))


def block_current(k, x):
    """``W x + b`` of a block ``x [K, B, C]`` in one GEMM (``k``: constants with ``Wt`` and ``bias``)."""
    x2 = x.reshape(-1, x.shape[-1])
    I = torch.addmm(k["bias"], x2, k["Wt"]) if k["bias"] is not None else x2 @ k["Wt"]
    return I.view(x.shape[0], x.shape[1], -1)


class LIFTrace(LayerTrace):
    kind = "LIF"
    input_params = ("weight", "bias")

    def __init__(self, cell, rule):
        super().__init__(cell, rule)
        self.k = 2 if cell.cuba else 1
        if cell.recurrent_weight is not None and cell.zero_diagonal:
            self.mask["recurrent_weight"] = cell.rec_mask

    def state_params(self):
        return ("weight", "bias", "recurrent_weight", "log_tau_mem", "log_tau_syn", "threshold")

    def make_consts(self, dtype):
        c = self.cell
        N = c.hidden_size
        alpha, dalpha = decay_partials(c.log_tau_mem, c.dt)
        w = c.effective_recurrent_weight()
        f = lambda t: t.detach().to(dtype).expand(N).contiguous()  # noqa: E731
        out = {"alpha": f(alpha), "dalpha": f(dalpha), "thr": f(c.threshold),
               "Wt": c.weight.detach().t().to(dtype).contiguous(),
               "bias": None if c.bias is None else c.bias.detach().to(dtype),
               "w_rec": None if w is None else w.detach().to(dtype),
               "Rd": None if w is None else torch.diagonal(w.detach()).to(dtype)}
        if c.cuba:
            out["alpha_s"], out["dalpha_s"] = (f(t) for t in decay_partials(c.log_tau_syn, c.dt))
        return out

    def step(self, x, prev):
        return _lif.step(detached(self.cell.params()), prev, x, self.cell.options())[1]

    def partials(self, x, prev, new):
        """``J`` and the immediate partials of :func:`spikerec.neurons.lif.step` (tested against ``torch.func``)."""
        c, k = self.cell, self.consts(x.dtype)
        thr, alpha, dalpha, Rd = k["thr"], k["alpha"], k["dalpha"], k["Rd"]
        v0 = prev.v
        zp = heaviside(v0 - thr)
        spike_reset = not c.detach_reset and c.reset != "none"
        psi = c.surrogate.derivative(v0 - thr) if (spike_reset or Rd is not None) else None
        dI_dv = Rd * psi if Rd is not None else torch.zeros_like(v0)  # d I_t / d v_{t-1} through W_rec z
        if c.reset == "subtract":
            dA_dv = alpha - thr * psi if spike_reset else alpha.expand_as(v0)
            dA_dthr, dA_da = (-zp + thr * psi) if spike_reset else -zp, v0
        elif c.reset == "zero":
            dA_dv = alpha * (1 - zp) - (alpha * v0 * psi if spike_reset else 0)
            dA_dthr, dA_da = (alpha * v0 * psi if spike_reset else torch.zeros_like(v0)), (1 - zp) * v0
        else:
            dA_dv, dA_dthr, dA_da = alpha.expand_as(v0), torch.zeros_like(v0), v0
        one = torch.ones_like(v0)
        if not c.cuba:
            J = (dA_dv + dI_dv)[..., None, None]
            vec = {"log_tau_mem": (dA_da * dalpha)[..., None], "threshold": (dA_dthr - dI_dv)[..., None],
                   "bias": one[..., None]}
            cvec = one[..., None]
        else:  # (i, v): i_t = alpha_s i_{t-1} + I_t, v_t = alpha v_{t-1} + i_t - reset
            a_s = k["alpha_s"].expand_as(v0)
            J = torch.stack([torch.stack([a_s, dI_dv], -1), torch.stack([a_s, dA_dv + dI_dv], -1)], -2)
            zero, ds = torch.zeros_like(v0), k["dalpha_s"] * prev.i
            vec = {"log_tau_syn": torch.stack([ds, ds], -1), "log_tau_mem": torch.stack([zero, dA_da * dalpha], -1),
                   "threshold": torch.stack([-dI_dv, dA_dthr - dI_dv], -1), "bias": torch.stack([one, one], -1)}
            cvec = torch.stack([one, one], -1)
        mat = {"weight": (cvec, x)}
        if c.recurrent_weight is not None:
            mat["recurrent_weight"] = (cvec, zp)
        return Partials(J, {n: v for n, v in vec.items() if self.params.get(n) is not None}, mat)

    def block_partials(self, x, prev, new, K: int, B: int) -> BlockPartials:
        """:meth:`partials` of a block's rows in one compiled pass (plain LIF, :mod:`spikerec.kernels.lif_online`)."""
        c = self.cell
        if c.cuba or not (self.compiled and compiled_cpu(x) and lif_online.lif_rows is not None):
            return super().block_partials(x, prev, new, K, B)
        k = self.consts(x.dtype)
        names = tuple(n for n in lif_online.COLUMNS if self.params.get(n) is not None and n in self.traced)
        cols = k.get(("cols", names))
        if cols is None:
            cols = k[("cols", names)] = np.asarray([lif_online.COLUMNS.index(n) for n in names], dtype=np.int64)
        N = prev.v.shape[-1]
        J, V, zp = lif_online.lif_block_partials(prev.v.reshape(K, B, N).contiguous(), c.surrogate, k, cols, c.reset,
                                                 c.detach_reset)
        pre = {"weight": x.reshape(K, B, -1)}
        if c.recurrent_weight is not None:
            pre["recurrent_weight"] = zp
        return BlockPartials(J, V, names, None, pre)  # the weights' immediate coefficient is 1

    def errors(self, rec, g_out, sp, below: bool):
        """The spatial backward of the spikes ``z = H(v - thr)``: ``g_v = g_z psi``, ``dthr -= sum
        g_v``, the input's error ``g_v W``; returns ``(g [rows, N, k], input error or None)``."""
        c, k = self.cell, self.consts(g_out.dtype)
        gp = spike_grad(g_out, rec[2].v, c.surrogate, k["thr"])
        if sp is not None and c.threshold.requires_grad:
            acc_add(sp, c.threshold, gp.sum(0), -1.0)
        g = gp[..., None] if not c.cuba else torch.stack([torch.zeros_like(gp), gp], 1).transpose(1, 2)
        return g, (gp @ k["Wt"].t() if below else None)

    def scan_block(self, x, state):
        """``(prev, last, new, spikes)`` of a block ``x [K, B, C]``: the currents by one GEMM, the time loop by the
        layer's forward kernel where it applies (numba on the CPU, Triton on CUDA, feed-forward), else in torch."""
        K, B = x.shape[0], x.shape[1]
        c, k = self.cell, self.consts(x.dtype)
        I = block_current(k, x)
        N, cuba = I.shape[-1], c.cuba
        args = (I, state.v, state.i if cuba else None, k["alpha"], k.get("alpha_s"), k["thr"])
        Vx = None  # the membranes before and after each step in one [K + 1] buffer (prev and new: views of it)
        if k["w_rec"] is None and compiled_cpu(I) and lif_sequence_numba.available():
            fc = k.get(("fc", B))
            if fc is None:
                fc = k[("fc", B)] = lif_sequence_numba.forward_consts(*args[3:], B, N, x.dtype)
            Vx = torch.empty((K + 1, B, N), dtype=I.dtype)
            vx = Vx.view(K + 1, B * N).numpy()
            vx[0] = as_numpy(state.v).reshape(-1)
            Z, V1, S1, _, _ = lif_sequence_numba.lif_forward(*args, c.reset, consts=fc, V=vx[1:])
        elif k["w_rec"] is None and K > 0 and triton_available(I):
            from ...kernels.lif_triton import lif_forward

            Z, V1, S1, _, _ = lif_forward(*args, c.reset)
        else:
            Z, V1, S1, _, _ = lif_sequence._torch_forward(*args, k["w_rec"], c.reset, torch.gt(state.v, k["thr"]))
        rows = lambda R, r0: torch.cat([r0[None], R[:-1]]).view(K * B, N)  # noqa: E731
        prev_v = rows(V1, state.v) if Vx is None else Vx[:-1].view(K * B, N)
        z = Z.reshape(K * B, N)
        if cuba:
            return (c.State(rows(S1, state.i), prev_v), c.State(S1[-1], V1[-1]),
                    c.State(S1.reshape(K * B, N), V1.reshape(K * B, N)), z)
        return c.State(prev_v), c.State(V1[-1]), c.State(V1.reshape(K * B, N)), z

    def row_kernel(self, dtype, B: int):
        """The compiled stream step (:func:`spikerec.kernels.lif_online.lif_rows`), its constants; CUBA: ``None``."""
        if self.cell.cuba or lif_online.lif_rows is None:
            return None
        k, N = self.consts(dtype), self.cell.hidden_size
        z = lambda *s: np.zeros(s, dtype=k["alpha"].numpy().dtype)  # noqa: E731
        w = k["w_rec"]
        return lif_online.lif_rows, (k["Wt"].numpy(), z(N) if k["bias"] is None else k["bias"].numpy(),
                                     k["bias"] is not None, z(N, N) if w is None else w.t().contiguous().numpy(),
                                     w is not None, k["alpha"].numpy(), k["thr"].numpy(),
                                     lif_online.RESET_CODES[self.cell.reset], z(B, N), z(B, N), z(B, N))


neurons.register_backend("lif", "online_partials (LIFTrace.partials)", LIFTrace.partials,
                         test="tests/test_online_partials.py::test_hand_written_partials_equal_derived_ones")
neurons.register_backend("lif", "online_spatial (LIFTrace.errors)", LIFTrace.errors,
                         test="tests/test_online_compiled.py::test_compiled_stream_equals_reference_stream")
neurons.register_backend("lif", "online_block_scan (LIFTrace.scan_block)", LIFTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")
neurons.register_backend("lif", "online_rows (the compiled step of the step window, LIFTrace.row_kernel)", LIFTrace.row_kernel,
                         test="tests/test_online_partials.py::test_row_kernels_with_the_layers_constants_equal_the_neuron_steps")

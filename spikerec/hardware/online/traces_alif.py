"""The online form of an ALIF layer (state ``(v, a)``): e-prop eligibility traces (Bellec et al. 2020, Methods) of
:func:`spikerec.neurons.alif.step`, exact without lateral weights; the 2x2 Jacobian ``J_t = d(v_t, a_t) / d(v_{t-1},
a_{t-1})`` includes the adaptation and the spike path through the surrogate ``psi = sigma'(v_{t-1} - theta_{t-1})``.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import alif_online, alif_sequence_numba
from ...kernels.trace_numba import compiled_cpu
from ...kernels.trace_triton import triton_available
from ...layers.alif import ALIFState
from ...neurons import alif as _alif
from ...surrogate import heaviside
from .traces import BlockPartials, LayerTrace, Partials, acc_add, spike_grad
from .traces_lif import block_current, decay_partials, detached

__all__ = ["ALIFTrace"]


class ALIFTrace(LayerTrace):
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
        c = self.cell
        N = c.hidden_size
        f = lambda t: t.detach().to(dtype).expand(N).contiguous()  # noqa: E731
        alpha, dalpha = decay_partials(c.log_tau_mem, c.dt)
        rho, drho = decay_partials(c.log_tau_adapt, c.dt)
        w = c.effective_recurrent_weight()
        out = {"alpha": f(alpha), "dalpha": f(dalpha), "rho": f(rho), "drho": f(drho), "one_m_rho": f(1 - rho),
               "b": f(c.b), "beta": f(c.beta), "Wt": c.weight.detach().t().to(dtype).contiguous(),
               "bias": None if c.bias is None else c.bias.detach().to(dtype),
               "w_rec": None if w is None else w.detach().to(dtype),
               "Rd": None if w is None else torch.diagonal(w.detach()).to(dtype).contiguous()}
        out["cn"] = torch.stack([out[n] for n in ("alpha", "dalpha", "rho", "drho", "one_m_rho", "b", "beta")])
        return out

    def step(self, x, prev):
        return _alif.step(detached(self.cell.params()), prev, x, self.cell.options())[1]

    def partials(self, x, prev, new):
        """``J`` and the immediate partials of :func:`spikerec.neurons.alif.step` (tested against ``torch.func``)."""
        c, k = self.cell, self.consts(x.dtype)
        b, beta, alpha, dalpha, rho, drho, omr, Rd = (k[n] for n in ("b", "beta", "alpha", "dalpha", "rho", "drho",
                                                                      "one_m_rho", "Rd"))
        v0, a0 = prev.v, prev.a
        u = v0 - (b + beta * a0)
        zp, psi = heaviside(u), c.surrogate.derivative(u)
        rd = Rd if Rd is not None else torch.zeros_like(alpha)
        dz_a, dz_beta = -beta * psi, -a0 * psi  # z_{t-1} = H(v - b - beta a)
        da_v, da_a, da_b, da_beta, da_rho = omr * psi, omr * dz_a + rho, -(omr * psi), omr * dz_beta, a0 - zp
        dv_v, dv_a, dv_b, dv_beta = rd * psi + alpha, rd * dz_a, -(rd * psi), rd * dz_beta
        dR_rho = torch.zeros_like(v0)
        if not c.detach_reset:  # d(theta_t z) = theta dz + z dtheta, dtheta = beta da (+1 for b, + a_t for beta)
            a1 = rho * a0 + omr * zp
            theta = b + beta * a1
            dv_v = dv_v - (theta * psi + zp * (beta * da_v))
            dv_a = dv_a - (theta * dz_a + zp * (beta * da_a))
            dv_b = dv_b - (-(theta * psi) + zp * (beta * da_b + 1))
            dv_beta = dv_beta - (theta * dz_beta + zp * (beta * da_beta + a1))
            dR_rho = zp * (beta * da_rho)
        J = torch.stack([dv_v, dv_a, da_v, da_a], -1).unflatten(-1, (2, 2))
        zero, one = torch.zeros_like(v0), torch.ones_like(v0)
        vec = {"log_tau_mem": torch.stack([v0 * dalpha, zero], -1),
               "log_tau_adapt": torch.stack([-dR_rho * drho, da_rho * drho], -1),
               "b": torch.stack([dv_b, da_b], -1), "beta": torch.stack([dv_beta, da_beta], -1),
               "bias": torch.stack([one, zero], -1)}
        cvec = torch.stack([one, zero], -1)
        mat = {"weight": (cvec, x)}
        if c.recurrent_weight is not None:
            mat["recurrent_weight"] = (cvec, zp)
        return Partials(J, {n: v for n, v in vec.items() if self.params.get(n) is not None}, mat)

    def block_partials(self, x, prev, new, K: int, B: int) -> BlockPartials:
        """:meth:`partials` of a block's rows in one compiled pass (:mod:`spikerec.kernels.alif_online`)."""
        if not (self.compiled and compiled_cpu(x) and alif_online.alif_rows is not None):
            return super().block_partials(x, prev, new, K, B)
        c, k = self.cell, self.consts(x.dtype)
        names = tuple(n for n in alif_online.COLUMNS if self.params.get(n) is not None and n in self.traced)
        cols = k.get(("cols", names))
        if cols is None:
            cols = k[("cols", names)] = np.asarray([alif_online.COLUMNS.index(n) for n in names], dtype=np.int64)
        N = prev.v.shape[-1]
        J, V, zp = alif_online.alif_block_partials(prev.v.reshape(K, B, N).contiguous(),
                                                   prev.a.reshape(K, B, N).contiguous(), c.surrogate, k["cn"], cols,
                                                   k["Rd"], c.detach_reset)
        pre = {"weight": x.reshape(K, B, -1)}
        if c.recurrent_weight is not None:
            pre["recurrent_weight"] = zp
        return BlockPartials(J, V, names, None, pre)  # the weights' immediate coefficient is (1, 0)

    def errors(self, rec, g_out, sp, below: bool):
        """The spatial backward of ``z = H(v - b - beta a)``: ``g = (g_v, -beta g_v)`` with ``g_v =
        g_z psi``, ``db -= sum g_v``, ``dbeta -= sum g_v a``, the input's error ``g_v W``."""
        c, k = self.cell, self.consts(g_out.dtype)
        new = rec[2]
        gp = spike_grad(g_out, new.v - torch.addcmul(k["b"], k["beta"], new.a), c.surrogate)
        acc_add(sp, c.b, gp.sum(0), -1.0)
        acc_add(sp, c.beta, (gp * new.a).sum(0), -1.0)
        g = torch.stack([gp, -k["beta"] * gp], 1).transpose(1, 2)  # [rows, N, 2], stored per row as (v, a)
        return g, (gp @ k["Wt"].t() if below else None)

    def scan_block(self, x, state):
        """``(prev, last, new, spikes)`` of ``x [K, B, C]`` by the layer's forward kernel, else the step loop."""
        K, B = x.shape[0], x.shape[1]
        dt = x.dtype
        nb = compiled_cpu(x) and alif_sequence_numba.available()
        if not (dt in (torch.float32, torch.float64) and K > 0 and (nb or triton_available(x))):
            prev, last, new = self.scan_loop(x, state)
            return prev, last, new, self.cell.output(None, new)
        k = self.consts(dt)
        I = block_current(k, x)
        N = I.shape[-1]
        S = torch.empty((2, K + 1, B, N), dtype=dt, device=x.device)  # v, a before and after each step
        S[0, 0], S[1, 0] = state.v, state.a
        if nb:
            fc = k.get("fc")
            if fc is None:
                fc = k["fc"] = alif_sequence_numba.forward_consts(k["alpha"], k["rho"], k["b"], k["beta"],
                                                                  k["w_rec"], N, dt)
            Z = alif_sequence_numba.alif_forward(I, state.v, state.a, None, None, None, None, None, V=S[0, 1:],
                                                 A=S[1, 1:], consts=fc)[0]
        else:
            from ...kernels.alif_triton import alif_forward

            Z, S[0, 1:], S[1, 1:] = alif_forward(I, state.v, state.a, k["alpha"], k["rho"], k["b"], k["beta"],
                                                 k["w_rec"])
        rows = lambda R: R.reshape(K * B, N)  # noqa: E731
        return (ALIFState(rows(S[0, :-1]), rows(S[1, :-1])), ALIFState(S[0, -1], S[1, -1]),
                ALIFState(rows(S[0, 1:]), rows(S[1, 1:])), Z.reshape(K * B, N))

    def row_kernel(self, dtype, B: int):
        """The compiled stream step (:func:`spikerec.kernels.alif_online.alif_rows`) and its constants."""
        if alif_online.alif_rows is None:
            return None
        k, N = self.consts(dtype), self.cell.hidden_size
        z = lambda *s: np.zeros(s, dtype=k["alpha"].numpy().dtype)  # noqa: E731
        w = k["w_rec"]
        return alif_online.alif_rows, (k["Wt"].numpy(), z(N) if k["bias"] is None else k["bias"].numpy(),
                                       k["bias"] is not None, z(N, N) if w is None else w.t().contiguous().numpy(),
                                       w is not None, k["alpha"].numpy(), k["rho"].numpy(), k["b"].numpy(),
                                       k["beta"].numpy(), z(B, N), z(B, N), z(B, N))


neurons.register_backend("alif", "online_partials (ALIFTrace.partials)", ALIFTrace.partials,
                         test="tests/test_online_partials.py::test_hand_written_partials_equal_derived_ones")
neurons.register_backend("alif", "online_spatial (ALIFTrace.errors)", ALIFTrace.errors,
                         test="tests/test_online_compiled.py::test_compiled_stream_equals_reference_stream")
neurons.register_backend("alif", "online_block_scan (ALIFTrace.scan_block)", ALIFTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")
neurons.register_backend("alif", "online_rows (the compiled step of the step window, ALIFTrace.row_kernel)", ALIFTrace.row_kernel,
                         test="tests/test_online_partials.py::test_row_kernels_with_the_layers_constants_equal_the_neuron_steps")

"""Exact RTRL traces of one LRU layer (Zucchet et al. 2023; thesis Zucchet 2025, Sec. 4.3.1, Eq. 4.6-4.7 and
App. B.1.2; the LRU of Orvieto et al. 2023, Sec. 3)::

    h_t = lam h_{t-1} + gamma B x_t,   lam = exp(-exp(nu_log) + i exp(theta_log)),   gamma = exp(gamma_log)

on the real pair ``s = (Re h, Im h)``, so ``J = [[Re lam, -Im lam], [Im lam, Re lam]]``. The immediate partials:
``(d lam / d p) h_{t-1}`` for ``p`` = ``nu_log`` (``d lam / d nu_log = -e^{nu_log} lam``), ``theta_log`` (``i
e^{theta_log} lam``); ``gamma B x_t = h_t - lam h_{t-1}`` for ``gamma_log``; ``(gamma_j, 0) x_i`` for ``B_re[j,
i]``, whose trace ``B_im`` reads as ``i eps[B_re]``. A real parameter gets ``sum_t Re[conj(g_t) eps_t]``.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import lru_online, scan_numba
from ...kernels.trace_numba import compiled_cpu
from ...neurons import lru as _lru
from ...scan import linear_scan
from .traces import BlockPartials, LayerTrace, Partials, acc_add, acc_mm, planar
from .traces_lif import detached

__all__ = ["LRUTrace"]

_ROT = torch.tensor([[0.0, -1.0], [1.0, 0.0]])  # multiplication by i on (re, im) pairs


class LRUTrace(LayerTrace):
    kind = "LRU"
    k = 2
    input_params = ("B_re", "B_im", "gamma_log")

    def __init__(self, cell, rule):
        super().__init__(cell, rule)
        self.shared = {"B_im": ("B_re", _ROT.to(dtype=cell.B_re.dtype, device=cell.B_re.device))}

    def state_params(self):
        return ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")

    def make_consts(self, dtype):
        c = self.cell
        lam = c.lam().detach()
        lr, li = lam.real.to(dtype), lam.imag.to(dtype)
        gam = torch.exp(c.gamma_log.detach()).to(dtype)
        out = {"lr": lr, "li": li, "lam": torch.complex(lr, li), "gam": gam,
               "Bg": torch.cat([c.B_re.detach().t(), c.B_im.detach().t()], 1).to(dtype) * torch.cat([gam, gam]),
               "J": torch.stack([torch.stack([lr, -li], -1), torch.stack([li, lr], -1)], -2)[None],  # [1, N, 2, 2]
               "cvec": torch.stack([gam, torch.zeros_like(gam)], -1),
               "D": c.D.detach().to(dtype),
               "Ci": torch.cat([c.C_re.detach(), -c.C_im.detach()], 1).to(dtype),  # [O, 2N]: (Re | Im) columns
               "Cx": torch.stack([c.C_re.detach(), -c.C_im.detach()], -1).flatten(1).to(dtype)}  # (Re, Im) of each
        for name, w in (("nu_log", -torch.exp(c.nu_log.detach()) * lam), ("theta_log", 1j * torch.exp(c.theta_log.detach()) * lam)):
            if name in self.traced:
                out[name] = (w.real.to(dtype), w.imag.to(dtype))
        return out

    def step(self, x, prev):
        return _lru.step(detached(self.cell.params()), prev, x)[1]

    def partials(self, x, prev, new):
        k = self.consts(x.dtype)
        lr, li, hr, hi = k["lr"], k["li"], prev.x_re, prev.x_im
        vec = {}
        for name in ("nu_log", "theta_log"):
            if name in k:
                wr, wi = k[name]
                vec[name] = torch.stack([wr * hr - wi * hi, wr * hi + wi * hr], -1)
        if "gamma_log" in self.traced:
            vec["gamma_log"] = torch.stack([new.x_re - (lr * hr - li * hi), new.x_im - (lr * hi + li * hr)], -1)
        return Partials(k["J"], vec, {"B_re": (k["cvec"].expand(x.shape[0], -1, -1), x)})

    def block_partials(self, x, prev, new, K: int, B: int) -> BlockPartials:
        """:meth:`partials` of a block's rows: ``J`` given once, the rest by :mod:`spikerec.kernels.lru_online`."""
        k = self.consts(x.dtype)
        names = tuple(n for n in ("nu_log", "theta_log", "gamma_log") if n in self.traced)
        if not (self.compiled and compiled_cpu(x) and lru_online.lru_rows is not None):
            return super().block_partials(x, prev, new, K, B)
        fixed = k.get("block")
        if fixed is None:
            z = torch.zeros_like(k["lr"])
            W = torch.stack([torch.stack(k.get(n, (z, z))) for n in ("nu_log", "theta_log")]).contiguous()
            fixed = k["block"] = (planar(k["J"][None].flatten(-2)).contiguous(), W,  # J [1, 1, 4, N]
                                  np.asarray([("nu_log", "theta_log", "gamma_log").index(n) for n in names], dtype=np.int64))
        Jp, W, kinds = fixed
        cc = k.get("c")
        if cc is None:  # c = (gamma, 0), the same at every step and sample, and the readers' M c (B_im: (0, gamma))
            cp = planar(k["cvec"])[None, None].contiguous()  # [1, 1, 2, N]
            rot = torch.stack([torch.zeros_like(cp[:, :, 0]), cp[:, :, 0]], 2)
            cr = [cp if r == "B_re" else rot for _, r, _ in self.mat_readers(("B_re",))]
            cc = k["c"] = (cp, torch.stack(cr) if cr else None)
        V = lru_online.lru_block_partials(prev, new, k["lr"], k["li"], W, kinds, K, B)
        pre = {"B_re": x.reshape(K, B, -1)} if ("B_re" in self.traced or "B_im" in self.traced) else {}
        return BlockPartials(Jp, V, names, cc[0], pre, cc[1])

    def errors(self, rec, g_out, sp, below: bool):
        """The spatial backward of ``y = C_re Re h - C_im Im h + D x``: ``g = (g_y C_re, -g_y C_im)``, ``dC_re +=
        g_y^T Re h``, ``dC_im -= g_y^T Im h``, ``dD``, the input's error ``g_y D + (gamma B)^T g``."""
        c, k = self.cell, self.consts(g_out.dtype)
        x, new = rec[0], rec[2]
        g = g_out @ k["Ci"]  # [rows, 2N]: (Re | Im) of the neurons
        acc_mm(sp, c.C_re, g_out.t(), new.x_re)
        acc_mm(sp, c.C_im, g_out.t(), new.x_im, -1.0)
        D = k["D"]
        if D.dim() == 1:
            acc_add(sp, c.D, (g_out * x).sum(0))
        else:
            acc_mm(sp, c.D, g_out.t(), x)
        gin = None
        if below:
            gin = torch.addmm(g_out * D if D.dim() == 1 else g_out @ D, g, k["Bg"].t())
        return g.view(g.shape[0], 2, -1).transpose(1, 2), gin

    def scan_block(self, x, state):
        """``(prev, last, new, y)`` of a block ``x [K, B, H]`` by the complex linear scan (numba on the CPU, Triton
        on CUDA); the states (Re, Im) views of one ``[K + 1]`` buffer, the outputs one GEMM on them."""
        K, B = x.shape[0], x.shape[1]
        k = self.consts(x.dtype)
        N, lam = k["lam"].shape[0], k["lam"]
        u = (x.reshape(K * B, -1) @ k["Bg"]).view(K, B, 2 * N)
        b, h0 = torch.complex(u[..., :N], u[..., N:]), torch.complex(state.x_re, state.x_im)
        hs = scan_numba.scan_forward(lam[None], b, h0) if scan_numba.supported(lam[None], b) else linear_scan(lam, b, h0)
        Hc = torch.cat([h0[None], hs])  # [K + 1, B, N]
        re, im = Hc.real.contiguous(), Hc.imag.contiguous()  # planar: every row a contiguous [N] (the partials read them)
        rows = lambda R: R.view(K * B, N)  # noqa: E731
        xr = x.reshape(K * B, -1)
        D = k["D"]
        y = torch.addmm(xr * D if D.dim() == 1 else xr @ D.t(), torch.view_as_real(Hc[1:]).reshape(K * B, 2 * N),
                        k["Cx"].t())
        return (type(state)(rows(re[:-1]), rows(im[:-1])), type(state)(re[-1], im[-1]),
                type(state)(rows(re[1:]), rows(im[1:])), y)

    def row_kernel(self, dtype, B: int):
        """The compiled stream step (:func:`spikerec.kernels.lru_online.lru_rows`) and its constants."""
        if lru_online.lru_rows is None:
            return None
        consts = lru_online.lru_consts(self.cell.params(), dtype)
        O = self.cell.C_re.shape[0]
        z = lambda *s: np.zeros(s, dtype=consts[1].dtype)  # noqa: E731
        return lru_online.lru_rows, consts + (z(B, 2 * self.cell.B_re.shape[0]), z(B, O), z(B, O), z(B, O))


neurons.register_backend("lru", "online_partials (LRUTrace.partials)", LRUTrace.partials,
                         test="tests/test_online_partials.py::test_hand_written_partials_equal_derived_ones")
neurons.register_backend("lru", "online_spatial (LRUTrace.errors)", LRUTrace.errors,
                         test="tests/test_online_compiled.py::test_compiled_stream_equals_reference_stream")
neurons.register_backend("lru", "online_block_scan (LRUTrace.scan_block)", LRUTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")
neurons.register_backend("lru", "online_rows (the compiled step of the step window, LRUTrace.row_kernel)", LRUTrace.row_kernel,
                         test="tests/test_online_partials.py::test_row_kernels_with_the_layers_constants_equal_the_neuron_steps")

"""Exact RTRL traces of one LRU layer (digest 003 §3.4, Eq. 4.6-4.7 / B.5-B.18; digest 001 §6.1).

    h_t = lam * h_{t-1} + gamma * (B x_t),   lam = exp(-exp(nu_log) + i exp(theta_log)),  gamma = exp(gamma_log)

The complex state is handled as the real pair ``s = (Re h, Im h)`` (split Re/Im, as the
kernels do), with ``J = [[Re lam, -Im lam], [Im lam, Re lam]]`` (multiplication by lam).
Traces (all zero at t = 0; h holomorphic in lam and B):

    s^lam_t = lam s^lam_{t-1} + h_{t-1}                  -> eps^{nu_log} = (d lam/d nu_log) s^lam, d lam/d nu_log = -e^{nu_log} lam
                                                           eps^{theta_log} = (i e^{theta_log} lam) s^lam
    eps^{gamma_log}_t = lam eps_{t-1} + gamma B x_t        (= h_t, the identity s^gamma = h / gamma)
    s^B_t[j, i] = lam_j s^B_{t-1}[j, i] + gamma_j x_t[i]   -> eps^{B_re} = s^B, eps^{B_im} = i s^B

In the PyTorch convention (``g = dl/dRe h + i dl/dIm h``) a real parameter ``p`` gets
``sum_t Re[conj(g_t) eps^p_t]`` (digest 003 §3.4.4), which is the real dot product of the
pairs used by the engine. ``C`` and ``D`` act in the output map only and get their spatial
gradient from autograd.
"""
from __future__ import annotations

import torch

from .traces_base import LayerTrace, Partials

__all__ = ["LRUTrace"]

# multiplication by i on (re, im) pairs: i (a + ib) = -b + ia
_ROT = torch.tensor([[0.0, -1.0], [1.0, 0.0]])


def _lam(cell) -> torch.Tensor:
    """Complex eigenvalues ``lam [N]`` (detached)."""
    return cell.lam().detach()


def _gamma(cell) -> torch.Tensor:
    """Input normalisation ``gamma [N]`` (detached); ``exp(gamma_log)``."""
    if hasattr(cell, "gamma") and callable(cell.gamma):
        g = cell.gamma()
    else:
        g = cell.gamma_log.exp()
    g = torch.as_tensor(g)
    return g.detach().real if g.is_complex() else g.detach()


class LRUTrace(LayerTrace):
    kind = "LRU"
    k = 2
    input_params = ("B_re", "B_im", "gamma_log")

    def __init__(self, cell, rule):
        super().__init__(cell, rule)
        p = cell.B_re
        self.shared = {"B_im": ("B_re", _ROT.to(dtype=p.dtype, device=p.device))}

    def state_params(self):
        return ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")

    def step(self, x, prev):
        c = self.cell
        lam = _lam(c)
        gam = _gamma(c)
        lr, li = lam.real.to(x.dtype), lam.imag.to(x.dtype)
        u_re = gam * (x @ c.B_re.detach().t())
        u_im = gam * (x @ c.B_im.detach().t())
        h_re = lr * prev.x_re - li * prev.x_im + u_re
        h_im = lr * prev.x_im + li * prev.x_re + u_im
        return type(prev)(h_re, h_im)

    def partials(self, x, prev, new):
        c = self.cell
        lam = _lam(c)
        gam = _gamma(c).to(x.dtype)
        lr, li = lam.real.to(x.dtype), lam.imag.to(x.dtype)
        J = torch.stack([torch.stack([lr, -li], -1), torch.stack([li, lr], -1)], -2)[None]  # [1, N, 2, 2]
        hr, hi = prev.x_re, prev.x_im
        vec = {}
        if "nu_log" in self.traced:
            w = -torch.exp(c.nu_log.detach()) * lam  # d lam / d nu_log
            vec["nu_log"] = torch.stack([w.real * hr - w.imag * hi, w.real * hi + w.imag * hr], -1).to(x.dtype)
        if "theta_log" in self.traced:
            w = 1j * torch.exp(c.theta_log.detach()) * lam
            vec["theta_log"] = torch.stack([w.real * hr - w.imag * hi, w.real * hi + w.imag * hr], -1).to(x.dtype)
        if "gamma_log" in self.traced:
            # d h_t / d gamma_log |imm = gamma B x_t = h_t - lam h_{t-1}
            vec["gamma_log"] = torch.stack([new.x_re - (lr * hr - li * hi), new.x_im - (lr * hi + li * hr)], -1)
        cvec = torch.stack([gam, torch.zeros_like(gam)], -1).expand(x.shape[0], -1, -1)
        return Partials(J, vec, {"B_re": (cvec, x)})

    def mat_readers(self, P):
        out = []
        if "B_re" in self.traced:
            out.append(("B_re", "B_re", None))
        if "B_im" in self.traced:
            out.append(("B_re", "B_im", self.shared["B_im"][1]))
        return out

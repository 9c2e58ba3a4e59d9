"""Exact RTRL traces of one LRU layer (Zucchet et al. 2023; thesis Zucchet 2025, Sec. 4.3.1,
Eq. 4.6-4.7 and App. B.1.2, Eq. B.5-B.18; the LRU of Orvieto et al. 2023, Sec. 3).

    h_t = lam * h_{t-1} + gamma * (B x_t),   lam = exp(-exp(nu_log) + i exp(theta_log)),  gamma = exp(gamma_log)

The complex state is handled as the real pair ``s = (Re h, Im h)`` (split Re/Im, as the
kernels do), with ``J = [[Re lam, -Im lam], [Im lam, Re lam]]`` (multiplication by lam).
Traces (all zero at t = 0; h holomorphic in lam and B):

    s^lam_t = lam s^lam_{t-1} + h_{t-1}                  -> eps^{nu_log} = (d lam/d nu_log) s^lam, d lam/d nu_log = -e^{nu_log} lam
                                                           eps^{theta_log} = (i e^{theta_log} lam) s^lam
    eps^{gamma_log}_t = lam eps_{t-1} + gamma B x_t        (= h_t, the identity s^gamma = h / gamma)
    s^B_t[j, i] = lam_j s^B_{t-1}[j, i] + gamma_j x_t[i]   -> eps^{B_re} = s^B, eps^{B_im} = i s^B

In the PyTorch convention (``g = dl/dRe h + i dl/dIm h``) a real parameter ``p`` gets
``sum_t Re[conj(g_t) eps^p_t]`` (PyTorch's complex-gradient convention), which is the real dot product of the
pairs used by the engine. ``C`` and ``D`` act in the output map only and get their spatial
gradient from autograd.
"""
from __future__ import annotations

import numpy as np
import torch

from ... import neurons
from ...kernels import scan_numba
from ...neurons import lru as _lru
from ...scan import linear_scan
from ...kernels.lru_online import (lru_block_scan_numba, lru_block_traces_numba, lru_matrix_carry_numba,
                                   lru_reverse_filter_numba, lru_trace_step_numba)
from ...kernels.trace_numba import compiled_cpu, compiled_dtype
from .traces_base import _STACK, LayerTrace, Partials

__all__ = ["LRUTrace"]

# multiplication by i on (re, im) pairs: i (a + ib) = -b + ia
_ROT = torch.tensor([[0.0, -1.0], [1.0, 0.0]])


def _scan(lam: torch.Tensor, b: torch.Tensor, x0=None) -> torch.Tensor:
    """``h_k = lam h_{k-1} + b_k`` over ``b [K, B, N]`` (complex, no autograd): the compiled scan
    called directly where it applies (none of :func:`spikerec.scan.linear_scan`'s dispatch),
    else ``linear_scan``."""
    if scan_numba.supported(lam[None], b):
        return scan_numba.scan_forward(lam[None], b, x0)
    return linear_scan(lam, b, x0)


def _reverse_scan(lam: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``gh_k = g_k + conj(lam) gh_{k+1}`` over ``g [K, B, N]`` (complex, no autograd): the
    compiled reverse pass of the scan where it applies, else a flipped ``linear_scan``."""
    if scan_numba.supported(lam[None], g):
        return scan_numba.scan_backward(lam[None], g, g, None, False)[1]
    return linear_scan(lam.conj(), g.flip(0)).flip(0)


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

    def make_consts(self, dtype):
        """Per-sequence constants: ``lam`` parts, ``gamma``, the stacked input matrix, ``J``,
        ``d lam / d nu_log`` and ``d lam / d theta_log`` (parameters are fixed within a sequence)."""
        c = self.cell
        lam = _lam(c)
        gam = _gamma(c).to(dtype)
        lr, li = lam.real.to(dtype), lam.imag.to(dtype)
        N = gam.shape[0]
        gam2 = torch.cat([gam, gam])
        Bt = torch.cat([c.B_re.detach(), c.B_im.detach()]).t().to(dtype)  # one GEMM for Re and Im: x @ [B_re; B_im]^T
        out = {
            "lr": lr, "li": li, "lam": torch.complex(lr, li), "gam": gam, "N": N, "gam2": gam2, "Bt": Bt,
            "Bt_gamma": (Bt * gam2).contiguous(),  # [gamma B_re^T | gamma B_im^T]: the compiled paths' input matrix
            "J": torch.stack([torch.stack([lr, -li], -1), torch.stack([li, lr], -1)], -2)[None],  # [1, N, 2, 2]
            "cvec": torch.stack([gam, torch.zeros_like(gam)], -1),
        }
        if "nu_log" in self.traced:
            w = -torch.exp(c.nu_log.detach()) * lam  # d lam / d nu_log
            out["w_nu"] = (w.real, w.imag)
        if "theta_log" in self.traced:
            w = 1j * torch.exp(c.theta_log.detach()) * lam
            out["w_theta"] = (w.real, w.imag)
        return out

    def step(self, x, prev):
        """The neuron's one step (:func:`spikerec.neurons.lru.step`) with detached parameters."""
        p = type(self.cell.params())(*(v.detach() for v in self.cell.params()))
        return _lru.step(p, prev, x)[1]

    def scan_block(self, x, state, with_new: bool = False, with_out: bool = False):
        """The states before each of the K steps of ``x [K, B, H]`` as one state with ``[K*B, N]``
        fields, and the final state, by the parallel scan of ``h_t = lam h_{t-1} + gamma B x_t``
        (:func:`spikerec.scan.linear_scan`): the same values as a loop of :meth:`step`. With
        ``with_new``, also the states after each step (``[K*B, N]`` fields; what :meth:`step`
        gives from the previous ones, here without a second input projection); ``with_out`` adds
        ``None`` (the output map ``y = C h + D u`` is the caller's)."""
        k = self.consts(x.dtype)
        N = k["N"]
        with_new = with_new or with_out
        if self._compiled_block(x):
            K, B = x.shape[0], x.shape[1]
            kn = self._np_base(k)
            u = torch.mm(x.reshape(K * B, -1), k["Bt_gamma"]).view(K, B, 2 * N)
            pr, pi, nr, ni = lru_block_scan_numba(u, kn["lr"], kn["li"], state.x_re, state.x_im)
            prev = type(state)(pr.view(K * B, N), pi.view(K * B, N))
            last = type(state)(nr[-1].clone(), ni[-1].clone())
            if not with_new:
                return prev, last
            new = type(state)(nr.view(K * B, N), ni.view(K * B, N))
            return (prev, last, new, None) if with_out else (prev, last, new)
        u = k["gam2"] * (x @ k["Bt"])
        hs = _scan(k["lam"], torch.complex(u[..., :N], u[..., N:]),
                   torch.complex(state.x_re, state.x_im))
        K, B = x.shape[0], x.shape[1]
        re = torch.cat([state.x_re[None], hs.real[:-1]]).reshape(K * B, N)
        im = torch.cat([state.x_im[None], hs.imag[:-1]]).reshape(K * B, N)
        last = type(state)(hs[-1].real.contiguous(), hs[-1].imag.contiguous())
        if not with_new:
            return type(state)(re, im), last
        new = type(state)(hs.real.reshape(K * B, N), hs.imag.reshape(K * B, N))
        return (type(state)(re, im), last, new, None) if with_out else (type(state)(re, im), last, new)

    @staticmethod
    def _np_base(k):
        """Numpy views of the per-sequence constants the compiled passes take (cached with the
        constants): ``lr``, ``li``, ``gam`` and the (Re, Im) rows ``W`` of ``d lam / d nu_log``
        and ``d lam / d theta_log``."""
        out = k.get("np")
        if out is None:
            zero = torch.zeros_like(k["lr"])
            W = torch.stack([torch.stack(k.get(key, (zero, zero))) for key in ("w_nu", "w_theta")]).contiguous()
            out = k["np"] = {"lr": k["lr"].contiguous().numpy(), "li": k["li"].contiguous().numpy(),
                             "gam": k["gam"].contiguous().numpy(), "W": W.numpy()}
        return out

    @staticmethod
    def _lam_powers(k, K):
        """``(lam^(K-1-k) for k = 0..K-1 [K, N], lam^K [N])``, complex; cached per block length."""
        pw = k.get(("lam_powers", K))
        if pw is None:  # the running product 1, lam, lam^2, ..., lam^K
            lam = k["lam"]
            p = torch.cumprod(torch.cat([torch.ones_like(lam)[None], lam.expand(K, -1)]), 0)
            pw = k[("lam_powers", K)] = (p[:K].flip(0), p[K])
        return pw

    def _np_consts(self, k, K):
        """:meth:`_np_base` with the block length's powers: ``lam^K`` as ``(Re, Im)`` and
        ``PK [K, N, 2]`` (``lam^(K-1-k)``)."""
        out = k.get(("np", K))
        if out is None:
            PK, lamK = self._lam_powers(k, K)
            out = k[("np", K)] = {**self._np_base(k),
                                  "lamK": (lamK.real.contiguous().numpy(), lamK.imag.contiguous().numpy()),
                                  "PK": torch.view_as_real(PK).contiguous().numpy()}
        return out

    def _compiled_block(self, x) -> bool:
        """Whether the block's scan and sums run as compiled loops (:mod:`spikerec.kernels.lru_online`): CPU
        float32/float64 tensors of the parameters' dtype, numba installed."""
        return compiled_cpu(x) and self.cell.B_re.dtype == x.dtype and not x.requires_grad

    def reverse_filter(self, G):
        """``gh_k = g_k + J^T gh_{k+1}`` over a block, ``G [K, B, N, 2]``: ``J^T`` is the
        multiplication by ``conj(lam)`` on (Re, Im) pairs, so this is a reverse linear scan."""
        return torch.view_as_real(self._reverse_filter_complex(G))

    def _reverse_filter_complex(self, G):
        """:meth:`reverse_filter` as a complex ``[K, B, N]`` tensor: one compiled pass on (Re, Im)
        pairs where the block's compiled passes apply (:func:`spikerec.kernels.lru_online.lru_reverse_filter_numba`),
        else the reverse scan."""
        k = self.consts(G.dtype)
        if self._compiled_block(G):
            return torch.view_as_complex(lru_reverse_filter_numba(G, k["lr"], k["li"]))
        return _reverse_scan(torch.complex(k["lr"], k["li"]), torch.view_as_complex(G.contiguous()))

    def block_contract(self, ts, x, prev, new, G, carry: bool, K: int, B: int) -> None:
        """The chunked block's contraction (the same sums as :func:`.traces_base.chunk_contract`
        on :meth:`partials`) with the per-neuron traces in closed form. With ``gh`` the reverse-
        filtered error, ``hp`` the previous states and ``u = gamma B x = h - lam hp`` (complex,
        ``[K, B, N]``), every per-neuron immediate partial is ``w hp`` (``w = d lam / d p``) or ``u``:

            dL/dp += Re[w sum_{k,b} conj(gh_k) hp_k]  (nu_log, theta_log);  Re[sum_{k,b} conj(gh_k) u_k]  (gamma_log)
            boundary with the carried trace e:         Re[lam sum_b conj(gh_0) e]
            carried trace:  e <- w sum_k lam^(K-1-k) hp_k + lam^K e   (u_k in place of w hp_k for gamma_log)

        so no ``[K, B, N, 2, m]`` products are formed. ``x``, ``prev``, ``new`` hold ``[K*B]``
        rows; ``G [K, B, N, 2]`` or ``None``. The input-matrix traces: :meth:`_block_matrix`."""
        k = self.consts(x.dtype)
        use_J = self.use_J()
        names = [n for n in ("nu_log", "theta_log", "gamma_log") if n in self.traced]
        N = k["N"]
        lam = k["lam"]
        PK, lamK = self._lam_powers(k, K)
        need_u = "gamma_log" in names
        compiled = self._compiled_block(x)
        if compiled:  # the reverse filter, the block sums and the traces' part in one compiled call
            kn = self._np_consts(k, K)
            kinds = kn.get("kinds")
            if kinds is None:
                kinds = kn["kinds"] = np.asarray([("nu_log", "theta_log", "gamma_log").index(n) for n in names])
            carry_v = carry and use_J  # without J (trunc1) no trace is carried, so no boundary term is formed
            gh, dG, E = lru_block_traces_numba(
                G, use_J, prev.x_re.reshape(K, B, N), prev.x_im.reshape(K, B, N), new.x_re.reshape(K, B, N),
                new.x_im.reshape(K, B, N), kn["lr"], kn["li"], kn["PK"] if carry_v else None,
                "nu_log" in names or "theta_log" in names, need_u, kn["W"], kinds if names else None,
                ts.carried(names) if use_J else [None] * len(names), kn["lamK"])
            ghc = None if gh is None else torch.view_as_complex(gh)
            self._block_matrix(ts, k, x, ghc, carry_v, use_J, PK, lamK, lam, K, B, N, compiled)
            if dG is not None:
                for j, n in enumerate(names):
                    ts.add(n, dG[j])
            if E is not None:
                ts.set_carried(names, E)
            return
        ghc = None  # the reverse-filtered error, complex [K, B, N]
        if G is not None:
            ghc = self._reverse_filter_complex(G) if use_J else torch.view_as_complex(G.contiguous())
        self._block_matrix(ts, k, x, ghc, carry and use_J, use_J, PK, lamK, lam, K, B, N, compiled)
        if not names:
            return
        w = {n: torch.complex(*k[key]) for n, key in (("nu_log", "w_nu"), ("theta_log", "w_theta")) if n in names}
        carry = carry and use_J
        hp = torch.complex(prev.x_re, prev.x_im)  # [K*B, N]
        u = torch.complex(new.x_re, new.x_im) - lam * hp
        ghf = None if ghc is None else ghc.reshape(K * B, N).conj_physical()
        S_h = (ghf * hp).sum(0) if ghf is not None and w else None
        S_u = (ghf * u).sum(0) if ghf is not None and need_u else None
        Q_h = (PK[:, None] * hp.reshape(K, B, N)).sum(0) if carry and w else None  # [B, N]
        Q_u = (PK[:, None] * u.reshape(K, B, N)).sum(0) if carry and need_u else None
        if ghc is not None:
            for n, wn in w.items():
                ts.add(n, (wn * S_h).real)
            if need_u:
                ts.add("gamma_log", S_u.real.clone())
            if use_J:
                b0 = lam * ghc[0].conj_physical()  # [B, N]
                for n in names:
                    e = ts.vec.get(n)
                    if e is not None:
                        ts.add(n, (b0 * torch.complex(e[..., 0], e[..., 1])).sum(0).real)
        if not carry:
            return
        for n in names:
            q = w[n] * Q_h if n in w else Q_u
            e = ts.vec.get(n)
            if e is not None:
                q = q + lamK * torch.complex(e[..., 0], e[..., 1])
            ts.vec[n] = torch.stack([q.real, q.imag], -1)

    def _block_matrix(self, ts, k, x, ghc, carry, use_J, PK, lamK, lam, K, B, N, compiled) -> None:
        """The input-matrix part of :meth:`block_contract`. The immediate partial of ``B_re[j, i]``
        is ``gamma_j x_i`` (of ``B_im``: ``i gamma_j x_i``), so with the carried complex trace
        ``e [N, B, H]`` (stored as ``[N, B, 2, H]``):

            dB_re += gamma * (Re gh)^T X,   dB_im += gamma * (Im gh)^T X     (X: the block's inputs [K*B, H])
            boundary, z = lam conj(gh_0):   dB_re += sum_b Re(z e),  dB_im -= sum_b Im(z e)
            carried trace:                  e <- gamma sum_k lam^(K-1-k) x_k + lam^K e   (two GEMMs)

        ``compiled``: :meth:`_compiled_block` of the block (tested once by the caller)."""
        names = [n for n in ("B_re", "B_im") if n in self.traced]
        if not names:
            return
        gam = k["gam"]
        H = x.shape[-1]
        e = ts.mat.get("B_re")
        S = None  # the block's sums (Re gh, Im gh)^T X, [N, 2, H]
        if ghc is not None:  # both parts in one GEMM: rows (n, Re/Im) of the interleaved pairs
            S = (torch.view_as_real(ghc).reshape(K * B, 2 * N).t() @ x).view(N, 2, -1)
        if compiled:  # gamma S, the boundary term and the carry in one compiled pass over e
            self._block_matrix_compiled(ts, k, x, S, None if ghc is None or not use_J else ghc[0], carry, PK, lamK,
                                        e, names, K, B, N, H)
            return
        if S is not None:
            both = S.mul_(gam[:, None, None])
            for n, f in (("B_re", 0), ("B_im", 1)):
                if n in names:
                    ts.add(n, both[:, f])
            if use_J and e is not None:
                z = (lam * ghc[0].conj_physical()).t()  # lam conj(gh0), [N, B]
                zr, zi = z.real, z.imag
                # per neuron, one small product over (b, Re/Im): rows (Re z, -Im z) for B_re and
                # (-Im z, -Re z) for B_im against e's rows (Re e_b, Im e_b)
                rows = torch.stack([torch.stack([zr, -zi], -1), torch.stack([-zi, -zr], -1)], 1)  # [N, 2, B, 2]
                both0 = torch.bmm(rows.reshape(N, 2, 2 * B), e.reshape(N, 2 * B, H))  # [N, 2, H]
                for n, f in (("B_re", 0), ("B_im", 1)):
                    if n in names:
                        ts.add(n, both0[:, f])
        if not carry:
            return
        q = (self._carry_rows(k, x, PK, K, N) @ x.reshape(K, B * H)).view(N, 2, B, H).mul_(gam[:, None, None, None]).transpose(1, 2).contiguous()  # [N, B, 2, H]
        if e is not None:  # + lam^K e on (Re, Im) pairs
            er, ei = e[:, :, 0], e[:, :, 1]
            Lr, Li = lamK.real[:, None, None], lamK.imag[:, None, None]
            q[:, :, 0].addcmul_(Lr, er).addcmul_(Li, ei, value=-1.0)
            q[:, :, 1].addcmul_(Lr, ei).addcmul_(Li, er)
        ts.mat["B_re"] = q

    @staticmethod
    def _carry_rows(k, x, PK, K, N):
        """The (Re, Im) parts of ``lam^(K-1-k)`` side by side, ``[2N, K]`` (one GEMM with the
        block's inputs gives both parts of ``sum_k lam^(K-1-k) x_k``); cached per block length."""
        pk = k.get(("PK_rows", K))
        if pk is None:
            pk = k[("PK_rows", K)] = torch.view_as_real(PK).reshape(K, 2 * N).t().contiguous()  # [2N, K]
        return pk

    def _block_matrix_compiled(self, ts, k, x, S, gh0, carry, PK, lamK, e, names, K, B, N, H) -> None:
        """:meth:`_block_matrix` from the block's sums ``S`` (or ``None``) in one compiled pass
        over the carried trace ``e`` (:func:`spikerec.kernels.lru_online.lru_matrix_carry_numba`): the
        gradient ``gamma S`` plus the boundary term (with ``gh0``, the first step's filtered
        error), and the carry; the same formulas."""
        q = (self._carry_rows(k, x, PK, K, N) @ x.reshape(K, B * H)).view(N, 2, B, H) if carry else None
        kn = self._np_consts(k, K)
        new_e, grad = lru_matrix_carry_numba(q, kn["gam"], kn["lamK"], e, gh0, kn["lr"], kn["li"], S)
        if grad is not None:
            for n, f in (("B_re", 0), ("B_im", 1)):
                if n in names:
                    ts.add(n, grad[:, f])
        if carry:
            ts.mat["B_re"] = new_e

    def partials(self, x, prev, new):
        k = self.consts(x.dtype)
        lr, li = k["lr"], k["li"]
        hr, hi = prev.x_re, prev.x_im
        vec = {}
        for name, key in (("nu_log", "w_nu"), ("theta_log", "w_theta")):
            if key in k:
                wr, wi = k[key]
                vec[name] = torch.stack([wr * hr - wi * hi, wr * hi + wi * hr], -1).to(x.dtype)
        if "gamma_log" in self.traced:
            # d h_t / d gamma_log |imm = gamma B x_t = h_t - lam h_{t-1}
            vec["gamma_log"] = torch.stack([new.x_re - (lr * hr - li * hi), new.x_im - (lr * hi + li * hr)], -1)
        cvec = k["cvec"].expand(x.shape[0], -1, -1)
        return Partials(k["J"], vec, {"B_re": (cvec, x)}, c_zero=(1,))

    def compiled_trace_ready(self, dtype, device) -> bool:
        """Whether :meth:`compiled_trace_step` applies: the ``full``/``snap1`` rule, numba
        installed, CPU tensors of the parameters' float dtype."""
        p = self.cell.B_re
        return compiled_dtype(dtype, device) and self.use_J() and p.dtype == dtype and p.device.type == "cpu"

    def compiled_trace_setup(self, dtype):
        """The compiled trace step's per-sequence constants: ``(cols, names, wnu, wth, (Re lam,
        Im lam), gam)`` (``cols``: the stacked per-neuron traces, 0 ``nu_log``, 1 ``theta_log``,
        2 ``gamma_log``)."""
        k = self.consts(dtype)
        f = k.get("fused")
        if f is None:
            kinds = [j for j, (name, key) in enumerate((("nu_log", "w_nu"), ("theta_log", "w_theta"), ("gamma_log", None)))
                     if (key in k if key else name in self.traced)]
            names = [("nu_log", "theta_log", "gamma_log")[j] for j in kinds]
            wnu = torch.stack(k["w_nu"], -1).to(dtype).contiguous() if "w_nu" in k else None
            wth = torch.stack(k["w_theta"], -1).to(dtype).contiguous() if "w_theta" in k else None
            f = k["fused"] = (np.asarray(kinds, dtype=np.int64), names, wnu, wth,
                              (k["lr"].contiguous(), k["li"].contiguous()), k["gam"].contiguous())
        return f

    def compiled_trace_step(self, ts, x, prev, new, g) -> None:
        """One stream step of every trace of this layer and its contraction with ``g [B, N, 2]``
        (or ``None``) as one compiled pass (:func:`spikerec.kernels.lru_online.lru_trace_step_numba`); the same
        result as ``stream_step(ts, self.partials(x, prev, new), g)``."""
        cols, names, wnu, wth, lam, gam = self.compiled_trace_setup(x.dtype)
        B, N = prev.x_re.shape
        ev = ts.vec.get(_STACK)
        if ev is None and names:
            ev = ts.vec[_STACK] = torch.zeros((B, N, 2, len(names)), dtype=x.dtype)
        mat = "B_re" in self.traced or "B_im" in self.traced
        em = ts.mat.get("B_re") if mat else None
        if mat and em is None:
            em = ts.mat["B_re"] = torch.zeros((N, B, 2, x.shape[1]), dtype=x.dtype)
        G = {}
        if g is not None:
            for name in names + [n for n in ("B_re", "B_im") if n in self.traced]:
                acc = ts.G.get(name)
                if acc is None:
                    acc = ts.G[name] = torch.zeros_like(self.params[name], memory_format=torch.contiguous_format)
                elif not acc.is_contiguous():
                    acc = ts.G[name] = acc.contiguous()
                G[name] = acc
        G_vec = [G.get(n) for n in ("nu_log", "theta_log", "gamma_log")]
        if ev is None:
            ev = torch.zeros((B, N, 2, 0), dtype=x.dtype)
        c = lambda t: t if t.is_contiguous() else t.contiguous()  # noqa: E731
        lru_trace_step_numba(type(prev)(c(prev.x_re), c(prev.x_im)), type(new)(c(new.x_re), c(new.x_im)), c(x),
                             None if g is None else c(g), lam, gam, wnu, wth, cols, ev, em, G_vec,
                             G.get("B_re"), G.get("B_im"))

    def mat_readers(self, P):
        out = []
        if "B_re" in self.traced:
            out.append(("B_re", "B_re", None))
        if "B_im" in self.traced:
            out.append(("B_re", "B_im", self.shared["B_im"][1]))
        return out


neurons.register_backend("lru", "online_block (compiled chunked block, LRUTrace.block_contract)", LRUTrace.block_contract,
                         test="tests/test_online_partials.py::test_compiled_block_equals_the_derived_recursion")
neurons.register_backend("lru", "online_block_scan (compiled block scan, LRUTrace.scan_block)", LRUTrace.scan_block,
                         test="tests/test_online_partials.py::test_compiled_block_scan_equals_the_step_loop")

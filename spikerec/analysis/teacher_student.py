"""Linear teacher-student task of Zucchet & Orvieto (2024) §4.2 (App. A.1, C).

A linear teacher ``h_t = A h_{t-1} + B x_t``, ``y_t = C h_t + D x_t`` (n = 10, scalar input and
output, white Gaussian inputs, ``h_0 = 0``) whose eigenvalues are pushed towards the unit circle
(eq. 15): ``lambda <- (nu0 + (1 - nu0) tanh|lambda|) exp(i angle(lambda) theta0 / pi)``. Students:

* :class:`DenseLinearRNN`, a dense linear RNN (the code's ``min_nu = 0`` initialisation);
* :class:`ComplexDiagonalRNN`, the complex diagonal family of the Fig. 3B ablation: ``reim``
  parametrisation without normalisation (cRNN), or ``exp`` (``lambda = exp(-exp nu) exp(i exp theta)``)
  with a learned ``gamma`` initialised at ``sqrt(1 - |lambda|^2)`` (the LRU form), LRU ring
  initialisation ``|lambda|^2 ~ U(r_min^2, 1)``;
* or any cell of the protocol (e.g. ``spikerec.layers.lru.LRU``) through :func:`train_student`.

Loss: ``0.5 * mean((y_hat - y)^2)`` over batch and time (the authors' code's convention,
``docs/decisions.md``, analysis 3);
Adam with a cosine learning-rate decay; fresh batches every step.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .. import neurons
from ..scan import linear_scan

__all__ = ["eigen_init", "LinearTeacher", "DenseLinearRNN", "ComplexDiagonalRNN", "train_student"]


def eigen_init(n: int, nu0: float, theta0: float = math.pi, *, max_nu: float = 1.0,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Real ``[n, n]`` matrix with eigenvalues remapped by eq. 15 (``A_ij ~ N(0, 1/n)`` first).

    Moduli become ``nu0 + (max_nu - nu0) tanh|lambda|`` in ``[nu0, max_nu)`` and angles are scaled
    by ``theta0 / pi``; conjugate pairs stay conjugate so the result is real.
    """
    if not 0 <= nu0 < max_nu <= 1:
        raise ValueError(f"nu0: expected 0 <= nu0 < max_nu <= 1, got nu0={nu0}, max_nu={max_nu}")
    A = torch.randn(n, n, generator=generator, dtype=torch.float64) / math.sqrt(n)
    lam, P = np.linalg.eig(A.numpy())
    mod = nu0 + (max_nu - nu0) * np.tanh(np.abs(lam))
    lam = mod * np.exp(1j * np.angle(lam) * theta0 / math.pi)
    out = np.real(P @ np.diag(lam) @ np.linalg.inv(P))
    return torch.as_tensor(out, dtype=torch.float64)


class LinearTeacher:
    """The teacher linear system (float64); :meth:`sample` returns ``(x [T, B, 1], y [T, B, 1])``."""

    def __init__(self, n: int = 10, nu0: float = 0.9, theta0: float = math.pi, *, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.n, self.nu0 = int(n), float(nu0)
        self.A = eigen_init(n, nu0, theta0, generator=g)
        self.B = torch.randn(n, 1, generator=g, dtype=torch.float64)
        self.C = torch.randn(1, n, generator=g, dtype=torch.float64) / math.sqrt(n)
        self.D = torch.randn(1, 1, generator=g, dtype=torch.float64)
        self._gen = torch.Generator().manual_seed(seed + 12345)

    def eigenvalues(self) -> np.ndarray:
        return np.linalg.eigvals(self.A.numpy())

    def sample(self, batch: int, steps: int, dtype=torch.float32):
        """Fresh white-noise inputs and the teacher's outputs (diagonalised, one parallel scan)."""
        x = torch.randn(steps, batch, 1, generator=self._gen, dtype=torch.float64)
        lam, P = np.linalg.eig(self.A.numpy())
        P = torch.as_tensor(P)
        lam = torch.as_tensor(lam)
        u = x.to(torch.complex128) @ torch.linalg.solve(P, self.B.to(torch.complex128)).t()
        hd = linear_scan(lam.expand_as(u), u)
        y = (hd @ (self.C.to(torch.complex128) @ P).t()).real + x @ self.D.t()
        return x.to(dtype), y.to(dtype)


class DenseLinearRNN(nn.Module):
    """Dense linear RNN student ``h_t = A h_{t-1} + B x_t``, ``y_t = C h_t + D x_t``; ``A`` from
    :func:`eigen_init` with ``nu0`` (the code uses 0), ``B, C, D`` LeCun-normal."""

    def __init__(self, n: int = 64, *, nu0: float = 0.0, d_in: int = 1, d_out: int = 1, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.A = nn.Parameter(eigen_init(n, nu0, generator=g).float())
        self.B = nn.Parameter(torch.randn(n, d_in, generator=g) / math.sqrt(d_in))
        self.C = nn.Parameter(torch.randn(d_out, n, generator=g) / math.sqrt(n))
        self.D = nn.Parameter(torch.randn(d_out, d_in, generator=g) / math.sqrt(d_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[1], self.A.shape[0])
        u = x @ self.B.t()
        hs = []
        for t in range(x.shape[0]):
            h = h @ self.A.t() + u[t]
            hs.append(h)
        return torch.stack(hs) @ self.C.t() + x @ self.D.t()


class ComplexDiagonalRNN(nn.Module):
    """Complex diagonal linear RNN ``h_t = lambda * h_{t-1} + gamma * (B x_t)``, ``y = Re(C h) + D x``.

    ``param="reim"``: ``lambda = a + i b`` learned directly, ``gamma = 1`` (the cRNN);
    ``param="exp"``: ``lambda = exp(-exp(nu)) exp(i exp(theta))`` and, with ``gamma="learned"``,
    ``gamma = exp(g)`` initialised at ``sqrt(1 - |lambda|^2)`` (§3.1, App. A.2).
    """

    def __init__(self, n: int = 64, *, r_min: float = 0.0, r_max: float = 1.0, max_phase: float = 2 * math.pi,
                 param: str = "exp", gamma: str = "learned", d_in: int = 1, d_out: int = 1, seed: int = 0):
        super().__init__()
        if param not in ("reim", "exp"):
            raise ValueError(f"param: expected 'reim' or 'exp', got {param!r}")
        if gamma not in ("none", "learned"):
            raise ValueError(f"gamma: expected 'none' or 'learned', got {gamma!r}")
        if not 0 <= r_min < r_max <= 1:
            raise ValueError(f"r_min/r_max: expected 0 <= r_min < r_max <= 1, got {r_min}, {r_max}")
        g = torch.Generator().manual_seed(seed)
        u1, u2 = torch.rand(n, generator=g), torch.rand(n, generator=g)
        mod = torch.sqrt(u1 * (r_max**2 - r_min**2) + r_min**2).clamp(max=1 - 1e-6)
        ang = u2 * max_phase
        self.param, self.gamma_mode = param, gamma
        if param == "reim":
            self.lam_re = nn.Parameter(mod * torch.cos(ang))
            self.lam_im = nn.Parameter(mod * torch.sin(ang))
        else:
            self.nu_log = nn.Parameter(torch.log(-torch.log(mod)))
            self.theta_log = nn.Parameter(torch.log(ang.clamp(min=1e-4)))
        self.gamma_log = nn.Parameter(0.5 * torch.log(1 - mod**2)) if gamma == "learned" else None
        self.B_re = nn.Parameter(torch.randn(n, d_in, generator=g) / math.sqrt(2 * d_in))
        self.B_im = nn.Parameter(torch.randn(n, d_in, generator=g) / math.sqrt(2 * d_in))
        self.C_re = nn.Parameter(torch.randn(d_out, n, generator=g) / math.sqrt(n))
        self.C_im = nn.Parameter(torch.randn(d_out, n, generator=g) / math.sqrt(n))
        self.D = nn.Parameter(torch.randn(d_out, d_in, generator=g) / math.sqrt(d_in))

    def lam(self) -> torch.Tensor:
        if self.param == "reim":
            return torch.complex(self.lam_re, self.lam_im)
        return torch.exp(-torch.exp(self.nu_log)) * torch.exp(1j * torch.exp(self.theta_log))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lam = self.lam()
        u = torch.complex(x @ self.B_re.t(), x @ self.B_im.t())
        if self.gamma_log is not None:
            u = u * torch.exp(self.gamma_log)
        h = linear_scan(lam.expand_as(u), u)
        C = torch.complex(self.C_re, self.C_im)
        return (h @ C.t()).real + x @ self.D.t()


neurons.register_backend("lru", "analysis.teacher_student.ComplexDiagonalRNN.forward (param='exp')",
                         ComplexDiagonalRNN.forward,
                         test="tests/test_lru.py::test_complex_diagonal_rnn_equals_the_lru_layer")


def train_student(student: nn.Module, teacher: LinearTeacher, *, steps: int = 1000, lr: float = 1e-3,
                  batch: int = 64, seq_len: int = 300, seed: int = 0, log_every: int = 0) -> list[float]:
    """Adam + cosine decay on fresh teacher batches; returns the loss of every step.

    ``student(x)`` may return a tensor or, for cells of the protocol, ``(out, state)``.
    """
    torch.manual_seed(seed)
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1), eta_min=lr * 1e-4)
    losses = []
    for i in range(steps):
        x, y = teacher.sample(batch, seq_len)
        out = student(x)
        out = out[0] if isinstance(out, tuple) else out
        loss = 0.5 * ((out - y) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
        if log_every and (i + 1) % log_every == 0:
            print(f"step {i + 1}: loss {losses[-1]:.3e}")
    return losses

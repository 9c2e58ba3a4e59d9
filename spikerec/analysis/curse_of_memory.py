"""The curse of memory (Zucchet & Orvieto, NeurIPS 2024): closed forms and Monte Carlo.

For the scalar diagonal recurrence ``h_t = lambda h_{t-1} + gamma x_t`` (real or complex
``lambda``) driven by a wide-sense-stationary input with autocorrelation ``R(Delta)``
(paper §2.2, App. B), the stationary second moments are

* forward pass (eq. 45/48): ``E|h|^2 = (R(0) + sum_{D>=1} (l^D + conj(l)^D) R(D)) / (1 - |l|^2)``,
  with ``R(D) = rho^|D|``: ``(1 - rho^2 |l|^2) / (|1 - rho l|^2 (1 - |l|^2))``;
* sensitivity (eq. 57, with the denominator ``(1 - |l|^2)^3`` corrected):
  ``E|dh/dl|^2 = S(l, conj(l))`` where ``S(a, b) = d_a d_b [(1 - rho^2 ab) / ((1 - ab)(1 - rho a)(1 - rho b))]``.

The paper's closed form for ``R = rho^|D|`` (eq. 59, and eq. 134) has a wrong numerator
whenever ``0 < rho < 1``; :func:`sensitivity_kernel` uses the corrected one
(``N = (1+p) - 2 rho (1-rho^2) p s - 4 rho^2 p (1-p) - rho^4 p^2 (1+p)`` with ``p = ab``,
``s = a + b``) and :func:`paper_eq59` keeps the printed one only to document the
erratum. Normalisation ``gamma(lambda)`` and reparametrisation ``lambda(omega)`` (§3.1,
App. B.3) multiply the sensitivity by ``gamma^2 lambda'(omega)^2`` when ``gamma`` is
treated as a constant (stop-gradient); the gate-coupled ``gamma = 1 - lambda`` (GRU, §3.2,
App. D eqs. 159-161) is attached and has its own closed form.

Everything here is numpy (complex-safe); :func:`monte_carlo_moments` checks the closed
forms by simulation (torch, float64), and :class:`ScalarRecurrence` is a small module whose
autograd derivatives give the same numbers.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = [
    "PARAMETRIZATIONS", "GAMMA_MODES",
    "second_moment_h", "second_moment_dh_dlam", "sensitivity_kernel", "paper_eq59",
    "second_moment_h_acf", "second_moment_dh_dlam_acf", "ar1_acf",
    "gated_moments", "dlam_domega", "gamma_of", "param_sensitivity", "normalized_h2",
    "asymptotic_prefactors", "loglog_slope",
    "ar1_inputs", "monte_carlo_moments", "ScalarRecurrence",
]

PARAMETRIZATIONS = ("direct", "exp", "tanh", "sigmoid")
GAMMA_MODES = ("none", "detached", "one_minus_lambda")


# --------------------------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------------------------
def _lam(lam):
    return np.asarray(lam, dtype=complex if np.iscomplexobj(lam) else float)


def _check_stable(lam, name="lam"):
    if np.any(np.abs(lam) >= 1):
        raise ValueError(f"{name}: the stationary moments need |lambda| < 1, got max |lambda| = {np.max(np.abs(lam)):.6g}")


def _check_rho(rho):
    r = np.asarray(rho, dtype=float)
    if np.any(r < 0) or np.any(r > 1):
        raise ValueError(f"rho: the AR(1) input correlation must lie in [0, 1], got {rho!r}")
    return r


def second_moment_h(lam, rho=0.0):
    """``E|h|^2`` for ``h_t = lam h_{t-1} + x_t`` and ``R_x(D) = rho^|D|`` (eq. 48)."""
    lam = _lam(lam)
    _check_stable(lam)
    rho = _check_rho(rho)
    a2 = np.abs(lam) ** 2
    return (1 - rho**2 * a2) / (np.abs(1 - rho * lam) ** 2 * (1 - a2))


def sensitivity_kernel(a, b, rho=0.0):
    """Corrected two-argument kernel ``S(a, b)`` (Zucchet & Orvieto 2024, App. B.2.2; replaces the
    numerators of eqs. 59 and 134, ``docs/decisions.md``, analysis 1).

    ``S(a, b) = N(ab, a+b) / ((1-ab)^3 (1-rho a)^2 (1-rho b)^2)``; ``S(l, conj l) = E|dh/dl|^2``
    and ``E[(dh_i/dl_i) conj(dh_j/dl_j)] = S(l_i, conj l_j)`` for a shared input.
    """
    a = np.asarray(a, dtype=complex)
    b = np.asarray(b, dtype=complex)
    rho = _check_rho(rho)
    p, s = a * b, a + b
    num = (1 + p) - 2 * rho * (1 - rho**2) * p * s - 4 * rho**2 * p * (1 - p) - rho**4 * p**2 * (1 + p)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / ((1 - p) ** 3 * (1 - rho * a) ** 2 * (1 - rho * b) ** 2)
        # rho = 1: N = (1-p)^3 exactly; use the cancelled form 1/((1-a)^2 (1-b)^2) (no round-off near p = 1)
        const = 1 / ((1 - a) ** 2 * (1 - b) ** 2)
    return np.where(rho == 1, const, out)


def second_moment_dh_dlam(lam, rho=0.0):
    """``E|dh/dlam|^2`` for ``R_x(D) = rho^|D|`` (corrected closed form, real or complex ``lam``).

    Real ``lam``: ``[(1+l^2)(1-rho^2 l^2) + 2 rho l (1-l^2)] / ((1-l^2)^3 (1-rho l)^2)``.
    """
    lam = _lam(lam)
    _check_stable(lam)
    return np.real(sensitivity_kernel(lam, np.conj(lam), rho))


def paper_eq59(lam, rho=0.0):
    """The closed form printed as eq. 59 of the paper, **wrong for 0 < rho < 1** (kept to test the erratum)."""
    lam = _lam(lam)
    rho = _check_rho(rho)
    a2 = np.abs(lam) ** 2
    num = ((1 - rho) * (1 + a2) + rho**2 * (1 - a2) ** 3
           + rho * (1 - rho) * a2 * (rho * a2 * (1 + a2) - 2 * lam - 2 * np.conj(lam)))
    return np.real(num / ((1 - a2) ** 3 * np.abs(1 - rho * lam) ** 4))


def ar1_acf(rho: float, max_lag: int) -> np.ndarray:
    """``R(D) = rho^D`` for ``D = 0..max_lag``."""
    return float(rho) ** np.arange(max_lag + 1, dtype=float)


def _acf_array(acf) -> np.ndarray:
    r = np.asarray(acf, dtype=float)
    if r.ndim != 1 or r.size < 1:
        raise ValueError(f"acf: expected a 1-D array R(0..K), got shape {r.shape}")
    return r


def second_moment_h_acf(lam, acf):
    """``E|h|^2`` for a general autocorrelation ``acf = [R(0), R(1), ..., R(K)]`` (eq. 45, truncated at K)."""
    lam = complex(lam)
    _check_stable(np.asarray(lam))
    r = _acf_array(acf)
    d = np.arange(1, r.size)
    tail = np.sum(2 * np.real(lam**d) * r[1:])
    return float((r[0] + tail) / (1 - abs(lam) ** 2))


def second_moment_dh_dlam_acf(lam, acf):
    """``E|dh/dlam|^2`` for a general autocorrelation (eq. 57 with ``(1-|l|^2)^3``; truncated at K)."""
    lam = complex(lam)
    _check_stable(np.asarray(lam))
    r = _acf_array(acf)
    d = np.arange(1, r.size)
    a2 = abs(lam) ** 2
    two_re = 2 * np.real(lam**d)
    first = (1 + a2) / (1 - a2) ** 3 * (r[0] + np.sum(two_re * r[1:]))
    second = np.sum(d * two_re * r[1:]) / (1 - a2) ** 2
    return float(first + second)


def gated_moments(lam, rho=0.0):
    """Gate-coupled input ``h_t = l h_{t-1} + (1-l) x_t`` with ``gamma = 1 - l`` attached (real ``l``).

    Returns ``(E[h^2], E[(dh/dl)^2], E[(dh/db)^2])`` where ``l = sigmoid(b)`` (Zucchet & Orvieto
    2024, §3.2 and App. D, eqs. 159-161: the coupled input gate acts as a normalisation): the gate bias gradient stays bounded as ``l -> 1``.
    """
    lam = np.asarray(lam, dtype=float)
    _check_stable(lam)
    rho = _check_rho(rho)
    h2 = (1 - lam) * (1 + rho * lam) / ((1 + lam) * (1 - rho * lam))
    dl2 = 2 * (1 - rho) * (1 + rho * lam**2) / ((1 - lam) * (1 + lam) ** 3 * (1 - rho * lam) ** 2)
    # rho = 1: constant input, h = 1 exactly and dh/dl = 0
    dl2 = np.where(rho == 1, 0.0, dl2)
    db2 = (lam * (1 - lam)) ** 2 * dl2
    return h2, dl2, db2


def dlam_domega(lam, param: str = "direct"):
    """``d lambda / d omega`` expressed through ``lambda`` for the reparametrisations of §3.1.

    ``direct``: ``l = w`` (1); ``exp``: ``l = exp(-exp(w))`` (LRU, log-tau LIF; ``l ln l``);
    ``tanh``: ``l = tanh(w)`` (``1 - l^2``); ``sigmoid``: ``l = sigmoid(w)`` (gate; ``l (1-l)``).
    """
    lam = np.asarray(lam, dtype=float)
    if param == "direct":
        return np.ones_like(lam)
    if param == "exp":
        return lam * np.log(lam)
    if param == "tanh":
        return 1 - lam**2
    if param == "sigmoid":
        return lam * (1 - lam)
    raise ValueError(f"param: expected one of {PARAMETRIZATIONS}, got {param!r}")


def gamma_of(lam, gamma: str = "none"):
    """Input normalisation ``gamma(lambda)``: ``none`` (1), ``detached`` (``sqrt(1 - |l|^2)``, as a
    constant) or ``one_minus_lambda`` (``1 - l``, the GRU coupling)."""
    lam = np.asarray(lam)
    if gamma == "none":
        return np.ones(lam.shape)
    if gamma == "detached":
        return np.sqrt(1 - np.abs(lam) ** 2)
    if gamma == "one_minus_lambda":
        return 1 - np.real(lam)
    raise ValueError(f"gamma: expected one of {GAMMA_MODES}, got {gamma!r}")


def normalized_h2(lam, rho=0.0, gamma: str = "detached"):
    """``E[h^2]`` with input normalisation (Fig. 2A for ``detached``: ``(1+rho l)/(1-rho l)``)."""
    if gamma == "one_minus_lambda":
        return gated_moments(lam, rho)[0]
    return gamma_of(lam, gamma) ** 2 * second_moment_h(lam, rho)


def param_sensitivity(lam, rho=0.0, param: str = "direct", gamma: str = "none"):
    """``E[(dh/d omega)^2]`` for ``l = l(omega)`` and normalisation ``gamma`` (real ``l``).

    Detached/no normalisation: ``gamma^2 l'(w)^2 E[(dh/dl)^2]`` (§3.1; Fig. 2B is
    ``param="exp", gamma="detached"``). ``one_minus_lambda`` is the attached gate coupling.
    """
    lam = np.asarray(lam, dtype=float)
    d = dlam_domega(lam, param) ** 2
    if gamma == "one_minus_lambda":
        return d * gated_moments(lam, rho)[1]
    return gamma_of(lam, gamma) ** 2 * d * second_moment_dh_dlam(lam, rho)


def asymptotic_prefactors(rho: float) -> dict:
    """Leading terms as ``l -> 1`` (real, fixed ``rho < 1``): ``E[h^2] ~ c_h (1-l)^-1``,
    ``E[(dh/dl)^2] ~ c_s (1-l)^-3``, normalised exp-parametrised sensitivity -> ``c_n``."""
    if not 0 <= rho < 1:
        raise ValueError(f"rho: asymptotic prefactors need 0 <= rho < 1, got {rho!r}")
    return {"h2": (1 + rho) / (2 * (1 - rho)), "dh2": (1 + rho) / (4 * (1 - rho)),
            "ratio": 0.5, "normalized_exp": (1 + rho) / (2 * (1 - rho))}


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    x, y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(x, y, 1)[0])


# --------------------------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------------------------
def ar1_inputs(batch: int, steps: int, rho: float, *, generator: torch.Generator | None = None,
               dtype=torch.float64) -> torch.Tensor:
    """Stationary AR(1) inputs ``[T, B]``: ``x_0 ~ N(0,1)``, ``x_t = rho x_{t-1} + sqrt(1-rho^2) eps_t``."""
    _check_rho(rho)
    eps = torch.randn(steps, batch, generator=generator, dtype=dtype)
    if rho == 0:
        return eps
    x = torch.empty_like(eps)
    x[0] = eps[0]
    c = math.sqrt(max(1 - rho**2, 0.0))
    for t in range(1, steps):
        x[t] = rho * x[t - 1] + c * eps[t]
    return x


def monte_carlo_moments(lam, rho: float = 0.0, *, n_chains: int = 20000, steps: int | None = None,
                        gamma: str = "none", param: str = "direct", seed: int = 0) -> dict:
    """Monte Carlo estimate of ``E|h|^2``, ``E|dh/dl|^2`` and ``E|dh/dw|^2`` (a numerical check of
    the closed forms of Zucchet & Orvieto 2024, App. B).

    ``n_chains`` independent chains run ``h_t = l h_{t-1} + g x_t`` and its derivative
    ``e_t = l e_{t-1} + h_{t-1} (+ g'(l) x_t when gamma is attached)`` from ``h = e = 0`` for
    ``steps`` (default ``20/(1-|l|) + 50``, bias ~ e^-20) on stationary AR(1) inputs; the second
    moments are read at the last step. ``domega2 = l'(w)^2 dh2`` for the real parametrisations
    (``gamma`` held constant, as in :func:`param_sensitivity`). Returns means and standard errors.
    """
    lam_c = complex(lam)
    if abs(lam_c) >= 1:
        raise ValueError(f"lam: Monte Carlo needs |lambda| < 1, got {abs(lam_c):.6g}")
    if gamma not in GAMMA_MODES:
        raise ValueError(f"gamma: expected one of {GAMMA_MODES}, got {gamma!r}")
    if n_chains < 2:
        raise ValueError(f"n_chains: expected >= 2, got {n_chains}")
    steps = int(steps if steps is not None else 20 / (1 - abs(lam_c)) + 50)
    g = torch.Generator().manual_seed(seed)
    x = ar1_inputs(n_chains, steps, rho, generator=g)
    is_complex = lam_c.imag != 0
    if is_complex and param != "direct":
        raise ValueError(f"param: complex lambda supports only 'direct' here, got {param!r}")
    dt = torch.complex128 if is_complex else torch.float64
    lam_t = torch.tensor(lam_c if is_complex else lam_c.real, dtype=dt)
    gam = float(gamma_of(abs(lam_c) if gamma == "detached" else lam_c.real, gamma))
    dgam = -1.0 if gamma == "one_minus_lambda" else 0.0
    h = torch.zeros(n_chains, dtype=dt)
    e = torch.zeros(n_chains, dtype=dt)
    for t in range(steps):
        e = lam_t * e + h + dgam * x[t]
        h = lam_t * h + gam * x[t]
    h2, e2 = h.abs() ** 2, e.abs() ** 2
    dw = float(dlam_domega(lam_c.real, param)) ** 2 if not is_complex else 1.0
    sq = math.sqrt(n_chains)
    return {"h2": h2.mean().item(), "h2_se": h2.std().item() / sq,
            "dh2": e2.mean().item(), "dh2_se": e2.std().item() / sq,
            "domega2": dw * e2.mean().item(), "steps": steps, "n_chains": n_chains}


class ScalarRecurrence(nn.Module):
    """``n`` independent units ``h_t = l h_{t-1} + gamma(l) x_t`` with ``l = l(omega)`` (§3.1).

    ``omega`` is a trainable ``[n]`` parameter, so autograd of ``h_T.sum()`` gives every unit's own
    ``dh_T/d omega``: running ``n`` units on ``n`` independent input chains is a Monte Carlo estimate
    of ``E[(dh/d omega)^2]`` through autograd. ``gamma="detached"`` computes
    ``sqrt(1 - l^2)`` from ``l.detach()`` (the paper's stop-gradient); ``one_minus_lambda`` is attached.
    """

    def __init__(self, lam, *, param: str = "exp", gamma: str = "detached"):
        super().__init__()
        if param not in PARAMETRIZATIONS:
            raise ValueError(f"param: expected one of {PARAMETRIZATIONS}, got {param!r}")
        if gamma not in GAMMA_MODES:
            raise ValueError(f"gamma: expected one of {GAMMA_MODES}, got {gamma!r}")
        lam = torch.as_tensor(lam, dtype=torch.float64).reshape(-1)
        if (lam <= 0).any() or (lam >= 1).any():
            raise ValueError("lam: ScalarRecurrence needs real 0 < lambda < 1")
        self.param, self.gamma_mode = param, gamma
        inv = {"direct": lambda l: l, "exp": lambda l: torch.log(-torch.log(l)),
               "tanh": torch.atanh, "sigmoid": torch.logit}[param]
        self.omega = nn.Parameter(inv(lam))

    def lam(self) -> torch.Tensor:
        w = self.omega
        return {"direct": lambda: w, "exp": lambda: torch.exp(-torch.exp(w)),
                "tanh": lambda: torch.tanh(w), "sigmoid": lambda: torch.sigmoid(w)}[self.param]()

    def gamma(self, lam: torch.Tensor) -> torch.Tensor:
        if self.gamma_mode == "none":
            return torch.ones_like(lam)
        if self.gamma_mode == "detached":
            return torch.sqrt(1 - lam.detach() ** 2)
        return 1 - lam

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x[T, n]`` -> all states ``h[T, n]`` (parallel scan)."""
        from ..scan import linear_scan

        if x.dim() != 2 or x.shape[1] != self.omega.shape[0]:
            raise ValueError(f"ScalarRecurrence input: expected shape [T, {self.omega.shape[0]}], got {tuple(x.shape)}")
        lam = self.lam()
        return linear_scan(lam.expand_as(x), self.gamma(lam) * x)

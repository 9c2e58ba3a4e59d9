"""Theory helpers of the LSC paper (Herranz-Celotti & Rouat, "Stabilizing RNN gradients through
pre-training", Sec. II-B, App. A, Sec. III-B) for tests and notebooks.

* Grid path counts (Lemma 2): shortest paths in a ``dt x dl`` grid ``C(dt+dl, dt)`` and
  ``sum_{t=0}^{T} sum_{dt=0}^{t} C(dl+dt, dt) = C(T+dl+2, T)``.
* Theorem 1: with ``E rho = 1`` the parameter-update variance bound grows like
  ``(1/T) C(T+dl+2, T)`` (eq. 20; eq. 14 as printed drops the binomial, an erratum: ``docs/decisions.md``, analysis 5);
  with ``E rho = 0.5`` like ``(T+1)/2`` (eq. 23).
* PascalRNN (Sec. III-B): ``h_{t,l} = rho h_{t-1,l} + rho h_{t,l-1}`` (stacked convention,
  ``h_{t,0} = x_t``) or ``rho h_{t-1,l} + rho h_{t-1,l-1}`` (eq. 1); for ``rho = 1`` and the
  stacked convention ``d sum_t h_{t,L} / d x_{t'} = C(L + dt - 1, L)``, ``dt = T - t'``.
* Expected spectral radius of initialisations (Corollary 1): Glorot (linear), He with a
  ReLU mask, orthogonal; and Kostlan's chi mean of Lemma 1.
"""
from __future__ import annotations

import math
from math import comb

import numpy as np
import torch

__all__ = [
    "grid_path_count",
    "path_sum",
    "thm1_bound_rho1",
    "thm1_bound_rho_half",
    "pascal_rnn",
    "pascal_rnn_gradient",
    "expected_radius",
    "kostlan_chi_mean",
    "INITS",
]

INITS = ("glorot_uniform", "he_normal_relu", "orthogonal", "gaussian")


def _nonneg_int(v, name: str) -> int:
    if int(v) != v or v < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {v!r}")
    return int(v)


def grid_path_count(dt: int, dl: int) -> int:
    """Number of shortest paths in a ``dt x dl`` grid: ``C(dt + dl, dt)`` (exact integer)."""
    dt, dl = _nonneg_int(dt, "dt"), _nonneg_int(dl, "dl")
    return comb(dt + dl, dt)


def path_sum(T: int, dl: int) -> int:
    """``sum_{t=0}^{T} sum_{dt=0}^{t} C(dl + dt, dt)`` by direct summation (equals ``C(T+dl+2, T)``)."""
    T, dl = _nonneg_int(T, "T"), _nonneg_int(dl, "dl")
    return sum(comb(dl + d, d) for t in range(T + 1) for d in range(t + 1))


def thm1_bound_rho1(T: int, dl: int) -> float:
    """Growth term of Theorem 1 for ``E rho = 1``: ``(1/T) C(T + dl + 2, T)``."""
    T, dl = _nonneg_int(T, "T"), _nonneg_int(dl, "dl")
    if T == 0:
        raise ValueError("T: expected T >= 1")
    return comb(T + dl + 2, T) / T


def thm1_bound_rho_half(T: int) -> float:
    """Growth term of Theorem 1 for ``E rho = 0.5``: ``(T + 1) / 2``, independent of depth."""
    return (_nonneg_int(T, "T") + 1) / 2.0


def pascal_rnn(x: torch.Tensor, L: int, rho: float, convention: str = "stacked"):
    """Run the scalar PascalRNN on ``x [T]`` (float64) and return ``(y, grad)``:
    ``y = sum_t h_{t,L}`` and ``grad[t'] = dy / dx_{t'}`` by autograd. Zero initial states.

    ``convention="stacked"``: ``h_{t,l} = rho h_{t-1,l} + rho h_{t,l-1}`` (official code);
    ``"eq1"``: ``h_{t,l} = rho h_{t-1,l} + rho h_{t-1,l-1}`` (paper eq. 1); there every link
    takes one step and the first link from the input goes up, so
    ``d h_{t,L} / d x_{t'} = rho^(t-t') C(t-t'-1, L-1)``.
    """
    if convention not in ("stacked", "eq1"):
        raise ValueError(f"convention: expected 'stacked' or 'eq1', got {convention!r}")
    L = _nonneg_int(L, "L")
    if L < 1:
        raise ValueError("L: expected at least one layer")
    x = torch.as_tensor(x, dtype=torch.float64).detach().clone().requires_grad_(True)
    T = x.shape[0]
    prev = [x.new_zeros(()) for _ in range(L + 1)]  # h_{t-1, l}, l = 0..L (index 0 = input)
    y = x.new_zeros(())
    for t in range(T):
        cur = [x[t]]
        for l in range(1, L + 1):
            below = cur[l - 1] if convention == "stacked" else prev[l - 1]
            cur.append(rho * prev[l] + rho * below)
        y = y + cur[L]
        prev = cur
    (g,) = torch.autograd.grad(y, x)
    return y.detach(), g


def pascal_rnn_gradient(T: int, L: int, rho: float) -> np.ndarray:
    """Closed form of the stacked PascalRNN gradient: ``sum_{d=0}^{dt-1} C(d+L-1, L-1) rho^(d+L)``, ``dt = T - t'``."""
    T, L = _nonneg_int(T, "T"), _nonneg_int(L, "L")
    out = np.zeros(T)
    for tp in range(T):
        dt = T - tp
        out[tp] = sum(comb(d + L - 1, L - 1) * rho ** (d + L) for d in range(dt))
    return out


def _draw(init: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if init == "glorot_uniform":
        a = math.sqrt(6.0 / (2 * n))
        return rng.uniform(-a, a, size=(n, n))
    if init == "he_normal_relu":  # He-normal W times a Bernoulli(1/2) column mask (the ReLU Jacobian)
        W = rng.normal(0.0, math.sqrt(2.0 / n), size=(n, n))
        return W * (rng.random(n) < 0.5)[None, :]
    if init == "orthogonal":
        q, r = np.linalg.qr(rng.normal(size=(n, n)))
        return q * np.sign(np.diag(r))[None, :]
    if init == "gaussian":  # i.i.d. N(0, 1/n)
        return rng.normal(0.0, 1.0 / math.sqrt(n), size=(n, n))
    raise ValueError(f"init: expected one of {INITS}, got {init!r}")


def expected_radius(init: str, n: int, draws: int = 200, seed: int = 0) -> tuple[float, float]:
    """Mean and std of ``rho(W)`` over ``draws`` random ``n x n`` matrices of an initialisation.

    Measured values (seed 0, 200 draws): Glorot-uniform 1.065 / 1.047 / 1.039 and He-normal with a
    ReLU mask 1.050 / 1.057 / 1.048 for n = 64 / 128 / 256; orthogonal exactly 1.
    """
    if int(n) < 1 or int(draws) < 1:
        raise ValueError(f"n and draws must be >= 1, got n={n!r}, draws={draws!r}")
    rng = np.random.default_rng(seed)
    radii = np.array([np.abs(np.linalg.eigvals(_draw(init, int(n), rng))).max() for _ in range(int(draws))])
    return float(radii.mean()), float(radii.std())


def kostlan_chi_mean(k: int) -> float:
    """``E chi_k = sqrt(2) Gamma((k+1)/2) / Gamma(k/2)`` (Lemma 1's ``E|lambda_k|``, ~ sqrt(k - 1/2))."""
    if k < 1:
        raise ValueError(f"k: expected k >= 1, got {k!r}")
    return math.sqrt(2.0) * math.exp(math.lgamma((k + 1) / 2.0) - math.lgamma(k / 2.0))

"""Lyapunov spectra of input-driven spikerec cells (QR method) and edge-of-chaos labels.

The finite-time Lyapunov exponents of a trajectory ``s_t = f(s_{t-1}, x_t)`` are
``LE_i = (1/T) sum_t log |r_ii(t)|`` where ``Q_t r(t) = J_t Q_{t-1}`` is the QR factorisation of
the time Jacobian ``J_t = d s_t / d s_{t-1}`` applied to the previous orthonormal frame
(Sandri 1996; WCRNN paper App. A, Algorithm 1). Choices the paper leaves open (``docs/decisions.md``, analysis 2): the
Jacobian is evaluated at the pre-update state, ``|diag r|`` is used (QR signs are arbitrary),
no burn-in by default, one trajectory per batch element, float64, thin QR when fewer than
``S`` exponents are wanted.

Time Jacobians come from :func:`spikerec.stability.cell_time_jacobian` when the stability
module provides it, otherwise from :func:`jacrev_time_jacobian` (``torch.func.jacrev`` of
``cell.step`` with respect to ``cell.state_vector``, vmapped over the batch); spiking cells get
their surrogate derivative in place of the Heaviside's.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, NamedTuple

import numpy as np
import torch

__all__ = [
    "jacrev_time_jacobian", "resolve_time_jacobian", "lyapunov_spectrum", "LyapunovResult",
    "residual_lyapunov_prediction", "classify_criticality", "memory_timescales",
]

JacobianFn = Callable[[object, torch.Tensor, object], torch.Tensor]


def jacrev_time_jacobian(cell, x_t: torch.Tensor, state) -> torch.Tensor:
    """``d state_vector(s_t) / d state_vector(s_{t-1})`` as ``[B, S, S]`` by ``torch.func.jacrev``.

    Works for any cell of the protocol: the state is flattened by ``cell.state_vector`` and
    rebuilt by ``cell.state_from_vector``; each batch element is differentiated on its own
    (``vmap``), so the result is the per-sample Jacobian.
    """
    vec = cell.state_vector(state)

    def f(v, x):
        st = cell.state_from_vector(v.unsqueeze(0))
        _, new = cell.step(x.unsqueeze(0), st)
        return cell.state_vector(new).squeeze(0)

    return torch.func.vmap(torch.func.jacrev(f), in_dims=(0, 0))(vec, x_t)


def _analytic(cell, x_t, state):
    if not hasattr(cell, "time_jacobian"):
        raise TypeError(f"jacobian='analytic': {type(cell).__name__} has no time_jacobian(x_t, state) method")
    return cell.time_jacobian(x_t, state)


def resolve_time_jacobian(jacobian: JacobianFn | str | None = None) -> JacobianFn:
    """The time-Jacobian function to use.

    ``None``/``"auto"``: the stability module's ``cell_time_jacobian`` (shared with the LSC radius
    estimator), falling back to :func:`jacrev_time_jacobian` when it is not available;
    ``"jacrev"``: the fallback itself; ``"analytic"``: the cell's own ``time_jacobian(x_t, state)``
    (e.g. :meth:`spikerec.analysis.wcrnn.WCRNN.time_jacobian`, much faster); a callable
    ``(cell, x_t, state) -> [B, S, S]`` is used as is.
    """
    if callable(jacobian):
        return jacobian
    if jacobian == "jacrev":
        return jacrev_time_jacobian
    if jacobian == "analytic":
        return _analytic
    if jacobian not in (None, "auto"):
        raise ValueError(f"jacobian: expected None, 'auto', 'jacrev', 'analytic' or a callable, got {jacobian!r}")
    try:
        from ..stability import cell_time_jacobian  # type: ignore[attr-defined]
        return cell_time_jacobian
    except ImportError:
        pass
    try:
        from ..stability.jacobians import cell_time_jacobian  # type: ignore[no-redef]
        return cell_time_jacobian
    except ImportError:
        return jacrev_time_jacobian


class LyapunovResult(NamedTuple):
    """``exponents [B, k]`` sorted descending (per step, natural log); ``running [T, B, k]`` the
    running estimates (``None`` unless asked; unsorted, column order of the frame); ``log_diag
    [T, B, k]`` the per-step ``log|r_ii|`` (``None`` unless asked); ``mean_logdet [B]`` the average
    ``log|det J_t|`` (``None`` unless ``k = S``), which equals ``exponents.sum(-1)`` (volume identity)."""
    exponents: torch.Tensor
    running: torch.Tensor | None
    log_diag: torch.Tensor | None
    mean_logdet: torch.Tensor | None


def lyapunov_spectrum(cell, x: torch.Tensor, state=None, *, k: int | None = None, burn_in: int = 0,
                      reortho_every: int = 1, dtype=torch.float64, jacobian: JacobianFn | str | None = None,
                      return_running: bool = False, return_log_diag: bool = False) -> LyapunovResult:
    """Finite-time Lyapunov spectrum of ``cell`` driven by ``x[T, B, C]`` (QR method).

    Args:
        cell: any cell of the protocol (a copy is run in ``dtype``; the original is untouched).
        x: the input sequence, time-first.
        state: initial state (default ``cell.initial_state``).
        k: number of exponents (default all ``S``; fewer uses a thin ``S x k`` frame).
        burn_in: steps run (and QR-orthonormalised) before exponents are accumulated.
        reortho_every: QR every this many steps (products of Jacobians in between).
        jacobian: see :func:`resolve_time_jacobian`.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x: expected a [T, B, C] tensor, got {getattr(x, 'shape', type(x))}")
    if x.shape[-1] != cell.input_size:
        raise ValueError(f"x: expected {cell.input_size} input features, got {x.shape[-1]}")
    T, B = x.shape[0], x.shape[1]
    if not 0 <= burn_in < T:
        raise ValueError(f"burn_in: expected 0 <= burn_in < T = {T}, got {burn_in}")
    if reortho_every < 1:
        raise ValueError(f"reortho_every: expected >= 1, got {reortho_every}")
    jac = resolve_time_jacobian(jacobian)
    run = copy.deepcopy(cell).to(dtype)
    for p in run.parameters():
        p.requires_grad_(False)
    x = x.to(dtype)
    if state is None:
        state = run.initial_state(B, x.device, dtype)
    else:
        state = type(state)(*(s.detach().to(dtype) for s in state))
    S = run.state_vector(state).shape[-1]
    k = S if k is None else int(k)
    if not 1 <= k <= S:
        raise ValueError(f"k: expected 1 <= k <= {S} (state size), got {k}")
    Q = torch.eye(S, k, dtype=dtype, device=x.device).expand(B, S, k).clone()
    acc = torch.zeros(B, k, dtype=dtype, device=x.device)
    logdet = torch.zeros(B, dtype=dtype, device=x.device) if k == S else None
    running, diags = [], []
    counted = 0
    with torch.no_grad():
        for t in range(T):
            J = jac(run, x[t], state)
            _, state = run.step(x[t], state)
            Q = J @ Q
            if logdet is not None and t >= burn_in:
                logdet = logdet + torch.linalg.slogdet(J)[1]
            if (t + 1) % reortho_every == 0 or t == T - 1:
                Q, R = torch.linalg.qr(Q)
                d = torch.log(torch.diagonal(R, dim1=-2, dim2=-1).abs())
            else:
                d = torch.zeros_like(acc)
            if t >= burn_in:
                acc = acc + d
                counted += 1
                if return_running:
                    running.append(acc / counted)
                if return_log_diag:
                    diags.append(d)
    exps = torch.sort(acc / counted, dim=-1, descending=True).values
    return LyapunovResult(
        exps,
        torch.stack(running) if return_running else None,
        torch.stack(diags) if return_log_diag else None,
        logdet / counted if logdet is not None else None,
    )


def residual_lyapunov_prediction(R) -> np.ndarray:
    """Weak-coupling prediction (WCRNN eq. 13): ``sort(log|eig R|)``, descending."""
    R = np.asarray(torch.as_tensor(R).detach().cpu().double().numpy() if isinstance(R, torch.Tensor) else R, float)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise ValueError(f"R: expected a square matrix, got shape {R.shape}")
    return np.sort(np.log(np.abs(np.linalg.eigvals(R))))[::-1]


def classify_criticality(value, tol: float = 1e-6, *, kind: str = "exponents") -> str:
    """Edge-of-chaos label: ``"subcritical"``, ``"critical"`` or ``"supercritical"``.

    ``kind="exponents"``: ``value`` holds Lyapunov exponents, judged by the largest against 0.
    ``kind="residual"``: ``value`` is a square residual matrix, judged by ``log max|eig R|``
    against 0 (i.e. ``max|eig R|`` against 1). ``tol`` is the half-width of the "critical" band
    (WCRNN paper Sec. 3, after eq. 13).
    """
    v = np.asarray(torch.as_tensor(value).detach().cpu().double().numpy() if isinstance(value, torch.Tensor) else value, float)
    if kind == "residual":
        if v.ndim != 2 or v.shape[0] != v.shape[1]:
            raise ValueError(f"classify_criticality: a residual must be a square matrix, got shape {v.shape}")
        m = float(np.log(np.max(np.abs(np.linalg.eigvals(v)))))
    elif kind == "exponents":
        if v.size == 0:
            raise ValueError("classify_criticality: no exponents given")
        m = float(np.max(v))
    else:
        raise ValueError(f"classify_criticality: kind must be 'exponents' or 'residual', got {kind!r}")
    if not math.isfinite(m):
        raise ValueError("classify_criticality: the largest exponent is not finite")
    if m > tol:
        return "supercritical"
    if m < -tol:
        return "subcritical"
    return "critical"


def memory_timescales(exponents) -> np.ndarray:
    """``-1 / LE`` in steps (positive for decaying directions; ``inf`` at LE = 0)."""
    le = np.asarray(torch.as_tensor(exponents).detach().cpu().double().numpy() if isinstance(exponents, torch.Tensor) else exponents, float)
    with np.errstate(divide="ignore"):
        return -1.0 / le

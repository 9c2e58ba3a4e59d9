"""Curse-of-memory measurements on spikerec cells and stacks (LRU, GRU, LIF/ALIF, WCRNN, ...).

The scalar theory of :mod:`spikerec.analysis.curse_of_memory` applies to a cell through the
eigenvalues of its time Jacobian ``J_t = d s_t / d s_{t-1}`` (the same Jacobians the stability
module uses for LSC): for the LRU ``J`` is exactly ``diag(lambda)`` in the real ``(Re, Im)``
view, for a sub-threshold LIF it is ``diag(alpha)``, and for a GRU at standard initialisation it
is close to ``diag(sigmoid(b_f))`` (Zucchet & Orvieto §3.2, App. D). The tools here

* estimate those effective eigenvalues along an input-driven trajectory
  (:func:`effective_eigenvalues`),
* measure the state's second moment and its sensitivity to a recurrent parameter
  (:func:`unit_sensitivity`, forward-mode differentiation of the ``step`` loop),
* predict both from the effective eigenvalues and the input's empirical autocorrelation
  (:func:`empirical_acf`, eq. 75; :func:`predicted_moments`, eqs. 45/57; "approximate" when the
  input is not wide-sense stationary, App. B.2.4),
* and give the Fig. 5-style per-group mean-square gradients of a loss
  (:func:`group_gradient_moments`) and per-layer activity (:func:`layer_state_moments`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from .curse_of_memory import second_moment_dh_dlam_acf, second_moment_h_acf
from .lyapunov import resolve_time_jacobian

__all__ = ["empirical_acf", "effective_eigenvalues", "unit_sensitivity", "predicted_moments",
           "layer_state_moments", "group_gradient_moments"]


def empirical_acf(x: torch.Tensor, max_lag: int, *, normalize: bool = False) -> np.ndarray:
    """Position-averaged autocorrelation ``R(D) = mean_{t,b,c} x_t x_{t+D}`` for ``D = 0..max_lag``
    (eq. 75) of ``x[T, B, C]``; ``normalize`` divides by ``R(0)``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x: expected a [T, B, C] tensor, got {getattr(x, 'shape', type(x))}")
    T = x.shape[0]
    if not 0 <= max_lag < T:
        raise ValueError(f"max_lag: expected 0 <= max_lag < T = {T}, got {max_lag}")
    x = x.detach().double()
    r = np.array([(x[d:] * x[: T - d]).mean().item() for d in range(max_lag + 1)])
    if normalize:
        if r[0] <= 0:
            raise ValueError("empirical_acf: zero input power, cannot normalise")
        r = r / r[0]
    return r


def _run_states(cell, x, state):
    if state is None:
        state = cell.initial_state(x.shape[1], x.device, x.dtype)
    states = [state]
    with torch.no_grad():
        for t in range(x.shape[0]):
            _, state = cell.step(x[t], state)
            states.append(state)
    return states


def effective_eigenvalues(cell, x: torch.Tensor, state=None, *, burn_in: int = 0, jacobian=None) -> np.ndarray:
    """Eigenvalues of the trajectory-averaged time Jacobian ``mean_{t >= burn_in, b} J_t``,
    sorted by decreasing modulus (complex ``[S]``). Exact for linear diagonal cells (LRU:
    ``lambda`` and ``conj(lambda)``; sub-threshold LIF: ``alpha``)."""
    jac = resolve_time_jacobian(jacobian)
    states = _run_states(cell, x, state)
    acc, n = None, 0
    with torch.no_grad():
        for t in range(burn_in, x.shape[0]):
            J = jac(cell, x[t], states[t]).detach().double().sum(0)
            acc = J if acc is None else acc + J
            n += x.shape[1]
    if acc is None:
        raise ValueError(f"burn_in: expected < T = {x.shape[0]}, got {burn_in}")
    ev = np.linalg.eigvals((acc / n).cpu().numpy())
    return ev[np.argsort(-np.abs(ev), kind="stable")]


class _Loop(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x, state):
        _, final = self.cell.step_loop(x, state)
        return self.cell.state_vector(final)


def unit_sensitivity(cell, x: torch.Tensor, param: str, state=None) -> dict:
    """Second moments of the final state and of its derivative along ``param``.

    Returns ``{"h2": E_b[s_T^2] [S], "dh2": E_b[(d s_T / d theta . 1)^2] [S]}``, where the
    derivative is taken (forward mode, through the ``step`` loop) along a uniform shift of every
    entry of the parameter ``param`` (e.g. ``"log_tau_mem"``, ``"nu_log"``). For cells whose
    units do not interact (LRU, feed-forward LIF, WCRNN with ``W_xx = 0``) this is each unit's
    own ``d s_{T,i} / d theta_i``; with couplings it includes the others' contributions.
    """
    params = dict(cell.named_parameters())
    if param not in params:
        raise ValueError(f"param: {type(cell).__name__} has no parameter {param!r}; it has {sorted(params)}")
    loop = _Loop(cell)
    p0 = params[param].detach()
    if state is None:
        state = cell.initial_state(x.shape[1], x.device, x.dtype)

    def f(p):
        return torch.func.functional_call(loop, {f"cell.{param}": p}, (x, state))

    s, ds = torch.func.jvp(f, (p0,), (torch.ones_like(p0),))
    return {"h2": (s.detach() ** 2).mean(0).double().cpu().numpy(),
            "dh2": (ds.detach() ** 2).mean(0).double().cpu().numpy()}


def predicted_moments(eigenvalues, acf) -> dict:
    """Scalar-theory predictions per eigenvalue for an input with autocorrelation ``acf``
    (eqs. 45 and 57, truncated at ``len(acf) - 1``): ``{"h2": [...], "dh2": [...]}``."""
    ev = np.atleast_1d(np.asarray(eigenvalues))
    h2 = np.array([second_moment_h_acf(l, acf) for l in ev])
    dh2 = np.array([second_moment_dh_dlam_acf(l, acf) for l in ev])
    return {"h2": h2, "dh2": dh2}


def layer_state_moments(model, x: torch.Tensor) -> list[float]:
    """Mean square of every hidden layer's output over time, batch and features (Fig. 5A)."""
    with torch.no_grad():
        _, _, hidden = model(x, record=True)
    return [float((h.double() ** 2).mean()) for h in hidden]


def group_gradient_moments(model, x: torch.Tensor, target: torch.Tensor, loss_fn: Callable,
                           groups: dict[str, list[nn.Parameter]] | None = None) -> dict[str, float]:
    """Mean squared gradient entry per parameter group (Fig. 5B / 13).

    ``loss_fn(model(x)[0], target)`` is differentiated once; the default groups are, per cell
    ``l`` of ``model.layers``, ``"l/time"`` and ``"l/depth"`` from ``stability_groups()``, and
    ``"other"`` for every remaining trainable parameter.
    """
    if groups is None:
        groups, seen = {}, set()
        for i, c in enumerate(getattr(model, "layers", [model])):
            for name, ps in c.stability_groups().items():
                ps = [p for p in ps if p.requires_grad and id(p) not in seen]
                seen.update(id(p) for p in ps)
                if ps:
                    groups[f"{i}/{name}"] = ps
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
        if rest:
            groups["other"] = rest
    model.zero_grad(set_to_none=True)
    y = model(x)[0]
    loss = loss_fn(y, target)
    loss.backward()
    out = {}
    for name, ps in groups.items():
        sq = [p.grad.double().pow(2).reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=torch.float64)
              for p in ps]
        out[name] = float(torch.cat(sq).mean())
    model.zero_grad(set_to_none=True)
    return out

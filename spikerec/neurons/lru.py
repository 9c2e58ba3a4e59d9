"""Linear Recurrent Unit (LRU): the one definition.

Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu & De (2023), "Resurrecting Recurrent Neural
Networks for Long Sequences", §3 (eq. 1 and the parametrisations of §3.3-3.4). For a real input
``u_k`` (``H`` features) and a complex state ``x_k`` (``N`` entries)::

    lambda = exp(-exp(nu_log) + i exp(theta_log))     |lambda| < 1 by construction (§3.3, exponential param.)
    gamma  = exp(gamma_log)                            normalisation, init sqrt(1 - |lambda|^2) (§3.4)
    x_k    = lambda * x_{k-1} + gamma * (B u_k)        B = B_re + i B_im                       (eq. 1)
    y_k    = Re(C x_k) + D * u_k                       C = C_re + i C_im, D elementwise        (eq. 1)

The step runs in real arithmetic on ``(Re x, Im x)`` (the 2x2-block form of App. E.3), so
``torch.func`` differentiates it without complex numbers; its time Jacobian is exactly
``[[diag Re lambda, -diag Im lambda], [diag Im lambda, diag Re lambda]]``. When the output width
differs from the input width, ``D`` is a dense ``[O, H]`` matrix (spikerec's extension).
The LRU is a real-valued cell: it runs in FLOAT only.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .arithmetic import FLOAT, Arithmetic

__all__ = ["LRUParams", "LRUState", "step", "output", "lam_parts", "gamma", "skip"]


class LRUParams(NamedTuple):
    nu_log: torch.Tensor
    theta_log: torch.Tensor
    gamma_log: torch.Tensor
    B_re: torch.Tensor
    B_im: torch.Tensor
    C_re: torch.Tensor
    C_im: torch.Tensor
    D: torch.Tensor


class LRUState(NamedTuple):
    x_re: torch.Tensor
    x_im: torch.Tensor


def _float_only(arith: Arithmetic) -> None:
    if arith is not FLOAT:
        raise NotImplementedError(f"LRU step: runs in FLOAT arithmetic only, got {arith!r}")


def lam_parts(params: LRUParams) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Re lambda, Im lambda)`` with ``|lambda| = exp(-exp(nu_log))``, ``arg lambda = exp(theta_log)``."""
    mag = torch.exp(-torch.exp(params.nu_log))
    theta = torch.exp(params.theta_log)
    return mag * torch.cos(theta), mag * torch.sin(theta)


def gamma(params: LRUParams) -> torch.Tensor:
    """``gamma = exp(gamma_log)``."""
    return torch.exp(params.gamma_log)


def skip(params: LRUParams, u: torch.Tensor) -> torch.Tensor:
    """``D u`` (elementwise ``D`` or dense ``[O, H]``)."""
    return u * params.D if params.D.dim() == 1 else u @ params.D.t()


def output(params: LRUParams, state, x_t: torch.Tensor, options=None, arith: Arithmetic = FLOAT) -> torch.Tensor:
    """``y = Re(C x) + D u = C_re Re x - C_im Im x + D u``."""
    _float_only(arith)
    return state.x_re @ params.C_re.t() - state.x_im @ params.C_im.t() + skip(params, x_t)


def step(params: LRUParams, state, x_t: torch.Tensor, options=None, arith: Arithmetic = FLOAT):
    """One step ``x' = lambda x + gamma B u`` in real arithmetic; returns ``(y, LRUState(x'))``."""
    _float_only(arith)
    lr, li = lam_parts(params)
    g = gamma(params)
    bu_re = x_t @ (params.B_re * g[:, None]).t()
    bu_im = x_t @ (params.B_im * g[:, None]).t()
    x_re = lr * state.x_re - li * state.x_im + bu_re
    x_im = li * state.x_re + lr * state.x_im + bu_im
    new = LRUState(x_re, x_im)
    return output(params, new, x_t), new

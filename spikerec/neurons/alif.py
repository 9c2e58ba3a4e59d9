"""Adaptive leaky integrate-and-fire neuron (ALIF): the one definition.

The form of Herranz-Celotti & Rouat, "Stabilizing RNN gradients through pre-training", App. H,
eq. 49 as their official code computes it (``docs/decisions.md``, neurons 1: the threshold is
parametrised through an adaptation variable ``a``; eq. 49 equals it with ``b_paper = (1 - rho) b``
and ``beta_paper = (1 - rho) beta``), with ``alpha = exp(-dt / tau_mem)``,
``rho = exp(-dt / tau_adapt)``::

    z_{t-1}  = H(v_{t-1} - theta_{t-1})                recomputed from the state
    a_t      = rho a_{t-1} + (1 - rho) z_{t-1}
    theta_t  = b + beta a_t
    v_t      = alpha v_{t-1} + W x_t + b_v + W_rec z_{t-1} - sg(theta_t z_{t-1})
    z_t      = H(v_t - theta_t)

State ``(v, a)``; ``sg`` is a stop-gradient on the whole reset term when ``detach_reset`` (the
official code always detaches it). The reset subtracts the *current* threshold ``theta_t`` (the
official code's order). ``adapt_gain`` replaces ``1 - rho`` where an integer arithmetic stores its
own increment; ``product`` of the arithmetic forms ``beta a``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..surrogate import Surrogate
from .arithmetic import FLOAT, Arithmetic
from .lif import BIAS_INTO

__all__ = ["ALIFParams", "ALIFOptions", "ALIFState", "step", "output", "decays", "threshold"]


class ALIFParams(NamedTuple):
    """Parameters of one ALIF layer; ``recurrent_weight`` is the effective (masked) matrix or None."""

    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    recurrent_weight: Optional[torch.Tensor]
    log_tau_mem: torch.Tensor
    log_tau_adapt: torch.Tensor
    b: torch.Tensor
    beta: torch.Tensor
    adapt_gain: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class ALIFOptions:
    dt: float = 1.0
    detach_reset: bool = True
    surrogate: Surrogate | None = None
    bias_into: str = "current"

    def __post_init__(self):
        if not (self.dt > 0):
            raise ValueError(f"ALIFOptions.dt: expected > 0, got {self.dt!r}")
        if self.bias_into not in BIAS_INTO:
            raise ValueError(f"ALIFOptions.bias_into: expected one of {BIAS_INTO}, got {self.bias_into!r}")


class ALIFState(NamedTuple):
    v: torch.Tensor
    a: torch.Tensor


def decays(params: ALIFParams, options: ALIFOptions, arith: Arithmetic = FLOAT):
    """``(alpha, rho)`` = ``exp(-dt / tau_mem)``, ``exp(-dt / tau_adapt)``."""
    return arith.decay_factor(params.log_tau_mem, options.dt), arith.decay_factor(params.log_tau_adapt, options.dt)


def threshold(params: ALIFParams, state, arith: Arithmetic = FLOAT) -> torch.Tensor:
    """Adaptive threshold ``theta = b + beta a``."""
    return params.b + arith.product(params.beta, state.a)


def output(params: ALIFParams, state, options: ALIFOptions, arith: Arithmetic = FLOAT) -> torch.Tensor:
    """The spikes read off a state: ``z = H(v - theta)``."""
    return arith.spike(state.v, threshold(params, state, arith), options.surrogate)


def step(params: ALIFParams, state, x_t: torch.Tensor, options: ALIFOptions, arith: Arithmetic = FLOAT):
    """One time step of the module docstring's equations; returns ``(z_t, ALIFState(v_t, a_t))``."""
    alpha, rho = decays(params, options, arith)
    z_prev = arith.spike(state.v, threshold(params, state, arith), options.surrogate)
    gain = (1.0 - rho) if params.adapt_gain is None else params.adapt_gain
    a = arith.state(arith.decay(state.a, rho) + gain * z_prev)
    theta = params.b + arith.product(params.beta, a)
    J = arith.synaptic_input(x_t, params.weight)
    if params.bias is not None and options.bias_into == "current":
        J = J + params.bias
    if params.recurrent_weight is not None:
        J = arith.synaptic_input(z_prev, params.recurrent_weight, J)
    i = arith.current(J)
    bias_v = params.bias if (params.bias is not None and options.bias_into == "voltage") else None
    reset = theta * z_prev
    if options.detach_reset:
        reset = reset.detach()
    if arith.reset_timing == "immediate":
        v = arith.integrate(state.v - reset, alpha, i, bias_v)
    else:
        v = arith.integrate(state.v, alpha, i, bias_v) - reset
    v = arith.state(v)
    return arith.spike(v, theta, options.surrogate), ALIFState(v, a)

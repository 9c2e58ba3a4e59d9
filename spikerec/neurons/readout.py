"""Leaky-integrator readout (NIR ``LI``): the one definition.

    y_t = alpha y_{t-1} + W x_t + b,     alpha = exp(-dt / tau)

``log_tau = None`` gives the plain linear readout ``y_t = W x_t + b`` of Herranz-Celotti & Rouat,
App. H (``o_t = W_R x_t``). With ``bias_into="voltage"`` the bias is added after the current's
overflow (Loihi, Xylo); in floating point both orders are the same number.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from .arithmetic import FLOAT, Arithmetic
from .lif import BIAS_INTO

__all__ = ["ReadoutParams", "ReadoutOptions", "ReadoutState", "step", "output", "decay"]


class ReadoutParams(NamedTuple):
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    log_tau: Optional[torch.Tensor]


@dataclass(frozen=True)
class ReadoutOptions:
    dt: float = 1.0
    bias_into: str = "current"

    def __post_init__(self):
        if not (self.dt > 0):
            raise ValueError(f"ReadoutOptions.dt: expected > 0, got {self.dt!r}")
        if self.bias_into not in BIAS_INTO:
            raise ValueError(f"ReadoutOptions.bias_into: expected one of {BIAS_INTO}, got {self.bias_into!r}")


class ReadoutState(NamedTuple):
    y: torch.Tensor


def decay(params: ReadoutParams, options: ReadoutOptions, arith: Arithmetic = FLOAT):
    """``alpha = exp(-dt / tau)``, or None for the plain linear readout."""
    return None if params.log_tau is None else arith.decay_factor(params.log_tau, options.dt)


def output(params: ReadoutParams, state, options: ReadoutOptions, arith: Arithmetic = FLOAT) -> torch.Tensor:
    return state.y


def step(params: ReadoutParams, state, x_t: torch.Tensor, options: ReadoutOptions, arith: Arithmetic = FLOAT):
    """One step; returns ``(y_t, ReadoutState(y_t))``."""
    J = arith.synaptic_input(x_t, params.weight)
    if params.bias is not None and options.bias_into == "current":
        J = arith.current(J + params.bias)
    else:
        J = arith.current(J)
        if params.bias is not None:
            J = J + params.bias
    alpha = decay(params, options, arith)
    y = J if alpha is None else arith.state(arith.decay(state.y, alpha) + J)
    return y, ReadoutState(y)

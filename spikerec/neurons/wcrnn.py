"""Weakly coupled residual RNN (WCRNN): the one definition.

Dubinin & Effenberger (2024), "Fading memory as inductive bias in residual recurrent networks",
Neural Networks, Sec. 3 (eq. 11) and Sec. 4.4 (eqs. 18, 19). With a fixed residual map ``R``, a
small coupling ``gamma`` (scalar or per unit, ``diag(gamma)``) and the trainable biases the paper
adds to eq. 11 (Sec. 4)::

    a_t      = W_xx x_{t-1} + b_xx + W_sx s_t + b_sx
    linear   : x_t = R x_{t-1} + gamma * tanh(a_t)                 (eq. 11)
    A        : x_t = tanh(R x_{t-1}) + gamma * tanh(a_t)           (eq. 18)
    B        : x_t = tanh(R x_{t-1} + gamma * a_t)                 (eq. 19; an Elman RNN)
    no_tanh  : x_t = R x_{t-1} + gamma * a_t                       (Table 2, "WCRNN_no tanh")

The output is the state. Runs in FLOAT only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .arithmetic import FLOAT, Arithmetic

__all__ = ["WCRNNParams", "WCRNNOptions", "WCRNNState", "VARIANTS", "step", "output", "drive", "update"]

VARIANTS = ("linear", "A", "B", "no_tanh")


class WCRNNParams(NamedTuple):
    weight_sx: torch.Tensor
    bias_sx: torch.Tensor
    weight_xx: torch.Tensor
    bias_xx: torch.Tensor
    residual: torch.Tensor
    gamma: torch.Tensor


@dataclass(frozen=True)
class WCRNNOptions:
    variant: str = "linear"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"WCRNNOptions.variant: expected one of {VARIANTS}, got {self.variant!r}")


class WCRNNState(NamedTuple):
    x: torch.Tensor


def drive(params: WCRNNParams, s: torch.Tensor) -> torch.Tensor:
    """``W_sx s + b_sx`` for one step ``[B, C]`` or a whole sequence ``[T, B, C]``."""
    return s @ params.weight_sx.t() + params.bias_sx


def update(params: WCRNNParams, x: torch.Tensor, drive_t: torch.Tensor, options: WCRNNOptions) -> torch.Tensor:
    """``x_t`` from ``x_{t-1}`` and the input drive ``W_sx s_t + b_sx`` (module docstring)."""
    a = x @ params.weight_xx.t() + params.bias_xx + drive_t
    Rx = x @ params.residual.t()
    g = params.gamma
    if options.variant == "linear":
        return Rx + g * torch.tanh(a)
    if options.variant == "A":
        return torch.tanh(Rx) + g * torch.tanh(a)
    if options.variant == "B":
        return torch.tanh(Rx + g * a)
    return Rx + g * a


def output(params: WCRNNParams, state, x_t=None, options=None, arith: Arithmetic = FLOAT) -> torch.Tensor:
    return state.x


def step(params: WCRNNParams, state, x_t: torch.Tensor, options: WCRNNOptions, arith: Arithmetic = FLOAT):
    """One step; returns ``(x_t, WCRNNState(x_t))``."""
    if arith is not FLOAT:
        raise NotImplementedError(f"WCRNN step: runs in FLOAT arithmetic only, got {arith!r}")
    x = update(params, state.x, drive(params, x_t), options)
    return x, WCRNNState(x)

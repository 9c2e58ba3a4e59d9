"""Gated recurrent unit (GRU): the one definition.

Cho, van Merrienboer, Gulcehre, Bahdanau, Bougares, Schwenk & Bengio (2014), "Learning Phrase
Representations using RNN Encoder-Decoder for Statistical Machine Translation", §2.3 (eqs. 5-8),
in the form ``torch.nn.GRU`` computes (the reset gate applied after the recurrent matrix, two bias
vectors; ``docs/decisions.md``, neurons 4), gates ordered ``(r, z, n)``::

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)            (eq. 5)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)            (eq. 6)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))       (eq. 8, reset after the matmul)
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}                           (eq. 7)

The GRU is a real-valued cell: it runs in FLOAT only.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch.nn import functional as F

from .arithmetic import FLOAT, Arithmetic

__all__ = ["GRUParams", "GRUState", "step", "output"]


class GRUParams(NamedTuple):
    weight_ih: torch.Tensor   # [3H, C], rows (r, z, n)
    weight_hh: torch.Tensor   # [3H, H]
    bias_ih: Optional[torch.Tensor]
    bias_hh: Optional[torch.Tensor]


class GRUState(NamedTuple):
    h: torch.Tensor


def output(params: GRUParams, state, x_t: torch.Tensor, options=None, arith: Arithmetic = FLOAT) -> torch.Tensor:
    return state.h


def step(params: GRUParams, state, x_t: torch.Tensor, options=None, arith: Arithmetic = FLOAT):
    """One step of the module docstring's equations; returns ``(h_t, GRUState(h_t))``."""
    if arith is not FLOAT:
        raise NotImplementedError(f"GRU step: runs in FLOAT arithmetic only, got {arith!r}")
    h = state.h
    gi = F.linear(x_t, params.weight_ih, params.bias_ih)
    gh = F.linear(h, params.weight_hh, params.bias_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h_new = (1 - z) * n + z * h
    return h_new, GRUState(h_new)

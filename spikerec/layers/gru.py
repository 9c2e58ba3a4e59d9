"""Gated recurrent unit (Cho et al. 2014) in PyTorch's exact form, behind the cell protocol.

With gates ordered ``(r, z, n)`` as in ``torch.nn.GRU``::

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

The parameters are those of an inner ``torch.nn.GRU(input_size, hidden_size)``:
``forward`` runs it (cuDNN on GPU); ``step`` computes the equations above from the
same weights in plain torch (so ``torch.func`` can take transition Jacobians), equal
to ``torch.nn.GRU`` to float rounding. Initialisation is PyTorch's default
(``U(-1/sqrt(H), 1/sqrt(H))``). The "curse of memory" paper's GRU (digest 000 §5.4)
is the same cell with ``f = z``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .base import Cell, check_sequence, check_step_input

__all__ = ["GRU", "GRUState"]


class GRUState(NamedTuple):
    h: torch.Tensor


class GRU(Cell):
    """GRU layer ``[T, B, input_size] -> [T, B, hidden_size]``, state ``GRUState(h)``.

    Stability groups: time = ``weight_hh`` (recurrent), depth = ``weight_ih`` (input).
    """

    def __init__(self, input_size: int, hidden_size: int, *, bias: bool = True):
        super().__init__()
        for name, v in (("input_size", input_size), ("hidden_size", hidden_size)):
            if int(v) != v or int(v) < 1:
                raise ValueError(f"GRU: {name} must be a positive integer, got {v!r}")
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.output_size = self.hidden_size
        self.rnn = nn.GRU(self.input_size, self.hidden_size, bias=bias)
        self.State = GRUState

    @property
    def weight_ih(self) -> nn.Parameter:
        return self.rnn.weight_ih_l0

    @property
    def weight_hh(self) -> nn.Parameter:
        return self.rnn.weight_hh_l0

    def initial_state(self, batch: int, device=None, dtype=None) -> GRUState:
        device = device if device is not None else self.weight_ih.device
        dtype = dtype if dtype is not None else self.weight_ih.dtype
        return GRUState(torch.zeros(batch, self.hidden_size, device=device, dtype=dtype))

    def _check_state(self, state) -> None:
        if not isinstance(state, tuple) or len(state) != 1:
            raise TypeError("GRU state: expected GRUState(h)")
        h = state[0]
        if h.dim() != 2 or h.shape[-1] != self.hidden_size:
            raise ValueError(f"GRU state.h: expected shape [B, {self.hidden_size}], got {tuple(h.shape)}")

    def output(self, x_t: torch.Tensor, state: GRUState) -> torch.Tensor:
        return state.h

    def step(self, x_t: torch.Tensor, state: GRUState):
        """One step of the equations in the module docstring; returns ``(h_t, GRUState(h_t))``."""
        if x_t.is_complex():
            raise TypeError(f"GRU step input: expected a real tensor, got dtype {x_t.dtype}")
        check_step_input(x_t, self.input_size, "GRU step input")
        self._check_state(state)
        h = state.h
        gi = F.linear(x_t, self.weight_ih, self.rnn.bias_ih_l0 if self.rnn.bias else None)
        gh = F.linear(h, self.weight_hh, self.rnn.bias_hh_l0 if self.rnn.bias else None)
        i_r, i_z, i_n = gi.chunk(3, -1)
        h_r, h_z, h_n = gh.chunk(3, -1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h_new = (1 - z) * n + z * h
        return h_new, GRUState(h_new)

    def forward(self, x: torch.Tensor, state: GRUState | None = None):
        """Whole sequence through ``torch.nn.GRU``: ``(h[T, B, H], GRUState(h_T))``."""
        check_sequence(x, self.input_size, "GRU input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        self._check_state(state)
        out, h_n = self.rnn(x, state.h.unsqueeze(0).contiguous())
        return out, GRUState(h_n[0])

    def stability_groups(self) -> dict[str, list[nn.Parameter]]:
        return {"time": [self.weight_hh], "depth": [self.weight_ih]}

"""GRU layer: a thin shell over :mod:`spikerec.neurons.gru` (Cho et al. 2014, in ``torch.nn.GRU``'s form).

The parameters are those of an inner ``torch.nn.GRU(input_size, hidden_size)``: ``forward`` runs it
(cuDNN on GPU), a registered backend tested equal to the step (values and gradients, float64);
``step`` calls the one definition. Initialisation is PyTorch's default (``U(-1/sqrt(H), 1/sqrt(H))``).
The GRU of Zucchet & Orvieto (2024, "Recurrent neural networks: vanishing and exploding gradients are
not the end of the story") is the same cell with their forget gate ``f = z``.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import neurons
from ..neurons import gru as _gru
from ..neurons.gru import GRUParams, GRUState
from ..neurons.roles import ParamSpec, Role
from .base import Cell, check_sequence, check_step_input

__all__ = ["GRU", "GRUState"]


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

    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles (:mod:`spikerec.neurons.roles`): time = ``W_hh``, input = ``W_ih``; biases are not scaled by LSC."""
        return {
            "rnn.weight_ih_l0": ParamSpec(Role.INPUT),
            "rnn.weight_hh_l0": ParamSpec(Role.TIME),
            "rnn.bias_ih_l0": ParamSpec(Role.INPUT, multiplier=False),
            "rnn.bias_hh_l0": ParamSpec(Role.TIME, multiplier=False, slow=False),
        }

    def params(self) -> GRUParams:
        b = self.rnn.bias
        return GRUParams(self.weight_ih, self.weight_hh, self.rnn.bias_ih_l0 if b else None, self.rnn.bias_hh_l0 if b else None)

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
        return _gru.step(self.params(), state, x_t)

    def forward(self, x: torch.Tensor, state: GRUState | None = None):
        """Whole sequence through ``torch.nn.GRU``: ``(h[T, B, H], GRUState(h_T))``."""
        check_sequence(x, self.input_size, "GRU input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        self._check_state(state)
        out, h_n = self.rnn(x, state.h.unsqueeze(0).contiguous())
        return out, GRUState(h_n[0])


neurons.register_backend("gru", "layers.GRU.forward (torch.nn.GRU / cuDNN)", GRU.forward,
                         test="tests/test_gru.py::test_forward_equals_step_loop_with_gradients")

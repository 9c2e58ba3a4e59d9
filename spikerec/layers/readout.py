"""Leaky-integrator readout layer: a thin shell over :mod:`spikerec.neurons.readout`.

``y_t = alpha y_{t-1} + W x_t + b`` (equations there); ``tau=None`` gives the plain linear readout.
:func:`aggregate` turns the output sequence into logits: ``last``, ``mean``, ``max`` or
``per_step`` (the whole sequence). ``forward`` runs the diagonal linear scan
(:func:`spikerec.scan.linear_scan`), a registered backend tested equal to the step.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import neurons
from ..neurons import readout as _readout
from ..neurons.readout import ReadoutOptions, ReadoutParams, ReadoutState
from ..neurons.roles import ParamSpec, Role, Transform
from ..scan import linear_scan
from .base import Cell, check_sequence, check_step_input, check_time_constant, init_weight_

__all__ = ["LeakyReadout", "ReadoutState", "aggregate", "READOUT_MODES"]

READOUT_MODES = ("last", "mean", "max", "per_step")


def aggregate(y: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a readout sequence ``[T, B, K]`` to ``[B, K]`` (or keep it, ``per_step``)."""
    if mode == "last":
        return y[-1]
    if mode == "mean":
        return y.mean(0)
    if mode == "max":
        return y.max(0).values
    if mode == "per_step":
        return y
    raise ValueError(f"readout mode must be one of {READOUT_MODES}, got {mode!r}")


class LeakyReadout(Cell):
    """Leaky-integrator (non-spiking) readout layer."""

    def __init__(self, input_size: int, output_size: int, *, tau=None, dt: float = 1.0, bias: bool = True,
                 learn_tau: bool = False, init: str = "glorot_uniform"):
        super().__init__()
        self.input_size, self.output_size = int(input_size), int(output_size)
        self.dt = float(dt)
        self.weight = nn.Parameter(init_weight_(torch.empty(self.output_size, self.input_size), init, "readout init"))
        self.bias = nn.Parameter(torch.zeros(self.output_size)) if bias else None
        self.leaky = tau is not None
        if self.leaky:
            t = check_time_constant(tau, "readout tau")
            t = t.expand(self.output_size).clone() if t.dim() == 0 else t
            self.log_tau = nn.Parameter(t.log(), requires_grad=learn_tau)
        else:
            self.log_tau = None
        self.State = ReadoutState

    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles of the parameters (:mod:`spikerec.neurons.roles`)."""
        return {
            "weight": ParamSpec(Role.READOUT),
            "bias": ParamSpec(Role.READOUT, multiplier=False),
            "log_tau": ParamSpec(Role.TIME, Transform.LOG_TAU),
        }

    def params(self) -> ReadoutParams:
        return ReadoutParams(self.weight, self.bias, self.log_tau)

    def options(self) -> ReadoutOptions:
        return ReadoutOptions(dt=self.dt)

    def alpha(self):
        return _readout.decay(self.params(), self.options())

    def initial_state(self, batch, device=None, dtype=None):
        device = device if device is not None else self.weight.device
        dtype = dtype if dtype is not None else self.weight.dtype
        return ReadoutState(torch.zeros(batch, self.output_size, device=device, dtype=dtype))

    def output(self, x_t, state):
        return state.y

    def step(self, x_t, state):
        check_step_input(x_t, self.input_size)
        return _readout.step(self.params(), state, x_t, self.options())

    def forward(self, x, state=None):
        check_sequence(x, self.input_size, "readout input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        J = x @ self.weight.t()
        if self.bias is not None:
            J = J + self.bias
        if not self.leaky:
            return J, ReadoutState(J[-1])
        y = linear_scan(self.alpha().expand_as(J), J, state.y)
        return y, ReadoutState(y[-1])


neurons.register_backend("readout", "layers.LeakyReadout.forward (linear scan)", LeakyReadout.forward,
                         test="tests/test_neurons.py::test_readout_forward_equals_step")

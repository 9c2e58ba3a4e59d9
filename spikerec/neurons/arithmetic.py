"""The arithmetic hook of a neuron step: the operations whose rules differ between training in
floating point and running on a chip's fixed-point datapath.

A step (``spikerec.neurons.lif.step`` and friends) is written once, in terms of these operations;
the *order* of the operations (synaptic input, synaptic decay, membrane decay, reset, spike) is the
step's, and the few orderings that targets disagree on are options of the step (``synapse`` order,
``bias_into``) or of the arithmetic (``reset_timing``). An arithmetic object supplies:

* ``synaptic_input(x, weight, into=None)``: ``into + W x`` for one step (``W x`` without ``into``);
  an integer arithmetic may saturate after each partial sum, as Xylo does per input event, starting
  from ``into`` (the synaptic current the events are added to);
* ``decay_factor(log_tau, dt)`` and ``decay(x, factor)``: the leak. FLOAT multiplies by
  ``exp(-dt / tau)``; integer rules (Loihi's ``(x (2^12 - d)) >> 12`` toward zero, Xylo's
  ``x - (x >> dash)`` that removes at least one LSB) read the time-constant field of the parameters
  as their decay code, so ``decay_factor`` returns it unchanged;
* ``integrate(v, factor, i, bias)``: the membrane's leak plus the step's input, ``decay(v, factor) +
  i (+ bias)``, before the state's overflow (``bias`` is None unless it goes into the voltage). A
  datapath that saturates the increment before adding it to ``v`` (Xylo Audio 2) says so here;
* ``current(i)`` and ``state(v)``: overflow of the synaptic current and of a state variable after
  each update (identity in FLOAT; two's-complement wrap or saturation in integers);
* ``spike(v, threshold, surrogate)``: spike generation from the membrane *before* its reset.
  FLOAT: ``H(v - thr)`` with the surrogate derivative; binary integers: ``[v > thr]`` (or ``>=``);
  multi-spike targets: the count ``clamp(floor(v / thr), 0, n_max)``, and reset "subtract" then
  removes ``n thr``;
* ``product(beta, a)``: the product of a gain and a state in the arithmetic's fixed point (ALIF's
  ``beta a``; an integer arithmetic shifts out its fractional bits);
* ``reset_timing``: ``"next_step"`` (spikerec's float model, snnTorch ``reset_delay=True``: the
  subtraction follows the decay of step ``t+1`` and is not decayed) or ``"immediate"`` (chips: the
  reset follows the spike at once, so it is decayed with the membrane at step ``t+1``).

The state always holds the membrane before the reset; a step recomputes the previous spike from
it, so both timings are expressed by where the step subtracts ``thr z_{t-1}``.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..surrogate import Surrogate

__all__ = ["Arithmetic", "FloatArithmetic", "FLOAT", "RESET_TIMINGS"]

RESET_TIMINGS = ("next_step", "immediate")


@runtime_checkable
class Arithmetic(Protocol):
    """The operations a neuron step delegates (module docstring)."""

    reset_timing: str

    def synaptic_input(self, x: torch.Tensor, weight: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor: ...

    def decay_factor(self, log_tau: torch.Tensor, dt: float) -> torch.Tensor: ...

    def decay(self, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor: ...

    def integrate(self, v: torch.Tensor, factor: torch.Tensor, i: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor: ...

    def current(self, i: torch.Tensor) -> torch.Tensor: ...

    def state(self, v: torch.Tensor) -> torch.Tensor: ...

    def spike(self, v: torch.Tensor, threshold: torch.Tensor, surrogate: Surrogate | None) -> torch.Tensor: ...

    def product(self, gain: torch.Tensor, x: torch.Tensor) -> torch.Tensor: ...


class FloatArithmetic:
    """Floating point with autograd: the arithmetic spikerec trains in.

    ``decay_factor = exp(-dt exp(-log_tau))``, ``decay = factor * x``, no overflow, spikes through the
    surrogate (Heaviside forward), reset at the next step."""

    reset_timing = "next_step"

    def synaptic_input(self, x, weight, into=None):
        out = x @ weight.t()
        return out if into is None else into + out

    def decay_factor(self, log_tau, dt):
        return torch.exp(-dt * torch.exp(-log_tau))

    def decay(self, x, factor):
        return factor * x

    def integrate(self, v, factor, i, bias):
        return self.decay(v, factor) + (i if bias is None else i + bias)

    def current(self, i):
        return i

    def state(self, v):
        return v

    def spike(self, v, threshold, surrogate):
        return surrogate(v - threshold)

    def product(self, gain, x):
        return gain * x

    def __repr__(self) -> str:
        return "FLOAT"


#: the default arithmetic of every step
FLOAT = FloatArithmetic()

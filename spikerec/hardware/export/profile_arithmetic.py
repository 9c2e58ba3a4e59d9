"""The integer arithmetic of a layered target profile (``loihi2``, ``generic``) as an arithmetic of
the one neuron step (:mod:`spikerec.neurons.arithmetic`).

Each quantised layer runs :func:`spikerec.neurons.lif.step`, :func:`spikerec.neurons.alif.step` or
:func:`spikerec.neurons.readout.step` with :class:`ProfileArithmetic`: weights are the shifted
mantissas, the time-constant fields hold decay codes, and the profile supplies

* ``decay``: ``sign(x) ((|x| (2^B - d)) >> B)`` (``mulshift``, Lava's ``PyLifModelBitAcc``: rounding
  toward zero) or ``x - (x >> dash)`` (``bitshift``, floor);
* ``current``/``state``: the overflow rule of the current and of the state (:func:`overflow`);
* ``spike``: ``v > thr`` (strict) or ``v >= thr``;
* ``product``: ``(beta a) >> adapt_frac_bits`` (ALIF's fixed-point threshold gain);
* ``reset_timing``: the profile's (``immediate`` on chips, ``next_step`` as spikerec's float model).

(The Xylo core has its own arithmetic, :class:`spikerec.hardware.export.xylo.spec.XyloArithmetic`.)
"""
from __future__ import annotations

import torch

from .profiles import TargetProfile

__all__ = ["ProfileArithmetic", "overflow", "decay"]


def overflow(x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """Two's-complement wrap to ``[-2^(N-1), 2^(N-1))``, Lava's wrap to ``(-2^(N-1), 2^(N-1)]``
    (``"wrap_lava"``: ``x > 2^(N-1)`` loses ``2^N``, ``x <= -2^(N-1)`` gains ``2^N``), or symmetric
    saturation to ``+-(2^(N-1) - 1)``."""
    if mode == "wrap":
        half = 1 << (bits - 1)
        return torch.remainder(x + half, 1 << bits) - half
    if mode == "wrap_lava":
        half = 1 << (bits - 1)
        return half - torch.remainder(half - x, 1 << bits)
    lim = (1 << (bits - 1)) - 1
    return x.clamp(-lim, lim)


def decay(x: torch.Tensor, code: torch.Tensor, profile: TargetProfile) -> torch.Tensor:
    """``sign(x) ((|x| (2^B - d)) >> B)`` (mulshift) or ``x - (x >> dash)`` (bitshift)."""
    if profile.decay == "mulshift":
        return torch.sign(x) * ((x.abs() * ((1 << profile.decay_bits) - code)) >> profile.decay_bits)
    return x - (x >> code)


class ProfileArithmetic:
    """The integer rules of a :class:`~spikerec.hardware.export.profiles.TargetProfile` for the neuron steps."""

    def __init__(self, profile: TargetProfile):
        self.p = profile
        self.reset_timing = profile.reset_timing

    def synaptic_input(self, x, weight, into=None):
        out = x @ weight.t()
        return out if into is None else into + out

    def decay_factor(self, code, dt):
        return code

    def decay(self, x, code):
        return decay(x, code, self.p)

    def integrate(self, v, code, i, bias):
        return self.decay(v, code) + (i if bias is None else i + bias)

    def current(self, i):
        return overflow(i, self.p.current_bits, self.p.current_overflow)

    def state(self, v):
        return overflow(v, self.p.state_bits, self.p.state_overflow)

    def spike(self, v, threshold, surrogate):
        return (v > threshold).long() if self.p.strict_threshold else (v >= threshold).long()

    def product(self, gain, x):
        return (gain * x) >> self.p.adapt_frac_bits

    def __repr__(self) -> str:
        return f"ProfileArithmetic({self.p.name!r})"

"""Integer simulator of a :class:`~spikerec.hardware.quantize.QuantizedNetwork`.

Integer arithmetic only (int64 tensors holding values of the profile's widths), vectorised
over the batch; the rules are those of :mod:`spikerec.hardware.profiles`. One step of a
spiking layer with state ``(i, v, z, a)`` and input spikes/counts ``x``::

    a_in = (W x + W_rec z) << shift
    i    = OV_I(decay(i, d_i) + a_in [+ bias if bias_into == "current"])
    v'   = v - R z  (subtract, immediate)  |  0 where z (zero)  |  v
    v    = OV_V(decay(v', d_v) + i [+ bias if bias_into == "voltage"] [- R z  (subtract, next_step)])
    z    = [v > thr]

ALIF (``kind == "alif"``): ``a = OV_V(decay(a, d_a) + inc z)``, ``theta = b + ((beta a) >> q)``,
``v = OV_V(decay(v, d_v) + i - theta z)`` (spikerec order: adaptation first, then the subtraction
of the new threshold), ``z = [v > theta]``. The readout is ``y = OV_V(decay(y, d_v) + i + bias)``.
:mod:`spikerec.hardware.intsim_reference` implements the same rules with Python integers;
the tests compare them bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .profiles import TargetProfile
from .qnetwork import QLayer, QuantizedNetwork
from .xylo_network import XyloNetwork

__all__ = ["simulate", "evaluate", "IntSimResult", "check_integer_input", "decay", "overflow"]


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


def check_integer_input(x: torch.Tensor, input_size: int) -> torch.Tensor:
    """``x`` as int64 ``[T, B, C]``; a clear error for non-integer values (spikes/counts expected)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != input_size:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"integer simulator input: expected a tensor [T, B, {input_size}], got {shape}")
    if x.is_floating_point():
        if not torch.isfinite(x).all() or (x != torch.round(x)).any():
            raise ValueError("integer simulator input: expected integer-valued spikes or counts; got non-integer "
                             "values (round or spike-encode the input first)")
    return x.long()


@dataclass
class IntSimResult:
    """Readout sequence ``y[T, B, K]`` (int64, readout state units), each hidden layer's spikes
    ``[T, B, N]`` (bool) and per-layer mean firing rates."""

    y: torch.Tensor
    spikes: list[torch.Tensor]
    scale: float

    @property
    def firing_rates(self) -> list[float]:
        return [float(z.double().mean()) for z in self.spikes]


def _spiking_step(q: QLayer, p: TargetProfile, x, state):
    i, v, z, a = state
    acc = x @ q.weight.t()
    if q.recurrent_weight is not None:
        acc = acc + z @ q.recurrent_weight.t()
    acc = acc << q.shift
    if p.bias_into == "current":
        acc = acc + q.bias
    i = overflow(decay(i, q.decay_i, p) + acc, p.current_bits, p.current_overflow)
    extra = i if p.bias_into == "current" else i + q.bias
    if q.kind == "alif":
        a = overflow(decay(a, q.decay_a, p) + q.adapt_inc * z, p.state_bits, p.state_overflow)
        theta = q.b + ((q.beta * a) >> p.adapt_frac_bits)
        v = overflow(decay(v, q.decay_v, p) + extra - theta * z, p.state_bits, p.state_overflow)
        return (i, v, (v > theta).long(), a)
    reset, R = q.reset, q.reset_amount
    if reset == "zero":
        v = torch.where(z.bool(), torch.zeros_like(v), v)
    elif reset == "subtract" and p.reset_timing == "immediate":
        v = v - R * z
    v = decay(v, q.decay_v, p) + extra
    if reset == "subtract" and p.reset_timing == "next_step":
        v = v - R * z
    v = overflow(v, p.state_bits, p.state_overflow)
    return (i, v, (v > q.threshold).long(), a)


def _readout_step(q: QLayer, p: TargetProfile, x, y):
    acc = (x @ q.weight.t()) << q.shift
    i = overflow(acc + q.bias, p.current_bits, p.current_overflow) if p.bias_into == "current" else \
        overflow(acc, p.current_bits, p.current_overflow) + q.bias
    return overflow(decay(y, q.decay_v, p) + i, p.state_bits, p.state_overflow)


@torch.no_grad()
def simulate(qnet: QuantizedNetwork, x: torch.Tensor) -> IntSimResult:
    """Run the integer network on ``x[T, B, C]`` (integer-valued). A Xylo network
    (:class:`~spikerec.hardware.xylo_network.XyloNetwork`) runs its whole core
    (:func:`~spikerec.hardware.xylo.simulate_spec`); ``y`` is then ``Vmem_out``."""
    if isinstance(qnet, XyloNetwork):
        x = check_integer_input(x, qnet.input_size)
        r = qnet.run(x)
        return IntSimResult(r.vmem_out, qnet.layer_spikes(r.spikes), qnet.spec.out_scale)
    p = qnet.profile
    x = check_integer_input(x, qnet.input_size)
    T, B, _ = x.shape
    hidden, ro = qnet.layers[:-1], qnet.layers[-1]
    zeros = lambda n: torch.zeros(B, n, dtype=torch.long)  # noqa: E731
    states = [(zeros(q.size), zeros(q.size), zeros(q.size), zeros(q.size)) for q in hidden]
    y = zeros(ro.size)
    ys, spikes = [], [[] for _ in hidden]
    for t in range(T):
        h = x[t]
        for k, q in enumerate(hidden):
            states[k] = _spiking_step(q, p, h, states[k])
            h = states[k][2]
            spikes[k].append(h)
        y = _readout_step(ro, p, h, y)
        ys.append(y)
    return IntSimResult(torch.stack(ys), [torch.stack(s).bool() for s in spikes], ro.scale)


def logits(qnet: QuantizedNetwork, y: torch.Tensor) -> torch.Tensor:
    """Aggregate the integer readout like the float model (in float, divided by the readout scale)."""
    from ..layers.readout import aggregate

    scale = qnet.spec.out_scale if isinstance(qnet, XyloNetwork) else qnet.layers[-1].scale
    return aggregate(y.double() / scale, qnet.readout_mode)


def evaluate(qnet: QuantizedNetwork, batches) -> dict:
    """Accuracy and per-layer firing rates over an iterable of ``(x[T, B, C], labels[B])``."""
    correct = total = 0
    rates, steps = None, 0
    for x, labels in batches:
        res = simulate(qnet, x)
        pred = logits(qnet, res.y).argmax(-1)
        correct += int((pred == torch.as_tensor(labels)).sum())
        total += len(labels)
        r = res.firing_rates
        rates = r if rates is None else [a + b for a, b in zip(rates, r)]
        steps += 1
    if total == 0:
        raise ValueError("evaluate: no data")
    return {"accuracy": correct / total, "firing_rates": [r / steps for r in rates], "samples": total}

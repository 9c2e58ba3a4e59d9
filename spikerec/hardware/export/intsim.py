"""Integer simulator of a :class:`~spikerec.hardware.export.quantized_network.QuantizedNetwork` (or of a Xylo
:class:`~spikerec.hardware.export.xylo.network.XyloNetwork`).

Integer arithmetic only (int64 tensors holding values of the profile's widths), vectorised over the
batch. There is no second copy of the neuron equations here: each layer runs the one step of its
kind (:func:`spikerec.neurons.lif.step`, :func:`spikerec.neurons.alif.step`,
:func:`spikerec.neurons.readout.step`) with the profile's integer arithmetic
(:class:`~spikerec.hardware.export.profile_arithmetic.ProfileArithmetic`: decay rule, overflow, ``>``/``>=``, reset
timing), so for a LIF layer with state ``(i, v)`` and input spikes/counts ``x``::

    i    = OV_I(decay(i, d_i) + (W x + W_rec z_{t-1}) << shift [+ bias if bias_into == "current"])
    v    = OV_V(decay(v - R z_{t-1} (subtract, immediate) | 0 where z_{t-1} (zero) | v, d_v) + i
                [+ bias if bias_into == "voltage"] [- R z_{t-1} (subtract, next_step)])
    z    = [v > R]  (or >=)

``tests/intsim_reference.py`` implements the rules again with Python integers, neuron by
neuron; the tests compare them bit for bit. A Xylo network runs its whole core
(:func:`spikerec.hardware.export.xylo.spec.simulate_spec`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import neurons
from ...neurons import alif, lif, readout
from .profile_arithmetic import ProfileArithmetic, decay, overflow
from .profiles import TargetProfile
from .quantized_network import QLayer, QuantizedNetwork
from .xylo.network import XyloNetwork

__all__ = ["simulate", "evaluate", "IntSimResult", "check_integer_input", "decay", "overflow"]


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


def layer_step(q: QLayer, p: TargetProfile):
    """``(step, params, options)`` of one quantised layer for the one neuron step: weights as shifted
    mantissas, decay codes in the time-constant fields, the reset amount as the threshold (the
    arithmetic compares with ``>`` or ``>=``)."""
    W = q.weight << q.shift
    R = None if q.recurrent_weight is None else q.recurrent_weight << q.shift
    if q.kind == "lif":
        return lif.step, lif.LIFParams(W, q.bias, R, q.decay_v, q.decay_i if q.cuba else None, q.reset_amount), \
            lif.LIFOptions(reset=q.reset, bias_into=p.bias_into)
    if q.kind == "alif":
        return alif.step, alif.ALIFParams(W, q.bias, R, q.decay_v, q.decay_a, q.b, q.beta, adapt_gain=q.adapt_inc), \
            alif.ALIFOptions(bias_into=p.bias_into)
    return readout.step, readout.ReadoutParams(W, q.bias, q.decay_v), readout.ReadoutOptions(bias_into=p.bias_into)


def _initial_state(q: QLayer, B: int):
    z = torch.zeros(B, q.size, dtype=torch.long)
    if q.kind == "lif":
        return lif.CubaLIFState(z, z) if q.cuba else lif.LIFState(z)
    if q.kind == "alif":
        return alif.ALIFState(z, z)
    return readout.ReadoutState(z)


@torch.no_grad()
def simulate(qnet: QuantizedNetwork, x: torch.Tensor) -> IntSimResult:
    """Run the integer network on ``x[T, B, C]`` (integer-valued). A Xylo network
    (:class:`~spikerec.hardware.export.xylo.network.XyloNetwork`) runs its whole core
    (:func:`~spikerec.hardware.export.xylo.spec.simulate_spec`); ``y`` is then ``Vmem_out``."""
    if isinstance(qnet, XyloNetwork):
        x = check_integer_input(x, qnet.input_size)
        r = qnet.run(x)
        return IntSimResult(r.vmem_out, qnet.layer_spikes(r.spikes), qnet.spec.out_scale)
    p = qnet.profile
    x = check_integer_input(x, qnet.input_size)
    T, B, _ = x.shape
    arith = ProfileArithmetic(p)
    steps = [layer_step(q, p) for q in qnet.layers]
    states = [_initial_state(q, B) for q in qnet.layers]
    ys, spikes = [], [[] for _ in qnet.layers[:-1]]
    for t in range(T):
        h = x[t]
        for k, (step, prm, opt) in enumerate(steps):
            h, states[k] = step(prm, states[k], h, opt, arith)
            (ys if k == len(steps) - 1 else spikes[k]).append(h)
    return IntSimResult(torch.stack(ys), [torch.stack(s).bool() for s in spikes], qnet.layers[-1].scale)


def logits(qnet: QuantizedNetwork, y: torch.Tensor) -> torch.Tensor:
    """Aggregate the integer readout like the float model (in float, divided by the readout scale)."""
    from ...layers.readout import aggregate

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


for _kind in ("lif", "alif", "readout"):
    neurons.register_backend(_kind, "hardware.export.intsim.simulate (integer profiles, ProfileArithmetic)", simulate,
                             test="tests/test_intsim.py::test_bit_exact_with_reference")

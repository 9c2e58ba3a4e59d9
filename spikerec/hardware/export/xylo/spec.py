"""Xylo's network specification and spikerec's integer simulator of it.

A :class:`XyloSpec` holds what the chip is configured with, named as the arguments of Rockpool's
``XyloSim.from_specification`` (``weights_in``, ``weights_rec``, ``weights_out``, ``dash_mem``,
``dash_syn``, ``dash_mem_out``, ``dash_syn_out``, ``threshold``, ``threshold_out``, ``bias``,
``bias_out``, ``weight_shift_in``, ``weight_shift_rec``, ``weight_shift_out``). All hidden neurons live
on one recurrent core: a stack of hidden layers is one ``weights_rec`` matrix whose diagonal blocks
are each layer's recurrent weights and whose blocks above the diagonal carry layer ``k`` to layer
``k+1``. Hence one step of delay per layer (layer ``k+1`` sees layer ``k``'s spikes of the previous
step) and one more to the output neurons, and one weight shift per matrix.

:func:`simulate_spec` runs the one LIF step (:func:`spikerec.neurons.lif.step`) with the rules of
:mod:`spikerec.hardware.export.xylo.arithmetic` as its arithmetic (:class:`XyloArithmetic`), vectorised over the batch;
``xylosim`` (:mod:`spikerec.hardware.export.xylo.xylosim_bridge`) is the reference it is tested against.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from ....atomic import atomic_write_text
from ....errors import ExportError
from .... import neurons
from ....neurons import lif
from .arithmetic import (INPUT_EVENT_CAP, SPIKE_CAP, STATE_MAX, accumulate, integrate_v1, integrate_v2, multi_spike,
                         saturate, xylo_decay)

__all__ = ["XyloSpec", "XyloResult", "XyloArithmetic", "layer_params", "XYLO_LIMITS", "XyloLimitError", "check_limits", "simulate_spec"]


class XyloLimitError(ExportError):
    """The network does not fit the chip; the message names the limit and the layer."""


#: Chip limits per version. Sources: Rockpool's Xylo documentation and ``config_from_specification``
#: checks (syns61300 "Xylo SNN core": 16 input channels, 1000 hidden neurons, 8 output neurons, int8
#: weights, 4-bit weight shifts and dashes, 16-bit state; syns61201 adds a per-neuron bias), and the
#: vendor's simulator ``xylosim`` 0.1.3 for the event caps (15 input events per channel and step, at
#: most 31 spikes per neuron and step), which the tests confirm.
XYLO_LIMITS = {
    1: dict(inputs=16, hidden=1000, outputs=8, weight_bits=8, shift_max=7, dash_max=15, threshold_max=STATE_MAX,
            bias=False, input_events=INPUT_EVENT_CAP),
    2: dict(inputs=16, hidden=1000, outputs=8, weight_bits=8, shift_max=7, dash_max=15, threshold_max=STATE_MAX,
            bias=True, input_events=INPUT_EVENT_CAP),
}


def _long(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long)


@dataclass
class XyloSpec:
    """One Xylo network (integer tensors; ``weights_*[pre, post]``)."""

    weights_in: torch.Tensor
    weights_rec: torch.Tensor
    weights_out: torch.Tensor
    dash_mem: torch.Tensor
    dash_syn: torch.Tensor
    dash_mem_out: torch.Tensor
    dash_syn_out: torch.Tensor
    threshold: torch.Tensor
    threshold_out: torch.Tensor
    weight_shift_in: int = 0
    weight_shift_rec: int = 0
    weight_shift_out: int = 0
    bias: torch.Tensor | None = None
    bias_out: torch.Tensor | None = None
    version: int = 1
    layer_sizes: list[int] = field(default_factory=list)
    out_scale: float = 1.0

    def __post_init__(self):
        for k in ("weights_in", "weights_rec", "weights_out", "dash_mem", "dash_syn", "dash_mem_out", "dash_syn_out",
                  "threshold", "threshold_out", "bias", "bias_out"):
            if getattr(self, k) is not None:
                setattr(self, k, _long(getattr(self, k)))
        if not self.layer_sizes:
            self.layer_sizes = [self.n_hidden]

    @property
    def n_in(self) -> int:
        return int(self.weights_in.shape[0])

    @property
    def n_hidden(self) -> int:
        return int(self.weights_in.shape[1])

    @property
    def n_out(self) -> int:
        return int(self.weights_out.shape[1])

    def layer_of(self, j: int) -> int:
        """The hidden layer a core neuron belongs to."""
        acc = 0
        for k, n in enumerate(self.layer_sizes):
            acc += n
            if j < acc:
                return k
        raise IndexError(j)

    def to_dict(self) -> dict:
        """JSON-ready: the arguments of ``XyloSim.from_specification`` plus ``version``, ``layer_sizes``
        and ``out_scale`` (readout state units per float unit)."""
        d = {}
        for k, v in self.__dict__.items():
            d[k] = v.tolist() if isinstance(v, torch.Tensor) else v
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "XyloSpec":
        return cls(**d)

    def save(self, path: str) -> str:
        atomic_write_text(path, json.dumps(self.to_dict()))
        return path

    @classmethod
    def load(cls, path: str) -> "XyloSpec":
        try:
            return cls.from_dict(json.load(open(path)))
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: not a Xylo specification ({e})") from None


def check_limits(spec: XyloSpec, names: list[str] | None = None) -> None:
    """Raise :class:`XyloLimitError` naming the first chip limit the spec exceeds and the layer."""
    lim = XYLO_LIMITS[spec.version]
    names = names or [f"cells.{k}" for k in range(len(spec.layer_sizes))]
    chip = f"Xylo v{spec.version}"

    def fail(what, layer):
        raise XyloLimitError(f"layer {layer}: {what} on {chip}")

    if spec.n_in > lim["inputs"]:
        fail(f"{spec.n_in} input channels exceed the limit of {lim['inputs']} inputs", names[0])
    if spec.n_hidden > lim["hidden"]:
        fail(f"{spec.n_hidden} hidden neurons (all hidden layers together, {spec.layer_sizes}) exceed the limit of "
             f"{lim['hidden']} hidden neurons", names[-1])
    if spec.n_out > lim["outputs"]:
        fail(f"{spec.n_out} output neurons exceed the limit of {lim['outputs']} outputs", "readout")
    wmin, wmax = -(2 ** (lim["weight_bits"] - 1)), 2 ** (lim["weight_bits"] - 1) - 1
    for key, layer in (("weights_in", names[0]), ("weights_rec", names[-1]), ("weights_out", "readout")):
        w = getattr(spec, key)
        if w.numel() and (int(w.min()) < wmin or int(w.max()) > wmax):
            fail(f"{key} outside the {lim['weight_bits']}-bit weight range [{wmin}, {wmax}]", layer)
    for key in ("weight_shift_in", "weight_shift_rec", "weight_shift_out"):
        s = getattr(spec, key)
        if not 0 <= s <= lim["shift_max"]:
            fail(f"{key} = {s} outside the one-shift-per-matrix range 0..{lim['shift_max']}", names[0])
    for key in ("dash_mem", "dash_syn", "dash_mem_out", "dash_syn_out"):
        d = getattr(spec, key)
        if d.numel() and (int(d.min()) < 0 or int(d.max()) > lim["dash_max"]):
            fail(f"{key} outside the 4-bit decay range 0..{lim['dash_max']}", names[0])
    for key in ("threshold", "threshold_out"):
        t = getattr(spec, key)
        if t.numel() and (int(t.min()) < 1 or int(t.max()) > lim["threshold_max"]):
            fail(f"{key} outside 1..{lim['threshold_max']}", names[0] if key == "threshold" else "readout")
    has_bias = any(b is not None and bool((b != 0).any()) for b in (spec.bias, spec.bias_out))
    if has_bias and not lim["bias"]:
        fail("a bias is not supported (Xylo v1 has no bias; use the v2 profile 'xylo2' or train without bias)",
             names[0])
    for key, layer in (("bias", names[0]), ("bias_out", "readout")):
        b = getattr(spec, key)
        if b is not None and b.numel() and (int(b.min()) < -STATE_MAX - 1 or int(b.max()) > STATE_MAX):
            fail(f"{key} outside the 16-bit range [{-STATE_MAX - 1}, {STATE_MAX}]", layer)


@dataclass
class XyloResult:
    """Recorded state ``[T, B, ...]`` (int64) of the core, as ``xylosim`` records it."""

    spikes: torch.Tensor     # hidden spike counts [T, B, N]
    vmem: torch.Tensor       # hidden membranes after the reset [T, B, N]
    isyn: torch.Tensor       # hidden synaptic currents [T, B, N]
    out_spikes: torch.Tensor
    vmem_out: torch.Tensor
    isyn_out: torch.Tensor


class XyloArithmetic:
    """The Xylo datapath as an arithmetic of the one LIF step (:func:`spikerec.neurons.lif.step` with
    ``synapse="add_then_decay"``, ``bias_into="voltage"``, reset "subtract"): decay codes are dashes,
    input events saturate one by one, states saturate to 16 bits, spikes are counts up to ``spike_cap``
    (31 for hidden neurons, 1 for output neurons), the reset is immediate, and the membrane integrates
    by the rule of the chip ``version`` (:func:`~spikerec.hardware.export.xylo.arithmetic.integrate_v1` or
    :func:`~spikerec.hardware.export.xylo.arithmetic.integrate_v2`)."""

    reset_timing = "immediate"

    def __init__(self, spike_cap: int = SPIKE_CAP, version: int = 1):
        self.spike_cap = spike_cap
        self.version = version
        self._integrate = {1: integrate_v1, 2: integrate_v2}[version]

    def synaptic_input(self, x, weight, into=None):
        """``W x`` alone, or the events of ``x`` added one by one to ``into`` with saturation after each."""
        if into is None:
            return x @ weight.t()
        return accumulate(into, x, weight.t(), 0)

    def decay_factor(self, code, dt):
        return code

    def decay(self, x, code):
        return xylo_decay(x, code)

    def integrate(self, v, code, i, bias):
        return self._integrate(v, code, i, bias)

    def current(self, i):
        return saturate(i)

    def state(self, v):
        return saturate(v)

    def spike(self, v, threshold, surrogate):
        return multi_spike(v, threshold, self.spike_cap)

    def product(self, gain, x):
        raise NotImplementedError("Xylo has no adaptive neurons")

    def __repr__(self) -> str:
        return f"XyloArithmetic(spike_cap={self.spike_cap}, version={self.version})"


#: (hidden, output) arithmetic per chip version
ARITHMETIC = {v: (XyloArithmetic(SPIKE_CAP, v), XyloArithmetic(1, v)) for v in (1, 2)}
OPTIONS = lif.LIFOptions(reset="subtract", synapse="add_then_decay", bias_into="voltage")


def layer_params(spec: XyloSpec) -> tuple[list[lif.LIFParams], lif.LIFParams]:
    """The core as one :class:`~spikerec.neurons.lif.LIFParams` per hidden layer (mantissas already
    shifted) and one for the output neurons. Raises if ``weights_rec`` connects anything but a layer
    to itself and to the next layer (the delays of the one-core layout assume that block structure)."""
    sizes, offs = spec.layer_sizes, [sum(spec.layer_sizes[:k]) for k in range(len(spec.layer_sizes))]
    if sum(sizes) != spec.n_hidden:
        raise ValueError(f"Xylo spec: layer_sizes {sizes} do not add up to {spec.n_hidden} hidden neurons")
    mask = torch.zeros_like(spec.weights_rec, dtype=torch.bool)
    hidden = []
    for k, (o, n) in enumerate(zip(offs, sizes)):
        if k == 0:
            w = spec.weights_in[:, o:o + n].t() << spec.weight_shift_in
        else:
            p = offs[k - 1]
            w = spec.weights_rec[p:p + sizes[k - 1], o:o + n].t() << spec.weight_shift_rec
            mask[p:p + sizes[k - 1], o:o + n] = True
        mask[o:o + n, o:o + n] = True
        wr = spec.weights_rec[o:o + n, o:o + n]
        hidden.append(lif.LIFParams(
            weight=w, bias=spec.bias[o:o + n] if spec.bias is not None else None,
            recurrent_weight=(wr.t() << spec.weight_shift_rec) if bool((wr != 0).any()) else None,
            log_tau_mem=spec.dash_mem[o:o + n], log_tau_syn=spec.dash_syn[o:o + n], threshold=spec.threshold[o:o + n]))
    if bool((spec.weights_rec[~mask] != 0).any()):
        raise ValueError("Xylo spec: weights_rec has connections outside the layer blocks (a layer to itself and to "
                         "the next layer); spikerec's simulator runs stacked layers only")
    o = offs[-1]
    out = lif.LIFParams(weight=spec.weights_out[o:].t() << spec.weight_shift_out, bias=spec.bias_out,
                        recurrent_weight=None, log_tau_mem=spec.dash_mem_out, log_tau_syn=spec.dash_syn_out,
                        threshold=spec.threshold_out)
    return hidden, out


@torch.no_grad()
def simulate_spec(spec: XyloSpec, x: torch.Tensor) -> XyloResult:
    """Run the core on input event counts ``x[T, B, n_in]`` (integers; counts above 15 are cut).

    Each hidden layer and the output neurons advance with :func:`spikerec.neurons.lif.step` under
    :class:`XyloArithmetic`; layer ``k+1`` and the outputs read the spike counts of the previous step."""
    x = torch.as_tensor(x)
    if x.dim() != 3 or x.shape[-1] != spec.n_in:
        raise ValueError(f"Xylo simulator input: expected [T, B, {spec.n_in}] event counts, got {tuple(x.shape)}")
    if x.is_floating_point() and (x != torch.round(x)).any():
        raise ValueError("Xylo simulator input: expected integer event counts")
    x = x.long().clamp(0, INPUT_EVENT_CAP)
    T, B, _ = x.shape
    hidden, out = layer_params(spec)
    HIDDEN, OUTPUT = ARITHMETIC[spec.version]
    zeros = lambda n: torch.zeros(B, n, dtype=torch.long)  # noqa: E731
    states = [lif.CubaLIFState(zeros(p.threshold.numel()), zeros(p.threshold.numel())) for p in hidden]
    ostate = lif.CubaLIFState(zeros(spec.n_out), zeros(spec.n_out))
    rec = {k: [] for k in ("spikes", "vmem", "isyn", "out_spikes", "vmem_out", "isyn_out")}
    for t in range(T):
        prev = [HIDDEN.spike(s.v, p.threshold, None) for s, p in zip(states, hidden)]
        zs = []
        for k, p in enumerate(hidden):
            z, states[k] = lif.step(p, states[k], x[t] if k == 0 else prev[k - 1], OPTIONS, HIDDEN)
            zs.append(z)
        zo, ostate = lif.step(out, ostate, prev[-1], OPTIONS, OUTPUT)
        z = torch.cat(zs, 1)
        rec["spikes"].append(z)
        rec["vmem"].append(torch.cat([s.v for s in states], 1) - z * spec.threshold)
        rec["isyn"].append(torch.cat([s.i for s in states], 1))
        rec["out_spikes"].append(zo)
        rec["vmem_out"].append(ostate.v - zo * spec.threshold_out)
        rec["isyn_out"].append(ostate.i)
    empty = torch.zeros(0, B, 0, dtype=torch.long)
    return XyloResult(**{k: torch.stack(vals) if vals else empty for k, vals in rec.items()})


neurons.register_backend("lif", "hardware.export.xylo.spec.simulate_spec (Xylo integer core, XyloArithmetic)", simulate_spec,
                         test="tests/test_xylo.py::test_random_networks_bit_exact_with_xylosim")

"""Deployment metrics of a trained stack, computed by NeuroBench's own metric implementations.

NeuroBench (Yik et al. 2025, "The neurobench framework for benchmarking neuromorphic computing
algorithms and systems", Nature Communications 16:1545; PyPI ``neurobench``) defines the cost
figures that neuromorphic papers report beside accuracy:

* **synaptic operations per sample**: every connection layer (a weight matrix) applied to its
  input at every step counts, per sample, ``sum_t sum_j [x_tj != 0] * nnz(W[:, j])`` operations:
  accumulates (**effective ACs**) when the input is binary (spikes), multiply-accumulates
  (**effective MACs**) otherwise; **dense** counts every weight at every step
  (``sum_t in * out``). Biases are not synaptic operations.
* **activation sparsity**: the share of zero outputs over all neurons, steps and samples (and the
  same per layer);
* **connection sparsity**: the share of zero weights over all connection layers;
* **footprint**: bytes of all parameters and buffers (float), and here also per integer export
  profile (see :func:`profile_footprint`).

spikerec's cells own their weights as raw parameters, while NeuroBench hooks ``torch.nn.Linear``
layers and activation modules. :class:`NeuroBenchAdapter` is the adapter: a ``NeuroBenchModel``
whose network holds, per layer, an ``nn.Linear`` carrying the input weight, one carrying the
effective (masked) recurrent weight, and a spike-activity module; each call runs the spikerec
model (its own forward, unchanged), then replays the recorded inputs and spikes through those
modules step by step (input ``x_t``, recurrent input ``z_{t-1}``, output ``z_t``) so that
NeuroBench's hooks see exactly what a chip computes. The readout is a connection layer too (its
input: the last layer's spikes). Only stacks of cells with ``weight`` (and optionally
``effective_recurrent_weight()``) are supported (LIF, ALIF, CuBa-LIF, readout).
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch import nn

__all__ = ["NeuroBenchAdapter", "deployment_metrics", "profile_footprint", "format_metrics", "neurobench_version"]


def neurobench_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("neurobench")
    except Exception:
        return None


def _require_neurobench():
    try:
        import neurobench  # noqa: F401
    except ImportError as e:
        raise ImportError(f"deployment metrics need the package neurobench ({e}): "
                          f"pip install neurobench, or pip install -e \".[metrics]\"") from None


class SpikeActivity(nn.Identity):
    """Marks a layer's output for NeuroBench's activation hooks (returns its input)."""


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    w = weight.detach()
    lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None).to(w.device, w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if bias is not None:
            lin.bias.copy_(bias.detach())
    return lin


def _cells(model) -> list:
    cells = list(getattr(model, "cells", []))
    readout = getattr(model, "readout", None)
    if not cells or readout is None:
        raise ValueError(f"deployment metrics: expected a stack with .cells and .readout (spikerec.models), got "
                         f"{type(model).__name__}")
    for i, c in enumerate(cells + [readout]):
        if not isinstance(getattr(c, "weight", None), torch.Tensor) or c.weight.dim() != 2:
            raise ValueError(f"deployment metrics: layer {i} ({type(c).__name__}) has no 2-d input weight; "
                             f"only LIF/ALIF stacks with a readout are supported")
    return cells


class _Proxy(nn.Module):
    """Connection layers and activity markers mirroring a stack (named ``layer{i}_*``, ``readout``)."""

    def __init__(self, model):
        super().__init__()
        self.n = len(_cells(model))
        for i, c in enumerate(model.cells):
            setattr(self, f"layer{i}_input", _linear(c.weight, getattr(c, "bias", None)))
            rec = c.effective_recurrent_weight() if hasattr(c, "effective_recurrent_weight") else None
            if rec is not None:
                setattr(self, f"layer{i}_recurrent", _linear(rec, None))
            setattr(self, f"layer{i}", SpikeActivity())
        self.readout = _linear(model.readout.weight, getattr(model.readout, "bias", None))

    def replay(self, x: torch.Tensor, hidden: list[torch.Tensor]) -> None:
        """Calls every module once per step with what the model computed (``x``: ``[T, B, C]``)."""
        inputs = [x] + hidden[:-1]
        for i in range(self.n):
            lin, act = getattr(self, f"layer{i}_input"), getattr(self, f"layer{i}")
            rec = getattr(self, f"layer{i}_recurrent", None)
            z = hidden[i]
            for t in range(z.shape[0]):
                lin(inputs[i][t])
                if rec is not None:
                    rec(z[t - 1] if t > 0 else torch.zeros_like(z[0]))
                act(z[t])
        for t in range(hidden[-1].shape[0]):
            self.readout(hidden[-1][t])


def _adapter_class():
    from neurobench.models.neurobench_model import NeuroBenchModel

    class NeuroBenchAdapter(NeuroBenchModel):
        """A spikerec stack as a ``neurobench`` model; batches come batch-first ``[B, T, C]``
        (NeuroBench's convention) and the predictions are class indices."""

        def __init__(self, model):
            super().__init__()
            self.model = model.eval()
            self.proxy = _Proxy(model)
            self.add_activation_module(SpikeActivity)

        def __call__(self, batch):
            x = batch.transpose(0, 1).to(next(self.model.parameters()).dtype)
            with torch.no_grad():
                y, _, hidden = self.model(x, record=True)
                self.proxy.replay(x, hidden)
                return self.model.logits(y).argmax(-1)

        def __net__(self):
            return self.proxy

    return NeuroBenchAdapter


def NeuroBenchAdapter(model):  # noqa: N802 - a class built on first use (neurobench is optional)
    """``NeuroBenchAdapter(model)``: see the module docstring."""
    _require_neurobench()
    return _adapter_class()(model)


class _BatchFirst:
    """Time-first batches ``(x[T, B, C], y)`` (a spikerec loader, or a list of batches) as NeuroBench
    expects them (``x[B, T, C]``); missing labels (``None``) become zeros (no metric here reads them)."""

    def __init__(self, loader, max_batches: int | None):
        self.loader, self.max_batches = loader, max_batches
        n = len(loader)
        self.n = n if max_batches is None else min(n, int(max_batches))
        if hasattr(loader, "dataset"):
            total = len(loader.dataset)
            self.samples = total if self.n == n else min(total, self.n * int(loader.batch_size))
        else:
            self.samples = sum(int(x.shape[1]) for x, _ in list(loader)[: self.n])
        self.dataset = _Sized(self.samples)  # NeuroBench weighs per-batch results by len(dataset)

    def __len__(self):
        return self.n

    def __iter__(self):
        for i, (x, y) in enumerate(self.loader):
            if i >= self.n:
                break
            if y is None:
                y = torch.zeros(x.shape[1], dtype=torch.long)
            yield x.transpose(0, 1), y


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _role_bits(name: str, profile) -> int:
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("weight", "recurrent_weight"):
        return int(profile.weight_bits)
    if leaf == "bias":
        return int(profile.bias_bits) + int(getattr(profile, "bias_exp_bits", 0))
    if "tau" in leaf:
        return int(profile.decay_bits)
    return int(profile.threshold_bits)


def profile_footprint(model, profile) -> int:
    """Bytes of the parameters stored at a profile's widths: weight matrices at ``weight_bits``,
    biases at ``bias_bits + bias_exp_bits``, time constants (decays) at ``decay_bits``, every other
    per-neuron parameter (threshold, adaptation) at ``threshold_bits``; rounded up to whole bytes."""
    bits = sum(p.numel() * _role_bits(n, profile) for n, p in model.named_parameters())
    return int(math.ceil(bits / 8))


def deployment_metrics(model, loader, *, profiles: Mapping | None = None, max_batches: int | None = None) -> dict:
    """Run NeuroBench's metrics on ``model`` over ``loader`` (spikerec's time-first batches: a loader
    or a list of ``(x[T, B, C], labels or None)``).

    Returns ``dict(synaptic_operations={effective_acs, effective_macs, dense} (per sample),
    activation_sparsity, activation_sparsity_by_layer={layer0: ...}, connection_sparsity,
    parameters, footprint_bytes={"float": ..., <profile>: ...}, samples, neurobench=<version>)``.
    ``profiles``: ``{name: profile}`` with ``weight_bits``, ``bias_bits``, ``decay_bits`` and
    ``threshold_bits`` (e.g. :data:`spikerec.hardware.export.profiles.PROFILES`).
    """
    _require_neurobench()
    from neurobench.benchmarks import Benchmark
    from neurobench.metrics.static import ConnectionSparsity, Footprint, ParameterCount
    from neurobench.metrics.workload import ActivationSparsity, ActivationSparsityByLayer, SynapticOperations
    from neurobench.models import TorchModel

    if not hasattr(ActivationSparsityByLayer(), "_requires_hooks"):
        # neurobench 2.3.0's ActivationSparsityByLayer skips its base __init__ (no requires_hooks);
        # the subclass sets the flag its base class would have set, nothing else changes
        class ActivationSparsityByLayer(ActivationSparsityByLayer):  # noqa: F811
            def __init__(self):
                super().__init__()
                self._requires_hooks = True

    adapter = NeuroBenchAdapter(model)
    data = _BatchFirst(loader, max_batches)
    bench = Benchmark(adapter, data, [], [], [[ConnectionSparsity], [SynapticOperations, ActivationSparsity,
                                                                     ActivationSparsityByLayer]])
    res = bench.run(quiet=True)
    adapter.cleanup_hooks()
    syn = res["SynapticOperations"]
    footprint = {"float": int(Footprint()(TorchModel(model)))}
    model.eval()
    for name, prof in (profiles or {}).items():
        footprint[str(name)] = profile_footprint(model, prof)
    return dict(
        synaptic_operations=dict(effective_acs=float(syn["Effective_ACs"]), effective_macs=float(syn["Effective_MACs"]),
                                 dense=float(syn["Dense"])),
        activation_sparsity=float(res["ActivationSparsity"]),
        activation_sparsity_by_layer={k: float(v) for k, v in res["ActivationSparsityByLayer"].items()},
        connection_sparsity=float(res["ConnectionSparsity"]),
        parameters=int(ParameterCount()(TorchModel(model))),
        footprint_bytes=footprint,
        samples=int(data.samples),
        neurobench=neurobench_version(),
    )


def format_metrics(m: dict) -> list[str]:
    """Human-readable lines of :func:`deployment_metrics`."""
    s = m["synaptic_operations"]
    fp = ", ".join(f"{k} {v:,} B" for k, v in m["footprint_bytes"].items())
    layers = ", ".join(f"{k} {v:.3f}" for k, v in m["activation_sparsity_by_layer"].items())
    return [
        f"synaptic operations per sample (NeuroBench {m.get('neurobench')}): effective ACs {s['effective_acs']:,.0f}, "
        f"effective MACs {s['effective_macs']:,.0f}, dense {s['dense']:,.0f}",
        f"activation sparsity {m['activation_sparsity']:.3f} (per layer: {layers}); "
        f"connection sparsity {m['connection_sparsity']:.4f}",
        f"parameters {m['parameters']:,}; footprint {fp}",
    ]

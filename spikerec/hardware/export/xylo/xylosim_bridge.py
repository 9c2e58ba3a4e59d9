"""Run a :class:`~spikerec.hardware.export.xylo.spec.XyloSpec` in SynSense's bit-accurate simulator ``xylosim``.

``pip install "spikerec[xylo]"`` installs it. The network is loaded the way Rockpool's
``XyloSim.from_config`` loads a Xylo configuration: one ``XyloSynapse(target_neuron, synapse=0,
weight)`` per non-zero weight, grouped by pre-synaptic source, the membrane and synaptic dashes and
thresholds per neuron, one weight shift per matrix. ``xylosim`` keeps references to the synapse
objects, so they are held for the lifetime of the layer (freeing them crashes the simulator).
"""
from __future__ import annotations

import numpy as np
import torch

from .spec import XyloResult, XyloSpec

__all__ = ["xylosim_available", "build_xylosim", "run_xylosim"]


def xylosim_available() -> bool:
    try:
        import xylosim  # noqa: F401
    except ImportError:
        return False
    return True


def _synapses(cls, w: np.ndarray) -> list:
    return [[cls(int(post), 0, int(w[pre, post])) for post in np.flatnonzero(w[pre])] for pre in range(w.shape[0])]


class _Layer:
    """A ``xylosim`` layer and the Python objects it points to."""

    def __init__(self, spec: XyloSpec):
        try:
            import xylosim.v1
            import xylosim.v2
        except ImportError:
            raise ImportError("xylosim is not installed: pip install 'spikerec[xylo]' (or pip install xylosim)") from None
        mod = {1: xylosim.v1, 2: xylosim.v2}[spec.version]
        N, K = spec.n_hidden, spec.n_out
        self.kwargs = dict(
            synapses_in=_synapses(mod.XyloSynapse, spec.weights_in.numpy()),
            synapses_rec=_synapses(mod.XyloSynapse, spec.weights_rec.numpy()),
            synapses_out=_synapses(mod.XyloSynapse, spec.weights_out.numpy()),
            aliases=[[] for _ in range(N)],
            threshold=spec.threshold.tolist(), threshold_out=spec.threshold_out.tolist(),
            weight_shift_inp=int(spec.weight_shift_in), weight_shift_rec=int(spec.weight_shift_rec),
            weight_shift_out=int(spec.weight_shift_out),
            dash_mem=spec.dash_mem.tolist(), dash_mem_out=spec.dash_mem_out.tolist(),
            dash_syns=[[int(d), int(d)] for d in spec.dash_syn.tolist()],
            dash_syns_out=[[int(d)] for d in spec.dash_syn_out.tolist()],
            name="spikerec")
        if spec.version == 2:
            bias = spec.bias if spec.bias is not None else torch.zeros(N, dtype=torch.long)
            bias_out = spec.bias_out if spec.bias_out is not None else torch.zeros(K, dtype=torch.long)
            self.kwargs.update(has_bias=spec.bias is not None or spec.bias_out is not None,
                               bias=bias.tolist(), bias_out=bias_out.tolist())
        self.layer = mod.XyloLayer(**self.kwargs)


def build_xylosim(spec: XyloSpec):
    """The ``xylosim`` layer object for ``spec`` (keep the returned holder alive while using ``.layer``)."""
    return _Layer(spec)


def run_xylosim(spec: XyloSpec, x: torch.Tensor) -> XyloResult:
    """Run ``x[T, B, n_in]`` (event counts) sample by sample from the reset state; returns the
    recorded state in the layout of :func:`~spikerec.hardware.export.xylo.spec.simulate_spec`."""
    holder = _Layer(spec)
    L = holder.layer
    x = torch.as_tensor(x).long()
    T, B, _ = x.shape
    rec = {k: [] for k in ("spikes", "vmem", "isyn", "out_spikes", "vmem_out", "isyn_out")}
    for b in range(B):
        L.reset_all()
        out = L.evolve(x[:, b].tolist())
        rec["out_spikes"].append(torch.tensor(out, dtype=torch.long).reshape(T, spec.n_out))
        rec["spikes"].append(torch.tensor(L.rec_recurrent_spikes, dtype=torch.long).reshape(T, spec.n_hidden))
        for key, attr, n in (("vmem", "rec_v_mem", spec.n_hidden), ("isyn", "rec_i_syn", spec.n_hidden),
                             ("vmem_out", "rec_v_mem_out", spec.n_out), ("isyn_out", "rec_i_syn_out", spec.n_out)):
            rec[key].append(torch.tensor(getattr(L, attr), dtype=torch.long).reshape(n, T).t())
    return XyloResult(**{k: torch.stack(v, 1) for k, v in rec.items()})

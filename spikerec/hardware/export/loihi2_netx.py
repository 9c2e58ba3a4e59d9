"""lava-dl ``netx`` HDF5 export of a network quantised to the ``loihi2`` profile.

Layout (lava-dl ``slayer/block/base.py::export_hdf5`` / ``netx/hdf5.py``)::

    /layer/0            type = b"input", shape = [C]
    /layer/k            type = b"dense" (or b"dense_rec"), shape = [N], inFeatures, outFeatures,
                        weight [N, C] (integers; Lava adds ``weight << 6``), weight_rec [N, N],
                        bias [N] (integers, Lava ``bias_exp = 6``), delay [N] (zeros),
                        neuron/{type = b"CUBA", iDecay, vDecay, vThMant, refDelay, gradedSpike}

``iDecay`` is the effective current decay (netx gives Lava ``du = iDecay - 1``), ``vDecay`` the
voltage decay, ``vThMant`` the threshold mantissa (``vth << 6``). Weight integers are the mantissas
shifted by ``shift - 6`` (the ``weight_exp`` that Lava's ``optimize_weight_bits`` recovers). netx
loads a bias with a fixed exponent of 6, so the bias is rounded to multiples of 64 state units
(:func:`write_netx` returns the largest rounding error). The readout is a CUBA layer whose
threshold is the largest mantissa (it does not fire): read its voltage. netx cannot load ALIF.
"""
from __future__ import annotations

import numpy as np

from ...atomic import atomic_path
from ...errors import ExportError
from .quantized_network import QuantizedNetwork

__all__ = ["write_netx", "NetxExportError"]


class NetxExportError(ExportError):
    """The quantised network cannot be written as a netx file (names the layer)."""


def write_netx(qnet: QuantizedNetwork, path: str) -> dict:
    """Write ``qnet`` (quantised with the ``loihi2`` profile) to ``path``; returns a small report."""
    import h5py

    p = qnet.profile
    if p.decay != "mulshift" or p.decay_bits != 12 or p.threshold_shift != 6 or p.weight_shift_range[0] < 6:
        raise NetxExportError(f"netx export needs the loihi2 arithmetic (12-bit mulshift decays, vth << 6, "
                              f"weights << 6); got profile '{p.name}'")
    for q in qnet.layers:
        if q.kind == "alif":
            raise NetxExportError(f"layer {q.name}: netx cannot load ALIF neurons")
        if q.kind == "lif" and q.reset not in ("zero",):
            raise NetxExportError(f"layer {q.name}: Loihi CUBA neurons reset to zero; layer has reset '{q.reset}'")
    bias_err = 0
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["producer"] = "spikerec"
            root = f.create_group("layer")
            g = root.create_group("0")
            g.create_dataset("type", data=np.bytes_("input"))
            g.create_dataset("shape", data=np.array([qnet.input_size]))
            for k, q in enumerate(qnet.layers, start=1):
                g = root.create_group(str(k))
                rec = q.recurrent_weight is not None
                g.create_dataset("type", data=np.bytes_("dense_rec" if rec else "dense"))
                g.create_dataset("shape", data=np.array([q.size]))
                g.create_dataset("inFeatures", data=q.weight.shape[1])
                g.create_dataset("outFeatures", data=q.size)
                exp = q.shift - 6
                g.create_dataset("weight", data=(q.weight << exp).numpy().astype(np.int32))
                if rec:
                    g.create_dataset("weight_rec", data=(q.recurrent_weight << exp).numpy().astype(np.int32))
                bias = np.round(q.bias.numpy() / 64.0).astype(np.int32)
                bias_err = max(bias_err, int(np.abs(bias.astype(np.int64) * 64 - q.bias.numpy()).max(initial=0)))
                g.create_dataset("bias", data=bias)
                g.create_dataset("delay", data=np.zeros(q.size, np.int32))
                n = g.create_group("neuron")
                n.create_dataset("type", data=np.bytes_("CUBA"))
                n.create_dataset("iDecay", data=q.decay_i.numpy().astype(np.int32))
                n.create_dataset("vDecay", data=q.decay_v.numpy().astype(np.int32))
                vth = (q.reset_amount >> 6).numpy().astype(np.int32) if q.kind == "lif" else np.full(q.size, p.threshold_max, np.int32)
                n.create_dataset("vThMant", data=vth)
                n.create_dataset("refDelay", data=1)
                n.create_dataset("gradedSpike", data=False)
    return {"path": path, "layers": len(qnet.layers) + 1, "bias_rounding_max_state_units": bias_err}

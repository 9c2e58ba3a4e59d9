"""The quantised network as data: :class:`QLayer`, :class:`QuantizedNetwork` (save/load as
safetensors + JSON), the per-layer :class:`QuantReport` and the quantisation errors.

Kept apart from :mod:`spikerec.hardware.export.quantize` (which builds these) so that the integer
simulator can read them without importing the quantiser.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from ...atomic import atomic_path
from ...errors import ExportError
from .profiles import TargetProfile

__all__ = ["HEADROOM", "QLayer", "QuantizedNetwork", "QuantReport", "QuantizationError", "SilentLayerWarning"]

HEADROOM = 8.0  # the membrane must be able to reach HEADROOM x threshold without overflow


class QuantizationError(ExportError):
    """A layer cannot be represented on the target (names the layer)."""


class SilentLayerWarning(UserWarning):
    """A layer that fires in float emits no spike after quantisation."""


@dataclass
class QLayer:
    """One quantised layer; integer tensors are int64, in state units unless noted.

    ``kind``: ``lif`` (plain or CUBA), ``alif`` or ``readout``. ``weight``/``recurrent_weight`` are
    mantissas added as ``(W_q x) << shift``. ``threshold``: fire iff ``v > threshold``;
    ``reset_amount``: what reset "subtract" removes (the chip's threshold register).
    ``decay_i``/``decay_v``/``decay_a``: decay codes (profile rule). ALIF: ``theta = b +
    ((beta * a) >> adapt_frac_bits)``, ``a <- decay(a) + adapt_inc z``.
    """

    kind: str
    name: str
    weight: torch.Tensor
    shift: int
    bias: torch.Tensor
    decay_i: torch.Tensor
    decay_v: torch.Tensor
    scale: float
    recurrent_weight: torch.Tensor | None = None
    threshold: torch.Tensor | None = None
    reset_amount: torch.Tensor | None = None
    reset: str = "none"
    cuba: bool = False
    decay_a: torch.Tensor | None = None
    adapt_inc: torch.Tensor | None = None
    b: torch.Tensor | None = None
    beta: torch.Tensor | None = None

    TENSORS = ("weight", "bias", "decay_i", "decay_v", "recurrent_weight", "threshold", "reset_amount", "decay_a", "adapt_inc", "b", "beta")

    @property
    def size(self) -> int:
        return int(self.weight.shape[0])

    def meta(self) -> dict:
        return {"kind": self.kind, "name": self.name, "shift": self.shift, "scale": self.scale, "reset": self.reset,
                "cuba": self.cuba}


@dataclass
class QuantizedNetwork:
    """Integer network: profile, layers (hidden cells then the readout), readout mode."""

    profile: TargetProfile
    layers: list[QLayer]
    readout_mode: str
    input_size: int

    def save(self, folder: str, stem: str = "quantized") -> tuple[str, str]:
        """Write ``<stem>.safetensors`` (integer tensors) and ``<stem>.json`` (profile, layer metadata),
        each through a temporary file and a rename."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        tensors = {f"layers.{k}.{name}": getattr(q, name).clone().contiguous()
                   for k, q in enumerate(self.layers) for name in QLayer.TENSORS if getattr(q, name) is not None}
        meta = {"format": "spikerec-quantized-1", "profile": self.profile.to_dict(), "readout_mode": self.readout_mode,
                "input_size": self.input_size, "layers": [q.meta() for q in self.layers]}
        st, js = os.path.join(folder, f"{stem}.safetensors"), os.path.join(folder, f"{stem}.json")
        _atomic(st, lambda p: save_file(tensors, p))
        _atomic(js, lambda p: open(p, "w").write(json.dumps(meta, indent=1)))
        return st, js

    @classmethod
    def load(cls, folder: str, stem: str = "quantized") -> "QuantizedNetwork":
        from safetensors.torch import load_file

        js = os.path.join(folder, f"{stem}.json")
        try:
            meta = json.load(open(js))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{js}: cannot read quantised-network metadata ({e})") from None
        if meta.get("format") != "spikerec-quantized-1":
            raise ValueError(f"{js}: not a spikerec quantised network (format {meta.get('format')!r})")
        tensors = load_file(os.path.join(folder, f"{stem}.safetensors"))
        layers = []
        for k, m in enumerate(meta["layers"]):
            t = {n: tensors.get(f"layers.{k}.{n}") for n in QLayer.TENSORS}
            layers.append(QLayer(**m, **t))
        return cls(TargetProfile.from_dict(meta["profile"]), layers, meta["readout_mode"], int(meta["input_size"]))


@dataclass
class QuantReport:
    """Per-layer quantisation error (float units) and, with calibration data, activity."""

    profile: str
    layers: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def table(self) -> str:
        cols = ("name", "kind", "shift", "weight_rel_err", "zeroed_frac", "threshold_rel_err", "decay_v_err",
                "decay_i_err", "rate_float", "rate_int", "spike_agreement")
        lines = [" ".join(f"{c:>16}" for c in cols)]
        for r in self.layers:
            cells = []
            for c in cols:
                v = r.get(c, "")
                cells.append(f"{v:>16.4g}" if isinstance(v, float) else f"{str(v):>16}")
            lines.append(" ".join(cells))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"profile": self.profile, "layers": self.layers, "warnings": self.warnings}


def _atomic(path: str, write) -> None:
    """Call ``write(tmp_path)``, then rename onto ``path`` (nothing partial is left)."""
    with atomic_path(path) as tmp:
        write(str(tmp))

"""A model quantised for Xylo: the chip specification plus what spikerec needs to read it out.

Returned by :func:`spikerec.hardware.export.quantize.quantize` for the ``xylo``/``xylo2`` profiles. The
readout is the output neurons' membrane ``Vmem_out`` divided by ``spec.out_scale`` (state units
per float unit) and aggregated over time like the float model (``readout_mode``). ``save`` writes
``xylo_spec.json``: the arguments of Rockpool's ``XyloSim.from_specification`` plus ``version``,
``layer_sizes`` and ``out_scale``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..profiles import TargetProfile
from .spec import XyloSpec, simulate_spec

__all__ = ["XyloNetwork"]


@dataclass
class XyloNetwork:
    profile: TargetProfile
    spec: XyloSpec
    readout_mode: str
    input_size: int
    names: list[str] = field(default_factory=list)

    def save(self, folder: str, stem: str = "xylo_spec") -> list[str]:
        os.makedirs(folder, exist_ok=True)
        return [self.spec.save(os.path.join(folder, f"{stem}.json"))]

    @classmethod
    def load(cls, folder: str, profile: TargetProfile, readout_mode: str = "mean", stem: str = "xylo_spec"):
        spec = XyloSpec.load(os.path.join(folder, f"{stem}.json"))
        return cls(profile, spec, readout_mode, spec.n_in)

    def layer_spikes(self, spikes: torch.Tensor) -> list[torch.Tensor]:
        """Split the core's spike counts ``[T, B, N]`` into per-layer boolean spike trains."""
        out, o = [], 0
        for n in self.spec.layer_sizes:
            out.append(spikes[..., o:o + n] > 0)
            o += n
        return out

    def run(self, x: torch.Tensor):
        return simulate_spec(self.spec, x)

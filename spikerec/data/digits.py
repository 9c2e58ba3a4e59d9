"""The embedded offline default: spike-latency digits.

scikit-learn ships the UCI optical digits (1797 images, 8x8 pixels, intensities 0..16,
10 classes) inside the package, so this set needs no download. Each pixel ``x = I / 16``
fires at most one spike with the latency code of :mod:`spikerec.data.latency`:

    T(x) = tau_eff ln(x / (x - theta)),  step = round(T / dt),  dropped when >= steps.

Defaults: ``tau_eff = 5`` steps, ``theta = 0.05`` (every non-zero pixel spikes: the
smallest intensity 1/16 = 0.0625 lies above theta), ``dt = 1``, ``steps = 12`` -> input
``[12, 64]``; pixels with ``x >= 9/16`` fire at step 0, fainter ones later, the faintest
(1/16) at step 8; steps 9-11 are silent (time for the network to settle). A logistic
regression on the flattened raster reaches about 95% test accuracy, a 1x64 ALIF network
about 90% after a few epochs.

``population = k`` spreads each pixel over ``k`` channels whose thresholds are
``theta_j = theta + j (1 - theta) / k`` (``j = 0..k-1``; channel ``p * k + j``): a spatial
population code with one spike per channel. ``time_repeat = r`` repeats every step ``r`` times.
``pool = p`` (1, 2, 4 or 8) sums the spikes of each ``p x p`` block of pixels into one channel
(``(8 / p)^2 * population`` channels of spike counts; ``pool = 2`` gives the 16 inputs of Xylo).
``classes = n`` keeps the digits ``0 .. n-1`` only (Xylo has 8 output neurons).

Split: stratified 60/20/20 train/valid/test (1078/360/359 samples) with a fixed seed (0),
identical on every machine (numpy PCG64).
"""
from __future__ import annotations

import numpy as np
import torch

from .core import ArrayDataset, LatencyDataset
from .latency import LatencyCode, latency_steps
from .sources import DIGITS_SHA256, load_digits_arrays  # noqa: F401  (re-exported)
from .splits import stratified_split

__all__ = ["digits_dataset", "digits_info", "DIGITS_DEFAULTS", "DIGITS_SHA256", "load_digits_arrays"]

DIGITS_DEFAULTS = dict(tau_eff=5.0, theta=0.05, dt=1.0, steps=12, population=1, time_repeat=1, split_seed=0, pool=1, classes=10)


def _options(options: dict) -> dict:
    unknown = sorted(set(options) - set(DIGITS_DEFAULTS))
    if unknown:
        raise ValueError(f"dataset 'digits': unknown option(s) {unknown}; valid: {sorted(DIGITS_DEFAULTS)}")
    o = {**DIGITS_DEFAULTS, **options}
    if int(o["population"]) < 1:
        raise ValueError(f"dataset 'digits': population must be >= 1, got {o['population']!r}")
    if not 2 <= int(o["classes"]) <= 10:
        raise ValueError(f"dataset 'digits': classes must be 2..10, got {o['classes']!r}")
    if int(o["pool"]) not in (1, 2, 4, 8):
        raise ValueError(f"dataset 'digits': pool must be 1, 2, 4 or 8 (pixels per block side), got {o['pool']!r}")
    return o


def digits_info(**options) -> dict:
    o = _options(options)
    return dict(input_size=(8 // int(o["pool"])) ** 2 * int(o["population"]), num_classes=int(o["classes"]), steps=int(o["steps"]) * int(o["time_repeat"]),
                task="classification", samples=dict(train=1078, valid=360, test=359))


def encode_digits(images: np.ndarray, o: dict) -> torch.Tensor:
    """Spike steps ``[N, 64 * population]`` (``-1`` = none) of images in ``[0, 1]``."""
    x = torch.as_tensor(images, dtype=torch.float64)
    k = int(o["population"])
    cols = []
    for j in range(k):
        th = o["theta"] + j * (1.0 - o["theta"]) / k
        code = LatencyCode(tau_eff=o["tau_eff"], theta=th, dt=o["dt"], steps=int(o["steps"]))
        cols.append(latency_steps(x, code))
    return torch.stack(cols, dim=-1).reshape(len(x), -1)


def digits_dataset(split: str, **options) -> LatencyDataset:
    o = _options(options)
    images, labels = load_digits_arrays()
    idx = stratified_split(labels, (0.6, 0.2, 0.2), seed=int(o["split_seed"]))[split]
    idx = idx[labels[idx] < int(o["classes"])]
    times = encode_digits(images[idx], o)
    ds = LatencyDataset(times, torch.as_tensor(labels[idx]), int(o["steps"]), time_repeat=int(o["time_repeat"]),
                        info=digits_info(**options))
    p = int(o["pool"])
    if p == 1:
        return ds
    x, y = ds.tensors()  # [N, T, 64 * population], channel = pixel * population + j
    k, side = int(o["population"]), 8 // p
    pix = torch.arange(64)
    block = (pix // 8 // p) * side + (pix % 8) // p
    target = (block[:, None] * k + torch.arange(k)[None, :]).reshape(-1)
    pooled = torch.zeros(*x.shape[:2], side * side * k).index_add_(2, target, x)
    return ArrayDataset(pooled, y, info=digits_info(**options))

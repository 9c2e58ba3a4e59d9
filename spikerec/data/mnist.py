"""MNIST from IDX files: spike-latency MNIST (sl-MNIST) and pixel-by-pixel (s/ps-MNIST).

Files (raw or ``.gz``) are looked up in ``<root>`` and ``<root>/MNIST/raw`` (torchvision's
layout), ``root`` defaulting to ``<data home>/mnist``:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte``. With ``download=True`` torchvision fetches them (online only).

Splits: ``train`` = the first ``60000 - valid_size`` training images, ``valid`` = the last
``valid_size`` (default 5000), ``test`` = the 10000 test images. (The LSC paper reports
45k/5k/10k; its code uses 48k/12k, i.e. ``valid_size=12000``.)

* ``slmnist``: 784 channels, one spike per pixel at most (:mod:`spikerec.data.latency`),
  ``preset`` in ``stork`` (default), ``spytorch``, ``lsc``, fields overridable.
* ``smnist``: 784 steps of one channel, ``x_t = pixel_t / 255`` in row-major order.
* ``psmnist``: the same with a fixed pixel permutation drawn from ``perm_seed`` (numpy PCG64).
"""
from __future__ import annotations

import numpy as np
import torch

from .core import ArrayDataset, LatencyDataset
from .fileio import read_idx
from .home import DataError, DatasetMissingError, dataset_dir
from .latency import LATENCY_PRESETS, LatencyCode, latency_steps
from .sources import MNIST_FILES, MNIST_MD5, MNIST_URL, find_mnist, missing_message  # noqa: F401

__all__ = ["MNIST_FILES", "find_mnist", "load_mnist_arrays", "slmnist_dataset", "smnist_dataset",
           "mnist_info", "MNIST_URL"]

_COMMON = dict(root=None, download=False, valid_size=5000, limit=None)
SLMNIST_OPTIONS = dict(_COMMON, preset="stork", tau_eff=None, theta=None, dt=None, steps=None, first_step=None,
                       rounding=None, time_repeat=None)
SMNIST_OPTIONS = dict(_COMMON, perm_seed=0)


def _download(root) -> None:
    try:
        from torchvision.datasets import MNIST
    except ImportError as e:  # pragma: no cover
        raise DatasetMissingError(f"download=True needs torchvision ({e})") from None
    base = dataset_dir("mnist", root)
    base.mkdir(parents=True, exist_ok=True)
    try:
        for train in (True, False):
            MNIST(str(base), train=train, download=True)
    except Exception as e:  # network errors come in many types
        raise DatasetMissingError(f"MNIST download failed ({type(e).__name__}: {e}).\n{missing_message(root)}") from None


def load_mnist_arrays(split: str, root=None, download: bool = False, valid_size: int = 5000, limit=None):
    """``(images[N, 784] uint8, labels[N] int64)`` of a split (see the module docstring)."""
    files = find_mnist(root)
    if files is None and download:
        _download(root)
        files = find_mnist(root)
    if files is None:
        raise DatasetMissingError(missing_message(root))
    part = "test" if split == "test" else "train"
    images, labels = read_idx(files[f"{part}_images"]), read_idx(files[f"{part}_labels"])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{files[part + '_images']}: expected images [N, H, W] and labels [N], got "
                        f"{images.shape} and {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{files[part + '_labels']}: labels must lie in 0..9, got {labels.min()}..{labels.max()}")
    images = images.reshape(len(images), -1)
    if split != "test":
        valid_size = int(valid_size)
        if not 0 <= valid_size < len(images):
            raise ValueError(f"MNIST: valid_size must lie in [0, {len(images)}), got {valid_size}")
        cut = len(images) - valid_size
        sl = slice(0, cut) if split == "train" else slice(cut, None)
        images, labels = images[sl], labels[sl]
    if limit is not None:
        images, labels = images[: int(limit)], labels[: int(limit)]
    return np.ascontiguousarray(images, dtype=np.uint8), labels.astype(np.int64)


def _check(name: str, options: dict, valid: dict) -> dict:
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"dataset {name!r}: unknown option(s) {unknown}; valid: {sorted(valid)}")
    return {**valid, **options}


def slmnist_code(options: dict) -> LatencyCode:
    o = _check("slmnist", options, SLMNIST_OPTIONS)
    if o["preset"] not in LATENCY_PRESETS:
        raise ValueError(f"dataset 'slmnist': unknown preset {o['preset']!r}; valid: {sorted(LATENCY_PRESETS)}")
    fields = {k: o[k] for k in ("tau_eff", "theta", "dt", "steps", "first_step", "rounding", "time_repeat") if o[k] is not None}
    return LATENCY_PRESETS[o["preset"]].with_options(**fields)


def mnist_info(name: str, **options) -> dict:
    if name == "slmnist":
        code = slmnist_code(options)
        return dict(input_size=784, num_classes=10, steps=code.total_steps, task="classification")
    _check(name, options, SMNIST_OPTIONS)
    return dict(input_size=1, num_classes=10, steps=784, task="classification")


def slmnist_dataset(split: str, **options) -> LatencyDataset:
    code = slmnist_code(options)
    o = {**SLMNIST_OPTIONS, **options}
    images, labels = load_mnist_arrays(split, o["root"], o["download"], o["valid_size"], o["limit"])
    x = torch.from_numpy(images).to(torch.float32) / 255.0
    times = latency_steps(x, code).to(torch.int16)
    return LatencyDataset(times, torch.from_numpy(labels), code.steps, time_repeat=code.time_repeat,
                          info=mnist_info("slmnist", **options))


def smnist_dataset(split: str, permuted: bool = False, **options) -> ArrayDataset:
    name = "psmnist" if permuted else "smnist"
    o = _check(name, options, SMNIST_OPTIONS)
    images, labels = load_mnist_arrays(split, o["root"], o["download"], o["valid_size"], o["limit"])
    if permuted:
        perm = np.random.default_rng(int(o["perm_seed"])).permutation(images.shape[1])
        images = images[:, perm]
    x = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(-1)  # [N, 784, 1] uint8
    return ArrayDataset(x, torch.from_numpy(labels), scale=1.0 / 255.0, info=mnist_info(name, **options))

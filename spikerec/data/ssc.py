"""Spiking Speech Commands (SSC) as binned ``[T, C]`` frames, from its official train/valid/test files.

SSC (Cramer et al. 2022, IEEE TNNLS 33(7)) has the layout of SHD (700 channels, times in seconds)
with 35 classes (the words of Speech Commands v0.02) and an official validation file, so each split
is one file: ``ssc_train.h5``, ``ssc_valid.h5``, ``ssc_test.h5``. Binning, caching and the options
``preset``, ``dt``, ``bins``, ``pool``, ``value``, ``t_start``, ``root``, ``file``, ``download``,
``verify`` and ``cache`` are SHD's (:mod:`spikerec.data.shd`).
"""
from __future__ import annotations

from pathlib import Path

from .core import SparseSpikeDataset
from .home import dataset_dir
from .shd import bin_shd_file, recipe_from_options
from .shd_file import SSC, find_shd

__all__ = ["SSC_OPTIONS", "ssc_dataset", "ssc_info"]

SSC_OPTIONS = dict(preset="zenke100", dt=None, bins=None, pool=None, value=None, t_start=None,
                   root=None, file=None, download=False, verify=True, cache=True)


def _opts(options: dict) -> dict:
    unknown = sorted(set(options) - set(SSC_OPTIONS))
    if unknown:
        hint = " (SSC has an official validation file: no speaker split)" if any(k.startswith(("valid", "split"))
                                                                                for k in unknown) else ""
        raise ValueError(f"dataset 'ssc': unknown option(s) {unknown}; valid: {sorted(SSC_OPTIONS)}{hint}")
    return {**SSC_OPTIONS, **options}


def ssc_info(**options) -> dict:
    r = recipe_from_options(_opts(options))
    return dict(input_size=r.channels, num_classes=SSC.n_classes, steps=int(r.bins), task="classification",
                dt=r.dt, value=r.value)


def ssc_dataset(split: str, **options) -> SparseSpikeDataset:
    o = _opts(options)
    if o["file"] is not None:
        path = Path(o["file"]).expanduser()
    else:
        path = find_shd(split, o["root"], download=o["download"], verify=o["verify"], hs=SSC)
    ds, _ = bin_shd_file(path, recipe_from_options(o), cache=bool(o["cache"]), info=ssc_info(**options), hs=SSC,
                         cache_dir=(dataset_dir("ssc", o["root"]) / "cache") if o["file"] is None else None)
    return ds

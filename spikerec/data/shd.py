"""Spiking Heidelberg Digits as binned ``[T, C]`` frames, with a speaker-held-out validation split.

``get_dataset("shd", split, preset="zenke100", ...)``:

* ``test`` is the official test file; ``train``/``valid`` split the official train file **by
  speaker** (SHD has no official validation set): the held-out speakers are
  ``valid_speakers`` or, by default, speakers taken in a fixed order (a permutation of the
  speaker ids from ``split_seed``) while that brings the held-out share closer to
  ``valid_fraction`` (0.1). ``valid="none"`` gives the whole train file as ``train``.
* Binning per :mod:`spikerec.data.binning` (``preset`` plus ``dt``, ``bins``, ``pool``,
  ``value``, ``t_start`` overrides). The binned file is cached under ``<shd dir>/cache``
  keyed by recipe and source file, so a second load skips reading the HDF5.
* ``root`` (folder with the files), ``file`` (explicit path of this split's HDF5),
  ``download`` (fetch through tonic when missing), ``verify`` (check the zip's md5 on unpack),
  ``cache`` (default True).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from .binning import BinRecipe, bin_ragged, get_recipe, window_report
from .cache import cache_key, load_cache, save_cache
from .core import SparseSpikeDataset
from .home import DataError, dataset_dir
from .shd_file import N_CLASSES, SHD, HeidelbergSet, ShdArrays, find_shd, read_shd

__all__ = ["SHD_OPTIONS", "shd_dataset", "shd_info", "bin_shd_file", "speaker_split", "arrays_to_dataset",
           "recipe_from_options"]

SHD_OPTIONS = dict(preset="zenke100", dt=None, bins=None, pool=None, value=None, t_start=None,
                   root=None, file=None, download=False, verify=True, cache=True,
                   valid="speaker", valid_speakers=None, valid_fraction=0.1, split_seed=0)


def _opts(options: dict) -> dict:
    unknown = sorted(set(options) - set(SHD_OPTIONS))
    if unknown:
        raise ValueError(f"dataset 'shd': unknown option(s) {unknown}; valid: {sorted(SHD_OPTIONS)}")
    o = {**SHD_OPTIONS, **options}
    if o["valid"] not in ("speaker", "none"):
        raise ValueError(f"dataset 'shd': valid must be 'speaker' or 'none', got {o['valid']!r}")
    return o


def recipe_from_options(o: dict) -> BinRecipe:
    return get_recipe(o["preset"], dt=o["dt"], bins=o["bins"], pool=o["pool"], value=o["value"], t_start=o["t_start"])


def shd_info(**options) -> dict:
    r = recipe_from_options(_opts(options))
    return dict(input_size=r.channels, num_classes=N_CLASSES, steps=int(r.bins), task="classification",
                dt=r.dt, value=r.value)


def _warn_far(report: dict, path, recipe: BinRecipe) -> None:
    if report.get("far_after", 0):
        warnings.warn(f"{path}: {report['far_after']} spike(s) lie at or past {recipe.t_start + 2 * recipe.window:g} s, more than a "
                      f"window ({recipe.window:g} s) after the binning window ends (are the times in seconds?); "
                      f"they are dropped, with the other {report['after'] - report['far_after']} spike(s) after "
                      f"the window, per the recipe", RuntimeWarning, stacklevel=3)


def arrays_to_dataset(arr: ShdArrays, recipe: BinRecipe, info: dict | None = None) -> SparseSpikeDataset:
    """Bin a file's arrays; ``info["dropped_spikes"]`` counts the spikes outside the window
    (``before``, ``after``, ``far_after``; see :func:`spikerec.data.binning.window_report`), and spikes
    far past the window are reported with a ``RuntimeWarning`` naming the file."""
    offsets, index, values = bin_ragged(arr.times, arr.units, arr.lengths, recipe)
    report = window_report(arr.times, recipe)
    _warn_far(report, arr.path, recipe)
    info = {**(info or {}), "dropped_spikes": report}
    extra = {} if arr.speakers is None else {"speaker": torch.from_numpy(arr.speakers)}
    return SparseSpikeDataset(torch.from_numpy(offsets), torch.from_numpy(index), torch.from_numpy(values),
                              torch.from_numpy(arr.labels), recipe.bins, recipe.channels, info=info, extra=extra)


def bin_shd_file(path, recipe: BinRecipe, *, cache: bool = True, cache_dir=None, info: dict | None = None,
                 hs: HeidelbergSet = SHD):
    """Binned dataset of a whole SHD-format file (of ``hs``: SHD or SSC), through the cache. Returns
    ``(dataset, hit)``."""
    from dataclasses import asdict

    path = Path(path)
    cdir = Path(cache_dir) if cache_dir is not None else path.parent / "cache"
    cpath = cdir / f"{path.stem}-{cache_key(asdict(recipe), path)}.safetensors"
    if cache:
        hit = load_cache(cpath)
        if hit is not None and len(hit[0].get("labels", ())) > 0:  # an empty entry is never used
            t, meta = hit
            report = meta.get("dropped_spikes", {})
            _warn_far(report, path, recipe)
            extra = {"speaker": t["speaker"]} if "speaker" in t else {}
            return SparseSpikeDataset(t["offsets"], t["index"], t["values"], t["labels"], recipe.bins,
                                      recipe.channels, info={**(info or {}), "dropped_spikes": report},
                                      extra=extra), True
    ds = arrays_to_dataset(read_shd(path, n_units=recipe.n_units, hs=hs), recipe, info)
    if cache:
        tensors = {"offsets": ds.offsets, "index": ds.index, "values": ds.values, "labels": ds.labels, **ds.extra}
        try:
            save_cache(cpath, tensors, {"recipe": asdict(recipe), "source": str(path), "samples": len(ds),
                                        "dropped_spikes": ds.info["dropped_spikes"]})
        except OSError as e:  # the data are fine; only the cache is lost (no partial file is left)
            warnings.warn(f"could not write the {hs.title} cache {cpath}: {e}", RuntimeWarning, stacklevel=2)
    return ds, False


def speaker_split(speakers: np.ndarray, valid_speakers=None, valid_fraction: float = 0.1, seed: int = 0):
    """``(train_idx, valid_idx, held_out_speakers)`` with no speaker in both parts."""
    speakers = np.asarray(speakers)
    ids = np.unique(speakers)
    if valid_speakers is not None:
        held = np.unique(np.asarray(list(valid_speakers), dtype=speakers.dtype))
        absent = sorted(set(held.tolist()) - set(ids.tolist()))
        if absent:
            raise ValueError(f"dataset 'shd': valid_speakers {absent} not in the train file (speakers: {ids.tolist()})")
    else:
        if not 0 < valid_fraction < 1:
            raise ValueError(f"dataset 'shd': valid_fraction must lie in (0, 1), got {valid_fraction!r}")
        if len(ids) < 2:
            raise DataError(f"dataset 'shd': a speaker split needs >= 2 speakers, the train file has {ids.tolist()}")
        counts = {int(s): int((speakers == s).sum()) for s in ids}
        order = ids[np.random.default_rng(int(seed)).permutation(len(ids))]
        held, share, n = [], 0.0, len(speakers)
        for s in order[:-1]:
            new = share + counts[int(s)] / n
            if held and abs(new - valid_fraction) >= abs(share - valid_fraction):
                break
            held.append(int(s))
            share = new
        held = np.asarray(sorted(held), dtype=speakers.dtype)
    mask = np.isin(speakers, held)
    return np.flatnonzero(~mask), np.flatnonzero(mask), held


def shd_dataset(split: str, **options) -> SparseSpikeDataset:
    o = _opts(options)
    recipe = recipe_from_options(o)
    part = "test" if split == "test" else "train"
    if o["file"] is not None:
        path = Path(o["file"]).expanduser()
    else:
        path = find_shd(part, o["root"], download=o["download"], verify=o["verify"])
    info = shd_info(**options)
    ds, _ = bin_shd_file(path, recipe, cache=bool(o["cache"]),
                         cache_dir=(dataset_dir("shd", o["root"]) / "cache") if o["file"] is None else None, info=info)
    if split == "test":
        return ds
    if o["valid"] == "none":
        if split == "valid":
            raise ValueError("dataset 'shd': valid='none' has no 'valid' split; use valid='speaker'")
        return ds
    if "speaker" not in ds.extra:
        raise DataError(f"{path}: no /extra/speaker array, so no speaker split; pass valid='none'")
    tr, va, held = speaker_split(ds.extra["speaker"].numpy(), o["valid_speakers"], float(o["valid_fraction"]),
                                 int(o["split_seed"]))
    out = ds.subset(tr if split == "train" else va)
    out.info = {**ds.info, "valid_speakers": [int(s) for s in held]}
    return out

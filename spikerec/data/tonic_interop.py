"""Interoperation with tonic.

* :func:`events_to_frame` bins one tonic event array (structured, ``t`` in microseconds,
  ``x`` = unit) with a :class:`~spikerec.data.binning.BinRecipe`;
* :class:`ToBinnedFrame` is the same as a tonic-style transform (``transform=`` of any tonic dataset);
* :func:`tonic_frame_transform` gives tonic's own ``ToFrame`` configured to the recipe's bins
  (counts, ``pool = 1``): ``[bins, 1, 700]`` frames equal to :func:`events_to_frame`;
* :func:`from_tonic` turns a tonic SHD or SSC dataset (or any dataset of ``(events, label)``) into
  spikerec's cached-binning container :class:`~spikerec.data.core.SparseSpikeDataset`.

Bins are computed in integer microseconds, ``k = (t - t_start) // dt`` (``dt`` and ``t_start``
rounded to whole microseconds), matching tonic's own slicing.
"""
from __future__ import annotations

import numpy as np
import torch

from .binning import BinRecipe, bin_ragged, get_recipe
from .core import SparseSpikeDataset
from .home import DataError

__all__ = ["events_to_frame", "ToBinnedFrame", "tonic_frame_transform", "from_tonic"]


def _us(v: float) -> int:
    return int(round(v * 1e6))


def _event_bins(events, recipe: BinRecipe):
    names = getattr(getattr(events, "dtype", None), "names", None) or ()
    if "t" not in names or "x" not in names:
        raise DataError(f"tonic events: expected a structured array with fields 't' (microseconds) and 'x' (unit), "
                        f"got fields {names}")
    units = np.asarray(events["x"], dtype=np.int64)
    if units.size and (units.min() < 0 or units.max() >= recipe.n_units):
        raise DataError(f"tonic events: unit 'x' outside 0..{recipe.n_units - 1} (got {units.min()}..{units.max()})")
    k = (np.asarray(events["t"], dtype=np.int64) - _us(recipe.t_start)) // _us(recipe.dt)
    return k.astype(np.float64), units


def _unit_recipe(recipe: BinRecipe) -> BinRecipe:
    return BinRecipe(dt=1.0, bins=recipe.bins, pool=recipe.pool, value=recipe.value, t_start=0.0, n_units=recipe.n_units)


def events_to_frame(events, recipe: BinRecipe | str = "zenke100") -> np.ndarray:
    """``[bins, channels]`` float32 frame of one tonic event array."""
    recipe = get_recipe(recipe)
    k, units = _event_bins(events, recipe)
    offsets, index, values = bin_ragged(k, units, np.array([len(k)]), _unit_recipe(recipe))
    out = np.zeros(recipe.bins * recipe.channels, np.float32)
    out[index] = values
    return out.reshape(recipe.bins, recipe.channels)


class ToBinnedFrame:
    """tonic-style transform: events -> ``[bins, channels]`` float32 frame."""

    def __init__(self, recipe: BinRecipe | str = "zenke100", **overrides):
        self.recipe = get_recipe(recipe, **overrides)

    def __call__(self, events):
        return events_to_frame(events, self.recipe)

    def __repr__(self):
        return f"ToBinnedFrame({self.recipe})"


def tonic_frame_transform(recipe: BinRecipe | str = "zenke100", **overrides):
    """``tonic.transforms.ToFrame`` with the recipe's window (counts; only ``pool == 1``)."""
    import tonic

    r = get_recipe(recipe, **overrides)
    if r.pool != 1 or r.value != "count":
        raise ValueError("tonic_frame_transform: tonic's ToFrame gives counts per unit; use pool=1, value='count' "
                         "(or ToBinnedFrame for pooling/binary)")
    t0 = _us(r.t_start)
    return tonic.transforms.ToFrame(sensor_size=(r.n_units, 1, 1), time_window=_us(r.dt), start_time=t0,
                                    end_time=t0 + r.bins * _us(r.dt))


def from_tonic(dataset, recipe: BinRecipe | str = "zenke100", **overrides) -> SparseSpikeDataset:
    """Bin every ``(events, label)`` of a tonic dataset (e.g. ``tonic.datasets.SHD`` or ``SSC``); the number
    of classes is that of the dataset's ``classes`` when it has them, else the largest label plus one."""
    r = get_recipe(recipe, **overrides)
    ks, us, lens, labels = [], [], [], []
    for i in range(len(dataset)):
        ev, y = dataset[i]
        k, u = _event_bins(ev, r)
        ks.append(k)
        us.append(u)
        lens.append(len(k))
        labels.append(int(y))
    k = np.concatenate(ks) if ks else np.zeros(0)
    u = np.concatenate(us) if us else np.zeros(0, np.int64)
    offsets, index, values = bin_ragged(k, u, np.asarray(lens), _unit_recipe(r))
    extra = {}
    spk = getattr(dataset, "speaker", None)
    if spk is not None and len(np.asarray(spk)) == len(labels):
        extra["speaker"] = torch.as_tensor(np.asarray(spk).astype(np.int64))
    classes = getattr(dataset, "classes", None)  # tonic's SHD (20) and SSC (35) keep their keys here
    n_classes = len(classes) if classes is not None and len(classes) else max(labels, default=-1) + 1
    info = dict(input_size=r.channels, num_classes=n_classes, steps=r.bins, task="classification")
    return SparseSpikeDataset(torch.from_numpy(offsets), torch.from_numpy(index), torch.from_numpy(values),
                              torch.as_tensor(labels), r.bins, r.channels, info=info, extra=extra)

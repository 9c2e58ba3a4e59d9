"""``spikerec bench data``: bin an SHD-sized synthetic train file cold and from the cache.

Writes a synthetic file in the exact SHD layout (8156 samples, ~6000 spikes per sample by
default) to a temporary folder, then times

* cold: read the HDF5, validate, bin (vectorised) and write the cache;
* cached: build the whole split from the cache and touch every byte (what every later run pays);
* one pass over the split in batches of 64 (densifying ``[T, B, C]`` batches);
* the slow per-spike reference on a few samples, extrapolated to the file (for the speed-up).

Goals (2 cores): cold < 30 s, cached < 2 s.
"""
from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from ..options import ArgumentParser, real_number, whole_number


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    from spikerec.data.binning import bin_reference, get_recipe
    from spikerec.data.core import make_loader
    from spikerec.data.shd import bin_shd_file
    from spikerec.data.shd_file import read_shd
    from spikerec.data.shd_synth import write_shd_like

    p = ArgumentParser(prog="spikerec bench data", description="SHD-sized binning, cold and cached")
    p.add_argument("--samples", type=whole_number(1), default=8156)
    p.add_argument("--mean-spikes", type=real_number(0, inclusive=False), default=6000)
    p.add_argument("--preset", default="zenke100")
    p.add_argument("--threads", type=whole_number(1), default=2)
    p.add_argument("--file", default=None, help="use this SHD-format file instead of a synthetic one")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    recipe = get_recipe(a.preset)
    with tempfile.TemporaryDirectory() as tmp:
        if a.file:
            path = Path(a.file)
        else:
            t0 = time.perf_counter()
            path = write_shd_like(Path(tmp) / "shd_train.h5", a.samples, mean_spikes=a.mean_spikes, seed=0)
            print(f"wrote synthetic SHD-format file ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")
        cache_dir = Path(tmp) / "cache"
        t0 = time.perf_counter()
        ds, hit = bin_shd_file(path, recipe, cache=True, cache_dir=cache_dir)
        cold = time.perf_counter() - t0
        assert not hit
        t0 = time.perf_counter()
        ds2, hit = bin_shd_file(path, recipe, cache=True, cache_dir=cache_dir)
        touched = int(ds2.values.sum()) + int(ds2.index.sum()) + int(ds2.labels.sum())  # page in every byte
        cached = time.perf_counter() - t0
        assert touched > 0 and hit and torch.equal(ds2.index, ds.index) and torch.equal(ds2.values, ds.values)
        t0 = time.perf_counter()
        for x, y in make_loader(ds2, 64, True, 0):
            pass
        epoch = time.perf_counter() - t0
        arr = read_shd(path)
        n_ref = 20
        t0 = time.perf_counter()
        bin_reference([arr.sample(i)[0] for i in range(n_ref)], [arr.sample(i)[1] for i in range(n_ref)], recipe)
        ref = (time.perf_counter() - t0) * len(arr.lengths) / n_ref
        spikes = int(arr.lengths.sum())
    print(f"\nmachine: {_cpu_name()}, {a.threads} threads; torch {torch.__version__}, numpy {np.__version__}")
    print(f"file: {len(ds)} samples, {spikes / 1e6:.1f} M spikes ({spikes / len(ds):.0f} per sample); "
          f"preset {a.preset} -> [{recipe.bins}, {recipe.channels}], {len(ds.index) / 1e6:.1f} M non-zero bins\n")
    print("| step | seconds | goal |")
    print("|---|---|---|")
    print(f"| cold: read + validate + bin + write cache | {cold:.2f} | < 30 |")
    print(f"| cached: whole split from the cache (every byte read) | {cached:.3f} | < 2 |")
    print(f"| one pass in batches of 64 ([T, 64, C] float32) | {epoch:.2f} | |")
    print(f"| slow per-spike reference (extrapolated from {n_ref} samples) | {ref:.0f} | |")
    return 0

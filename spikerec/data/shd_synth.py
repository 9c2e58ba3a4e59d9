"""Synthetic files in the exact SHD layout, for tests and benchmarks (no download needed).

``write_shd_like(path, n_samples)`` writes ``/spikes/times`` (ragged float16 seconds, sorted
within each sample), ``/spikes/units`` (ragged uint16, 0..699), ``/labels`` (uint16, 0..19),
``/extra/speaker`` (uint16), ``/extra/keys`` (20 class names) and
``/extra/meta_info/{gender, age, body_height}`` (one entry per speaker) - the layout and
dtypes of the official files (and of tonic's SHD test fixture).

Statistics: utterances last ``U(0.3, 1.2)`` s after an onset ``U(0, 0.1)`` s (the SHD range);
the spike count per sample is log-normal around ``mean_spikes * duration / 0.75 s``
(``mean_spikes`` = 6000 by default, i.e. thousands of spikes per sample, an assumed order of
magnitude, not a measured SHD statistic); units follow three class-specific frequency bands
that drift over the utterance, shifted per speaker, so the classes are learnable.
Knobs for edge cases: ``empty`` samples with no spike, ``late_fraction`` of spikes moved past
1.4 s, ``unsorted`` rows, ``times_dtype`` (float16/32/64). ``n_classes=35`` writes a file in the
layout of Spiking Speech Commands (SSC: the same arrays, the 35 words of Speech Commands v0.02 as
``/extra/keys``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .fileio import atomic_path

__all__ = ["write_shd_like", "SHD_KEYS", "SSC_KEYS"]

SHD_KEYS = [f"english {w}" for w in ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")] + \
           [f"german {w}" for w in ("null", "eins", "zwei", "drei", "vier", "fuenf", "sechs", "sieben", "acht", "neun")]
# the 35 words of Speech Commands v0.02 (the SSC classes), alphabetical
SSC_KEYS = ["backward", "bed", "bird", "cat", "dog", "down", "eight", "five", "follow", "forward", "four", "go", "happy",
            "house", "learn", "left", "marvin", "nine", "no", "off", "on", "one", "right", "seven", "sheila", "six", "stop",
            "three", "tree", "two", "up", "visual", "wow", "yes", "zero"]


def _generate(n, n_classes, speakers, mean_spikes, rng, late_fraction, n_units):
    labels = rng.integers(0, n_classes, n)
    spk = speakers[rng.integers(0, len(speakers), n)]
    dur = rng.uniform(0.3, 1.2, n)
    onset = rng.uniform(0.0, 0.1, n)
    counts = np.maximum(0, np.rint(rng.lognormal(np.log(mean_spikes * dur / 0.75), 0.3))).astype(np.int64)
    # class templates: 3 bands with start channel and drift (channels over the utterance)
    trng = np.random.default_rng(12345)
    start = trng.uniform(50, 650, (n_classes, 3))
    drift = trng.uniform(-150, 150, (n_classes, 3))
    width = trng.uniform(8, 30, (n_classes, 3))
    spk_shift = {int(s): float(np.random.default_rng(1000 + int(s)).normal(0, 15)) for s in speakers}
    S = int(counts.sum())
    sid = np.repeat(np.arange(n), counts)
    phase = rng.random(S)
    band = rng.integers(0, 3, S)
    lab = labels[sid]
    shift = np.vectorize(spk_shift.get, otypes=[float])(spk)[sid] if S else np.zeros(0)
    units = start[lab, band] + drift[lab, band] * phase + shift + rng.normal(0, 1, S) * width[lab, band]
    units = np.clip(np.rint(units), 0, n_units - 1).astype(np.int64)
    times = onset[sid] + phase * dur[sid]
    if late_fraction > 0 and S:
        late = rng.random(S) < late_fraction
        times[late] = rng.uniform(1.4, 1.6, int(late.sum()))
    return labels, spk, counts, times, units


def write_shd_like(path, n_samples: int, *, n_classes: int = 20, speakers=tuple(range(10)), mean_spikes: float = 6000,
                   seed: int = 0, empty: int = 0, late_fraction: float = 0.0, unsorted: bool = False,
                   times_dtype="float16", units_dtype="uint16", n_units: int = 700) -> Path:
    """Write an SHD-format HDF5 file (atomic). See the module docstring."""
    import h5py

    rng = np.random.default_rng(seed)
    speakers = np.asarray(speakers, dtype=np.int64)
    labels, spk, counts, times, units = _generate(int(n_samples), n_classes, speakers, mean_spikes, rng,
                                                  late_fraction, n_units)
    if empty:
        drop = rng.choice(int(n_samples), size=min(int(empty), int(n_samples)), replace=False)
        keep = ~np.isin(np.repeat(np.arange(int(n_samples)), counts), drop)
        times, units = times[keep], units[keep]
        counts[drop] = 0
    offs = np.concatenate([[0], np.cumsum(counts)])
    sid = np.repeat(np.arange(int(n_samples)), counts)
    key = rng.random(len(times)) if unsorted else times / (2.0 * max(1.0, float(times.max(initial=0.0))))
    order = np.argsort(sid + key)  # grouped by sample, sorted by time (or shuffled) within it
    tdt, udt = np.dtype(times_dtype), np.dtype(units_dtype)
    times, units = times[order].astype(tdt), units[order].astype(udt)
    t_rows = np.empty(int(n_samples), dtype=object)
    u_rows = np.empty(int(n_samples), dtype=object)
    for i in range(int(n_samples)):
        t_rows[i] = times[offs[i]:offs[i + 1]]
        u_rows[i] = units[offs[i]:offs[i + 1]]
    path = Path(path)
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("spikes/times", data=t_rows, dtype=h5py.vlen_dtype(tdt))
            f.create_dataset("spikes/units", data=u_rows, dtype=h5py.vlen_dtype(udt))
            f.create_dataset("labels", data=labels.astype(np.uint16))
            f.create_dataset("extra/speaker", data=spk.astype(np.uint16))
            keys = {20: SHD_KEYS, 35: SSC_KEYS}.get(n_classes, [f"class {i}" for i in range(n_classes)])
            f.create_dataset("extra/keys", data=np.array([k.encode() for k in keys]))
            m = np.random.default_rng(7)
            nspk = int(speakers.max()) + 1 if speakers.size else 0
            f.create_dataset("extra/meta_info/gender", data=np.array([b"female" if i % 2 else b"male" for i in range(nspk)]))
            f.create_dataset("extra/meta_info/age", data=m.integers(20, 60, nspk).astype(np.uint16))
            f.create_dataset("extra/meta_info/body_height", data=m.integers(155, 195, nspk).astype(np.uint16))
    return path

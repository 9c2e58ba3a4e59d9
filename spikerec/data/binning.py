"""Binning ragged spike events into dense ``[T, C]`` count frames.

A recipe (:class:`BinRecipe`) puts the spike at time ``t`` (seconds) of unit ``u`` into

    bin  k = floor((t - t_start) / dt),   kept when 0 <= k < bins   (half-open window [t_start, t_start + bins dt))
    channel c = u // pool                 (sum-pooling of ``pool`` neighbouring units)

and stores the count, or ``min(count, 1)`` for ``value="binary"``.

**Exact arithmetic.** ``dt`` and ``t_start`` must be whole microseconds; the division is done in
integer microseconds, never in floating point (``(1.4 - 0) / 0.014`` is ``99.99...`` in float64,
which would keep a spike at the window end; ``0.003 / 0.001`` is ``2.99...``, which would put a
spike on a bin edge one bin early). The stored value is the spike time: a stored ``t`` (float16,
float32 or float64) becomes integer microseconds by

    t_us = round(t * 10^6)      the stored value exactly, to the nearest microsecond (ties to even)
    k    = (t_us - t_start_us) // dt_us

A float32 or float64 that was written from an exact edge (``0.014`` s) lies within half a
microsecond of it, so the rounding recovers the edge and the spike lands in the bin that starts
there. float16 cannot hold most edges (its spacing is 488 µs in [0.5 s, 1 s) and 977 µs in
[1 s, 2 s): ``1.003`` s is stored as ``1.0029296875``), so a float16 time is wherever its stored
value lies, up to half a spacing from the time it was converted from: a spike converted from just
below an edge may be stored above it and be binned after it, and the other way round.

This is the field's reading of SHD: tonic converts ``int(t * 1e6)`` (truncation) and slices in
integer microseconds; SpyTorch bins the stored value with ``np.digitize``. The truncation differs
from the rounding only for a stored value less than a microsecond below an edge (a float32 or
float64 edge such as ``0.014`` stored as ``0.0139999995``), where tonic bins one bin early.

Presets
(``BIN_PRESETS``; the recipes of the papers in the last column; the data set: Cramer et al. 2022,
IEEE TNNLS 33(7)):

==============  =======  ======  =========  =====  ======  =====================================
preset          dt       bins    window     pool   value   used by
==============  =======  ======  =========  =====  ======  =====================================
``zenke100``    14 ms    100     0-1.4 s    1      count   SpyTorch / sparch (Zenke & Vogels, Bittar)
``yin250``      4 ms     250     0-1.0 s    1      binary  Yin et al. 2021; LSC (Herranz-Celotti)
``dcls10ms``    10 ms    140     0-1.4 s    5      count   Hammouamri et al. 2023 (700 -> 140 ch)
``norse1ms``    1 ms     1400    0-1.4 s    1      count   Norse's 1 ms binning (counts kept)
==============  =======  ======  =========  =====  ======  =====================================

Deviations from the original scripts, on purpose: ``zenke100`` uses 100 equal 14 ms bins
(SpyTorch's ``np.digitize`` on ``linspace(0, 1.4, 100)`` has 99 edges 14.14 ms apart and
shifts bins by one); ``yin250`` keeps all 700 units in their natural order (the LSC copy drops
unit 0 and flips the order); ``dcls10ms`` uses a fixed 1.4 s window instead of per-batch padding.

:func:`bin_ragged` is the vectorised path (chunked sort + run-length count); :func:`bin_reference`
is a slow per-spike loop that defines the result, and the tests check they agree.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace

import numpy as np

__all__ = ["BinRecipe", "BIN_PRESETS", "get_recipe", "bin_ragged", "bin_reference", "bin_indices", "microseconds",
           "window_report", "densify"]


@dataclass(frozen=True)
class BinRecipe:
    dt: float = 0.014
    bins: int = 100
    pool: int = 1
    value: str = "count"
    t_start: float = 0.0
    n_units: int = 700

    def __post_init__(self):
        if not (self.dt > 0 and math.isfinite(self.dt)):
            raise ValueError(f"binning: dt must be > 0 seconds, got {self.dt!r}")
        if int(self.bins) < 1 or int(self.pool) < 1 or int(self.n_units) < 1:
            raise ValueError(f"binning: bins, pool and n_units must be >= 1, got {self.bins}, {self.pool}, {self.n_units}")
        if self.value not in ("count", "binary"):
            raise ValueError(f"binning: value must be 'count' or 'binary', got {self.value!r}")
        for name in ("dt", "t_start"):
            v = float(getattr(self, name))
            if not math.isfinite(v) or abs(v * 1e6 - round(v * 1e6)) > 1e-6 * max(1.0, abs(v * 1e6)):
                raise ValueError(f"binning: {name} must be a whole number of microseconds (bins are computed "
                                 f"in integer microseconds), got {v!r} s")

    @property
    def dt_us(self) -> int:
        return int(round(float(self.dt) * 1e6))

    @property
    def t_start_us(self) -> int:
        return int(round(float(self.t_start) * 1e6))

    @property
    def channels(self) -> int:
        return -(-int(self.n_units) // int(self.pool))

    @property
    def window(self) -> float:
        return self.dt * self.bins

    def key(self) -> str:
        """Short hash of the recipe (for cache names)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


BIN_PRESETS: dict[str, BinRecipe] = {
    "zenke100": BinRecipe(dt=0.014, bins=100, pool=1, value="count"),
    "yin250": BinRecipe(dt=0.004, bins=250, pool=1, value="binary"),
    "dcls10ms": BinRecipe(dt=0.010, bins=140, pool=5, value="count"),
    "norse1ms": BinRecipe(dt=0.001, bins=1400, pool=1, value="count"),
}


def get_recipe(preset: str | BinRecipe = "zenke100", **overrides) -> BinRecipe:
    """A preset (by name) with fields overridden (``dt``, ``bins``, ``pool``, ``value``, ``t_start``)."""
    if isinstance(preset, BinRecipe):
        base = preset
    elif preset in BIN_PRESETS:
        base = BIN_PRESETS[preset]
    else:
        raise ValueError(f"binning: unknown preset {preset!r}; valid: {sorted(BIN_PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(overrides) - set(asdict(base)))
    if unknown:
        raise ValueError(f"binning: unknown field(s) {unknown}; valid: {sorted(asdict(base))}")
    return replace(base, **overrides)


def bin_ragged(times: np.ndarray, units: np.ndarray, lengths: np.ndarray, recipe: BinRecipe,
               chunk_spikes: int = 1 << 22):
    """Vectorised binning of ``N`` concatenated samples.

    Args:
        times: ``[S]`` spike times (seconds, float16/32/64; see :func:`microseconds`) of all
            samples, sample after sample (any order within a sample).
        units: ``[S]`` unit indices in ``[0, n_units)`` (checked by the caller).
        lengths: ``[N]`` spikes per sample.
    Returns:
        ``(offsets[N+1] int64, index[nnz] int32 (t * C + c), values[nnz] uint8/int32)``,
        entries of each sample sorted by ``index``.

    Works on chunks of whole samples (about ``chunk_spikes`` spikes each): the flat keys
    ``(sample * bins + k) * C + c`` of the kept spikes are sorted and run-length counted.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    N, C, K = len(lengths), recipe.channels, int(recipe.bins)
    cells = K * C
    ends = np.cumsum(lengths)
    starts = ends - lengths
    smp_parts, idx_parts, val_parts = [], [], []
    s0 = 0
    while s0 < N:
        s1 = int(np.searchsorted(ends, starts[s0] + chunk_spikes, side="right"))
        s1 = max(s1, s0 + 1)
        lo, hi = int(starts[s0]), int(ends[s1 - 1])
        k = bin_indices(times[lo:hi], recipe)
        keep = (k >= 0) & (k < K)
        sample = np.repeat(np.arange(s1 - s0, dtype=np.int64), lengths[s0:s1])[keep]
        key = (sample * K + k[keep]) * C + np.asarray(units[lo:hi], dtype=np.int64)[keep] // int(recipe.pool)
        key.sort()
        if key.size:
            first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
            uk = key[first]
            smp_parts.append(uk // cells + s0)
            idx_parts.append((uk % cells).astype(np.int32))
            val_parts.append(np.diff(np.append(first, key.size)))
        s0 = s1
    if idx_parts:
        smp, index, values = np.concatenate(smp_parts), np.concatenate(idx_parts), np.concatenate(val_parts)
    else:
        smp, index, values = np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
    if recipe.value == "binary":
        values = np.minimum(values, 1)
    values = values.astype(np.uint8 if values.size == 0 or values.max() <= 255 else np.int32)
    offsets = np.zeros(N + 1, np.int64)
    offsets[1:] = np.cumsum(np.bincount(smp, minlength=N))
    return offsets, index, values


def microseconds(times) -> np.ndarray:
    """Stored times (seconds) as int64 microseconds, each the stored value rounded to the nearest
    microsecond (ties to even). float16/float32 values times ``10^6`` are exact in float64; a float64
    product may be off by an ulp, so values within ``2^-20`` of a half are redone in exact rationals."""
    times = np.asarray(times)
    if not np.issubdtype(times.dtype, np.floating):
        times = times.astype(np.float64)
    prod = times.astype(np.float64) * 1e6
    us = np.rint(prod).astype(np.int64)
    if times.dtype.itemsize > 4:
        near_half = np.flatnonzero(np.abs(np.abs(prod - np.floor(prod)) - 0.5) < 2.0**-20)
        if near_half.size:
            from fractions import Fraction

            flat = times.reshape(-1)
            us.reshape(-1)[near_half] = [round(Fraction(float(flat[j])) * 1_000_000) for j in near_half]
    return us


def bin_indices(times, recipe: BinRecipe) -> np.ndarray:
    """Bin index ``k`` (int64, may lie outside ``[0, bins)``) of every spike time, by the exact
    rule of the module docstring (the stored value to the nearest microsecond, then integers)."""
    return (microseconds(times) - recipe.t_start_us) // recipe.dt_us


def window_report(times, recipe: BinRecipe) -> dict:
    """Counts of spikes the recipe drops: ``before`` the window, ``after`` it, and ``far_after``
    (at or past one more window length after its end: a sign of times not in seconds)."""
    k = bin_indices(times, recipe)
    K = int(recipe.bins)
    return dict(before=int((k < 0).sum()), after=int((k >= K).sum()), far_after=int((k >= 2 * K).sum()))


def bin_reference(times_list, units_list, recipe: BinRecipe) -> np.ndarray:
    """Slow per-spike definition with Python integers: ``[N, bins, channels]`` float64 counts (or 0/1)."""
    from fractions import Fraction

    out = np.zeros((len(times_list), int(recipe.bins), recipe.channels))
    dt, t0 = recipe.dt_us, recipe.t_start_us
    for n, (ts, us) in enumerate(zip(times_list, units_list)):
        ts = np.asarray(ts)
        for t, u in zip(ts, us):
            t_us = round(Fraction(float(t)) * 1_000_000)     # the stored value, exactly, to the nearest µs (ties to even)
            k = (t_us - t0) // dt
            if 0 <= k < recipe.bins:
                out[n, k, int(u) // int(recipe.pool)] += 1
    if recipe.value == "binary":
        out = np.minimum(out, 1)
    return out


def densify(offsets, index, values, steps: int, channels: int) -> np.ndarray:
    """Sparse rows -> dense ``[N, steps, channels]`` float32 (numpy)."""
    N = len(offsets) - 1
    out = np.zeros(N * steps * channels, np.float32)
    base = np.repeat(np.arange(N, dtype=np.int64) * steps * channels, np.diff(offsets))
    out[base + index] = values
    return out.reshape(N, steps, channels)

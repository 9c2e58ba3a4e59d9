"""Dataset containers, time-first collation and the reproducible loader.

Every spikerec dataset yields ``(x[T, C] float32, target)``; ``collate_time_first`` stacks a
batch into ``x[T, B, C]`` and

* class labels (ints or 0-d tensors) into ``y[B]`` (int64);
* per-sequence tensor targets (e.g. the adding problem) into ``y[B, ...]``;
* per-step targets (tensors whose first dim equals the sample's ``T``) into
  ``y[T, B, ...]`` (time-first like ``x``).

Sequences of unequal length are zero-padded at the end to the longest in the batch.
The containers keep their data compact (uint8 pixels, spike-time tables, sparse COO counts)
and densify one sample at a time; ``tensors()`` hands the whole split as dense tensors.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = [
    "ArrayDataset", "LatencyDataset", "SparseSpikeDataset", "collate_time_first",
    "make_loader", "EpochSampler", "Loader", "keyed_generator",
]


class _Base(Dataset):
    per_step_target = False
    info: dict = {}

    def tensors(self):
        """The whole split as ``(x[N, T, C] float32, y)``."""
        items = [self[i] for i in range(len(self))]
        x = torch.stack([it[0] for it in items]) if items else torch.empty(0)
        ys = [it[1] for it in items]
        if ys and isinstance(ys[0], torch.Tensor) and ys[0].dim() > 0:
            y = torch.stack(ys)
        else:
            y = torch.as_tensor([int(v) for v in ys], dtype=torch.long)
        return x, y


class ArrayDataset(_Base):
    """Dense samples ``x[N, T, C]`` (any dtype, returned as ``float32 * scale``) and targets.

    ``x_fn`` (optional) maps the stored sample ``x[i]`` to the returned one (e.g. a fixed
    pixel permutation); ``targets`` is an int64 tensor ``[N]`` or a float/long tensor ``[N, ...]``.
    """

    def __init__(self, x: torch.Tensor, targets: torch.Tensor, *, scale: float = 1.0,
                 per_step_target: bool = False, info: dict | None = None):
        if x.dim() != 3:
            raise ValueError(f"ArrayDataset: x must be [N, T, C], got shape {tuple(x.shape)}")
        if len(targets) != len(x):
            raise ValueError(f"ArrayDataset: {len(x)} samples but {len(targets)} targets")
        self.x, self.targets, self.scale = x, targets, float(scale)
        self.per_step_target = bool(per_step_target)
        self.info = dict(info or {})

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i].to(torch.float32)
        if self.scale != 1.0:
            x = x * self.scale
        y = self.targets[i]
        return x, (int(y) if y.dim() == 0 and not y.is_floating_point() else y)

    def tensors(self):
        x = self.x.to(torch.float32)
        return (x * self.scale if self.scale != 1.0 else x), self.targets


class LatencyDataset(_Base):
    """At most one spike per channel: ``times[N, C]`` (int, step index; ``-1`` = no spike).

    Sample ``i`` is the raster ``x[t, c] = 1`` iff ``times[i, c] == t``, of ``steps`` steps,
    with each step repeated ``time_repeat`` times (the LSC code's ``timerepeat``).
    """

    def __init__(self, times: torch.Tensor, labels: torch.Tensor, steps: int, *, time_repeat: int = 1,
                 info: dict | None = None):
        if times.dim() != 2:
            raise ValueError(f"LatencyDataset: times must be [N, C], got shape {tuple(times.shape)}")
        if times.numel() and int(times.max()) >= steps:
            raise ValueError(f"LatencyDataset: a spike time is >= steps={steps}")
        self.times, self.labels = times, labels.to(torch.long)
        self.steps, self.time_repeat = int(steps), int(time_repeat)
        self.info = dict(info or {})

    def __len__(self):
        return len(self.times)

    def _raster(self, times: torch.Tensor) -> torch.Tensor:
        """``times[..., C] -> x[..., T, C]`` one-hot over time (no spike -> zeros)."""
        grid = torch.arange(self.steps, dtype=times.dtype).view(*([1] * (times.dim() - 1)), self.steps, 1)
        x = (times.unsqueeze(-2) == grid).to(torch.float32)
        if self.time_repeat > 1:
            x = x.repeat_interleave(self.time_repeat, dim=-2)
        return x

    def __getitem__(self, i):
        return self._raster(self.times[i]), int(self.labels[i])

    def tensors(self):
        return self._raster(self.times), self.labels


class SparseSpikeDataset(_Base):
    """Binned spike counts in compressed sparse rows: sample ``i`` holds the entries
    ``offsets[i]:offsets[i+1]`` of ``index`` (flat ``t * C + c``) and ``values`` (counts)."""

    def __init__(self, offsets: torch.Tensor, index: torch.Tensor, values: torch.Tensor, labels: torch.Tensor,
                 steps: int, channels: int, *, info: dict | None = None, extra: dict | None = None):
        if offsets.dim() != 1 or len(offsets) != len(labels) + 1:
            raise ValueError(f"SparseSpikeDataset: offsets must be [N+1] for N={len(labels)} labels")
        self.offsets, self.index, self.values = offsets.to(torch.int64), index, values
        self._index_np, self._values_np = index.numpy(), values.numpy()
        self.labels = labels.to(torch.long)
        self.steps, self.channels = int(steps), int(channels)
        self.info = dict(info or {})
        self.extra = dict(extra or {})

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        if i < 0:
            i += len(self)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        x = np.zeros(self.steps * self.channels, dtype=np.float32)  # numpy: no thread-pool overhead per item
        x[self._index_np[a:b]] = self._values_np[a:b]
        return torch.from_numpy(x.reshape(self.steps, self.channels)), int(self.labels[i])

    def __getitems__(self, idx):
        """A whole batch at once, already time-first: ``_Batch(x[T, B, C], y[B])``."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        B, C = len(idx), self.channels
        off = self.offsets.numpy()
        starts, lens = off[idx.numpy()], off[idx.numpy() + 1] - off[idx.numpy()]
        pos = np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))
        b = np.repeat(np.arange(B), lens)
        flat = self._index_np[pos].astype(np.int64)
        x = np.zeros(self.steps * B * C, np.float32)
        x[(flat // C) * (B * C) + b * C + flat % C] = self._values_np[pos]
        return _Batch((torch.from_numpy(x.reshape(self.steps, B, C)), self.labels[idx]))

    def subset(self, idx: Sequence[int] | torch.Tensor) -> "SparseSpikeDataset":
        """A new dataset with the samples ``idx`` (in that order)."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        lens = self.offsets[1:] - self.offsets[:-1]
        sel_lens = lens[idx]
        offs = torch.zeros(len(idx) + 1, dtype=torch.int64)
        offs[1:] = torch.cumsum(sel_lens, 0)
        starts = self.offsets[idx]
        gather = torch.repeat_interleave(starts - offs[:-1], sel_lens) + torch.arange(int(offs[-1]))
        extra = {k: v[idx] for k, v in self.extra.items()}
        return SparseSpikeDataset(offs, self.index[gather], self.values[gather], self.labels[idx],
                                  self.steps, self.channels, info=self.info, extra=extra)

    def tensors(self):
        """Dense ``(x[N, T, C] float32, y)``: ``N*T*C*4`` bytes (SHD train at 100x700: 2.3 GB)."""
        n = len(self)
        x = torch.zeros(n * self.steps * self.channels, dtype=torch.float32)
        lens = self.offsets[1:] - self.offsets[:-1]
        base = torch.repeat_interleave(torch.arange(n, dtype=torch.int64) * (self.steps * self.channels), lens)
        x[base + self.index.to(torch.int64)] = self.values.to(torch.float32)
        return x.view(n, self.steps, self.channels), self.labels


class _Batch(tuple):
    """A batch a dataset assembled itself (``__getitems__``); collation passes it through."""


def collate_time_first(batch):
    """``[(x[T_i, C], y_i)] -> (x[T, B, C], y)``; see the module docstring for ``y``."""
    if isinstance(batch, _Batch):
        return tuple(batch)
    if not batch:
        raise ValueError("collate_time_first: empty batch")
    xs, ys = zip(*batch)
    for i, x in enumerate(xs):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"collate_time_first: sample {i} input must be a [T, C] tensor, got "
                             f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
    C = xs[0].shape[1]
    if any(x.shape[1] != C for x in xs):
        raise ValueError(f"collate_time_first: channel counts differ in the batch: {sorted({x.shape[1] for x in xs})}")
    T = max(x.shape[0] for x in xs)
    if all(x.shape[0] == T for x in xs):
        X = torch.stack(xs, dim=1)
    else:
        X = xs[0].new_zeros(T, len(xs), C)
        for b, x in enumerate(xs):
            X[: x.shape[0], b] = x
    y0 = ys[0]
    if isinstance(y0, torch.Tensor) and y0.dim() > 0:
        if any(not isinstance(y, torch.Tensor) or y.shape != y0.shape for y in ys):
            raise ValueError("collate_time_first: tensor targets must all have the same shape")
        if all(y.shape[0] == x.shape[0] for x, y in zip(xs, ys)) and T == y0.shape[0]:
            return X, torch.stack(ys, dim=1)  # per-step targets: [T, B, ...]
        return X, torch.stack(ys, dim=0)
    return X, torch.as_tensor([int(y) for y in ys], dtype=torch.long)


def keyed_generator(key: str) -> torch.Generator:
    """A CPU generator seeded by ``key``: the first 8 bytes of ``sha256(key)`` read little-endian,
    top bit cleared. Randomness that depends only on what the key names (seed, epoch), so a resumed
    run draws exactly what an uninterrupted one drew."""
    first8 = bytes.fromhex(hashlib.sha256(key.encode()).hexdigest()[:16])
    return torch.Generator().manual_seed(int.from_bytes(first8, "little") & ((1 << 63) - 1))


class EpochSampler(Sampler):
    """Index order for epoch ``e``: a permutation drawn from a generator seeded by
    ``sha256(seed, e)`` (or ``0..N-1`` without shuffling). Each complete pass advances the
    epoch by one; ``set_epoch(e)`` fixes the epoch of the next pass (resuming a run)."""

    def __init__(self, n: int, shuffle: bool, seed: int):
        self.n, self.shuffle, self.seed, self.epoch = int(n), bool(shuffle), int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        return torch.randperm(self.n, generator=keyed_generator(f"spikerec-loader:{self.seed}:{epoch}"))

    def __iter__(self):
        order = self.order(self.epoch)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self):
        return self.n


class Loader(DataLoader):
    """A ``DataLoader`` whose order depends only on ``(seed, epoch)``; see :class:`EpochSampler`.
    A dataset with a ``set_epoch(epoch, seed)`` method (random augmentation) is told the pass it
    serves before every pass, so its randomness too depends only on ``(seed, epoch)``."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(self.sampler.epoch, seed=self.sampler.seed)
        return super().__iter__()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch


def make_loader(dataset, batch_size: int, shuffle: bool, seed: int, drop_last: bool = False, **kwargs) -> Loader:
    """Batches ``(x[T, B, C], y)`` in an order fixed by ``(seed, epoch)``.

    Per-step targets come time-first as ``y[T, B, ...]`` (see :func:`collate_time_first`).
    Extra keyword arguments go to ``torch.utils.data.DataLoader`` (e.g. ``num_workers``).
    """
    if int(batch_size) <= 0:
        raise ValueError(f"make_loader: batch_size must be a positive int, got {batch_size!r}")
    collate = collate_time_first
    sampler = EpochSampler(len(dataset), shuffle, seed)
    return Loader(dataset, batch_size=int(batch_size), sampler=sampler, drop_last=drop_last,
                  collate_fn=kwargs.pop("collate_fn", collate), **kwargs)

"""Random translations of latency-coded images, reproducible per ``(seed, epoch)``.

A small training set (``mnist5k``: 3,500 digits) is memorised within a few epochs; shifting every
training image by a random whole number of pixels per epoch is the classic remedy for MNIST
(Simard, Steinkraus & Platt 2003, "Best practices for convolutional neural networks applied to
visual document analysis", ICDAR, Sec. 2). The shift acts on the spike-time table: pixel
``(r, c)`` of the shifted image is pixel ``(r - dy, c - dx)`` of the original, and pixels moved in
from outside the image do not spike (time ``-1``). Offsets ``dy, dx`` are drawn uniformly from
``-max_shift..max_shift`` for every sample, from a generator seeded by ``sha256(seed, epoch)``, so
a resumed run sees exactly the shifts of an uninterrupted one. :class:`spikerec.data.core.Loader`
calls :meth:`set_epoch` with the training seed and the epoch at the start of every pass.
"""
from __future__ import annotations

import torch

from .core import LatencyDataset, keyed_generator

__all__ = ["ShiftedLatencyDataset", "shift_times"]


def shift_times(times: torch.Tensor, shape: tuple[int, int], dy: int, dx: int) -> torch.Tensor:
    """``times[..., H*W]`` of an ``H x W`` image translated by ``(dy, dx)`` pixels (``-1`` = no spike)."""
    H, W = shape
    t = times.reshape(*times.shape[:-1], H, W)
    out = torch.full_like(t, -1)
    if abs(dy) < H and abs(dx) < W:
        out[..., max(0, dy):H + min(0, dy), max(0, dx):W + min(0, dx)] = \
            t[..., max(0, -dy):H + min(0, -dy), max(0, -dx):W + min(0, -dx)]
    return out.reshape(times.shape)


class ShiftedLatencyDataset(LatencyDataset):
    """A :class:`LatencyDataset` of ``H x W`` images whose samples are shifted by per-epoch random
    offsets of at most ``max_shift`` pixels (see the module docstring)."""

    def __init__(self, times, labels, steps: int, *, image_shape: tuple[int, int], max_shift: int,
                 time_repeat: int = 1, info: dict | None = None):
        super().__init__(times, labels, steps, time_repeat=time_repeat, info=info)
        H, W = (int(v) for v in image_shape)
        if H * W != self.times.shape[1]:
            raise ValueError(f"ShiftedLatencyDataset: image_shape {H}x{W} does not match {self.times.shape[1]} channels")
        if int(max_shift) < 0:
            raise ValueError(f"ShiftedLatencyDataset: max_shift must be >= 0, got {max_shift}")
        self.image_shape, self.max_shift = (H, W), int(max_shift)
        self.set_epoch(0, seed=0)

    def set_epoch(self, epoch: int, seed: int = 0) -> None:
        """Draw the offsets ``[N, 2]`` of pass ``epoch`` of a run with ``seed``."""
        m = self.max_shift
        g = keyed_generator(f"spikerec-shift:{int(seed)}:{int(epoch)}")
        self.offsets = torch.randint(-m, m + 1, (len(self.times), 2), generator=g)

    def __getitem__(self, i):
        dy, dx = (int(v) for v in self.offsets[i])
        return self._raster(shift_times(self.times[i], self.image_shape, dy, dx)), int(self.labels[i])

    def tensors(self):
        return torch.stack([self[i][0] for i in range(len(self))]) if len(self) else torch.empty(0), self.labels

"""Losses, accuracies and the metrics files of a run.

Losses (``y[T, B, K]`` is the readout sequence):

* classification, ``loss_on``: ``last`` -> ``CE(y_{T-1}, c)``; ``mean`` -> ``CE(mean_t y_t, c)``;
  ``per_step`` -> ``mean_t CE(y_t, c)`` (the LSC paper's loss, Herranz-Celotti & Rouat,
  Sec. II-G: the label repeated at every step); ``readout`` -> the model's readout mode (``max`` too);
* per-step class targets ``c[T, B, ...]`` (copy task): logits ``[T, B, n, 2]`` when the
  readout has ``2n`` outputs, cross-entropy over the non-ignored entries (``-100``);
* regression (``mse``): ``mean (y - target)^2`` at the last step (``target[B, K]``) or at every
  step (``target[T, B, K]``).

"Mode" accuracy (Herranz-Celotti & Rouat, Sec. II-G; the official code's definition,
``docs/decisions.md``, layering 1):
``argmax_c mean_t y_{t,c}``; ``readout`` accuracy uses the readout's own aggregation.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from ..layers.readout import aggregate
from .checkpoint import atomic_write_text

__all__ = ["sequence_loss", "step_loss_fn", "accuracy_counts", "mode_accuracy", "firing_rates", "MetricsLogger"]

IGNORE_INDEX = -100


def _per_step_logits(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``y[..., K]`` -> ``[..., n, K/n]`` when the target has ``n`` entries per step."""
    extra = target.shape[2:] if target.dim() > 2 else ()
    if not extra:
        return y
    n = int(torch.tensor(extra).prod())
    K = y.shape[-1]
    if K % n:
        raise ValueError(f"per-step targets with {n} entries per step need a multiple of {n} outputs, got {K}")
    return y.reshape(*y.shape[:-1], *extra, K // n)


def sequence_loss(y: torch.Tensor, target: torch.Tensor, *, loss: str, loss_on: str, readout_mode: str,
                  reduction: str = "mean") -> torch.Tensor:
    """Loss of a whole readout sequence ``y[T, B, K]`` (see the module docstring).

    ``reduction="sum"`` sums over samples instead of averaging (for data-parallel weighting).
    """
    on = readout_mode if loss_on == "readout" else loss_on
    if loss == "mse":
        target = target.to(y.dtype)
        if target.dim() == y.dim():  # per-step [T, B, K]
            err = (y - target) ** 2
            per_sample = err.mean(dim=(0, 2))
        else:
            pred = y[-1] if on in ("last", "per_step") else y.mean(0) if on == "mean" else y.max(0).values
            per_sample = ((pred - target.reshape(pred.shape)) ** 2).mean(-1)
        return per_sample.sum() if reduction == "sum" else per_sample.mean()
    if target.dim() >= 2:  # per-step class targets [T, B, ...]
        logits = _per_step_logits(y, target)
        C = logits.shape[-1]
        tot = F.cross_entropy(logits.reshape(-1, C), target.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        counts = (target != IGNORE_INDEX).sum()
        if reduction == "sum":  # sum over samples of each sample's mean token loss
            return tot / counts.clamp(min=1) * target.shape[1]
        return tot / counts.clamp(min=1)
    if on == "per_step":
        T, B, K = y.shape
        l = F.cross_entropy(y.reshape(T * B, K), target.repeat(T), reduction="sum") / T
        return l if reduction == "sum" else l / B
    if on == "last":
        logits = y[-1]
    elif on == "mean":
        logits = y.mean(0)
    elif on == "max":
        logits = y.max(0).values
    else:
        raise ValueError(f"loss_on: unknown mode {on!r}")
    return F.cross_entropy(logits, target, reduction=reduction)


def step_loss_fn(*, loss: str, loss_on: str, readout_mode: str, steps: int, scale: float = 1.0):
    """The same loss as a per-step function ``loss_fn(y_t, target, t)`` for online learning
    (``None`` at steps without a loss); ``scale`` multiplies it (data-parallel weighting).

    ``CE(mean_t y_t)`` is not a sum over steps, so a ``mean`` readout learns online with
    ``mean_t CE(y_t, c)`` (as :func:`spikerec.hardware.online.classification_loss`)."""
    on = readout_mode if loss_on == "readout" else loss_on
    T = int(steps)
    if loss == "mse":
        def fn(y_t, target, t):
            if target.dim() == 3:
                return scale * ((y_t - target[t]) ** 2).mean(-1).mean() / T
            if t != T - 1:
                return None
            return scale * ((y_t - target.reshape(y_t.shape)) ** 2).mean(-1).mean()
        return fn

    def fn(y_t, target, t):
        if target.dim() >= 2:
            tt = target[t]
            logits = y_t.reshape(*y_t.shape[:-1], *tt.shape[1:], -1) if tt.dim() > 1 else y_t
            n = (target != IGNORE_INDEX).sum().clamp(min=1)
            return scale * F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tt.reshape(-1),
                                           ignore_index=IGNORE_INDEX, reduction="sum") / n
        if on in ("per_step", "mean"):  # "mean": mean_t CE(y_t, c), the per-step form of the mean readout
            return scale * F.cross_entropy(y_t, target) / T
        if on == "last":
            return scale * F.cross_entropy(y_t, target) if t == T - 1 else None
        raise ValueError(f"online learning needs a per-step loss: loss_on 'last' or 'per_step' "
                         f"(the readout's '{on}' aggregation is not a sum over steps); set train.loss_on")
    return fn


def mode_accuracy(y: torch.Tensor, target: torch.Tensor) -> float:
    """``argmax_c mean_t y[t, b, c] == target[b]`` averaged over the batch."""
    return float((y.mean(0).argmax(-1) == target).float().mean())


def accuracy_counts(y: torch.Tensor, target: torch.Tensor, *, kind: str, readout_mode: str, loss: str):
    """``(correct, total)`` for one batch; ``(0, 0)`` for regression."""
    if loss == "mse" or target.is_floating_point():
        return 0, 0
    if target.dim() >= 2:
        logits = _per_step_logits(y, target)
        mask = target != IGNORE_INDEX
        return int(((logits.argmax(-1) == target) & mask).sum()), int(mask.sum())
    if kind == "mode":
        pred = y.mean(0).argmax(-1)
    else:
        agg = aggregate(y, readout_mode)
        pred = (agg.mean(0) if agg.dim() == 3 else agg).argmax(-1)
    return int((pred == target).sum()), int(target.numel())


def firing_rates(hidden: list[torch.Tensor], layers) -> dict[str, float]:
    """Mean output of each spiking hidden layer (spikes per neuron per step)."""
    out = {}
    for i, (h, cell) in enumerate(zip(hidden, layers)):
        if getattr(cell, "spiking", False):
            out[f"rate_{i}"] = float(h.detach().float().mean())
    return out


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and epoch rows to ``metrics.csv`` (rank 0 only).

    ``offsets()`` gives the byte sizes of both files so a resumed run can truncate them back
    to the checkpoint (no duplicated or orphaned rows).
    """

    def __init__(self, run_dir, enabled: bool = True, tensorboard: bool = True):
        self.dir = Path(run_dir)
        self.enabled = enabled
        self.jsonl = self.dir / "metrics.jsonl"
        self.csv = self.dir / "metrics.csv"
        self.records: list[dict] = []
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tensorboard"))
            except Exception:  # tensorboard not installed
                self.tb = None

    def offsets(self) -> dict:
        return {n: (p.stat().st_size if p.exists() else 0) for n, p in (("jsonl", self.jsonl), ("csv", self.csv))}

    def truncate(self, offsets: dict) -> None:
        """Cut both files back to ``offsets`` and reload the kept records."""
        if not self.enabled:
            return
        for n, p in (("jsonl", self.jsonl), ("csv", self.csv)):
            if p.exists():
                with open(p, "r+b") as f:
                    f.truncate(int(offsets.get(n, 0)))
        self.records = []
        if self.jsonl.exists():
            with open(self.jsonl) as f:
                self.records = [json.loads(line) for line in f if line.strip()]

    def log(self, record: dict) -> None:
        rec = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self.records.append(rec)
        if not self.enabled:
            return
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb is not None:
            step = rec.get("step", 0)
            for k, v in rec.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "epoch"):
                    self.tb.add_scalar(f"{rec.get('kind', 'x')}/{k}", v, step)
        if rec.get("kind") == "epoch":
            self._csv_row(rec)

    def _csv_row(self, rec: dict) -> None:
        row = {k: v for k, v in rec.items() if k != "kind"}
        header = None
        if self.csv.exists() and self.csv.stat().st_size:
            with open(self.csv) as f:
                header = next(csv.reader(f), None)
        if header is not None and all(k in header for k in row):
            with open(self.csv, "a", newline="") as f:
                csv.DictWriter(f, fieldnames=header).writerow(row)
            return
        rows = [r for r in self.records if r.get("kind") == "epoch"]
        fields: list[str] = []
        for r in rows:
            fields += [k for k in r if k != "kind" and k not in fields]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k != "kind"})
        atomic_write_text(self.csv, buf.getvalue())

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

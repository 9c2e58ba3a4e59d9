"""Training on one endless stream (``[online] stream = true``).

The training set's sequences are presented back to back in every lane of the batch: lane ``b``
sees sample ``b`` of the first batch, then sample ``b`` of the next one, and so on, epoch after
epoch, with no reset of the layer states or of the eligibility traces between them. The learner
takes one time step at a time (:meth:`spikerec.hardware.online.OnlineLearner.step`) and the
optimiser steps once per batch, that is every sequence length of stream steps (the update policy
of Zucchet et al. 2023, Sec. 4; thesis Zucchet 2025, Sec. 4.4.1, learned here without resets).
The network must therefore also learn to let go of one sequence when the next one starts.

The stream's loss at a step with targets is the mean over the step's valid targets: the
cross-entropy of every per-step target that is not ``IGNORE_INDEX`` (the copy task's recall
bits), of a class label at every step (``loss_on = "per_step"``) or at each sequence's last step
(``"last"``), or the squared error of a regression target. The running loss is the mean of these
over the steps that have targets.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .metrics import IGNORE_INDEX

__all__ = ["StreamLoss", "stream_targets", "stream_batch"]


class StreamLoss:
    """The per-step loss ``loss(y_t, target_t)`` of the stream (module docstring); ``kind`` is
    ``"per_step"`` (integer targets ``[B, ...]`` with ignored entries), ``"label"`` (class
    labels ``[B]``) or ``"mse"`` (float targets ``[B, K]``)."""

    def __init__(self, kind: str):
        self.kind = kind

    def logits(self, y_t: torch.Tensor, target_t: torch.Tensor) -> torch.Tensor:
        """``y_t`` as ``[B, ..., classes]`` matching an integer ``target_t [B, ...]``."""
        return y_t.reshape(*y_t.shape[:-1], *target_t.shape[1:], -1) if target_t.dim() > 1 else y_t

    def __call__(self, y_t: torch.Tensor, target_t: torch.Tensor) -> torch.Tensor:
        if self.kind == "mse":
            return ((y_t - target_t) ** 2).mean()
        logits = self.logits(y_t, target_t)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_t.reshape(-1), ignore_index=IGNORE_INDEX)


def stream_targets(y: torch.Tensor, T: int, loss: str, loss_on: str) -> list:
    """The per-step targets of one batch (``None`` at steps without one): per-step targets
    ``y [T, B, ...]`` step by step (``None`` where every entry is ignored), class labels ``y [B]``
    at every step or at the last one."""
    if loss == "mse" or y.is_floating_point():
        if y.dim() < 3:
            raise ValueError("online stream training with an MSE loss needs per-step targets [T, B, K]")
        return list(y.unbind(0))
    if y.dim() >= 2:
        valid = (y != IGNORE_INDEX).flatten(1).any(1).tolist()
        return [yt if v else None for yt, v in zip(y.unbind(0), valid)]
    if loss_on == "last":
        return [None] * (T - 1) + [y]
    if loss_on in ("per_step", "mean"):
        return [y] * T
    raise ValueError(f"online stream training needs a per-step loss: train.loss_on 'last' or 'per_step', got "
                     f"{loss_on!r}")


def stream_batch(learner, x: torch.Tensor, targets: list, loss: StreamLoss) -> tuple[float, int, int, int]:
    """Feed one batch ``x [T, B, C]`` to ``learner`` as the next ``T`` steps of its stream (no
    reset), then write the accumulated gradient into ``.grad`` (:meth:`update`; the caller steps
    the optimiser). Returns ``(sum of the step losses, steps with a loss, correct, counted)``."""
    total, n, correct, counted = 0.0, 0, 0, 0
    for x_t, tt in zip(x.unbind(0), targets):
        out, l = learner.step(x_t, tt)
        if l is None:
            continue
        total += float(l)
        n += 1
        if loss.kind != "mse":
            with torch.no_grad():
                pred = loss.logits(out, tt).argmax(-1)
                mask = tt != IGNORE_INDEX
                correct += int(((pred == tt) & mask).sum())
                counted += int(mask.sum())
    learner.update()
    return total, n, correct, counted

"""The per-step losses of online learning (Zucchet et al. 2023: the total loss is a sum of
instantaneous losses ``L = sum_t l_t(y_t)``, the only kind an online rule can learn), each with its
gradient ``d l_t / d y_t`` in closed form (``value_and_grad``); some with the loss of a whole block of
steps ``t0..t1-1`` in one op (``block(y [K, B, ...], target, t0, t1)``, ``block_value_and_grad``).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["classification_loss", "mse_loss", "mse_step_loss", "cross_entropy_step_loss", "bptt_loss"]


def classification_loss(readout_mode: str, steps: int) -> Callable:
    """Per-step cross-entropy for ``target [B]`` (or ``[T, B]`` with ``per_step``).

    * ``mean``: ``l_t = CE(y_t, target) / T`` at every step;
    * ``last``: ``l_{T-1} = CE(y_{T-1}, target)``, no loss elsewhere;
    * ``per_step``: ``l_t = CE(y_t, target[t]) / T``.
    """
    T = int(steps)
    if readout_mode == "mean":
        def mean(y, target, t):
            return F.cross_entropy(y, target) / T

        mean.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target, 1.0 / T)
        # all K steps of a block in one op: sum_k CE_mean(y_k) / T = K * CE_mean(all K*B rows) / T
        mean.block = lambda y, target, t0, t1: F.cross_entropy(
            y.flatten(0, 1), target.repeat(t1 - t0)) * ((t1 - t0) / T)
        return mean
    if readout_mode == "last":
        def last(y, target, t):
            return F.cross_entropy(y, target) if t == T - 1 else None

        last.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target, 1.0) if t == T - 1 else None
        return last
    if readout_mode == "per_step":
        def per_step(y, target, t):
            return F.cross_entropy(y, target[t]) / T

        per_step.value_and_grad = lambda y, target, t: _ce_value_and_grad(y, target[t], 1.0 / T)
        per_step.block = lambda y, target, t0, t1: F.cross_entropy(
            y.flatten(0, 1), target[t0:t1].flatten(0, 1)) * ((t1 - t0) / T)
        return per_step
    raise ValueError(f"classification_loss: readout mode '{readout_mode}' has no per-step form; "
                     f"use 'mean', 'last' or 'per_step' (or rule='bptt')")


def mse_loss(y, target, t):
    """``l_t = 0.5 * sum over batch and features of (y_t - target[t])^2`` for ``target [T, B, K]``."""
    return 0.5 * ((y - target[t]) ** 2).sum()


def _mse_value_and_grad(y, target_t):
    """``(0.5 sum (y - target)^2, y - target)``: the loss and its gradient in closed form."""
    d = torch.sub(y, target_t if target_t.dtype == y.dtype else target_t.to(y.dtype))
    flat = d.reshape(-1)
    return torch.dot(flat, flat).mul_(0.5), d


def _ce_value_and_grad(y, label, scale):
    """``scale * CE_mean(y, label)`` and its gradient ``scale * (softmax(y) - onehot(label)) / B``."""
    logp = torch.log_softmax(y, -1)
    B = y.shape[0]
    loss = -logp.gather(1, label.view(-1, 1)).sum() * (scale / B)
    g = logp.exp_()
    g[torch.arange(B, device=y.device), label] -= 1.0
    return loss, g.mul_(scale / B)


mse_loss.value_and_grad = lambda y, target, t: _mse_value_and_grad(y, target[t])
mse_loss.block = lambda y, target, t0, t1: 0.5 * ((y - target[t0:t1]) ** 2).sum()
mse_loss.block_value_and_grad = lambda Y, target, t0, t1: _mse_value_and_grad(Y, target[t0:t1])


def mse_step_loss(y_t, target_t):
    """The per-step loss ``0.5 * sum (y_t - target_t)^2`` (``target_t [B, K]``) of :meth:`OnlineLearner.step`."""
    return 0.5 * ((y_t - target_t) ** 2).sum()


mse_step_loss.value_and_grad = _mse_value_and_grad


def cross_entropy_step_loss(scale: float = 1.0) -> Callable:
    """The per-step loss ``scale * CE(y_t, label_t)`` (batch mean; ``label_t [B]``) of :meth:`OnlineLearner.step`."""
    scale = float(scale)

    def ce(y_t, label_t):
        return F.cross_entropy(y_t, label_t) * scale

    ce.value_and_grad = lambda y, label: _ce_value_and_grad(y, label, scale)
    return ce


def bptt_loss(model, x, target, loss_fn):
    """``sum_t loss_fn(y_t, target, t)`` through the model's fast sequence path (graph kept)."""
    y, _ = model(x)
    total = None
    for t in range(y.shape[0]):
        l = loss_fn(y[t], target, t)
        if l is not None:
            total = l if total is None else total + l
    if total is None:
        raise ValueError("loss_fn returned None at every step: no loss to differentiate")
    return total

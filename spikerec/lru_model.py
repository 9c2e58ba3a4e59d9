"""Deep LRU network (Orvieto et al. 2023, Fig. 1, §2.2, App. D) and its optimiser recipe.

Architecture, time-first ``x[T, B, C]``::

    h = Linear_enc(x)                                     encoder to H features
    repeat n_layers:  h = h + Mix(LRU(Norm(h)))            pre-norm residual block
    logits = Head(Pool_t(h))                               mean / last pooling, linear head

``Norm`` is BatchNorm over (batch, time) per channel (the paper's default) or
LayerNorm. ``Mix`` (the definitions of Smith, Warrington & Linderman 2023, S5, since the LRU paper is terse):

* ``glu``:      ``z = drop(gelu(v)); z = W1 z * sigmoid(W2 z); z = drop(z)``
* ``half_glu``: ``z = drop(gelu(v)); z = z * sigmoid(W2 z); z = drop(z)`` (PathX)
* ``mlp``:      ``z = drop(W2 drop(gelu(W1 v)))``

Dropout masks are element-wise (PyTorch ``Dropout``). Optimiser (App. D.2, Table 9):
AdamW; the recurrence's parameters ``lambda`` (``nu_log, theta_log``), ``gamma_log`` and ``B``
(selected by role: ``ParamSpec.slow``) get ``lr * lr_factor`` and no weight decay, everything else ``lr`` and ``weight_decay`` (:func:`lru_param_groups`); the learning
rate warms up linearly from 1e-7 over the first 10% of the steps, then follows a cosine
down to 1e-7 (:func:`warmup_cosine`). Both are :mod:`spikerec.optim`'s shared functions.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers.base import check_sequence, match_input_dtype
from .layers.lru import LRU
from .optim import LambdaSchedule, param_groups

__all__ = ["LRUBlock", "LRUModel", "lru_param_groups", "warmup_cosine", "NORMS", "MIXES", "POOLS"]

NORMS = ("batch", "layer")
MIXES = ("glu", "half_glu", "mlp")
POOLS = ("mean", "last", "none")


class _Norm(nn.Module):
    """BatchNorm1d over (time, batch) per channel, or LayerNorm, on ``[T, B, H]``."""

    def __init__(self, kind: str, d: int):
        super().__init__()
        if kind not in NORMS:
            raise ValueError(f"LRU block: norm must be one of {NORMS}, got {kind!r}")
        self.kind = kind
        self.norm = nn.BatchNorm1d(d) if kind == "batch" else nn.LayerNorm(d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.kind == "layer":
            return self.norm(h)
        T, B, H = h.shape
        return self.norm(h.reshape(T * B, H)).reshape(T, B, H)


class _Mix(nn.Module):
    def __init__(self, kind: str, d: int, dropout: float):
        super().__init__()
        if kind not in MIXES:
            raise ValueError(f"LRU block: mix must be one of {MIXES}, got {kind!r}")
        self.kind = kind
        self.drop = nn.Dropout(dropout)
        self.W1 = nn.Linear(d, d) if kind in ("glu", "mlp") else None
        self.W2 = nn.Linear(d, d)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        if self.kind == "mlp":
            return self.drop(self.W2(self.drop(F.gelu(self.W1(v)))))
        z = self.drop(F.gelu(v))
        gate = torch.sigmoid(self.W2(z))
        z = self.W1(z) * gate if self.kind == "glu" else z * gate
        return self.drop(z)


class LRUBlock(nn.Module):
    """``h + Mix(LRU(Norm(h)))`` (pre-norm residual block, Fig. 1)."""

    def __init__(self, d_model: int, d_state: int, *, norm: str = "batch", mix: str = "glu", dropout: float = 0.0,
                 r_min: float = 0.0, r_max: float = 1.0, max_phase: float = 6.28, impl: str = "auto"):
        super().__init__()
        self.norm = _Norm(norm, d_model)
        self.lru = LRU(d_model, d_state, r_min=r_min, r_max=r_max, max_phase=max_phase, impl=impl)
        self.mix = _Mix(mix, d_model, dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y, _ = self.lru(self.norm(h))
        return h + self.mix(y)


class LRUModel(nn.Module):
    """Encoder, ``n_layers`` LRU blocks, pooling over time, linear head.

    Args:
        input_size: input features ``C``.
        output_size: classes (or regression outputs).
        d_model, d_state: ``H`` and ``N`` of every LRU.
        n_layers: number of blocks (6 in every task of the paper).
        norm, mix, dropout: see the module docstring.
        pool: ``mean`` (default), ``last``, or ``none`` (per-step outputs ``[T, B, K]``).
        r_min, r_max, max_phase: LRU ring initialisation (Table 8 gives per-task rings).
    """

    def __init__(self, input_size: int, output_size: int, *, d_model: int = 128, d_state: int = 256,
                 n_layers: int = 6, norm: str = "batch", mix: str = "glu", dropout: float = 0.0, pool: str = "mean",
                 r_min: float = 0.0, r_max: float = 1.0, max_phase: float = 6.28, impl: str = "auto"):
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"LRUModel: pool must be one of {POOLS}, got {pool!r}")
        if int(n_layers) < 1:
            raise ValueError(f"LRUModel: n_layers must be >= 1, got {n_layers}")
        self.input_size, self.output_size, self.pool = int(input_size), int(output_size), pool
        self.encoder = nn.Linear(self.input_size, d_model)
        self.blocks = nn.ModuleList(
            LRUBlock(d_model, d_state, norm=norm, mix=mix, dropout=dropout, r_min=r_min, r_max=r_max,
                     max_phase=max_phase, impl=impl)
            for _ in range(int(n_layers)))
        self.head = nn.Linear(d_model, self.output_size)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden sequence ``[T, B, H]`` after the last block."""
        check_sequence(x, self.input_size, "LRUModel input")
        h = self.encoder(match_input_dtype(x, self.encoder.weight.dtype, "LRUModel input"))
        for blk in self.blocks:
            h = blk(h)
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` (``[T, B, K]`` with ``pool='none'``)."""
        h = self.features(x)
        if self.pool == "mean":
            h = h.mean(0)
        elif self.pool == "last":
            h = h[-1]
        return self.head(h)


def lru_param_groups(model: nn.Module, lr: float, lr_factor: float = 1.0, weight_decay: float = 0.0) -> list[dict]:
    """AdamW parameter groups of the paper (App. D.2): the parameters of every LRU's recurrence
    (``lambda``, ``gamma``, ``B``; those whose spec is in the slow group) get ``lr * lr_factor`` and
    ``weight_decay = 0``; all other parameters (C, D, encoder, mix, norms, head) get ``lr`` and
    ``weight_decay`` (``docs/decisions.md``, neurons 10). This is :func:`spikerec.optim.param_groups`
    with the recipe's arguments."""
    if not lr_factor > 0:
        raise ValueError(f"lru_param_groups: need lr_factor > 0, got {lr_factor}")
    return param_groups(model, lr, weight_decay=weight_decay, slow_lr_factor=lr_factor, slow_weight_decay=0.0)


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_fraction: float = 0.1,
                  start_lr: float = 1e-7, end_lr: float = 1e-7) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-group schedule of the paper (App. D.2): linear from ``start_lr`` to the group's ``lr``
    over the first ``warmup_fraction * total_steps`` steps, then cosine down to ``end_lr`` at
    ``total_steps`` (:class:`spikerec.optim.LambdaSchedule`)."""
    return LambdaSchedule(optimizer, total_steps, warmup_fraction, "cosine", start_lr=start_lr, end_lr=end_lr)

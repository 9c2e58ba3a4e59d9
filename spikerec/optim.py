"""Optimisation pieces shared by the trainer, LSC pre-training and the deep LRU recipe:
one parameter-group function, one optimiser factory and one learning-rate schedule.

* :func:`param_groups`: two groups, ``"recurrent"`` (the slow group: the parameters of the
  recurrence; ``lr * slow_lr_factor``, ``slow_weight_decay``) and ``"other"`` (``lr``,
  ``weight_decay``). Orvieto et al. (2023), App. D.2, give the LRU's ``nu``, ``theta``,
  ``gamma`` and ``B`` a reduced learning rate and no weight decay; for spiking and gated
  cells the slow group is the recurrence of the LSC (recurrent weights and time constants;
  Herranz-Celotti & Rouat, Sec. II-B). Parameters are selected by the role their cell
  declares (``spikerec.neurons.roles``, ``ParamSpec.in_slow_group``); a cell that declares no
  roles falls back to its ``stability_groups()["time"]``.
  The readout layer's parameters are never in the slow group.
* :func:`make_optimizer`: Adam, AdamW, AdaBelief, or AdaBelief inside Lookahead (the LSC
  paper's choice, Sec. II-G; from ``torch-optimizer``). Every group remembers its
  ``base_lr`` for the schedule.
* :func:`lr_factor`: linear warm-up over ``round(warmup * total)`` steps, then a cosine from
  1 to ``min_factor`` (or constant). Without ``start_factor`` the warm-up is
  ``(step + 1) / w`` (no update with a zero learning rate); with it, it rises linearly from
  ``start_factor`` (the LRU recipe warms up from 1e-7, App. D.2).
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

from .neurons.roles import param_specs_of

__all__ = ["param_groups", "slow_parameter_ids", "make_optimizer", "lr_factor", "LambdaSchedule", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "adamw", "adabelief", "adabelief+lookahead")


def slow_parameter_ids(model: nn.Module) -> set[int]:
    """``id`` of every parameter in the slow (recurrent) learning-rate group."""
    readout = getattr(model, "readout", None)
    excluded = {id(p) for p in readout.parameters()} if isinstance(readout, nn.Module) else set()
    specs = param_specs_of(model)
    ids = {pid for pid, (_, _, spec) in specs.items() if spec.in_slow_group}
    for mod in model.modules():  # a cell that declares no roles: its hand-written LSC time group
        if mod is readout or not hasattr(mod, "stability_groups") or any(id(p) in specs for p in mod.parameters()):
            continue
        try:
            ids |= {id(p) for p in mod.stability_groups()["time"]}
        except (NotImplementedError, KeyError, TypeError):
            pass
    return ids - excluded


def param_groups(model: nn.Module, lr: float, *, weight_decay: float = 0.0, slow_lr_factor: float = 1.0,
                 slow_weight_decay: float = 0.0) -> list[dict]:
    """``[{"name": "recurrent", ...}, {"name": "other", ...}]`` (empty groups left out), each in
    the order of ``model.named_parameters()``; frozen parameters are left out."""
    if not (lr > 0 and math.isfinite(lr)) or not slow_lr_factor >= 0 or not weight_decay >= 0 or not slow_weight_decay >= 0:
        raise ValueError(f"param_groups: need lr > 0 (finite), slow_lr_factor >= 0 and weight decays >= 0; got "
                         f"lr={lr}, slow_lr_factor={slow_lr_factor}, weight_decay={weight_decay}, "
                         f"slow_weight_decay={slow_weight_decay}")
    slow = slow_parameter_ids(model)
    rec = [p for _, p in model.named_parameters() if p.requires_grad and id(p) in slow]
    other = [p for _, p in model.named_parameters() if p.requires_grad and id(p) not in slow]
    groups = []
    if rec:
        groups.append({"params": rec, "lr": lr * slow_lr_factor, "weight_decay": slow_weight_decay, "name": "recurrent"})
    if other:
        groups.append({"params": other, "lr": lr, "weight_decay": weight_decay, "name": "other"})
    return groups


def make_optimizer(params: Iterable, name: str, lr: float, *, weight_decay: float = 0.0, betas=None, eps=None,
                   lookahead_k: int = 6, lookahead_alpha: float = 0.5) -> torch.optim.Optimizer:
    """The optimiser ``name`` (one of :data:`OPTIMIZERS`) over ``params`` (tensors or groups).
    ``betas``/``eps`` left as ``None`` take the optimiser's own defaults."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    params = list(params)
    if params and not isinstance(params[0], dict):
        params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    kw = {"lr": lr, "weight_decay": weight_decay}
    if betas is not None:
        kw["betas"] = tuple(betas)
    if eps is not None:
        kw["eps"] = eps
    if name in ("adam", "adamw"):
        opt = (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, **kw)
    else:
        import torch_optimizer  # a dependency, imported only where used (it pulls in several optimisers)

        opt = torch_optimizer.AdaBelief(params, **kw)
        if name == "adabelief+lookahead":
            opt = torch_optimizer.Lookahead(opt, k=lookahead_k, alpha=lookahead_alpha)
    for g in opt.param_groups:
        g.setdefault("base_lr", g["lr"])
    return opt


def lr_factor(step: int, total: int, warmup: float = 0.0, schedule: str = "cosine", min_factor: float = 0.0,
              start_factor: float | None = None) -> float:
    """Multiplier of the base learning rate before update ``step`` (0-based); see the module docstring."""
    w = int(round(warmup * total))
    if step < w:
        if start_factor is None:
            return (step + 1) / w
        return start_factor + (1.0 - start_factor) * step / w
    if schedule == "constant":
        return 1.0
    if schedule != "cosine":
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    prog = min(1.0, (step - w) / max(1, total - w))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * prog))


class LambdaSchedule(torch.optim.lr_scheduler.LambdaLR):
    """:func:`lr_factor` as a ``torch`` scheduler, with the warm-up start and the cosine end
    given as absolute learning rates (the same for every group, as in the LRU recipe)."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup: float = 0.0,
                 schedule: str = "cosine", start_lr: float | None = None, end_lr: float = 0.0):
        if total_steps < 1 or not 0.0 <= warmup < 1.0:
            raise ValueError(f"schedule: need total_steps >= 1 and 0 <= warmup < 1, got {total_steps}, {warmup}")

        def make(base: float):
            s = None if start_lr is None else start_lr / base
            return lambda step: lr_factor(step, total_steps, warmup, schedule, end_lr / base, s)

        super().__init__(optimizer, [make(g["lr"]) for g in optimizer.param_groups])

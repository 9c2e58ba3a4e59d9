"""Local Stability Condition (LSC) pre-training (Herranz-Celotti & Rouat, "Stabilizing RNN gradients through
pre-training", Sec. II-B, II-D).

The LSC asks every transition-derivative radius to have expectation ``rho_t`` (1, or
0.5, or the "unbalanced" split: time ``T/(T+L)``, depth ``L/(T+L)``). Pre-training
minimises, at every time step of the task inputs (eq. 2),

    L = sum_k mean_b (rho(M_{k,b}) - rho_t(k))^2        (``reduce="mean"`` divides by the number of terms)

over the chosen terms k (``time/l``, ``depth/l``, ``input/0``, optionally ``readout/L``),
with one optimiser update per time step. The next step's state is the one the updated
weights reach on the input so far (``state="replay"``: ``x[:t+1]`` run again from the initial
state, no gradients), so the radii are taken in the network's own states; the official code
carries the state across updates (``state="carry"``), which after a shuffle is a state of other
weights (``docs/decisions.md``, neurons 9). After each update (paper order, ``order="grad,kappa,shuffle"``):

* **clipped weight multiplier**: ``kappa = clip(rho_t / rho_bar, 0.85, 1.15)`` with
  ``rho_bar`` the batch-mean radius of that term (the official code's rule); layer ``l``'s
  ``"time"`` group (``stability_groups()``, from the parameter roles) gets ``kappa_time,l`` and
  its ``"depth"`` group gets ``kappa_depth,l`` (layer 0: the ``input/0`` radius). A parameter is
  scaled according to its declared transform (:class:`spikerec.neurons.Transform`): identity
  (weights, thresholds, ``beta``): ``p <- kappa p``; ``LOG_TAU``: ``tau <- kappa tau``
  (``p <- p + log kappa``; the paper scales tau); ``LOG``: ``p <- p + log kappa``; ``NU_LOG``
  (``|lambda| = exp(-exp(nu))``, a time constant ``exp(-nu)``): ``nu <- nu - log kappa``
  (``docs/decisions.md``, neurons 7); a phase (``PHASE_LOG``) is never scaled. Frozen
  parameters are left alone.
  ``multiplier_gain = g < 1`` (not in the paper or the code; default 1) damps it to
  ``kappa = clip((rho_t / rho_bar)^g, lo, hi)``: in log scale each step moves the weights by the
  fraction ``g`` of the correction, so the batch mean's sampling error reaches the weights
  averaged over about ``1 / g`` steps (its variance times ``g / (2 - g)``).
* **shuffling**: with probability ``shuffle_prob`` per step, the entries of every
  trainable tensor with ``ndim >= shuffle_min_ndim`` are permuted (paper: every tensor,
  every step; code: p = 1/3, ndim >= 2, before kappa: ``order="grad,shuffle,kappa"``);
  a GRU's gate-stacked tensors within each gate's block.

The optimiser's per-entry state follows: a shuffle permutes every state tensor of the
parameter's shape (Lookahead's slow weights, the moment estimates) with the same
permutation, and kappa scales the slow weights like the parameter, so that the Lookahead
synchronisation does not average a shuffled or rescaled tensor with its past.

Optimiser (Sec. II-G): AdaBelief (lr 3.14e-3, weight decay 1e-4) inside Lookahead
(k = 6, alpha = 0.5) from ``torch-optimizer``; ``optimizer="adam"`` is plain Adam with
the same lr / weight decay (no belief-based second moment, no slow weights).

Stopping (Sec. II-D; ``docs/decisions.md``, neurons 9): the LSC is a condition on *expectations*, and
one step's batch mean ``rho_bar_k`` varies a lot along a sequence (and the weights move
every step), so every ``verify_every`` steps (default ``min(T, 25)``) the radii are
averaged over the whole current batch and up to ``verify_points`` (25) evenly spaced time
steps, at fixed current weights (:func:`mean_radii`). The run has converged when every
such mean is within ``eps`` (0.02) of its target, the std over k of the deviations is below ``std_thr``
(0.2; with equal targets this is the std of the radii) and the EMA (factor
``1 - 1/ema_steps``) of the per-step std is below ``std_thr``, ``patience`` checks in a
row. (The code asks the per-step condition, with eps 0.08, for 20 consecutive steps.)
The run lasts until it converges, as the paper's does ("until convergence", Sec. II-G), bounded
by a wall-clock limit ``max_time_s`` (one hour; the official code: 16 h) and, where set,
``max_steps`` and ``max_epochs`` (passes over the data), the limits a test or a preset with a
fixed budget uses.
Keep-best: the checked weights with the smallest worst deviation
``max_k |mean rho_k - rho_t(k)|`` are restored unless the run converged. A non-finite
loss, radius or weight stops the run (``report.diverged``) and restores the best or
last finite weights; an update whose gradient is not finite (an ill-conditioned
eigen-gradient) is skipped and counted.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Iterable, Literal

import torch

from .. import optim, schema
from ..atomic import atomic_write_text
from ..errors import ConfigError
from ..neurons.roles import Transform, param_specs_of
from ..schema import Range
from .jacobians import (
    all_finite,
    model_layers,
    parse_key,
    transition_jacobians,
    transition_operators,
)
from .radius import SQUARE_MODES, spectral_radius

__all__ = ["LSCConfig", "LSCReport", "lsc_pretrain", "lsc_targets", "apply_clipped_multiplier",
           "shuffle_parameters", "measure_radii", "mean_radii", "make_optimizer"]

ORDERS = ("grad,kappa,shuffle", "grad,shuffle,kappa")


_TERM = Literal["time", "depth", "input", "readout"]
_POS = Annotated[float, Range(gt=0)]
_COUNT = Annotated[int, Range(ge=1)]


@dataclass
class LSCConfig:
    """Options of :func:`lsc_pretrain` (defaults: the paper; the code's choices in comments).

    The field types are the schema (:mod:`spikerec.schema`): a dict of options or a preset's
    ``[lsc]`` table is checked against them, with one clear error per bad key.
    """

    target: _POS = 1.0                       # rho_t: 1 or 0.5
    balance: Literal["equal", "unbalanced"] = "equal"  # unbalanced: time T/(T+L), depth L/(T+L)
    terms: Annotated[tuple[_TERM, ...], Range(nonempty=True)] = ("time", "depth", "input")  # + "readout": the code's decoder term
    readout_target: _POS = 1.0
    reduce: Literal["sum", "mean"] = "sum"   # eq. 2 sums; the code averages ("mean")
    method: Literal["auto", "exact", "arnoldi", "iterative", "gelfand"] = "auto"  # auto: exact up to exact_max, else arnoldi
    exact_max: Annotated[int, Range(ge=0)] = 128
    dense_max: Annotated[int, Range(ge=0)] = 1024  # blocks up to this side are formed densely (faster than jvp products)
    n_iter: _COUNT = 32                      # Krylov dimension / products of the iterative estimator
    square_mode: Literal[SQUARE_MODES] = "subsample"  # non-square blocks: "subsample" (code), "topleft", "svd"
    optimizer: Literal["adabelief+lookahead", "adabelief", "adam"] = "adabelief+lookahead"
    lr: _POS = 3.14e-3                       # code: 7.2e-3
    weight_decay: Annotated[float, Range(ge=0)] = 1e-4
    lookahead_k: _COUNT = 6
    lookahead_alpha: Annotated[float, Range(gt=0, le=1)] = 0.5
    multiplier: bool = True
    clip: tuple[float, float] = (0.85, 1.15)
    multiplier_gain: Annotated[float, Range(gt=0, le=1)] = 1.0  # kappa = clip((rho_t / rho_bar)^gain); paper/code: 1
    shuffle: bool = True
    shuffle_prob: Annotated[float, Range(ge=0, le=1)] = 1.0  # code: 1/3
    shuffle_min_ndim: Annotated[int, Range(ge=0)] = 1        # code: 2
    order: Literal[ORDERS] = "grad,kappa,shuffle"            # code: "grad,shuffle,kappa"
    eps: _POS = 0.02                         # code: 0.08
    std_thr: _POS = 0.2
    ema_steps: _COUNT = 10
    patience: _COUNT = 1                     # code: 20
    state: Literal["replay", "carry"] = "replay"  # replay x[:t] at the current weights; code: "carry" across updates
    verify_every: _COUNT | None = None       # steps between checks of the mean radii at fixed weights (None: min(T, 25))
    verify_points: _COUNT | None = 25        # time steps measured per check (evenly spaced; None: all)
    max_steps: _COUNT | None = None          # a step limit (None: none; the paper runs until convergence)
    max_epochs: _COUNT | None = None         # passes over the LSC data (None: as many as it takes)
    max_time_s: _POS | None = 3600.0         # wall-clock limit (code: 16 h); None: none (then set max_steps)
    keep_best: bool = True
    seed: int = 0
    num_threads: _COUNT | None = None        # torch threads during pre-training (None: leave as is)

    @classmethod
    def from_dict(cls, d: dict | None, section: str = "lsc") -> "LSCConfig":
        """Checked against the field types; unknown options are refused with the valid names."""
        d = dict(d or {})
        names = set(schema.field_names(cls))
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"{section}: unknown options {unknown}; expected some of {sorted(names)}")
        return schema.from_dict(cls, d, section)

    def validate(self, section: str = "lsc") -> "LSCConfig":
        """Check the fields of an instance built in Python (types, ranges, choices)."""
        return schema.validate(self, section)

    def check(self, section: str = "lsc") -> None:
        """The rule the types cannot say: ``clip = (lo, hi)`` with ``0 < lo <= 1 <= hi``."""
        lo, hi = self.clip
        if not (0 < lo <= 1 <= hi):
            raise ConfigError(f"'{section}.clip' must be (lo, hi) with 0 < lo <= 1 <= hi, got {list(self.clip)!r}")
        if self.max_steps is None and self.max_epochs is None and self.max_time_s is None:
            raise ConfigError(f"'{section}': max_time_s, max_steps and max_epochs are all unset; a run that never "
                              "converges would not stop: set at least one")


def lsc_targets(model, cfg: LSCConfig, seq_len: int) -> dict[str, float]:
    """Target radius of every term key (``"time/0"``, ...). Unbalanced: time ``T/(T+L)``, depth/input ``L/(T+L)``."""
    cells, readout = model_layers(model)
    L = len(cells)
    if cfg.balance == "unbalanced":
        t_time, t_depth = seq_len / (seq_len + L), L / (seq_len + L)
    else:
        t_time = t_depth = float(cfg.target)
    out = {}
    for l in range(L):
        if "time" in cfg.terms:
            out[f"time/{l}"] = t_time
        if l == 0 and "input" in cfg.terms:
            out["input/0"] = t_depth
        if l >= 1 and "depth" in cfg.terms:
            out[f"depth/{l}"] = t_depth
    if "readout" in cfg.terms and readout is not None:
        out[f"readout/{L}"] = float(cfg.readout_target)
    return out


def _method_for(cfg: LSCConfig, n: int) -> str:
    if cfg.method == "auto":
        return "exact" if n <= cfg.exact_max else "arnoldi"
    return cfg.method


def measure_radii(model, x_t, states, cfg: LSCConfig, keys: Iterable[str], generator=None):
    """Per-sample radii ``{key: [B]}`` (differentiable) and the detached new states, for one step.

    Blocks whose square side is at most ``cfg.dense_max`` are formed with ``vmap(jacrev)``
    (one batched call) and reduced with ``eigvals`` (up to ``cfg.exact_max``, ``method="auto"``)
    or Arnoldi on the dense block; wider ones stay matrix-free (Arnoldi through ``jvp``).
    """
    keys = list(keys)
    kinds = tuple(sorted({parse_key(k)[0] for k in keys}))
    ops, new_states = transition_operators(model, x_t, states, kinds, return_states=True)
    side = {k: min(ops[k].shape[1:]) for k in keys}
    dense_keys = [k for k in keys if cfg.square_mode == "svd" or side[k] <= cfg.dense_max
                  or _method_for(cfg, side[k]) == "exact"]
    dense = {}
    if dense_keys:
        dkinds = tuple(sorted({parse_key(k)[0] for k in dense_keys}))
        dense = transition_jacobians(model, x_t, states, dkinds)
    radii = {}
    for k in keys:
        M = dense[k] if k in dense_keys else ops[k]
        radii[k] = spectral_radius(M, _method_for(cfg, side[k]), square_mode=cfg.square_mode, n_iter=cfg.n_iter,
                                   generator=generator, name=k)
    return radii, new_states


def _advance(layers, x_t, states) -> tuple:
    """One plain step of every layer (no Jacobians)."""
    h, new = x_t, []
    for c, st in zip(layers, states):
        h, st = c.step(h, st)
        new.append(st)
    return tuple(new)


def _replay(layers, x, batch: int, device, dtype) -> tuple:
    """The states every layer reaches after running ``x [t, B, C]`` from its initial state
    (each layer's sequence path; no gradients)."""
    states = []
    h = x
    with torch.no_grad():
        for c in layers:
            h, s = c(h, c.initial_state(batch, device, dtype))
            states.append(s)
    return tuple(states)


def mean_radii(model, data, config: LSCConfig | dict | None = None, *, max_batches: int | None = None,
               max_points: int | None = None) -> dict:
    """Radius statistics of every LSC term over the data: ``{key: {"mean", "std", "target"}}``.

    The LSC is a condition on expectations (Sec. II-B): the mean is over samples and time
    steps, walking each sequence from its initial state at the current (fixed) weights, the
    network's own states (what ``state="replay"`` pre-trains on). No gradients.
    ``max_points`` measures at most that many evenly spaced time steps per sequence (the
    state still walks every step).
    """
    cfg = config if isinstance(config, LSCConfig) else LSCConfig.from_dict(config)
    cfg.validate()
    cells, readout = model_layers(model)
    p0 = next(model.parameters())
    gen = torch.Generator().manual_seed(int(cfg.seed) + 1)
    layers = cells + ([readout] if readout is not None else [])
    acc: dict[str, list] = {}
    targets = None
    for i, x in enumerate(_batches(data, 0)):
        if max_batches is not None and i >= max_batches:
            break
        x = _check_batch(x, cells[0].input_size, p0.device, p0.dtype)
        if targets is None:
            targets = lsc_targets(model, cfg, x.shape[0])
        states = tuple(c.initial_state(x.shape[1], p0.device, p0.dtype) for c in layers)
        T = x.shape[0]
        stride = 1 if not max_points else max(1, math.ceil(T / max_points))
        for t in range(T):
            with torch.no_grad():  # torch.func's jacrev/jvp still differentiate inside
                if t % stride:
                    states = _advance(layers, x[t], states)
                    continue
                radii, states = measure_radii(model, x[t], states, cfg, targets, generator=gen)
            for k, r in radii.items():
                acc.setdefault(k, []).append(r.detach())
    if targets is None:
        raise ValueError("lsc data: no batches")
    out = {}
    for k, rs in acc.items():
        r = torch.cat(rs)
        out[k] = {"mean": float(r.mean()), "std": float(r.std(unbiased=False)), "target": targets[k]}
    return out


# ----------------------------------------------------------------------------------------
# multiplier and shuffling
# ----------------------------------------------------------------------------------------
def _param_transforms(module) -> dict[int, Transform]:
    return {i: spec.transform for i, (_, _, spec) in param_specs_of(module).items()}


def _opt_states(optimizer) -> list[dict]:
    if optimizer is None:
        return []
    out = [getattr(optimizer, "state", {})]
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and getattr(inner, "state", None) is not out[0]:
        out.append(inner.state)
    return out


def _scale_param(p: torch.Tensor, transform: Transform, kappa: float, optimizer=None) -> None:
    """Scale one parameter by ``kappa`` according to its parametrisation (module docstring)."""
    if transform is Transform.PHASE_LOG:
        return

    def tf(t):
        if transform in (Transform.LOG_TAU, Transform.LOG):
            t.add_(math.log(kappa))
        elif transform is Transform.NU_LOG:
            t.sub_(math.log(kappa))
        else:
            t.mul_(kappa)

    with torch.no_grad():
        tf(p)
        for st in _opt_states(optimizer):
            s = st.get(p, {})
            if "slow_param" in s:
                tf(s["slow_param"])


def apply_clipped_multiplier(model, mean_radii: dict[str, float], targets: dict[str, float],
                             clip=(0.85, 1.15), optimizer=None, gain: float = 1.0) -> dict[str, float]:
    """Apply ``kappa = clip((target / rho_bar)^gain, lo, hi)`` to every layer's time and depth groups
    (``gain = 1``: the paper's multiplier; below 1 a damped one).

    Returns ``{"time/l": kappa, "depth/l": kappa}`` (layer 0's depth kappa comes from ``input/0``).
    """
    cells, _ = model_layers(model)
    lo, hi = clip
    kappas = {}
    for l, cell in enumerate(cells):
        groups = cell.stability_groups()
        transforms = _param_transforms(cell)
        for group, key in (("time", f"time/{l}"), ("depth", "input/0" if l == 0 else f"depth/{l}")):
            if key not in mean_radii or key not in targets:
                continue
            rho = max(float(mean_radii[key]), 1e-12)
            kappa = min(max((targets[key] / rho) ** gain, lo), hi)
            kappas[f"{group}/{l}"] = kappa
            for p in groups.get(group, []):
                if p is None or not p.requires_grad:
                    continue
                _scale_param(p, transforms.get(id(p), Transform.IDENTITY), kappa, optimizer)
    return kappas


def _gate_blocks(model) -> dict[int, int]:
    """``{id(param): number of gate blocks}`` for gate-stacked tensors: the weights and biases
    of ``torch.nn.GRU`` (3 blocks ``r, z, n`` along dim 0) and ``torch.nn.LSTM`` (4 blocks)."""
    out = {}
    for m in model.modules():
        n = 3 if isinstance(m, torch.nn.GRU) else 4 if isinstance(m, torch.nn.LSTM) else 0
        if n:
            for p in m.parameters(recurse=False):
                if p.shape[0] % n == 0:
                    out[id(p)] = n
    return out


def _block_permutation(numel: int, blocks: int, generator) -> torch.Tensor:
    """A permutation of ``range(numel)`` that maps each of ``blocks`` equal contiguous blocks onto itself."""
    size = numel // blocks
    return torch.cat([b * size + torch.randperm(size, generator=generator) for b in range(blocks)])


def shuffle_parameters(model, prob: float = 1.0, min_ndim: int = 1, generator: torch.Generator | None = None,
                       optimizer=None) -> bool:
    """With probability ``prob``, permute the entries of every trainable tensor with ``ndim >= min_ndim``
    (and the matching per-entry optimiser state). Returns whether it shuffled.

    Gate-stacked tensors (a GRU's ``weight_ih``, ``weight_hh``, biases: ``[r; z; n]`` along
    dim 0) are permuted within each gate's block, never across gates: the gates play different
    roles (the update gate ``z`` sets how much of ``h_{t-1}`` passes on, so it dominates the time
    radius), and mixing their entries undoes what the gradient learnt per gate. With whole-tensor
    shuffling a 2-layer GRU stays 0.08-0.15 above target 0.5 in the time radius (docs/lsc.md)."""
    if prob <= 0 or torch.rand((), generator=generator).item() >= prob:
        return False
    states = _opt_states(optimizer)
    blocks = _gate_blocks(model)
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad or p.dim() < min_ndim or p.numel() < 2:
                continue
            perm = _block_permutation(p.numel(), blocks.get(id(p), 1), generator).to(p.device)
            p.copy_(p.reshape(-1)[perm].reshape(p.shape))
            for st in states:
                for v in st.get(p, {}).values():
                    if isinstance(v, torch.Tensor) and v.shape == p.shape:
                        v.copy_(v.reshape(-1)[perm].reshape(v.shape))
    return True


# ----------------------------------------------------------------------------------------
# optimiser
# ----------------------------------------------------------------------------------------
def make_optimizer(params, cfg: LSCConfig):
    """AdaBelief (+ Lookahead) or Adam (see the module docstring), from :func:`spikerec.optim.make_optimizer`."""
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("lsc: the model has no trainable parameters")
    return optim.make_optimizer(params, cfg.optimizer, cfg.lr, weight_decay=cfg.weight_decay,
                                lookahead_k=cfg.lookahead_k, lookahead_alpha=cfg.lookahead_alpha)


# ----------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------
@dataclass
class LSCReport:
    """History and outcome of :func:`lsc_pretrain`.

    ``history`` holds per pre-training step: ``loss``, ``radius[key]`` (batch mean),
    ``radius_std[key]`` (std over the batch), ``kappa[group/l]``, ``std``, ``std_ema`` and
    ``deviation`` (worst ``|rho_bar - target|``).
    """

    config: dict
    targets: dict
    history: dict = field(default_factory=dict)
    converged: bool = False
    diverged: bool = False
    stop_reason: str = ""
    steps: int = 0
    best_step: int = -1
    best_deviation: float = float("inf")
    best_radii: dict = field(default_factory=dict)
    wall_time_s: float = 0.0
    restored: str = "last"
    skipped_updates: int = 0
    notes: list = field(default_factory=list)  # what the warning of an unconverged run adds (lsc_warning)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["best_deviation"] = None if not math.isfinite(self.best_deviation) else self.best_deviation
        return _json_safe(d)

    def save(self, path) -> str:
        """Write the report as JSON (atomically: temp file + rename)."""
        path = os.fspath(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path) -> "LSCReport":
        with open(path) as f:
            d = json.load(f)
        if d.get("best_deviation") is None:
            d["best_deviation"] = float("inf")
        return cls(**d)

    def plot(self, path) -> str:
        """PNG of the radius histories (one line per term, dashed targets) and the loss."""
        from .plots import plot_lsc_history

        return plot_lsc_history(self, path)


def _json_safe(o):
    if isinstance(o, dict):
        return {str(k): _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


# ----------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------
def _batches(data, epoch: int):
    """Yield ``x [T, B, C]`` from a tensor, a list of tensors or a loader of ``(x, y)``."""
    if isinstance(data, torch.Tensor):
        yield data
        return
    for item in data:
        x = item[0] if isinstance(item, (tuple, list)) else item
        yield x


def _check_batch(x, model_in: int, device, dtype) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"lsc data: expected batches x of shape [T, B, C] (time-first), got {getattr(x, 'shape', type(x))}")
    if x.shape[-1] != model_in:
        raise ValueError(f"lsc data: expected {model_in} input channels in the last dimension, got {x.shape[-1]}")
    x = x.to(device=device, dtype=dtype)
    if not torch.isfinite(x).all():
        raise ValueError("lsc data: the input batch contains NaN or inf values")
    return x


# ----------------------------------------------------------------------------------------
# the loop
# ----------------------------------------------------------------------------------------
def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _finite_params(model) -> bool:
    return all(all_finite(p) for p in model.parameters())


def _verify(model, x, cfg, targets, keys, seed):
    """Radius means over the whole batch ``x`` at the current weights (no update)."""
    stats = mean_radii(model, x, replace(cfg, seed=seed), max_points=cfg.verify_points)
    means = {k: stats[k]["mean"] for k in keys}
    devs = [means[k] - targets[k] for k in keys]
    return means, max(abs(d) for d in devs), (float(torch.tensor(devs).std(unbiased=False)) if len(devs) > 1 else 0.0)


def _notes(cells, targets) -> list[str]:
    """What an unconverged run's warning should add: spiking layers below target 1 (Sec. II-E)."""
    if any(getattr(c, "spiking", False) for c in cells) and min(targets.values()) < 1:
        return ["Spiking networks were pre-trained only to target 1 in the paper: 0.5 was difficult to converge to "
                "(Herranz-Celotti & Rouat, Sec. II-E); target 1 is what they reach (--set lsc.target=1)."]
    return []


def _spread_notes(report: LSCReport, cfg: LSCConfig, batch: int) -> list[str]:
    """What an unconverged run's warning should add when the multiplier is fed by a noisy batch mean:
    the worst term's per-sample radii spread so widely that one step's batch mean misses the expectation
    by its standard error ``std / sqrt(B)``, and the multiplier with gain ``g`` leaves the weights off by
    about that error times ``sqrt(g / (2 - g))`` (an exponential average over ``1 / g`` steps), more than ``eps``."""
    if not cfg.multiplier or not report.best_radii or batch < 1:
        return []
    key = max(report.best_radii, key=lambda k: abs(report.best_radii[k] - report.targets[k]))
    stds = report.history["radius_std"][key]
    std = sum(stds[len(stds) // 2:]) / max(1, len(stds) - len(stds) // 2)
    g = cfg.multiplier_gain
    damping = math.sqrt(g / (2 - g))
    if std * damping / math.sqrt(batch) <= cfg.eps:
        return []
    need = math.ceil((std * damping / cfg.eps) ** 2)
    return [f"The radius of {key} varies between samples with std {std:.2f}, so one step's batch mean "
            f"(batch {batch}) misses its expectation by about {std / math.sqrt(batch):.2f}, and the clipped "
            f"multiplier (gain {g:g}) applies about {std * damping / math.sqrt(batch):.2f} of it to the weights, "
            f"more than eps {cfg.eps:g}; a batch of about {need} or wider layers (a narrower spread) would be "
            f"needed, or a smaller lsc.multiplier_gain without shuffling (docs/lsc.md)."]


def lsc_pretrain(model, data, config: LSCConfig | dict | None = None, *, progress=None) -> LSCReport:
    """LSC pre-training of ``model`` (a :class:`~spikerec.models.RecurrentStack` or one cell) in place.

    Args:
        model: the model; every layer must follow the cell protocol.
        data: ``x [T, B, C]``, a list of such tensors, or a loader yielding ``(x, y)``
            (labels are ignored: the loss does not use them).
        config: :class:`LSCConfig` or a dict of its fields (the ``[lsc]`` preset section).
        progress: optional callable ``progress(step, record_dict)`` called after every step.

    Returns an :class:`LSCReport`; the model ends at the converged, best (``keep_best``)
    or last finite weights.
    """
    cfg = config if isinstance(config, LSCConfig) else LSCConfig.from_dict(config)
    cfg.validate()
    cells, readout = model_layers(model)
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            raise ValueError(f"lsc: parameter {name!r} contains NaN or inf before pre-training")
    p0 = next(model.parameters())
    device, dtype = p0.device, p0.dtype
    gen = torch.Generator().manual_seed(int(cfg.seed))
    optimizer = make_optimizer(model.parameters(), cfg)
    in_size = cells[0].input_size
    layers = cells + ([readout] if readout is not None else [])
    was_training = model.training
    old_threads = torch.get_num_threads()
    if cfg.num_threads:
        torch.set_num_threads(int(cfg.num_threads))
    model.eval()  # no dropout while the Jacobians are taken (docs/decisions.md, neurons 8)

    report = None
    keys: list[str] = []
    targets: dict[str, float] = {}
    hist: dict[str, Any] = {}
    best_state, last_good = None, _snapshot(model)
    std_ema = None
    streak = 0
    step = 0
    B = 0
    t0 = time.perf_counter()
    stop = ""
    try:
        for epoch in (range(cfg.max_epochs) if cfg.max_epochs is not None else itertools.count()):
            steps_before = step
            for x in _batches(data, epoch):
                x = _check_batch(x, in_size, device, dtype)
                T, B = x.shape[0], x.shape[1]
                if report is None:
                    targets = lsc_targets(model, cfg, T)
                    keys = list(targets)
                    hist = {"step": [], "epoch": [], "t": [], "loss": [], "std": [], "std_ema": [], "deviation": [],
                            "radius": {k: [] for k in keys}, "radius_std": {k: [] for k in keys}, "kappa": {},
                            "verify": []}
                    report = LSCReport(config=asdict(cfg), targets=dict(targets), history=hist,
                                       notes=_notes(cells, targets))
                verify_every = cfg.verify_every or min(T, 25)
                states = tuple(c.initial_state(B, device, dtype) for c in layers)
                for t in range(T):
                    if step > 0 and step % verify_every == 0:
                        # check the condition in expectation at the current weights
                        v_means, v_dev, v_std = _verify(model, x, cfg, targets, keys, cfg.seed + 1 + step)
                        hist["verify"].append({"step": step, "deviation": v_dev, "std": v_std, "radius": v_means})
                        if v_dev < report.best_deviation:
                            report.best_deviation, report.best_step, report.best_radii = v_dev, step, dict(v_means)
                            best_state = _snapshot(model)
                        ok = v_dev <= cfg.eps and v_std < cfg.std_thr and std_ema is not None and std_ema < cfg.std_thr
                        streak = streak + 1 if ok else 0
                        if streak >= cfg.patience:
                            report.converged = True
                            stop = (f"converged: every mean |rho - target| <= {cfg.eps}, std and EMA(std) < {cfg.std_thr}")
                            break
                    try:
                        radii, new_states = measure_radii(model, x[t], states, cfg, keys, generator=gen)
                    except FloatingPointError as e:
                        stop = f"diverged: {e}"
                        break
                    terms = [((radii[k] - targets[k]) ** 2).mean() for k in keys]
                    loss = torch.stack(terms).sum()
                    if cfg.reduce == "mean":
                        loss = loss / len(terms)
                    means = {k: float(radii[k].detach().mean()) for k in keys}
                    if not math.isfinite(float(loss.detach())) or not all(math.isfinite(v) for v in means.values()):
                        stop = "diverged: non-finite loss or radius"
                        break
                    devs = [means[k] - targets[k] for k in keys]
                    worst = max(abs(d) for d in devs)
                    std = float(torch.tensor(devs).std(unbiased=False)) if len(devs) > 1 else 0.0
                    a = 1.0 - 1.0 / cfg.ema_steps
                    std_ema = std if std_ema is None else a * std_ema + (1 - a) * std
                    hist["step"].append(step); hist["epoch"].append(epoch); hist["t"].append(t)
                    hist["loss"].append(float(loss.detach())); hist["std"].append(std); hist["std_ema"].append(std_ema)
                    hist["deviation"].append(worst)
                    for k in keys:
                        hist["radius"][k].append(means[k])
                        hist["radius_std"][k].append(float(radii[k].detach().std(unbiased=False)) if B > 1 else 0.0)

                    optimizer.zero_grad(set_to_none=True)
                    try:
                        loss.backward()
                        grads_ok = all(p.grad is None or all_finite(p.grad) for p in model.parameters())
                    except torch.linalg.LinAlgError:
                        grads_ok = False
                    if grads_ok:
                        optimizer.step()
                    else:  # an ill-conditioned eigen-gradient (e.g. a repeated dominant eigenvalue)
                        report.skipped_updates += 1
                    kappas = {}
                    for op in cfg.order.split(",")[1:]:
                        if op == "kappa" and cfg.multiplier:
                            kappas = apply_clipped_multiplier(model, means, targets, cfg.clip, optimizer, cfg.multiplier_gain)
                        elif op == "shuffle" and cfg.shuffle:
                            shuffle_parameters(model, cfg.shuffle_prob, cfg.shuffle_min_ndim, gen, optimizer)
                    for g, v in kappas.items():
                        hist["kappa"].setdefault(g, [None] * (len(hist["step"]) - 1)).append(v)
                    step += 1
                    if not _finite_params(model):
                        stop = "diverged: a parameter became NaN or inf"
                        break
                    last_good = _snapshot(model)
                    if cfg.state == "replay" and t + 1 < T:
                        # the state at t+1 that the network with the current (updated, shuffled) weights reaches
                        states = _replay(layers, x[: t + 1], B, device, dtype)
                    else:
                        states = new_states
                    if progress is not None:
                        progress(step, {"loss": float(loss.detach()), "deviation": worst, "radius": means})
                    if cfg.max_steps is not None and step >= cfg.max_steps:
                        stop = f"max_steps ({cfg.max_steps}) reached"
                        break
                    if cfg.max_time_s is not None and time.perf_counter() - t0 > cfg.max_time_s:
                        stop = f"max_time_s ({cfg.max_time_s}) reached"
                        break
                if stop:
                    if not stop.startswith(("converged", "diverged")) and cfg.keep_best:
                        # a last check of the final weights, so that they can be kept if best
                        v_means, v_dev, v_std = _verify(model, x, cfg, targets, keys, cfg.seed + 1 + step)
                        hist["verify"].append({"step": step, "deviation": v_dev, "std": v_std, "radius": v_means})
                        if v_dev < report.best_deviation:
                            report.best_deviation, report.best_step, report.best_radii = v_dev, step, dict(v_means)
                            best_state = _snapshot(model)
                        if v_dev <= cfg.eps and v_std < cfg.std_thr and std_ema is not None and std_ema < cfg.std_thr:
                            report.converged = True
                            stop = f"converged at the final check ({stop})"
                    break
            if stop:
                break
            if report is None:
                break  # no batches: the error below
            if step == steps_before:  # an iterable that can be read only once: no further passes
                stop = f"the data gave no batches in pass {epoch + 1} (it can be read only once)"
                break
        if report is None:
            raise ValueError("lsc data: no batches")
        if not stop:
            stop = f"max_epochs ({cfg.max_epochs}) reached"
    finally:
        model.train(was_training)
        for p in model.parameters():  # the last LSC step's gradients must not leak into training's first step
            p.grad = None
        if cfg.num_threads:
            torch.set_num_threads(old_threads)

    report.diverged = stop.startswith("diverged")
    report.stop_reason = stop
    report.steps = step
    if not report.converged and not report.diverged:
        report.notes += _spread_notes(report, cfg, B)
    if report.converged:
        report.restored = "converged"
    elif cfg.keep_best and best_state is not None:
        model.load_state_dict(best_state)
        report.restored = "best"
    elif report.diverged:
        model.load_state_dict(last_good)
        report.restored = "last finite"
    report.wall_time_s = time.perf_counter() - t0
    for g, v in hist["kappa"].items():
        v.extend([None] * (len(hist["step"]) - len(v)))
    return report

"""Per-sample transition Jacobians of cells and stacks (Herranz-Celotti & Rouat,
"Stabilizing RNN gradients through pre-training", Sec. II-A, eq. 1).

For a stack of cells with states ``s^l_t`` (the cell's ``state_vector``: LIF ``v``; ALIF
``v ‖ a``; GRU ``h``; LRU ``Re x ‖ Im x``) the transition derivatives are

* ``time/l``:    ``M = d s^l_t / d s^l_{t-1}`` through ``cells[l].step(h^{l-1}_t, s^l_{t-1})``;
* ``depth/l``:   ``M = d s^l_t / d s^{l-1}_t`` (l >= 1) through
  ``cells[l].step(cells[l-1].output(h^{l-2}_t, s^{l-1}_t), s^l_{t-1})``. The layer below
  feeds the layer above at the *same* time step, as stacked RNNs and the official code
  do (``docs/decisions.md``, neurons 11; ``depth_delay = 0``);
* ``input/0``:   ``M = d s^1_t / d x_t`` (the input-to-first-layer "depth" derivative);
* ``readout/L``: ``M = d y_t / d s^L_t``, with ``y_t`` the readout's step output (L =
  index of the readout in ``model.layers``).

Every block is per sample, ``[B, S_out, S_in]``, taken with ``torch.func``
(``vmap(jacrev(...))``) and differentiable with respect to the model's parameters, so a
loss on its spectral radius trains the model. :func:`transition_operators` gives the
same derivatives matrix-free (``matvec`` by ``jvp``, ``rmatvec`` by ``vjp``) for wide layers.

Keys of the returned dicts are ``"kind/layer"`` strings (``"time/0"``, ``"depth/1"``,
``"input/0"``, ``"readout/2"``); :func:`parse_key` splits them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.func import jacrev, jvp, vjp, vmap

from ..layers.base import PROTOCOL_METHODS, protocol_missing

__all__ = [
    "KINDS",
    "all_finite",
    "PROTOCOL",
    "check_cell",
    "model_layers",
    "parse_key",
    "cell_time_jacobian",
    "transition_jacobians",
    "transition_operators",
    "LinearOp",
]

KINDS = ("time", "depth", "input", "readout")
PROTOCOL = PROTOCOL_METHODS


def check_cell(cell, name: str = "cell") -> None:
    """Raise ``TypeError`` unless ``cell`` implements the cell protocol of ``spikerec.layers.base``."""
    missing = protocol_missing(cell)
    if missing:
        raise TypeError(
            f"{name} ({type(cell).__name__}) does not follow the cell protocol: missing {', '.join(missing)} "
            "(see spikerec.layers.base.Cell)"
        )


def model_layers(model) -> tuple[list, object | None]:
    """``(cells, readout)`` of a :class:`~spikerec.models.RecurrentStack`, or ``([cell], None)`` for one cell."""
    if hasattr(model, "cells") and hasattr(model, "readout"):
        cells, readout = list(model.cells), model.readout
        for i, c in enumerate(cells):
            check_cell(c, f"model layer {i}")
        check_cell(readout, "model readout")
        return cells, readout
    check_cell(model, "model")
    return [model], None


def parse_key(key: str) -> tuple[str, int]:
    """``"depth/1" -> ("depth", 1)``."""
    kind, _, layer = key.partition("/")
    if kind not in KINDS or not layer.isdigit():
        raise ValueError(f"Jacobian key: expected 'kind/layer' with kind in {KINDS}, got {key!r}")
    return kind, int(layer)


def _check_which(which) -> tuple[str, ...]:
    which = (which,) if isinstance(which, str) else tuple(which)
    bad = [w for w in which if w not in KINDS]
    if bad:
        raise ValueError(f"which: unknown Jacobian kinds {bad}; expected a subset of {KINDS}")
    return which


# ----------------------------------------------------------------------------------------
# the functions that are differentiated (batched: [B, ...] in, [B, ...] out; each sample
# only depends on its own row, so vmap of the 1-sample version gives the per-sample blocks)
# ----------------------------------------------------------------------------------------
def _time_fn(cell):
    def f(s_prev, x):
        _, new = cell.step(x, cell.state_from_vector(s_prev))
        return cell.state_vector(new)

    return f


def _input_fn(cell):
    def f(x, s_prev):
        _, new = cell.step(x, cell.state_from_vector(s_prev))
        return cell.state_vector(new)

    return f


def _depth_fn(cell, below):
    def f(s_below, x_below, s_prev):
        h = below.output(x_below, below.state_from_vector(s_below))
        _, new = cell.step(h, cell.state_from_vector(s_prev))
        return cell.state_vector(new)

    return f


def _readout_fn(readout, last):
    def f(s_last, x_last, r_prev):
        h = last.output(x_last, last.state_from_vector(s_last))
        y, _ = readout.step(h, readout.state_from_vector(r_prev))
        return y

    return f


def _one_sample(f):
    """Wrap a batched function so it takes and returns single-sample rows (for vmap)."""

    def g(*args):
        return f(*(a.unsqueeze(0) for a in args)).squeeze(0)

    return g


@dataclass
class _Point:
    """Where the derivatives are taken: one entry per (kind, layer)."""

    fn: Callable
    args: tuple  # batched primal arguments; the derivative is w.r.t. args[0]


def _forward_points(model, x_t, states, which):
    cells, readout = model_layers(model)
    layers = cells + ([readout] if readout is not None else [])
    if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2:
        raise ValueError(f"x_t: expected a [B, C] tensor (one time step), got {getattr(x_t, 'shape', type(x_t))}")
    if states is None:
        states = tuple(c.initial_state(x_t.shape[0], x_t.device, x_t.dtype) for c in layers)
    states = tuple(states)
    if len(states) != len(layers):
        raise ValueError(f"states: expected {len(layers)} layer states (cells + readout), got {len(states)}")
    inputs, new_states = [], []
    h = x_t
    with torch.no_grad():
        for c, s in zip(layers, states):
            inputs.append(h)
            h, s_new = c.step(h, s)
            new_states.append(c.detach_state(s_new) if hasattr(c, "detach_state") else s_new)
    sv = lambda c, s: c.state_vector(s).detach()  # noqa: E731
    points: dict[str, _Point] = {}
    for l, c in enumerate(cells):
        if "time" in which:
            points[f"time/{l}"] = _Point(_time_fn(c), (sv(c, states[l]), inputs[l]))
        if l == 0 and "input" in which:
            points["input/0"] = _Point(_input_fn(c), (inputs[0].detach(), sv(c, states[0])))
        if l >= 1 and "depth" in which:
            below = cells[l - 1]
            points[f"depth/{l}"] = _Point(_depth_fn(c, below), (sv(below, new_states[l - 1]), inputs[l - 1], sv(c, states[l])))
    if readout is not None and "readout" in which:
        L = len(cells)
        last = cells[-1]
        points[f"readout/{L}"] = _Point(_readout_fn(readout, last), (sv(last, new_states[L - 1]), inputs[L - 1], sv(readout, states[L])))
    return points, tuple(new_states)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite: its sum first (a NaN or inf entry makes the sum one), every entry only
    where the sum is not finite (also where finite entries overflow it)."""
    t = t.detach()
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def _check_finite(key: str, J: torch.Tensor) -> torch.Tensor:
    if not all_finite(J):
        raise FloatingPointError(f"Jacobian {key!r} contains NaN or inf entries (check the model's parameters and the input)")
    return J


def transition_jacobians(model, x_t: torch.Tensor, states=None, which: Sequence[str] = KINDS, *,
                         return_states: bool = False, check_finite: bool = True):
    """Per-sample transition Jacobians ``{key: [B, S_out, S_in]}`` at one time step.

    Args:
        model: a :class:`~spikerec.models.RecurrentStack` (readout included as the last
            layer) or a single cell (then only ``time/0`` and ``input/0`` exist).
        x_t: the model input at this step, ``[B, C]``.
        states: the layer states *before* the step (``None``: initial states).
        which: the kinds to compute, a subset of ``("time", "depth", "input", "readout")``.
        return_states: also return the new (detached) states of every layer.

    Raises ``FloatingPointError`` if a block has NaN/inf entries.
    """
    which = _check_which(which)
    points, new_states = _forward_points(model, x_t, states, which)
    out = {}
    for key, p in points.items():
        J = vmap(jacrev(_one_sample(p.fn), argnums=0))(*p.args)
        out[key] = _check_finite(key, J) if check_finite else J
    return (out, new_states) if return_states else out


def cell_time_jacobian(cell, x_t: torch.Tensor, state=None) -> torch.Tensor:
    """``d s_t / d s_{t-1}`` of one cell, per sample ``[B, S, S]``."""
    check_cell(cell)
    if state is None:
        state = cell.initial_state(x_t.shape[0], x_t.device, x_t.dtype)
    return transition_jacobians(cell, x_t, (state,), which=("time",))["time/0"]


@dataclass
class LinearOp:
    """A batch of matrices ``M_b`` (``[B, n_out, n_in]``) known only through products.

    ``matvec(V[B, n_in]) -> [B, n_out]`` (``M_b v_b``, by ``jvp``) and
    ``rmatvec(U[B, n_out]) -> [B, n_in]`` (``M_b^T u_b``, by ``vjp``). Both are
    differentiable with respect to the model parameters.
    """

    matvec: Callable[[torch.Tensor], torch.Tensor]
    rmatvec: Callable[[torch.Tensor], torch.Tensor]
    shape: tuple[int, int, int]
    dtype: torch.dtype
    device: torch.device

    def dense(self) -> torch.Tensor:
        """The full matrices (``n_in`` products); for tests and small layers."""
        B, n_out, n_in = self.shape
        eye = torch.eye(n_in, dtype=self.dtype, device=self.device)
        cols = [self.matvec(eye[j].expand(B, n_in)) for j in range(n_in)]
        return torch.stack(cols, dim=-1)


def _make_op(key: str, p: _Point, check_finite: bool) -> LinearOp:
    primal, rest = p.args[0], p.args[1:]
    f = lambda s: p.fn(s, *rest)  # noqa: E731
    with torch.no_grad():
        out0 = f(primal)
    B, n_in, n_out = primal.shape[0], primal.shape[-1], out0.shape[-1]

    def matvec(v):
        _, t = jvp(f, (primal,), (v.to(primal.dtype),))
        return _check_finite(key, t) if check_finite else t

    def rmatvec(u):
        _, pull = vjp(f, primal)
        (g,) = pull(u.to(out0.dtype))
        return _check_finite(key, g) if check_finite else g

    return LinearOp(matvec, rmatvec, (B, n_out, n_in), primal.dtype, primal.device)


def transition_operators(model, x_t: torch.Tensor, states=None, which: Sequence[str] = KINDS, *,
                         return_states: bool = False, check_finite: bool = True):
    """Matrix-free version of :func:`transition_jacobians`: ``{key: LinearOp}``.

    A 1024-wide layer's radius then costs a few dozen ``jvp`` of one step instead of its
    full Jacobian (see :func:`spikerec.stability.radius.spectral_radius`).
    """
    which = _check_which(which)
    points, new_states = _forward_points(model, x_t, states, which)
    ops = {key: _make_op(key, p, check_finite) for key, p in points.items()}
    return (ops, new_states) if return_states else ops

"""Leaky integrate-and-fire cell, current- or conductance-free ("LIF") and current-based ("CUBA").

Discrete dynamics (time in units of ``dt``; decays ``alpha = exp(-dt/tau_mem)``,
``alpha_s = exp(-dt/tau_syn)``), for input ``x_t``:

    z_{t-1} = H(v_{t-1} - thr)                        (recomputed from the state)
    J_t     = W x_t + b + W_rec z_{t-1}               (W_rec: recurrent layers, zero diagonal optional)
    i_t     = alpha_s i_{t-1} + J_t                   (CUBA only; otherwise i_t = J_t)
    v_t     = alpha v_{t-1} + i_t - thr z_{t-1}       (reset "subtract")
            = alpha (1 - z_{t-1}) v_{t-1} + i_t       (reset "zero")
            = alpha v_{t-1} + i_t                     (reset "none")
    z_t     = H(v_t - thr)   (strict: v == thr does not spike)

The state holds ``v`` (and ``i``): the membrane *before* the reset, from which the
spike is recomputed, so ``d state_t / d state_{t-1}`` includes the spike path through
the surrogate (digest 002 §5.1). These are exactly snnTorch's ``Leaky``/``Synaptic``
with ``reset_delay=True`` (reset applied at the next step, reset spike detached);
Norse's ``LIFBox`` and current-based ``LIF`` (Euler, reset to 0 at once) map to reset
"zero" with ``alpha = 1 - dt/tau`` and inputs scaled by ``dt/tau_mem`` (see the tests).
One exception: snnTorch's ``Synaptic`` with ``reset_mechanism="zero"`` zeroes the *new*
membrane, dropping that step's input, whereas its ``Leaky`` and Norse zero the old one;
spikerec's "zero" follows ``Leaky`` and Norse.

Time constants are stored as ``log tau`` (unconstrained, learnable with ``learn_tau``).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..surrogate import Surrogate, get_surrogate
from ..kernels.lif_sequence import LIFSequence
from .base import Cell, check_sequence, check_step_input, check_time_constant, init_weight_

__all__ = ["LIF", "LIFState", "CubaLIFState", "RESET_MODES"]

RESET_MODES = ("subtract", "zero", "none")


class LIFState(NamedTuple):
    v: torch.Tensor


class CubaLIFState(NamedTuple):
    i: torch.Tensor
    v: torch.Tensor


def _per_neuron(value, n: int, name: str) -> torch.Tensor:
    t = check_time_constant(value, name)
    if t.dim() == 0:
        t = t.expand(n).clone()
    if t.shape != (n,):
        raise ValueError(f"{name}: expected a scalar or a tensor of shape ({n},), got {tuple(t.shape)}")
    return t


class LIF(Cell):
    """Leaky integrate-and-fire layer (feed-forward or recurrent, optional CUBA synapse).

    Args:
        input_size, hidden_size: features in and neurons.
        tau_mem: membrane time constant(s), in the units of ``dt`` (scalar or per neuron).
        tau_syn: synaptic time constant(s); ``None`` for a plain LIF, a value for CUBA.
        dt: time step. ``alpha = exp(-dt / tau_mem)``.
        threshold: firing threshold (scalar or per neuron).
        reset: ``"subtract"``, ``"zero"`` or ``"none"``.
        recurrent: add lateral weights ``W_rec``; ``zero_diagonal`` removes self-connections.
        bias: learnable input bias.
        learn_tau, learn_threshold: make time constants / thresholds trainable.
        surrogate: surrogate spec (name, dict or :class:`~spikerec.surrogate.Surrogate`).
        detach_reset: stop the gradient through the spike in the reset term (snnTorch's default).
        init, rec_init: weight initialisation schemes (``glorot_uniform``, ``orthogonal``, ...).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        tau_mem=20.0,
        tau_syn=None,
        dt: float = 1.0,
        threshold=1.0,
        reset: str = "subtract",
        recurrent: bool = False,
        zero_diagonal: bool = True,
        bias: bool = True,
        learn_tau: bool = True,
        learn_threshold: bool = False,
        surrogate="fast_sigmoid",
        detach_reset: bool = True,
        init: str = "glorot_uniform",
        rec_init: str = "orthogonal",
    ):
        super().__init__()
        if int(input_size) <= 0 or int(hidden_size) <= 0:
            raise ValueError(f"LIF: input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        if reset not in RESET_MODES:
            raise ValueError(f"LIF: reset must be one of {RESET_MODES}, got {reset!r}")
        if not (dt > 0):
            raise ValueError(f"LIF: dt must be > 0, got {dt!r}")
        self.input_size, self.hidden_size, self.output_size = int(input_size), int(hidden_size), int(hidden_size)
        self.dt, self.reset, self.detach_reset = float(dt), reset, bool(detach_reset)
        self.surrogate: Surrogate = get_surrogate(surrogate)
        n = self.hidden_size
        self.weight = nn.Parameter(init_weight_(torch.empty(n, self.input_size), init, "LIF init"))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.recurrent, self.zero_diagonal = bool(recurrent), bool(zero_diagonal)
        if recurrent:
            self.recurrent_weight = nn.Parameter(init_weight_(torch.empty(n, n), rec_init, "LIF rec_init"))
            self.register_buffer("rec_mask", 1.0 - torch.eye(n) if zero_diagonal else torch.ones(n, n), persistent=False)
        else:
            self.recurrent_weight = None
        log_tau = _per_neuron(tau_mem, n, "tau_mem").log()
        self.log_tau_mem = nn.Parameter(log_tau, requires_grad=learn_tau)
        self.cuba = tau_syn is not None
        self.log_tau_syn = nn.Parameter(_per_neuron(tau_syn, n, "tau_syn").log(), requires_grad=learn_tau) if self.cuba else None
        thr = torch.as_tensor(threshold, dtype=torch.get_default_dtype())
        if torch.isnan(thr).any() or (thr <= 0).any():
            raise ValueError(f"LIF: threshold must be > 0, got {threshold!r}")
        thr = thr.expand(n).clone() if thr.dim() == 0 else thr
        if thr.shape != (n,):
            raise ValueError(f"LIF: threshold must be a scalar or shape ({n},), got {tuple(thr.shape)}")
        self.threshold = nn.Parameter(thr, requires_grad=learn_threshold)
        self.State = CubaLIFState if self.cuba else LIFState

    # --- derived quantities ------------------------------------------------------------
    @property
    def tau_mem(self) -> torch.Tensor:
        return self.log_tau_mem.exp()

    @property
    def tau_syn(self) -> torch.Tensor | None:
        return self.log_tau_syn.exp() if self.cuba else None

    def decays(self):
        """``(alpha, alpha_s)`` with ``alpha = exp(-dt / tau)``; ``alpha_s`` is None without CUBA."""
        alpha = torch.exp(-self.dt * torch.exp(-self.log_tau_mem))
        alpha_s = torch.exp(-self.dt * torch.exp(-self.log_tau_syn)) if self.cuba else None
        return alpha, alpha_s

    def effective_recurrent_weight(self) -> torch.Tensor | None:
        if self.recurrent_weight is None:
            return None
        return self.recurrent_weight * self.rec_mask if self.zero_diagonal else self.recurrent_weight

    @property
    def spiking(self) -> bool:
        return True

    # --- protocol ------------------------------------------------------------------------
    def initial_state(self, batch: int, device=None, dtype=None):
        device = device if device is not None else self.weight.device
        dtype = dtype if dtype is not None else self.weight.dtype
        zeros = lambda: torch.zeros(batch, self.hidden_size, device=device, dtype=dtype)  # noqa: E731
        return CubaLIFState(zeros(), zeros()) if self.cuba else LIFState(zeros())

    def input_current(self, x: torch.Tensor) -> torch.Tensor:
        """``W x + b`` for a step ``[B, C]`` or a whole sequence ``[T, B, C]``."""
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def output(self, x_t, state):
        return self.surrogate(state.v - self.threshold)

    def step(self, x_t, state):
        check_step_input(x_t, self.input_size)
        alpha, alpha_s = self.decays()
        thr = self.threshold
        v = state.v
        z_prev = self.surrogate(v - thr)
        J = self.input_current(x_t)
        w_rec = self.effective_recurrent_weight()
        if w_rec is not None:
            J = J + z_prev @ w_rec.t()
        if self.cuba:
            i = alpha_s * state.i + J
            J = i
        z_reset = z_prev.detach() if self.detach_reset else z_prev
        if self.reset == "subtract":
            v = alpha * v + J - thr * z_reset
        elif self.reset == "zero":
            v = alpha * (1.0 - z_reset) * v + J
        else:
            v = alpha * v + J
        new = CubaLIFState(i, v) if self.cuba else LIFState(v)
        return self.surrogate(v - thr), new

    def forward(self, x, state=None):
        """Whole sequence: one matmul for all input currents, then the fused loop."""
        check_sequence(x, self.input_size, "LIF input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        alpha, alpha_s = self.decays()
        I = self.input_current(x)
        Z, v, i = LIFSequence.apply(
            I, state.v, state.i if self.cuba else None, alpha, alpha_s, self.threshold,
            self.effective_recurrent_weight(), self.surrogate, self.reset, self.detach_reset,
        )
        return Z, (CubaLIFState(i, v) if self.cuba else LIFState(v))

    def stability_groups(self):
        time = [p for p in (self.recurrent_weight, self.log_tau_mem, self.log_tau_syn) if p is not None]
        depth = [p for p in (self.weight, self.threshold) if p is not None]
        return {"time": time, "depth": depth}

    def extra_repr(self):
        kind = "CUBA" if self.cuba else "LIF"
        return (f"{self.input_size}, {self.hidden_size}, {kind}, reset={self.reset}, recurrent={self.recurrent}, "
                f"dt={self.dt}, surrogate={self.surrogate.name}")

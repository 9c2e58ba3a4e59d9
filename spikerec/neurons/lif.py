"""Leaky integrate-and-fire neuron (LIF), plain or with a current-based synapse (CUBA): the one definition.

Discrete dynamics (Herranz-Celotti & Rouat, "Stabilizing RNN gradients through pre-training",
App. H, eq. 49 with a constant threshold, i.e. beta = 0; the current-based synapse is the discrete
LIF of Neftci, Mostafa & Zenke 2019, "Surrogate gradient learning in spiking neural networks",
IEEE Signal Processing Magazine 36(6)), with
``alpha = exp(-dt / tau_mem)``, ``alpha_s = exp(-dt / tau_syn)``::

    z_{t-1} = H(v_{t-1} - thr)                         recomputed from the state
    J_t     = W x_t + b + W_rec z_{t-1}                 W_rec: recurrent layers (diagonal masked or not)
    i_t     = alpha_s i_{t-1} + J_t                     CUBA, synapse "decay_then_add" (otherwise i_t = J_t)
            = alpha_s (i_{t-1} + J_t)                   CUBA, synapse "add_then_decay" (Xylo / Rockpool)
    v_t     = alpha v_{t-1} + i_t - thr z_{t-1}         reset "subtract" (timing "next_step")
            = alpha (v_{t-1} - thr z_{t-1}) + i_t       reset "subtract" (timing "immediate", chips)
            = alpha (1 - z_{t-1}) v_{t-1} + i_t         reset "zero"
            = alpha v_{t-1} + i_t                       reset "none"
    z_t     = H(v_t - thr)                              strict: v == thr does not spike

The state holds ``v`` (and ``i``), the membrane *before* its reset, from which the spike is
recomputed, so ``d state_t / d state_{t-1}`` includes the spike path through the surrogate
(Herranz-Celotti & Rouat, Sec. II-A: the transition derivatives are taken of the full state).
``detach_reset`` stops the gradient through ``z_{t-1}`` in the reset term (snnTorch's default,
and the LSC paper's official code). With ``bias_into="voltage"`` the bias is added to ``v``
instead of ``J`` (Loihi, Xylo). Every operation whose rule depends on the arithmetic (decay,
``alpha v + i (+ b)`` as ``arith.integrate``, overflow, spike, reset timing) goes through ``arith``
(:mod:`spikerec.neurons.arithmetic`).

These dynamics are snnTorch's ``Leaky``/``Synaptic`` with ``reset_delay=True``; Norse's
``LIFBox`` and current-based ``LIF`` (Euler, reset to 0 at once) map to reset "zero" with
``alpha = 1 - dt/tau`` and inputs scaled by ``dt/tau_mem`` (the tests say so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from ..surrogate import Surrogate
from .arithmetic import FLOAT, Arithmetic

__all__ = ["LIFParams", "LIFOptions", "LIFState", "CubaLIFState", "step", "output", "decays", "input_current",
           "RESET_MODES", "SYNAPSE_ORDERS", "BIAS_INTO"]

RESET_MODES = ("subtract", "zero", "none")
SYNAPSE_ORDERS = ("decay_then_add", "add_then_decay")
BIAS_INTO = ("current", "voltage")


class LIFParams(NamedTuple):
    """Parameters of one LIF layer (``[N, C]`` weights, ``[N]`` vectors).

    ``recurrent_weight`` is the *effective* matrix (any diagonal mask already applied) or None;
    ``log_tau_syn`` is None for a plain LIF. Under an integer arithmetic the time-constant fields hold
    the arithmetic's decay codes and the weights its (shifted) mantissas."""

    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    recurrent_weight: Optional[torch.Tensor]
    log_tau_mem: torch.Tensor
    log_tau_syn: Optional[torch.Tensor]
    threshold: torch.Tensor


@dataclass(frozen=True)
class LIFOptions:
    """Static choices of a LIF layer (module docstring)."""

    dt: float = 1.0
    reset: str = "subtract"
    detach_reset: bool = True
    surrogate: Surrogate | None = None
    synapse: str = "decay_then_add"
    bias_into: str = "current"

    def __post_init__(self):
        if not (self.dt > 0):
            raise ValueError(f"LIFOptions.dt: expected > 0, got {self.dt!r}")
        if self.reset not in RESET_MODES:
            raise ValueError(f"LIFOptions.reset: expected one of {RESET_MODES}, got {self.reset!r}")
        if self.synapse not in SYNAPSE_ORDERS:
            raise ValueError(f"LIFOptions.synapse: expected one of {SYNAPSE_ORDERS}, got {self.synapse!r}")
        if self.bias_into not in BIAS_INTO:
            raise ValueError(f"LIFOptions.bias_into: expected one of {BIAS_INTO}, got {self.bias_into!r}")


class LIFState(NamedTuple):
    v: torch.Tensor


class CubaLIFState(NamedTuple):
    i: torch.Tensor
    v: torch.Tensor


def decays(params: LIFParams, options: LIFOptions, arith: Arithmetic = FLOAT):
    """``(alpha, alpha_s)``: ``exp(-dt / tau_mem)``, ``exp(-dt / tau_syn)`` (None without a synapse)."""
    alpha = arith.decay_factor(params.log_tau_mem, options.dt)
    alpha_s = None if params.log_tau_syn is None else arith.decay_factor(params.log_tau_syn, options.dt)
    return alpha, alpha_s


def input_current(params: LIFParams, x: torch.Tensor) -> torch.Tensor:
    """``W x + b`` for a step ``[B, C]`` or a whole sequence ``[T, B, C]`` (float)."""
    return torch.nn.functional.linear(x, params.weight, params.bias)  # one fused addmm when there is a bias


def output(params: LIFParams, state, options: LIFOptions, arith: Arithmetic = FLOAT) -> torch.Tensor:
    """The spikes read off a state: ``z = H(v - thr)``."""
    return arith.spike(state.v, params.threshold, options.surrogate)


def _synaptic(params: LIFParams, x_t, z_prev, options: LIFOptions, arith: Arithmetic, into=None):
    """``[into +] W x_t + W_rec z_{t-1} [+ b]`` in the arithmetic's partial-sum rule: input events,
    then recurrent events (each may saturate, as on Xylo), then the bias."""
    J = arith.synaptic_input(x_t, params.weight, into)
    if params.recurrent_weight is not None:
        J = arith.synaptic_input(z_prev, params.recurrent_weight, J)
    if params.bias is not None and options.bias_into == "current":
        J = J + params.bias
    return J


def step(params: LIFParams, state, x_t: torch.Tensor, options: LIFOptions, arith: Arithmetic = FLOAT):
    """One time step of the module docstring's equations; returns ``(z_t, new_state)``."""
    alpha, alpha_s = decays(params, options, arith)
    thr = params.threshold
    z_prev = arith.spike(state.v, thr, options.surrogate)
    if alpha_s is not None and options.synapse == "add_then_decay":
        i = arith.current(arith.decay(arith.current(_synaptic(params, x_t, z_prev, options, arith, state.i)), alpha_s))
    elif alpha_s is not None:
        i = arith.current(arith.decay(state.i, alpha_s) + _synaptic(params, x_t, z_prev, options, arith))
    else:
        i = arith.current(_synaptic(params, x_t, z_prev, options, arith))
    bias_v = params.bias if (params.bias is not None and options.bias_into == "voltage") else None
    z_r = z_prev.detach() if options.detach_reset else z_prev
    v = state.v
    subtract = options.reset == "subtract"
    if options.reset == "zero":
        v = (1 - z_r) * v
    elif subtract and arith.reset_timing == "immediate":
        v = v - thr * z_r
    v = arith.integrate(v, alpha, i, bias_v)
    if subtract and arith.reset_timing != "immediate":
        v = v - thr * z_r
    v = arith.state(v)
    new = LIFState(v) if alpha_s is None else CubaLIFState(i, v)
    return arith.spike(v, thr, options.surrogate), new

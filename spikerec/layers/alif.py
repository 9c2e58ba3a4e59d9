"""ALIF layer: a thin shell over :mod:`spikerec.neurons.alif` (equations and citations there).

This module owns the parameters and their initialisation: ``tau_mem``, ``tau_adapt``, ``b`` and
``beta`` are per-neuron and trainable; each is drawn from a truncated normal with mean ``mu`` and
std ``3 mu / 7``, truncated at two standard deviations (Keras' TruncatedNormal, support
``[mu/7, 13 mu/7]``). Herranz-Celotti & Rouat, Table S1 defaults: ``tau_mem = 0.1``, ``b = 0.01``,
``beta = 1.8``, ``tau_adapt = 100`` (sl-MNIST; SHD uses 250); ``b`` and ``beta`` are in the official
code's parametrisation (``docs/decisions.md``, neurons 1).

``beta_init="centered"`` gives ALIF± with ``beta ~ N(0, beta / sqrt(n_in))``, the official code's
standard deviation where App. H prints ``beta / n_in`` (``docs/decisions.md``, neurons 2). The time
constants are stored as ``log tau``; the recurrent matrix has a zero diagonal by default (the code's
mask). The input bias of the voltage is zero and not trainable in the paper (``bias=False``).
``forward`` runs the fused kernel ``ALIFSequence``, a registered backend tested equal to the step.
"""
from __future__ import annotations

import math
import torch
from torch import nn

from .. import neurons
from ..neurons import alif as _alif
from ..neurons.alif import ALIFOptions, ALIFParams, ALIFState
from ..neurons.roles import ParamSpec, Role, Transform
from ..surrogate import Surrogate, get_surrogate
from ..kernels.alif_sequence import IMPLS, ALIFSequence
from .base import Cell, check_sequence, check_step_input, check_time_constant, init_weight_

__all__ = ["ALIF", "ALIFState", "truncated_normal_positive"]


def truncated_normal_positive(mean: float, n: int, spread: float = 3.0 / 7.0, generator=None) -> torch.Tensor:
    """``n`` draws of ``N(mean, spread*mean)`` truncated at +-2 std (resampled), as Keras' TruncatedNormal."""
    std = abs(spread * mean)
    out = torch.empty(n)
    if std == 0:
        return out.fill_(mean)
    nn.init.trunc_normal_(out, mean=mean, std=std, a=mean - 2 * std, b=mean + 2 * std, generator=generator)
    return out


class ALIF(Cell):
    """Adaptive-threshold LIF layer with recurrent weights (LSC form).

    Args:
        input_size, hidden_size: features in and neurons.
        tau_mem, tau_adapt, b, beta: means of the per-neuron parameters (Table S1 defaults).
        init_spread: std / mean of their truncated-normal initialisation (3/7; 0 for constants).
        beta_init: ``"truncnormal"`` (ALIF+) or ``"centered"`` (ALIF±).
        dt: time step; decays are ``exp(-dt / tau)``.
        recurrent, zero_diagonal: lateral weights, without self-connections by default.
        surrogate: default ``fast_sigmoid(slope=2, scale=0.5)``, i.e. the paper's
            ``gamma / (1 + |2 omega v|)^2`` with ``omega = 1``, ``gamma = 0.5``.
        detach_reset: stop-gradient on the reset term ``theta_t z_{t-1}``.
        impl: the sequence kernel of :meth:`forward` (:data:`spikerec.kernels.alif_sequence.IMPLS`):
            ``"auto"`` takes the compiled form of the device (numba on the CPU, Triton on CUDA).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        tau_mem: float = 0.1,
        tau_adapt: float = 100.0,
        b: float = 0.01,
        beta: float = 1.8,
        init_spread: float = 3.0 / 7.0,
        beta_init: str = "truncnormal",
        dt: float = 1.0,
        recurrent: bool = True,
        zero_diagonal: bool = True,
        bias: bool = False,
        surrogate=None,
        detach_reset: bool = True,
        init: str = "glorot_uniform",
        rec_init: str = "glorot_uniform",
        learn_tau: bool = True,
        impl: str = "auto",
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"ALIF: impl must be one of {IMPLS}, got {impl!r}")
        self.impl = impl
        if int(input_size) <= 0 or int(hidden_size) <= 0:
            raise ValueError(f"ALIF: input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        check_time_constant(tau_mem, "tau_mem")
        check_time_constant(tau_adapt, "tau_adapt")
        if not (dt > 0):
            raise ValueError(f"ALIF: dt must be > 0, got {dt!r}")
        if not (math.isfinite(b) and b > 0):
            raise ValueError(f"ALIF: b (base threshold) must be > 0, got {b!r}")
        if beta_init not in ("truncnormal", "centered"):
            raise ValueError(f"ALIF: beta_init must be 'truncnormal' or 'centered', got {beta_init!r}")
        self.input_size, self.hidden_size, self.output_size = int(input_size), int(hidden_size), int(hidden_size)
        n = self.hidden_size
        self.dt, self.detach_reset = float(dt), bool(detach_reset)
        self.surrogate: Surrogate = get_surrogate(surrogate if surrogate is not None else {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5})
        self.weight = nn.Parameter(init_weight_(torch.empty(n, self.input_size), init, "ALIF init"))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None
        self.recurrent, self.zero_diagonal = bool(recurrent), bool(zero_diagonal)
        if recurrent:
            self.recurrent_weight = nn.Parameter(init_weight_(torch.empty(n, n), rec_init, "ALIF rec_init"))
            self.register_buffer("rec_mask", 1.0 - torch.eye(n) if zero_diagonal else torch.ones(n, n), persistent=False)
        else:
            self.recurrent_weight = None
        tn = lambda mu: truncated_normal_positive(mu, n, init_spread)  # noqa: E731
        self.log_tau_mem = nn.Parameter(tn(tau_mem).log(), requires_grad=learn_tau)
        self.log_tau_adapt = nn.Parameter(tn(tau_adapt).log(), requires_grad=learn_tau)
        self.b = nn.Parameter(tn(b))
        if beta_init == "centered":
            self.beta = nn.Parameter(torch.randn(n) * beta / math.sqrt(self.input_size))
        else:
            self.beta = nn.Parameter(tn(beta))
        self.State = ALIFState

    @property
    def spiking(self) -> bool:
        return True

    def decays(self):
        """``(alpha, rho)`` = ``exp(-dt/tau_mem)``, ``exp(-dt/tau_adapt)``."""
        return _alif.decays(self.params(masked=False), self.options())

    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles of the parameters (:mod:`spikerec.neurons.roles`)."""
        return {
            "weight": ParamSpec(Role.INPUT),
            "bias": ParamSpec(Role.INPUT, multiplier=False),
            "recurrent_weight": ParamSpec(Role.TIME),
            "log_tau_mem": ParamSpec(Role.TIME, Transform.LOG_TAU),
            "log_tau_adapt": ParamSpec(Role.TIME, Transform.LOG_TAU),
            "b": ParamSpec(Role.THRESHOLD),
            "beta": ParamSpec(Role.THRESHOLD),
        }

    def params(self, *, masked: bool = True) -> ALIFParams:
        """The parameters as the step takes them (effective recurrent matrix; ``masked=False`` skips the
        mask product for readers that do not use ``W_rec``, such as :meth:`output`)."""
        w_rec = self.effective_recurrent_weight() if masked else self.recurrent_weight
        return ALIFParams(self.weight, self.bias, w_rec, self.log_tau_mem, self.log_tau_adapt, self.b, self.beta)

    def options(self) -> ALIFOptions:
        return ALIFOptions(dt=self.dt, detach_reset=self.detach_reset, surrogate=self.surrogate)

    def effective_recurrent_weight(self):
        if self.recurrent_weight is None:
            return None
        return self.recurrent_weight * self.rec_mask if self.zero_diagonal else self.recurrent_weight

    def threshold(self, state) -> torch.Tensor:
        """Adaptive threshold ``theta = b + beta a``."""
        return _alif.threshold(self.params(masked=False), state)

    def initial_state(self, batch: int, device=None, dtype=None):
        device = device if device is not None else self.weight.device
        dtype = dtype if dtype is not None else self.weight.dtype
        z = torch.zeros(batch, self.hidden_size, device=device, dtype=dtype)
        return ALIFState(z, z.clone())

    def input_current(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def output(self, x_t, state):
        return _alif.output(self.params(masked=False), state, self.options())

    def step(self, x_t, state):
        check_step_input(x_t, self.input_size)
        return _alif.step(self.params(), state, x_t, self.options())

    def forward(self, x, state=None):
        check_sequence(x, self.input_size, "ALIF input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        p, o = self.params(), self.options()
        alpha, rho = _alif.decays(p, o)
        Z, v, a = ALIFSequence.apply(
            self.input_current(x), state.v, state.a, alpha, rho, p.b, p.beta,
            p.recurrent_weight, o.surrogate, o.detach_reset, self.impl,
        )
        return Z, ALIFState(v, a)

    def extra_repr(self):
        return f"{self.input_size}, {self.hidden_size}, recurrent={self.recurrent}, dt={self.dt}, surrogate={self.surrogate.name}"


neurons.register_backend("alif", "layers.ALIF.forward (fused ALIFSequence, CPU)", ALIF.forward,
                         test="tests/test_lif_alif.py::test_alif_fused_equals_step_loop")
neurons.register_backend("alif", "kernels.alif_triton (ALIFSequence impl='triton', CUDA)", ALIFSequence.apply,
                         test="tests/test_triton_spiking.py::test_triton_layers_equal_step_loop_under_interpreter")

"""LIF layer (plain or current-based): a thin shell over :mod:`spikerec.neurons.lif`.

The equations, their paper citations and the reset/synapse options are defined once in
:mod:`spikerec.neurons.lif`. This module owns the ``nn.Parameter``s (time constants stored as
``log tau``, learnable with ``learn_tau``), declares their roles (:meth:`LIF.param_specs`), and runs
``step`` through the one definition and ``forward`` through the fused sequence kernel
(``LIFSequence``, a registered backend tested equal to the step in values and gradients).
"""
from __future__ import annotations

import torch
from torch import nn

from .. import neurons
from ..neurons import lif as _lif
from ..neurons.lif import RESET_MODES, CubaLIFState, LIFOptions, LIFParams, LIFState
from ..neurons.roles import ParamSpec, Role, Transform
from ..surrogate import Surrogate, get_surrogate
from ..kernels.lif_sequence import IMPLS, LIFSequence
from .base import Cell, check_sequence, check_step_input, check_time_constant, init_weight_

__all__ = ["LIF", "LIFState", "CubaLIFState", "RESET_MODES"]


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
        impl: the sequence kernel of :meth:`forward` (:data:`spikerec.kernels.lif_sequence.IMPLS`):
            ``"auto"`` takes the compiled form of the device (numba on the CPU, Triton on CUDA).
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
        impl: str = "auto",
    ):
        super().__init__()
        if impl not in IMPLS:
            raise ValueError(f"LIF: impl must be one of {IMPLS}, got {impl!r}")
        self.impl = impl
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
        # alpha (and alpha_s) of fixed time constants, derived once for the fused loop (_sequence_decays)
        self.register_buffer("_fixed_alpha", None, persistent=False)
        self.register_buffer("_fixed_alpha_s", None, persistent=False)
        self._fixed_key = None

    # --- derived quantities ------------------------------------------------------------
    @property
    def tau_mem(self) -> torch.Tensor:
        return self.log_tau_mem.exp()

    @property
    def tau_syn(self) -> torch.Tensor | None:
        return self.log_tau_syn.exp() if self.cuba else None

    def decays(self):
        """``(alpha, alpha_s)`` with ``alpha = exp(-dt / tau)``; ``alpha_s`` is None without CUBA."""
        return _lif.decays(self.params(masked=False), self.options())

    def effective_recurrent_weight(self) -> torch.Tensor | None:
        if self.recurrent_weight is None:
            return None
        return self.recurrent_weight * self.rec_mask if self.zero_diagonal else self.recurrent_weight

    @property
    def spiking(self) -> bool:
        return True

    # --- the one definition -------------------------------------------------------------
    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles of the parameters (:mod:`spikerec.neurons.roles`)."""
        return {
            "weight": ParamSpec(Role.INPUT),
            "bias": ParamSpec(Role.INPUT, multiplier=False),
            "recurrent_weight": ParamSpec(Role.TIME),
            "log_tau_mem": ParamSpec(Role.TIME, Transform.LOG_TAU),
            "log_tau_syn": ParamSpec(Role.TIME, Transform.LOG_TAU),
            "threshold": ParamSpec(Role.THRESHOLD),
        }

    def params(self, *, masked: bool = True) -> LIFParams:
        """The parameters as the step takes them (effective recurrent matrix; ``masked=False`` skips the
        mask product for readers that do not use ``W_rec``, such as :meth:`output`)."""
        w_rec = self.effective_recurrent_weight() if masked else self.recurrent_weight
        return LIFParams(self.weight, self.bias, w_rec, self.log_tau_mem, self.log_tau_syn, self.threshold)

    def options(self) -> LIFOptions:
        return LIFOptions(dt=self.dt, reset=self.reset, detach_reset=self.detach_reset, surrogate=self.surrogate)

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
        return _lif.output(self.params(masked=False), state, self.options())

    def step(self, x_t, state):
        check_step_input(x_t, self.input_size)
        return _lif.step(self.params(), state, x_t, self.options())

    def forward(self, x, state=None):
        """Whole sequence: one matmul for all input currents, then the fused loop."""
        check_sequence(x, self.input_size, "LIF input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        p, o = self.params(), self.options()
        alpha, alpha_s = self._sequence_decays(p, o)
        Z, v, i = LIFSequence.apply(
            _lif.input_current(p, x), state.v, state.i if self.cuba else None, alpha, alpha_s, p.threshold,
            p.recurrent_weight, o.surrogate, o.reset, o.detach_reset, self.impl,
        )
        return Z, (CubaLIFState(i, v) if self.cuba else LIFState(v))

    def _sequence_decays(self, p, o):
        """``decays`` for the fused loop. Learned time constants: derived on each call (their
        gradient flows through it). Fixed ones: derived once and held by the layer until
        ``log_tau`` changes (an in-place edit bumps its version; a move, a cast or a new
        parameter gives a new tensor or storage), so a call does not make, or save for its
        backward, a new decay vector."""
        taus = [t for t in (self.log_tau_mem, self.log_tau_syn) if t is not None]
        if any(t.requires_grad for t in taus):
            return _lif.decays(p, o)
        # the tensors themselves (compared by identity, and kept alive so that no new one can take
        # their place), their versions and storages, and dt
        key = (self.dt, [(t, t._version, t.data_ptr()) for t in taus])
        old = self._fixed_key
        if (old is None or self._fixed_alpha is None or old[0] != key[0] or len(old[1]) != len(key[1])
                or any(a[0] is not b[0] or a[1:] != b[1:] for a, b in zip(old[1], key[1]))):
            with torch.no_grad():
                self._fixed_alpha, self._fixed_alpha_s = _lif.decays(p, o)
            self._fixed_key = key
        return self._fixed_alpha, self._fixed_alpha_s

    def extra_repr(self):
        kind = "CUBA" if self.cuba else "LIF"
        return (f"{self.input_size}, {self.hidden_size}, {kind}, reset={self.reset}, recurrent={self.recurrent}, "
                f"dt={self.dt}, surrogate={self.surrogate.name}")


neurons.register_backend("lif", "layers.LIF.forward (fused LIFSequence, CPU)", LIF.forward,
                         test="tests/test_lif_alif.py::test_lif_fused_equals_step_loop")
neurons.register_backend("lif", "kernels.lif_triton (LIFSequence impl='triton', CUDA)", LIFSequence.apply,
                         test="tests/test_triton_spiking.py::test_triton_layers_equal_step_loop_under_interpreter")

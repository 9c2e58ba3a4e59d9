"""LRU layer: a thin shell over :mod:`spikerec.neurons.lru` (equations and citations there).

Orvieto et al. (2023), "Resurrecting Recurrent Neural Networks for Long Sequences". ``forward``
computes ``gamma B u`` for all steps in one GEMM, runs the diagonal recurrence through
:func:`spikerec.scan.linear_scan` (complex), and reads ``Re(C x)`` in a second GEMM: a registered
backend of the step, tested equal to it (values and gradients, float64). The state vector is
``[Re x, Im x]``.

Initialisation follows the paper's App. A code: ``|lambda|^2 ~ U[r_min^2, r_max^2]``,
``theta ~ U[0, max_phase]`` (Lemma 3.2), ``B_re, B_im ~ N(0, 1/(2H))``, ``C_re, C_im ~ N(0, 1/N)``
(the code halves B's variance, not C's, unlike the prose; ``docs/decisions.md``, neurons 5),
``D ~ N(0, 1)``. Departure from the code: the radius draw is clamped to
``|lambda|^2 in [1e-12, 1 - 1e-7]`` and ``theta >= 1e-8`` so that ``r_max = 1`` (the default and the
paper's ``[0, 1]`` ablations) never gives ``|lambda| = 1``, ``gamma_log = -inf`` or
``theta_log = -inf``; ``r_max > 1`` is an error.

When ``output_size != input_size`` the elementwise ``D`` cannot apply; ``D`` is then a dense
``[output_size, input_size]`` matrix ``~ N(0, 1/input_size)`` (our extension).
Parameter count with ``output_size == input_size``: ``4NH + 3N + H``.
"""
from __future__ import annotations

import math
import torch
from torch import nn

from .. import neurons
from ..neurons import lru as _lru
from ..neurons.lru import LRUParams, LRUState
from ..neurons.roles import ParamSpec, Role, Transform
from ..scan import linear_scan
from .base import Cell, check_sequence, check_step_input

__all__ = ["LRU", "LRUState", "sample_ring", "RECURRENT_PARAMS"]

# the parameters that get the reduced learning rate and no weight decay (Orvieto et al. 2023, App. D.2);
# selected through their roles (``ParamSpec.slow``); this tuple is kept for reference
RECURRENT_PARAMS = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")

_R2_MIN, _R2_MAX, _THETA_MIN = 1e-12, 1.0 - 1e-7, 1e-8


def _check_ring(r_min: float, r_max: float, max_phase: float) -> None:
    if not (math.isfinite(r_min) and math.isfinite(r_max)):
        raise ValueError(f"LRU ring: r_min and r_max must be finite, got r_min={r_min}, r_max={r_max}")
    if r_min < 0:
        raise ValueError(f"LRU ring: r_min must be >= 0, got {r_min}")
    if r_max > 1:
        raise ValueError(f"LRU ring: r_max must be <= 1 (|lambda| < 1 for stability; r_max = 1 is clamped to "
                         f"|lambda|^2 <= 1 - 1e-7), got {r_max}")
    if r_min > r_max:
        raise ValueError(f"LRU ring: r_min ({r_min}) must not exceed r_max ({r_max})")
    if not (max_phase > 0 and math.isfinite(max_phase)):
        raise ValueError(f"LRU ring: max_phase must be a finite number > 0, got {max_phase}")


def sample_ring(n: int, r_min: float = 0.0, r_max: float = 1.0, max_phase: float = 6.28,
                generator: torch.Generator | None = None, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Lemma 3.2 sampler: ``(nu_log, theta_log)`` of ``n`` eigenvalues uniform on the ring
    ``r_min <= |lambda| <= r_max`` with phase in ``[0, max_phase]`` (App. A code semantics)::

        nu_log    = log(-0.5 log(u1 (r_max^2 - r_min^2) + r_min^2))
        theta_log = log(max_phase u2)

    with the clamps of the module docstring. Computed in float64, returned in ``dtype``.
    """
    _check_ring(float(r_min), float(r_max), float(max_phase))
    u1 = torch.rand(n, generator=generator, dtype=torch.float64)
    u2 = torch.rand(n, generator=generator, dtype=torch.float64)
    r2 = (u1 * (r_max ** 2 - r_min ** 2) + r_min ** 2).clamp(_R2_MIN, _R2_MAX)
    nu_log = torch.log(-0.5 * torch.log(r2))
    theta_log = torch.log((max_phase * u2).clamp_min(_THETA_MIN))
    return nu_log.to(dtype), theta_log.to(dtype)


class LRU(Cell):
    """Linear Recurrent Unit cell (time-first ``[T, B, H]``), state ``LRUState(x_re, x_im)``.

    Args:
        input_size: ``H``, features of ``u``.
        state_size: ``N``, complex state entries.
        output_size: features of ``y`` (default ``input_size``).
        r_min, r_max: ring of the initial ``|lambda|`` (``0 <= r_min <= r_max <= 1``).
        max_phase: initial phases uniform in ``[0, max_phase]`` (App. A default 6.28; pi/10 for PathX).
        generator: optional ``torch.Generator`` for a reproducible initialisation.
        impl: scan implementation passed to :func:`spikerec.scan.linear_scan`.
    """

    def __init__(self, input_size: int, state_size: int, *, output_size: int | None = None, r_min: float = 0.0,
                 r_max: float = 1.0, max_phase: float = 6.28, generator: torch.Generator | None = None,
                 impl: str = "auto"):
        super().__init__()
        for name, v in (("input_size", input_size), ("state_size", state_size)):
            if int(v) != v or int(v) < 1:
                raise ValueError(f"LRU: {name} must be a positive integer, got {v!r}")
        H, N = int(input_size), int(state_size)
        O = H if output_size is None else int(output_size)
        if O < 1:
            raise ValueError(f"LRU: output_size must be a positive integer, got {output_size!r}")
        self.input_size, self.d_state, self.output_size = H, N, O
        self.r_min, self.r_max, self.max_phase = float(r_min), float(r_max), float(max_phase)
        self.impl = impl
        nu_log, theta_log = sample_ring(N, self.r_min, self.r_max, self.max_phase, generator)
        lam_abs2 = torch.exp(-2.0 * torch.exp(nu_log))
        gamma_log = 0.5 * torch.log1p(-lam_abs2)
        f32 = torch.get_default_dtype()

        def randn(*shape, std):
            return torch.randn(*shape, generator=generator, dtype=torch.float64).mul_(std).to(f32)

        self.nu_log = nn.Parameter(nu_log.to(f32))
        self.theta_log = nn.Parameter(theta_log.to(f32))
        self.gamma_log = nn.Parameter(gamma_log.to(f32))
        self.B_re = nn.Parameter(randn(N, H, std=1.0 / math.sqrt(2 * H)))
        self.B_im = nn.Parameter(randn(N, H, std=1.0 / math.sqrt(2 * H)))
        self.C_re = nn.Parameter(randn(O, N, std=1.0 / math.sqrt(N)))
        self.C_im = nn.Parameter(randn(O, N, std=1.0 / math.sqrt(N)))
        self.D = nn.Parameter(randn(H, std=1.0) if O == H else randn(O, H, std=1.0 / math.sqrt(H)))
        self.State = LRUState

    # --- the one definition ------------------------------------------------------------
    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles (:mod:`spikerec.neurons.roles`). LSC scales ``nu_log`` (time: the radius of ``diag(lambda)``
        is ``max exp(-exp(nu_log))``; the phase cannot steer it) and the input map ``B`` (depth); not the
        output map ``C``, which enters the next layer's depth derivative ``gamma B^{l+1} C^l``, not this
        layer's (Herranz-Celotti & Rouat, Sec. II-D: "input matrices"; ``docs/decisions.md``, LSC stopping 4).
        The slow learning-rate group is ``lambda``, ``gamma``, ``B`` (Orvieto et al. 2023, App. D.2)."""
        return {
            "nu_log": ParamSpec(Role.TIME, Transform.NU_LOG),
            "theta_log": ParamSpec(Role.TIME, Transform.PHASE_LOG, multiplier=False),
            "gamma_log": ParamSpec(Role.INPUT, Transform.LOG, multiplier=False, slow=True),
            "B_re": ParamSpec(Role.INPUT, slow=True),
            "B_im": ParamSpec(Role.INPUT, slow=True),
            "C_re": ParamSpec(Role.DEPTH, multiplier=False),
            "C_im": ParamSpec(Role.DEPTH, multiplier=False),
            "D": ParamSpec(Role.INPUT, multiplier=False),
        }

    def params(self) -> LRUParams:
        return LRUParams(self.nu_log, self.theta_log, self.gamma_log, self.B_re, self.B_im, self.C_re, self.C_im, self.D)

    # --- eigenvalues and normalisation ------------------------------------------------
    def _lam_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Re lambda, Im lambda)`` computed in real arithmetic (shared by step, lam, to_dense_real)."""
        return _lru.lam_parts(self.params())

    def lam(self) -> torch.Tensor:
        """Complex eigenvalues ``lambda`` ``[N]``."""
        re, im = self._lam_parts()
        return torch.complex(re, im)

    def gamma(self) -> torch.Tensor:
        """Input normalisation ``gamma = exp(gamma_log)`` ``[N]``."""
        return _lru.gamma(self.params())

    def spectral_radius(self) -> torch.Tensor:
        """``max |lambda|``: the exact radius of the time Jacobian ``diag(lambda)``."""
        return torch.exp(-torch.exp(self.nu_log)).max()

    def _skip(self, u: torch.Tensor) -> torch.Tensor:
        return _lru.skip(self.params(), u)

    # --- protocol ---------------------------------------------------------------------
    def initial_state(self, batch: int, device=None, dtype=None) -> LRUState:
        device = device if device is not None else self.nu_log.device
        dtype = dtype if dtype is not None else self.nu_log.dtype
        z = torch.zeros(batch, self.d_state, device=device, dtype=dtype)
        return LRUState(z, z.clone())

    def _check_state(self, state) -> None:
        if not isinstance(state, tuple) or len(state) != 2:
            raise TypeError("LRU state: expected LRUState(x_re, x_im)")
        for name, s in zip(("x_re", "x_im"), state):
            if s.dim() != 2 or s.shape[-1] != self.d_state:
                raise ValueError(f"LRU state.{name}: expected shape [B, {self.d_state}], got {tuple(s.shape)}")
            if s.is_complex():
                raise TypeError(f"LRU state.{name}: expected a real tensor, got dtype {s.dtype}")

    def output(self, x_t: torch.Tensor, state: LRUState) -> torch.Tensor:
        """``y = Re(C x) + D u = C_re Re x - C_im Im x + D u``."""
        return _lru.output(self.params(), state, x_t)

    def step(self, x_t: torch.Tensor, state: LRUState):
        """One step in real arithmetic: ``x' = lambda x + gamma B u``; returns ``(y, x')``."""
        if x_t.is_complex():
            raise TypeError(f"LRU step input: expected a real tensor, got dtype {x_t.dtype}")
        check_step_input(x_t, self.input_size, "LRU step input")
        self._check_state(state)
        return _lru.step(self.params(), state, x_t)

    def states(self, x: torch.Tensor, state: LRUState | None = None) -> torch.Tensor:
        """All complex states ``x_k`` ``[T, B, N]`` through the parallel scan."""
        check_sequence(x, self.input_size, "LRU input")
        if state is not None:
            self._check_state(state)
        g = self.gamma()
        # one GEMM with interleaved (Re, Im) rows -> a complex view without copies
        W = torch.stack([self.B_re * g[:, None], self.B_im * g[:, None]], dim=1).reshape(2 * self.d_state, -1)
        bu = torch.view_as_complex((x @ W.t()).unflatten(-1, (self.d_state, 2)))
        x0 = None if state is None else torch.complex(state.x_re, state.x_im)
        return linear_scan(self.lam(), bu, x0, impl=self.impl)

    def forward(self, x: torch.Tensor, state: LRUState | None = None):
        """Whole sequence ``x[T, B, H]`` -> ``(y[T, B, O], final LRUState)``; equals the step loop."""
        xs = self.states(x, state)
        Wc = torch.stack([self.C_re, -self.C_im], dim=-1).reshape(self.output_size, 2 * self.d_state)
        y = torch.view_as_real(xs).flatten(-2) @ Wc.t() + self._skip(x)
        last = xs[-1]
        return y, LRUState(last.real.contiguous(), last.imag.contiguous())

    # --- analysis helpers ----------------------------------------------------------------
    def to_dense_real(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Equivalent real linear RNN on the state vector ``s = [Re x, Im x]``::

            s_k = A s_{k-1} + Bd u_k,   y_k = Cd s_k + Dd u_k

        ``A = [[diag Re lam, -diag Im lam], [diag Im lam, diag Re lam]]`` ``[2N, 2N]``,
        ``Bd = [gamma B_re; gamma B_im]`` ``[2N, H]``, ``Cd = [C_re, -C_im]`` ``[O, 2N]``,
        ``Dd = diag(D)`` (or ``D``) ``[O, H]``.
        """
        lr, li = self._lam_parts()
        A = torch.cat([torch.cat([torch.diag(lr), -torch.diag(li)], 1), torch.cat([torch.diag(li), torch.diag(lr)], 1)], 0)
        g = self.gamma()[:, None]
        Bd = torch.cat([g * self.B_re, g * self.B_im], 0)
        Cd = torch.cat([self.C_re, -self.C_im], 1)
        Dd = torch.diag(self.D) if self.D.dim() == 1 else self.D
        return A, Bd, Cd, Dd

    def extra_repr(self) -> str:
        return (f"input_size={self.input_size}, state_size={self.d_state}, output_size={self.output_size}, "
                f"r_min={self.r_min}, r_max={self.r_max}, max_phase={self.max_phase}")


neurons.register_backend("lru", "layers.LRU.forward (complex parallel scan)", LRU.forward,
                         test="tests/test_lru.py::test_forward_scan_equals_step_loop")

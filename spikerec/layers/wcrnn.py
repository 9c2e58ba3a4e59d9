"""WCRNN layer (Dubinin & Effenberger, "Fading memory as inductive bias in residual recurrent
networks", Neural Networks 2024): a thin shell over :mod:`spikerec.neurons.wcrnn` (equations there),
plus the residual constructions of the paper's Sec. 4.

The residual ``R`` and the coupling ``gamma`` are buffers (``R`` a parameter with
``trainable_residual``); the weights use the ``nn.Linear`` default ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
with both biases (Sec. 4). Because ``gamma`` is small the time Jacobian is ``J_t = R + O(gamma)`` and
the Lyapunov exponents are close to ``log|eig R|`` (eq. 13). The readout is the stack's readout (the
paper reads the last state out).

Choices where the paper is silent (``docs/decisions.md``, neurons 6): the informed heterogeneous
residual uses one ``r`` and one angle per 2x2 block, ``R = blockdiag(r_k T(phi_k))`` (so the
eigenvalues are exactly ``r_k e^{+-i phi_k}``); ``random_rotation`` draws angles ``U[0, 2 pi)`` per
block; the initial state is zero. ``forward`` precomputes the input drive with one matmul and runs the
step's update: a registered backend tested equal to the step loop.
"""
from __future__ import annotations

import math
import numpy as np
import torch
from torch import nn

from .. import neurons
from ..neurons import wcrnn as _wcrnn
from ..neurons.roles import ParamSpec, Role
from ..neurons.wcrnn import VARIANTS, WCRNNOptions, WCRNNParams, WCRNNState
from .base import Cell, check_sequence, check_step_input

__all__ = [
    "WCRNN", "WCRNNState", "VARIANTS", "RESIDUALS",
    "scaled_identity", "diagonal_residual", "heterogeneous_diagonal", "block_rotation",
    "random_block_rotation", "haar_orthogonal", "informed_heterogeneous", "make_residual",
    "weakly_coupled_elman_init",
]
RESIDUALS = ("identity", "diagonal", "heterogeneous", "rotation", "random_rotation", "orthogonal", "informed")


def _gen(seed):
    return torch.Generator().manual_seed(int(seed)) if seed is not None else None


def _uniform(n, lo, hi, generator):
    if hi < lo:
        raise ValueError(f"range: expected low <= high, got ({lo}, {hi})")
    return lo + (hi - lo) * torch.rand(n, generator=generator, dtype=torch.float64)


# --------------------------------------------------------------------------------------------
# residual constructions (all float64 [N, N])
# --------------------------------------------------------------------------------------------
def scaled_identity(n: int, r: float = 1.0) -> torch.Tensor:
    """``R = r I`` (Sec. 4.1): sub-critical ``r < 1``, critical ``r = 1``, super-critical ``r > 1``."""
    if not (r > 0):
        raise ValueError(f"r: the residual strength must be > 0, got {r!r}")
    return float(r) * torch.eye(int(n), dtype=torch.float64)


def diagonal_residual(r) -> torch.Tensor:
    """``R = diag(r)`` (eq. 17)."""
    r = torch.as_tensor(r, dtype=torch.float64).reshape(-1)
    if (r <= 0).any():
        raise ValueError("r: diagonal residual entries must be > 0")
    return torch.diag(r)


def heterogeneous_diagonal(n: int, r0: float = 0.96, dr: float = 0.02, *, seed=None) -> torch.Tensor:
    """``R = diag(r)``, ``r_i ~ U(r0 - dr/2, r0 + dr/2)`` (Sec. 4.3, eq. 17)."""
    if dr < 0 or r0 - dr / 2 <= 0:
        raise ValueError(f"heterogeneous residual: need dr >= 0 and r0 - dr/2 > 0, got r0={r0}, dr={dr}")
    return diagonal_residual(_uniform(int(n), r0 - dr / 2, r0 + dr / 2, _gen(seed)))


def block_rotation(phis, r=None) -> torch.Tensor:
    """Block-diagonal ``blockdiag(r_k [[cos phi_k, -sin phi_k], [sin phi_k, cos phi_k]])`` (eq. 16).

    ``phis``: one angle per 2x2 block; ``r``: optional modulus per block (scalar or vector), so the
    eigenvalues are ``r_k exp(+-i phi_k)``.
    """
    phis = torch.as_tensor(phis, dtype=torch.float64).reshape(-1)
    m = phis.numel()
    rr = torch.ones(m, dtype=torch.float64) if r is None else torch.as_tensor(r, dtype=torch.float64).reshape(-1).expand(m)
    if (rr <= 0).any():
        raise ValueError("r: rotation block moduli must be > 0")
    R = torch.zeros(2 * m, 2 * m, dtype=torch.float64)
    c, s = rr * torch.cos(phis), rr * torch.sin(phis)
    i = torch.arange(m) * 2
    R[i, i], R[i, i + 1], R[i + 1, i], R[i + 1, i + 1] = c, -s, s, c
    return R


def _even(n, what):
    if int(n) % 2:
        raise ValueError(f"{what}: needs an even number of units (2x2 blocks), got {n}")
    return int(n) // 2


def random_block_rotation(n: int, phi_range=(0.0, 2 * math.pi), *, r_range=None, seed=None) -> torch.Tensor:
    """Rotation blocks with angles ``U[phi_range]`` (and moduli ``U[r_range]`` when given)."""
    m = _even(n, "random_rotation residual")
    g = _gen(seed)
    phis = _uniform(m, *phi_range, g)
    r = _uniform(m, *r_range, g) if r_range is not None else None
    return block_rotation(phis, r)


def haar_orthogonal(n: int, *, seed=None) -> torch.Tensor:
    """Haar-random orthogonal matrix (``scipy.stats.ortho_group``; Sec. 4.2, Fig. B.4D)."""
    from scipy.stats import ortho_group

    return torch.as_tensor(ortho_group.rvs(int(n), random_state=seed), dtype=torch.float64)


def informed_heterogeneous(n: int, *, r_range=(0.99, 1.0), phi_range=(0.0, math.pi / 4),
                           gamma_range=(0.005, 0.05), seed=None) -> tuple[torch.Tensor, torch.Tensor]:
    """"WCRNN_best" (Sec. 4.3): rotation x diagonal residual with per-unit coupling.

    One modulus ``r_k ~ U[r_range]`` and one angle ``phi_k ~ U[phi_range]`` per 2x2 block, and
    ``gamma_i ~ U[gamma_range]`` per unit. Returns ``(R, gamma)``.
    """
    m = _even(n, "informed residual")
    g = _gen(seed)
    r = _uniform(m, *r_range, g)
    phis = _uniform(m, *phi_range, g)
    gam = _uniform(2 * m, *gamma_range, g)
    return block_rotation(phis, r), gam


def make_residual(name, n: int, *, r=1.0, phi=None, r0=0.96, dr=0.02, r_range=(0.99, 1.0),
                  phi_range=(0.0, math.pi / 4), gamma_range=(0.005, 0.05), seed=None):
    """Residual by name; returns ``(R [n, n] float64, gamma or None)``. See :data:`RESIDUALS`.

    ``identity``: ``r I``; ``diagonal``: ``diag(r)`` (``r`` a vector); ``heterogeneous``: ``r0``,
    ``dr``; ``rotation``: homogeneous angle ``phi`` (or one per block), scaled by ``r``;
    ``random_rotation``: angles ``U[0, 2 pi)``; ``orthogonal``: Haar; ``informed``: ``r_range``,
    ``phi_range``, ``gamma_range`` (also returns the per-unit ``gamma``).
    """
    if isinstance(name, (torch.Tensor, np.ndarray)):
        R = torch.as_tensor(name, dtype=torch.float64)
        if R.shape != (n, n):
            raise ValueError(f"residual: expected a [{n}, {n}] matrix, got {tuple(R.shape)}")
        return R, None
    if name == "identity":
        return scaled_identity(n, r), None
    if name == "diagonal":
        R = diagonal_residual(torch.as_tensor(r, dtype=torch.float64).reshape(-1).expand(n))
        return R, None
    if name == "heterogeneous":
        return heterogeneous_diagonal(n, r0, dr, seed=seed), None
    if name == "rotation":
        if phi is None:
            raise ValueError("residual 'rotation': needs the angle phi (radians; scalar or one per 2x2 block)")
        m = _even(n, "rotation residual")
        phis = torch.as_tensor(phi, dtype=torch.float64).reshape(-1).expand(m)
        return block_rotation(phis, r), None
    if name == "random_rotation":
        return random_block_rotation(n, (0.0, 2 * math.pi), seed=seed), None
    if name == "orthogonal":
        return haar_orthogonal(n, seed=seed), None
    if name == "informed":
        return informed_heterogeneous(n, r_range=r_range, phi_range=phi_range, gamma_range=gamma_range, seed=seed)
    raise ValueError(f"residual: expected a matrix or one of {RESIDUALS}, got {name!r}")


# --------------------------------------------------------------------------------------------
# the cell
# --------------------------------------------------------------------------------------------
def _linear_default_(w: torch.Tensor, fan_in: int, generator=None) -> torch.Tensor:
    b = 1.0 / math.sqrt(fan_in)
    with torch.no_grad():
        return w.uniform_(-b, b, generator=generator)


class WCRNN(Cell):
    """Weakly coupled residual RNN cell (see the module docstring for the equations).

    Args:
        input_size, hidden_size: features in and units ``N``.
        residual: a name of :data:`RESIDUALS` or an ``[N, N]`` matrix; options ``r``, ``phi``,
            ``r0``, ``dr``, ``r_range``, ``phi_range``, ``gamma_range``, ``seed`` (see
            :func:`make_residual`).
        gamma: coupling, scalar or ``[N]``; default 0.01 (the per-unit draw for ``informed``).
        variant: ``"linear"``, ``"A"``, ``"B"`` or ``"no_tanh"``.
        trainable_residual: make ``R`` a parameter (the paper keeps it fixed).
    """

    def __init__(self, input_size: int, hidden_size: int, *, residual="identity", gamma=None,
                 variant: str = "linear", r=1.0, phi=None, r0: float = 0.96, dr: float = 0.02,
                 r_range=(0.99, 1.0), phi_range=(0.0, math.pi / 4), gamma_range=(0.005, 0.05),
                 seed=None, trainable_residual: bool = False):
        super().__init__()
        if int(input_size) <= 0 or int(hidden_size) <= 0:
            raise ValueError(f"WCRNN: input_size and hidden_size must be positive, got {input_size}, {hidden_size}")
        if variant not in VARIANTS:
            raise ValueError(f"WCRNN: variant must be one of {VARIANTS}, got {variant!r}")
        n = int(hidden_size)
        self.input_size, self.hidden_size, self.output_size = int(input_size), n, n
        self.variant = variant
        self.residual_name = residual if isinstance(residual, str) else "matrix"
        R, gam_draw = make_residual(residual, n, r=r, phi=phi, r0=r0, dr=dr, r_range=tuple(r_range),
                                    phi_range=tuple(phi_range), gamma_range=tuple(gamma_range), seed=seed)
        if gamma is None:
            gamma = gam_draw if gam_draw is not None else 0.01
        g = torch.as_tensor(gamma, dtype=torch.float64).reshape(-1)
        if g.numel() == 1:
            g = g.expand(n).clone()
        if g.shape != (n,):
            raise ValueError(f"WCRNN: gamma must be a scalar or have shape ({n},), got {tuple(g.shape)}")
        if (g < 0).any():
            raise ValueError("WCRNN: gamma must be >= 0")
        dtype = torch.get_default_dtype()
        gen = _gen(None if seed is None else int(seed) + 1)
        self.weight_sx = nn.Parameter(_linear_default_(torch.empty(n, self.input_size), self.input_size, gen))
        self.bias_sx = nn.Parameter(_linear_default_(torch.empty(n), self.input_size, gen))
        self.weight_xx = nn.Parameter(_linear_default_(torch.empty(n, n), n, gen))
        self.bias_xx = nn.Parameter(_linear_default_(torch.empty(n), n, gen))
        if trainable_residual:
            self.residual = nn.Parameter(R.to(dtype))
        else:
            self.register_buffer("residual", R.to(dtype))
        self.register_buffer("gamma", g.to(dtype))
        self.State = WCRNNState

    # --- the one definition ---------------------------------------------------------------
    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        """Roles (:mod:`spikerec.neurons.roles`): time = ``W_xx`` (and ``R`` when trainable), input = ``W_sx``;
        biases are not scaled by LSC."""
        return {
            "weight_sx": ParamSpec(Role.INPUT),
            "bias_sx": ParamSpec(Role.INPUT, multiplier=False),
            "weight_xx": ParamSpec(Role.TIME),
            "bias_xx": ParamSpec(Role.TIME, multiplier=False, slow=False),
            "residual": ParamSpec(Role.TIME),
        }

    def params(self) -> WCRNNParams:
        return WCRNNParams(self.weight_sx, self.bias_sx, self.weight_xx, self.bias_xx, self.residual, self.gamma)

    def options(self) -> WCRNNOptions:
        return WCRNNOptions(self.variant)

    # --- protocol ---------------------------------------------------------------------------
    def initial_state(self, batch: int, device=None, dtype=None):
        device = device if device is not None else self.weight_xx.device
        dtype = dtype if dtype is not None else self.weight_xx.dtype
        return WCRNNState(torch.zeros(batch, self.hidden_size, device=device, dtype=dtype))

    def output(self, x_t, state):
        return state.x

    def drive(self, s: torch.Tensor) -> torch.Tensor:
        """``W_sx s + b_sx`` for one step ``[B, C]`` or a sequence ``[T, B, C]``."""
        return _wcrnn.drive(self.params(), s)

    def step(self, x_t, state):
        check_step_input(x_t, self.input_size)
        return _wcrnn.step(self.params(), state, x_t, self.options())

    def forward(self, x, state=None):
        """Whole sequence: one matmul for the input drive, then the recurrence."""
        check_sequence(x, self.input_size, "WCRNN input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        p, o = self.params(), self.options()
        drive = _wcrnn.drive(p, x)
        h, outs = state.x, []
        for t in range(x.shape[0]):
            h = _wcrnn.update(p, h, drive[t], o)
            outs.append(h)
        return torch.stack(outs), WCRNNState(h)

    # --- analysis helpers ---------------------------------------------------------------------
    def time_jacobian(self, x_t: torch.Tensor, state) -> torch.Tensor:
        """Analytic ``d x_t / d x_{t-1}`` ``[B, N, N]`` (derived from eqs. 11, 18, 19):

        linear ``R + diag(g tanh'(a)) W``; A ``diag(tanh'(R x)) R + diag(g tanh'(a)) W``;
        B ``diag(1 - x_t^2)(R + diag(g) W)``; no_tanh ``R + diag(g) W``.
        """
        x = state.x
        W, R, g = self.weight_xx, self.residual, self.gamma
        a = x @ W.t() + self.bias_xx + self.drive(x_t)
        B = x.shape[0]
        if self.variant == "linear":
            return R + (g * (1 - torch.tanh(a) ** 2)).unsqueeze(-1) * W
        if self.variant == "A":
            Rx = x @ R.t()
            return (1 - torch.tanh(Rx) ** 2).unsqueeze(-1) * R + (g * (1 - torch.tanh(a) ** 2)).unsqueeze(-1) * W
        M = R + g.unsqueeze(-1) * W
        if self.variant == "B":
            xn = torch.tanh(x @ R.t() + g * a)
            return (1 - xn**2).unsqueeze(-1) * M
        return M.expand(B, -1, -1).clone()

    def to_elman(self) -> nn.RNN:
        """The equal Elman RNN of a type-B cell (Sec. 4.4): ``W_hh = R + diag(g) W_xx``,
        ``W_ih = diag(g) W_sx``, ``b_ih = g b_sx``, ``b_hh = g b_xx`` (``torch.nn.RNN``, tanh)."""
        if self.variant != "B":
            raise ValueError(f"to_elman: only the type-B variant is an Elman RNN, this cell is {self.variant!r}")
        rnn = nn.RNN(self.input_size, self.hidden_size, nonlinearity="tanh", bias=True)
        g = self.gamma.detach()
        with torch.no_grad():
            rnn = rnn.to(dtype=self.weight_xx.dtype, device=self.weight_xx.device)
            rnn.weight_hh_l0.copy_(self.residual.detach() + g.unsqueeze(-1) * self.weight_xx.detach())
            rnn.weight_ih_l0.copy_(g.unsqueeze(-1) * self.weight_sx.detach())
            rnn.bias_ih_l0.copy_(g * self.bias_sx.detach())
            rnn.bias_hh_l0.copy_(g * self.bias_xx.detach())
        return rnn

    def extra_repr(self):
        g = self.gamma
        gs = f"{g[0].item():.4g}" if bool((g == g[0]).all()) else f"[{g.min().item():.3g}, {g.max().item():.3g}]"
        return f"{self.input_size}, {self.hidden_size}, variant={self.variant}, residual={self.residual_name}, gamma={gs}"


def weakly_coupled_elman_init(rnn: nn.RNN, residual="identity", gamma: float = 0.01, *, seed=None,
                              **residual_kw) -> nn.RNN:
    """Weakly coupled residual initialisation of a ``torch.nn.RNN`` (tanh), in place (Sec. 4.4).

    Every layer gets ``W_hh = R + gamma W``, ``W_ih = gamma W_in``, ``b = gamma b`` where ``W``,
    ``W_in`` and ``b`` are fresh ``nn.Linear``-default draws: the network starts as a type-B
    WCRNN (eq. 19). Training the merged ``W_hh`` directly with SGD at learning rate
    ``eta gamma^2`` follows the same iterates as training ``W`` at ``eta`` (derived from eq. 19).
    """
    if not isinstance(rnn, nn.RNN) or rnn.nonlinearity != "tanh":
        raise TypeError("weakly_coupled_elman_init: expected a torch.nn.RNN with nonlinearity='tanh'")
    n = rnn.hidden_size
    R, _ = make_residual(residual, n, seed=seed, **residual_kw)
    g = torch.as_tensor(gamma, dtype=torch.float64).reshape(-1).expand(n)
    gen = _gen(seed)
    for layer in range(rnn.num_layers):
        for sfx in [""] + (["_reverse"] if rnn.bidirectional else []):
            hh = getattr(rnn, f"weight_hh_l{layer}{sfx}")
            ih = getattr(rnn, f"weight_ih_l{layer}{sfx}")
            with torch.no_grad():
                W = _linear_default_(torch.empty(n, n, dtype=torch.float64), n, gen)
                Win = _linear_default_(torch.empty(ih.shape, dtype=torch.float64), ih.shape[1], gen)
                hh.copy_(R + g.unsqueeze(-1) * W)
                ih.copy_(g.unsqueeze(-1) * Win)
                if rnn.bias:
                    for name, fan in (("bias_ih", ih.shape[1]), ("bias_hh", n)):
                        b = getattr(rnn, f"{name}_l{layer}{sfx}")
                        b.copy_(g * _linear_default_(torch.empty(n, dtype=torch.float64), fan, gen))
    return rnn


neurons.register_backend("wcrnn", "layers.WCRNN.forward (precomputed drive + update loop)", WCRNN.forward,
                         test="tests/test_neurons.py::test_wcrnn_forward_equals_step_with_gradients")

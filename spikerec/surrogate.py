"""Spike functions with surrogate derivatives.

Forward: the Heaviside step ``H(x) = 1 if x > 0 else 0`` (strict, so ``v == threshold``
does not spike). Backward: the derivative of a smooth function ``F`` that stands in
for ``H``. Every surrogate here is named after its formula, with the width/slope and the
scale (dampening) explicit, because the libraries disagree on names: Norse's
``super`` with ``alpha`` is our ``fast_sigmoid`` with ``slope=alpha``; SpikingJelly's
``SuperSpike(alpha)`` is ``fast_sigmoid(slope=1, scale=alpha)``; snnTorch's
``triangular`` is a sign flip, not a triangle.

Conversions to the papers and peer libraries:

* LSC paper (Herranz-Celotti & Rouat, App. H): ``gamma / (1 + |2 omega v|)^2`` with
  ``omega = 1``, ``gamma = 0.5``  ->  ``fast_sigmoid(slope=2.0, scale=0.5)``.
* snnTorch ``fast_sigmoid(slope=25)`` -> ``fast_sigmoid(slope=25, scale=1)``;
  snnTorch ``atan(alpha=2)`` -> ``atan(slope=2, scale=1)``.
* Norse ``method="super", alpha=100`` -> ``fast_sigmoid(slope=100, scale=1)``.
* lava-dl / Sinabs single exponential -> ``exponential(width=..., scale=...)``.

Use :func:`get_surrogate` to build one from a config name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.autograd.forward_ad as _forward_ad

__all__ = [
    "Surrogate",
    "FastSigmoid",
    "ATan",
    "Triangle",
    "Gaussian",
    "Sigmoid",
    "Exponential",
    "MultiGaussian",
    "SURROGATES",
    "COMPILED_CODES",
    "get_surrogate",
    "heaviside",
]


def heaviside(x: torch.Tensor) -> torch.Tensor:
    """Strict Heaviside ``H(x) = [x > 0]`` in the dtype of ``x``. Written straight into a tensor of
    that dtype (``torch.gt(..., out=)``; a boolean intermediate and its cast are slower on the
    CPU, docs/decisions.md, Kernels and benchmarks 6); where autograd records ``x`` or a
    ``torch.func`` transform is active (``out=`` is not allowed there), through the cast."""
    if (x.requires_grad and torch.is_grad_enabled()) or torch._C._are_functorch_transforms_active():
        return (x > 0).to(x.dtype)
    return torch.gt(x, 0, out=torch.empty_like(x))


class _SpikeFn(torch.autograd.Function):
    """Heaviside forward, ``surrogate.derivative`` backward; works under torch.func (its vmap rule: the
    function is elementwise, so it runs on the batched tensor as it is and keeps its batch dimension)."""

    @staticmethod
    def vmap(info, in_dims, x, surrogate):
        return _SpikeFn.apply(x, surrogate), in_dims[0]

    @staticmethod
    def forward(x, surrogate):
        return heaviside(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, surrogate = inputs
        ctx.save_for_backward(x)
        ctx.save_for_forward(x)
        ctx.surrogate = surrogate

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * ctx.surrogate.derivative(x), None

    @staticmethod
    def jvp(ctx, x_tangent, _):
        (x,) = ctx.saved_tensors
        return x_tangent * ctx.surrogate.derivative(x)


@dataclass(frozen=True)
class Surrogate:
    """Base class: ``__call__`` spikes with the surrogate gradient.

    Subclasses define ``derivative(x)`` (what backward uses) and ``primitive(x)``
    (the smooth function whose derivative it is; it rises from 0 to ``scale``, except
    the fast sigmoid, which spans ``2 scale / slope`` centred on 0, and the multi-Gaussian,
    whose negative side lobes make it end at ``(1 - height) scale``).
    """

    name: str = field(default="", init=False)
    scale: float = 1.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (not (x.requires_grad and torch.is_grad_enabled()) and _forward_ad._current_level < 0
                and not torch._C._are_functorch_transforms_active()):
            return heaviside(x)  # nothing records this call: the forward alone (no autograd.Function overhead)
        return _SpikeFn.apply(x, self)

    def derivative(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def primitive(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_config(self) -> dict:
        cfg = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "name"}
        return {"name": self.name, **cfg}

    def compiled_form(self) -> tuple[int, float, float] | None:
        """``(code, p, scale)`` of this surrogate's compiled form: the derivative formula compiled
        kernels evaluate inline, ``code`` one of :data:`COMPILED_CODES` and ``p`` its slope or width
        (the numba kernels have codes 1-2, :func:`spikerec.kernels.surrogate_numba.sd_consts`;
        the Triton kernels 1-6, :mod:`spikerec.kernels.surrogate_triton`; each tested equal to
        :meth:`derivative`), or ``None``: the compiled paths then take :meth:`derivative` in torch."""
        return None


def _positive(name: str, value: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"surrogate '{name}': {what} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class FastSigmoid(Surrogate):
    """SuperSpike / fast sigmoid: ``dH/dx ~ scale / (1 + slope*|x|)^2``.

    Primitive ``F(x) = scale * x / (1 + slope*|x|)`` (Zenke & Ganguli 2018, eq. 5).
    """

    slope: float = 25.0
    scale: float = 1.0
    name: str = field(default="fast_sigmoid", init=False)

    def __post_init__(self):
        _positive(self.name, self.slope, "slope")

    def derivative(self, x):
        return self.scale / (1.0 + self.slope * x.abs()) ** 2

    def primitive(self, x):
        return self.scale * x / (1.0 + self.slope * x.abs())

    def compiled_form(self):
        return 1, float(self.slope), float(self.scale)


@dataclass(frozen=True)
class ATan(Surrogate):
    """Arc-tangent: ``dH/dx ~ scale * (slope/2) / (1 + (pi/2 * slope * x)^2)``.

    Primitive ``F(x) = scale * (1/2 + atan(pi/2 * slope * x) / pi)`` (Fang et al. 2021).
    """

    slope: float = 2.0
    scale: float = 1.0
    name: str = field(default="atan", init=False)

    def __post_init__(self):
        _positive(self.name, self.slope, "slope")

    def derivative(self, x):
        return self.scale * (self.slope / 2.0) / (1.0 + (math.pi / 2.0 * self.slope * x) ** 2)

    def primitive(self, x):
        return self.scale * (0.5 + torch.atan(math.pi / 2.0 * self.slope * x) / math.pi)

    def compiled_form(self):
        return 2, float(self.slope), float(self.scale)


@dataclass(frozen=True)
class Triangle(Surrogate):
    """Triangle (piecewise linear, Bellec et al. 2018): ``dH/dx ~ scale * max(0, 1 - |x|/width) / width``.

    Primitive: the integral of the triangle, ``0`` below ``-width``, ``scale`` above ``width``.
    """

    width: float = 1.0
    scale: float = 1.0
    name: str = field(default="triangle", init=False)

    def __post_init__(self):
        _positive(self.name, self.width, "width")

    def derivative(self, x):
        return self.scale * torch.clamp(1.0 - x.abs() / self.width, min=0.0) / self.width

    def primitive(self, x):
        w = self.width
        xc = torch.clamp(x, -w, w)
        return self.scale * (0.5 + xc / w - xc * xc.abs() / (2.0 * w * w))

    def compiled_form(self):
        return 3, float(self.width), float(self.scale)


@dataclass(frozen=True)
class Gaussian(Surrogate):
    """Gaussian: ``dH/dx ~ scale * exp(-x^2 / (2 width^2)) / (sqrt(2 pi) width)``.

    Primitive ``F(x) = scale * (1 + erf(x / (sqrt(2) width))) / 2``.
    """

    width: float = 0.5
    scale: float = 1.0
    name: str = field(default="gaussian", init=False)

    def __post_init__(self):
        _positive(self.name, self.width, "width")

    def derivative(self, x):
        w = self.width
        return self.scale * torch.exp(-0.5 * (x / w) ** 2) / (math.sqrt(2.0 * math.pi) * w)

    def primitive(self, x):
        return self.scale * 0.5 * (1.0 + torch.erf(x / (math.sqrt(2.0) * self.width)))

    def compiled_form(self):
        return 4, float(self.width), float(self.scale)


@dataclass(frozen=True)
class Sigmoid(Surrogate):
    """Logistic sigmoid: ``dH/dx ~ scale * slope * s(slope x) (1 - s(slope x))``.

    Primitive ``F(x) = scale * s(slope * x)`` with ``s`` the logistic function.
    """

    slope: float = 4.0
    scale: float = 1.0
    name: str = field(default="sigmoid", init=False)

    def __post_init__(self):
        _positive(self.name, self.slope, "slope")

    def derivative(self, x):
        s = torch.sigmoid(self.slope * x)
        return self.scale * self.slope * s * (1.0 - s)

    def primitive(self, x):
        return self.scale * torch.sigmoid(self.slope * x)

    def compiled_form(self):
        return 5, float(self.slope), float(self.scale)


@dataclass(frozen=True)
class Exponential(Surrogate):
    """Single exponential (SLAYER, Sinabs): ``dH/dx ~ scale * exp(-|x|/width) / (2 width)``.

    Primitive ``F(x) = scale * e^{x/w}/2`` for ``x < 0`` and ``scale * (1 - e^{-x/w}/2)`` otherwise.
    """

    width: float = 0.5
    scale: float = 1.0
    name: str = field(default="exponential", init=False)

    def __post_init__(self):
        _positive(self.name, self.width, "width")

    def derivative(self, x):
        return self.scale * torch.exp(-x.abs() / self.width) / (2.0 * self.width)

    def primitive(self, x):
        e = 0.5 * torch.exp(-x.abs() / self.width)
        return self.scale * torch.where(x < 0, e, 1.0 - e)

    def compiled_form(self):
        return 6, float(self.width), float(self.scale)


def _normal_pdf(x, mu, sigma):
    return torch.exp(-0.5 * ((x - mu) / sigma) ** 2) / (math.sqrt(2.0 * math.pi) * sigma)


def _normal_cdf(x, mu, sigma):
    return 0.5 * (1.0 + torch.erf((x - mu) / (math.sqrt(2.0) * sigma)))


@dataclass(frozen=True)
class MultiGaussian(Surrogate):
    """Multi-Gaussian (Yin et al. 2021), tried by the LSC paper for target 0.5:

    ``dH/dx ~ scale * [(1+h) N(x; 0, w) - h N(x; w, k w) - h N(x; -w, k w)]``
    with ``h = 0.15``, ``k = 6`` by default. Primitive: the same mixture of normal CDFs.
    """

    width: float = 0.5
    height: float = 0.15
    spread: float = 6.0
    scale: float = 1.0
    name: str = field(default="multi_gaussian", init=False)

    def __post_init__(self):
        _positive(self.name, self.width, "width")
        _positive(self.name, self.spread, "spread")

    def derivative(self, x):
        w, h, k = self.width, self.height, self.spread
        return self.scale * (
            (1 + h) * _normal_pdf(x, 0.0, w) - h * _normal_pdf(x, w, k * w) - h * _normal_pdf(x, -w, k * w)
        )

    def primitive(self, x):
        w, h, k = self.width, self.height, self.spread
        return self.scale * (
            (1 + h) * _normal_cdf(x, 0.0, w) - h * _normal_cdf(x, w, k * w) - h * _normal_cdf(x, -w, k * w)
        )


#: the codes of :meth:`Surrogate.compiled_form`, by formula
COMPILED_CODES = {"fast_sigmoid": 1, "atan": 2, "triangle": 3, "gaussian": 4, "sigmoid": 5, "exponential": 6}

SURROGATES: dict[str, type[Surrogate]] = {
    "fast_sigmoid": FastSigmoid,
    "atan": ATan,
    "triangle": Triangle,
    "gaussian": Gaussian,
    "sigmoid": Sigmoid,
    "exponential": Exponential,
    "multi_gaussian": MultiGaussian,
}
_ALIASES = {"superspike": "fast_sigmoid"}


def get_surrogate(spec: str | dict | Surrogate = "fast_sigmoid", **kwargs) -> Surrogate:
    """Build a surrogate from a name (``"atan"``), a dict (``{"name": "atan", "slope": 2}``) or pass one through.

    >>> get_surrogate("fast_sigmoid", slope=2.0, scale=0.5).derivative(torch.tensor(0.0))
    tensor(0.5000)
    """
    if isinstance(spec, Surrogate):
        if kwargs:
            raise ValueError("get_surrogate: keyword arguments are only accepted with a surrogate name")
        return spec
    if isinstance(spec, dict):
        spec = dict(spec)
        name = spec.pop("name", None)
        if name is None:
            raise ValueError("surrogate config: missing 'name'; expected one of " + ", ".join(sorted(SURROGATES)))
        kwargs = {**spec, **kwargs}
        spec = name
    if not isinstance(spec, str):
        raise TypeError(f"surrogate: expected a name, a dict or a Surrogate, got {type(spec).__name__}")
    key = _ALIASES.get(spec.lower(), spec.lower())
    if key not in SURROGATES:
        raise ValueError(f"unknown surrogate '{spec}'; expected one of: " + ", ".join(sorted(SURROGATES)))
    cls = SURROGATES[key]
    valid = [k for k in cls.__dataclass_fields__ if k != "name"]
    bad = [k for k in kwargs if k not in valid]
    if bad:
        raise ValueError(f"surrogate '{key}': unknown option(s) {bad}; valid options: {valid}")
    return cls(**kwargs)

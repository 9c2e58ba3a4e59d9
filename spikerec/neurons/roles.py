"""Parameter roles: what a parameter does in its cell, declared once by the cell.

Consumers (the LSC clipped multiplier, the optimiser's parameter groups, the quantiser, the
eligibility-trace builders, the NIR mapping) select parameters by :class:`Role` and read
their parametrisation from :class:`Transform`; never by attribute or class name.

Roles:

* ``TIME``: the state-to-state map (recurrent weights, time constants, eigenvalues, ``W_hh``).
* ``INPUT``: the map of the layer's input into its state (``W_in``, bias, the LRU's ``B``,
  ``gamma`` and skip ``D``, ``W_ih``).
* ``DEPTH``: the map of the state to the layer's output on its way to the next layer (the LRU's ``C``).
* ``THRESHOLD``: spike thresholds and threshold adaptation (``threshold``; ALIF ``b``, ``beta``).
* ``READOUT``: the parameters of a readout layer (its weight and bias; its time constant is ``TIME``).

Transforms (how the stored value maps to the quantity it parametrises):

* ``LOG_TAU``: ``tau = exp(p)``, decay ``exp(-dt / tau)``.
* ``NU_LOG``: ``|lambda| = exp(-exp(p))`` (Orvieto et al. 2023, §3.3).
* ``PHASE_LOG``: ``arg lambda = exp(p)`` (Orvieto et al. 2023, §3.3); a phase has no magnitude to scale.
* ``LOG``: ``value = exp(p)`` (the LRU's input normalisation ``gamma``, §3.4).
* ``IDENTITY``: the value itself.

A :class:`ParamSpec` also says whether the LSC clipped multiplier (Herranz-Celotti & Rouat,
Sec. II-D) scales the parameter (``multiplier``; biases, the LRU's phase, normalisation and skip are
left alone, and the LRU's output map ``C``: the LRU's scaled parameters are ``nu`` and ``B``) and
whether it belongs to the slow learning-rate group of the recurrence (``slow``; default: role ``TIME``;
the LRU adds ``gamma`` and ``B``, the "recurrent parameters" of Orvieto et al. 2023, App. D.2).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from torch import nn

__all__ = ["Role", "Transform", "ParamSpec", "parameters_by_role", "param_specs_of", "stability_groups_from_specs"]


class Role(str, enum.Enum):
    TIME = "time"
    DEPTH = "depth"
    INPUT = "input"
    THRESHOLD = "threshold"
    READOUT = "readout"


class Transform(str, enum.Enum):
    LOG_TAU = "log_tau"
    NU_LOG = "nu_log"
    PHASE_LOG = "phase_log"
    LOG = "log"
    IDENTITY = "identity"


@dataclass(frozen=True)
class ParamSpec:
    """Role and parametrisation of one parameter (see the module docstring)."""

    role: Role
    transform: Transform = Transform.IDENTITY
    multiplier: bool = True
    slow: bool | None = field(default=None)

    @property
    def in_slow_group(self) -> bool:
        return self.role is Role.TIME if self.slow is None else bool(self.slow)


def param_specs_of(module: nn.Module) -> dict[int, tuple[str, nn.Parameter, ParamSpec]]:
    """``{id(param): (qualified_name, param, spec)}`` for every parameter declared by a submodule whose
    class defines ``param_specs()``; parameters without a spec are absent."""
    out: dict[int, tuple[str, nn.Parameter, ParamSpec]] = {}
    for prefix, mod in module.named_modules():
        specs_fn = getattr(type(mod), "param_specs", None)
        if specs_fn is None:
            continue
        for attr, spec in mod.param_specs().items():
            try:
                p = mod.get_parameter(attr)  # dotted paths allowed (e.g. "rnn.weight_hh_l0")
            except AttributeError:
                continue  # an optional parameter that this instance does not have (None)
            if not isinstance(spec, ParamSpec):
                raise TypeError(f"{type(mod).__name__}.param_specs()[{attr!r}]: expected a ParamSpec, got {type(spec).__name__}")
            out.setdefault(id(p), (f"{prefix}.{attr}" if prefix else attr, p, spec))
    return out


def parameters_by_role(module: nn.Module, *roles: Role | str) -> list[tuple[str, nn.Parameter]]:
    """``[(qualified_name, parameter)]`` of the parameters whose declared role is one of ``roles``
    (all declared parameters when no role is given), in module order."""
    wanted = {Role(r) for r in roles}
    return [(n, p) for n, p, s in param_specs_of(module).values() if not wanted or s.role in wanted]


def stability_groups_from_specs(module: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The LSC groups of one cell from its specs: ``time`` = role ``TIME``, ``depth`` = every other role;
    only parameters the multiplier scales (``multiplier=True``)."""
    time, depth = [], []
    for _, p, s in param_specs_of(module).values():
        if not s.multiplier:
            continue
        (time if s.role is Role.TIME else depth).append(p)
    return {"time": time, "depth": depth}

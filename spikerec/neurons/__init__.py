"""One definition per neuron or cell kind, and the registry of its backends.

Each kind (``lif`` incl. CUBA, ``alif``, ``readout``, ``lru``, ``gru``, ``wcrnn``) lives in one
module of this package: typed parameters and state, and a pure
``step(params, state, x_t, options, arith=FLOAT) -> (out_t, new_state)`` that reads like its paper.
Every other implementation of a kind (the fused sequence kernel behind a layer's ``forward``, an
integer arithmetic, online-learning partials, the NIR mapping) is a *backend*: registered here with
the test that shows it equal to the step (values and gradients on fresh random inputs).
This package imports only ``torch`` and :mod:`spikerec.surrogate`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import alif, arithmetic, gru, lif, lru, readout, roles, wcrnn
from .arithmetic import FLOAT, Arithmetic, FloatArithmetic
from .roles import ParamSpec, Role, Transform, parameters_by_role

__all__ = ["lif", "alif", "readout", "lru", "gru", "wcrnn", "roles", "arithmetic", "FLOAT", "Arithmetic", "FloatArithmetic",
           "ParamSpec", "Role", "Transform", "parameters_by_role", "Backend", "BACKENDS", "KINDS",
           "register_backend", "backends_of"]

#: the neuron / cell kinds defined in this package
KINDS = ("lif", "alif", "readout", "lru", "gru", "wcrnn")


@dataclass(frozen=True)
class Backend:
    """One implementation of a kind's step: ``fn`` and the test (``path::name``) showing it equal."""

    kind: str
    name: str
    fn: Callable
    test: str


#: ``{kind: {name: Backend}}``
BACKENDS: dict[str, dict[str, Backend]] = {k: {} for k in KINDS}


def register_backend(kind: str, name: str, fn: Callable, *, test: str) -> Callable:
    """Register ``fn`` as backend ``name`` of ``kind``; ``test`` names its equality test
    (``"tests/test_file.py::test_name"``). Returns ``fn`` (usable as a decorator argument)."""
    if kind not in BACKENDS:
        raise ValueError(f"register_backend: unknown kind {kind!r}; expected one of {KINDS}")
    if not isinstance(test, str) or "::" not in test:
        raise ValueError(f"register_backend({kind!r}, {name!r}): test must name its equality test as "
                         f"'tests/<file>.py::<test>', got {test!r}")
    BACKENDS[kind][name] = Backend(kind, name, fn, test)
    return fn


def backends_of(kind: str) -> dict[str, Backend]:
    """The registered backends of ``kind`` (``{name: Backend}``)."""
    if kind not in BACKENDS:
        raise ValueError(f"backends_of: unknown kind {kind!r}; expected one of {KINDS}")
    return dict(BACKENDS[kind])

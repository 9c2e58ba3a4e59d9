"""The NIR mapping of each neuron kind, both directions: one table entry per kind.

:data:`MAPPINGS` holds one :class:`NIRMapping` per kind (``lif``, ``cuba``, ``alif``, ``readout``);
:func:`~spikerec.hardware.export.nir_io.to_nir` and :func:`~spikerec.hardware.export.nir_io.from_nir` walk the graph
and ask the table for each neuron, so a new kind is a new entry. Each entry is registered as a
backend of its kind in :mod:`spikerec.neurons` with the round-trip test that shows it equal.

NIR neurons are continuous, ``tau dv/dt = (v_leak - v) + r I``; a reader integrating with forward
Euler at step ``dt`` runs ``v <- (1 - dt/tau) v + (dt/tau) r I``. spikerec's discrete
``v <- alpha v + J`` (``alpha = exp(-dt_model / tau_model)``, :mod:`spikerec.neurons.lif`) is written as

========== ================ ===================================================================
kind       NIR node         export (``to_node``)
========== ================ ===================================================================
lif        ``LIF``          ``tau = dt / (1 - alpha)``, ``r = 1``, gain ``tau / dt`` folded into
                            the incoming Affine/Linear and the recurrent Linear, ``v_leak = v_reset = 0``
cuba       ``CubaLIF``      ``tau_syn = dt / (1 - alpha_s)``, ``w_in = tau_syn / dt``,
                            ``tau_mem = dt / (1 - alpha)``, ``r = tau_mem / dt``
alif       ``LIF`` + meta   extension: ``tau`` = membrane, ``v_threshold = b``, ``r = tau / dt``;
                            metadata ``spikerec_kind = "alif"``, ``tau_adapt = dt / (1 - rho)``, ``b``, ``beta``
readout    ``LI``           ``tau = dt / (1 - alpha)``, ``r = tau / dt`` (a plain readout is only its Affine)
========== ================ ===================================================================

Import (``from_node``) inverts it for any reader's graph: ``alpha = 1 - dt/tau`` (refused when
``tau < dt``: forward Euler would be unstable) and the factor ``(dt/tau) r`` (times ``(dt/tau_syn) w_in``
for ``CubaLIF``) plus ``(dt/tau) v_leak`` folded into the incoming weights and bias; ``IF`` reads as
``alpha = 1``. The parameters of a cell are read through its ``params()`` tuple and written only under
the names its ``param_specs()`` declares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import nir
import numpy as np
import torch

from ... import neurons
from ...layers.alif import ALIF
from ...layers.lif import LIF
from ...layers.readout import LeakyReadout
from ...neurons import alif as _alif
from ...neurons import lif as _lif
from ...neurons import readout as _readout

__all__ = ["NIRMapping", "NeuronNode", "NeuronRead", "MAPPINGS", "mapping_for_cell", "mapping_for_node",
           "assign_params", "NIRImportError"]


class NIRImportError(ValueError):
    """A NIR graph (or file) spikerec cannot read; the message names the node."""


@dataclass(frozen=True)
class NeuronNode:
    """What a kind writes: the NIR ``node`` and the per-neuron ``gain`` (float64, or None) that the
    graph folds into the neuron's incoming Affine/Linear and recurrent Linear."""

    node: nir.NIRNode
    gain: Optional[np.ndarray] = None


@dataclass(frozen=True)
class NeuronRead:
    """What a kind reads from a node: incoming weights are scaled by ``gain``, ``offset`` is added to the
    bias (both float64 ``[N]``), and ``build(input_size, n, bias, recurrent)`` makes the cell with the
    node's own parameters set (its weights are assigned by the caller)."""

    gain: np.ndarray
    offset: np.ndarray
    build: Callable[[int, int, np.ndarray, bool], torch.nn.Module]


@dataclass(frozen=True)
class NIRMapping:
    """One kind's mapping, both directions.

    ``matches(cell)``: this entry writes ``cell``; ``claims(node, meta)``: this entry reads ``node``;
    ``extension(cell)``: why plain NIR cannot express the cell (None: it can);
    ``to_node(cell, dt) -> NeuronNode | None`` (None: nothing beyond the Affine, e.g. a plain readout);
    ``from_node(node, name, n, dt, meta) -> NeuronRead``."""

    kind: str
    neuron_kind: str
    node_types: tuple
    matches: Callable
    claims: Callable
    extension: Callable
    to_node: Callable
    from_node: Callable


# --- shared conversions ------------------------------------------------------------------------
def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy().astype(np.float32)


def _f64(t) -> np.ndarray:
    return t.detach().double().numpy()


def _tau(alpha: np.ndarray, dt: float) -> np.ndarray:
    """``dt / (1 - alpha)`` (float32): the NIR time constant whose Euler step decays by ``alpha``."""
    return (dt / np.clip(1.0 - alpha, 1e-12, None)).astype(np.float32)


def _arr(node, name, field, n=None):
    v = getattr(node, field, None)
    if v is None:
        raise NIRImportError(f"node '{name}': missing field '{field}'")
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    if n is not None and a.size == 1:
        a = np.full(n, a.item())
    if n is not None and a.size != n:
        raise NIRImportError(f"node '{name}': field '{field}' has {a.size} values, expected {n}")
    if not np.all(np.isfinite(a)) and field not in ("tau", "tau_mem", "tau_syn"):
        raise NIRImportError(f"node '{name}': field '{field}' has non-finite values")
    return a


def _alpha(tau: np.ndarray, dt: float, name: str) -> np.ndarray:
    a = 1.0 - dt / tau
    if np.any(a < -1e-6) or np.any(a > 1.0):
        raise NIRImportError(f"node '{name}': tau {tau.min():.3g} is shorter than dt {dt:.3g}; forward Euler is unstable "
                             f"(pass the dt the graph was written for)")
    return np.clip(a, 0.0, 1.0)


def _model_tau(alpha: np.ndarray) -> torch.Tensor:
    """tau in steps (dt_model = 1) with ``exp(-1/tau) = alpha``; alpha 0 -> a tiny tau, alpha 1 -> a huge one."""
    a = np.clip(alpha, 1e-300, 1.0 - 1e-15)
    return torch.tensor(np.clip(-1.0 / np.log(a), 1e-3, 1e12), dtype=torch.get_default_dtype())


def assign_params(cell, **values) -> None:
    """Copy ``values`` into the cell's parameters, each named by the cell's ``param_specs()``."""
    specs = type(cell).param_specs()
    with torch.no_grad():
        for name, value in values.items():
            if name not in specs:
                raise ValueError(f"{type(cell).__name__} declares no parameter {name!r} (param_specs: {sorted(specs)})")
            getattr(cell, name).copy_(torch.as_tensor(value))


def _neuron_meta(cell, dt: float) -> dict:
    return {"dt": dt, "model_dt": float(cell.dt), "reset_timing": "next_step"}


def _spiking_checks(node, name: str, n: int) -> np.ndarray:
    """The threshold of a spiking node; refuses ``v_reset != 0``."""
    thr = _arr(node, name, "v_threshold", n)
    v_reset = _arr(node, name, "v_reset", n) if getattr(node, "v_reset", None) is not None else np.zeros(n)
    if np.any(v_reset != 0):
        raise NIRImportError(f"node '{name}': v_reset != 0 is not supported (spikerec resets to 0 or subtracts)")
    return thr


def _leaky_read(node, name: str, n: int, dt: float):
    """``(alpha, gain, offset)`` of a ``LIF``/``IF`` node: ``v <- alpha v + (dt/tau) (r I + v_leak)``."""
    if isinstance(node, nir.IF):
        return np.ones(n), _arr(node, name, "r", n), np.zeros(n)
    tau, r, v_leak = _arr(node, name, "tau", n), _arr(node, name, "r", n), _arr(node, name, "v_leak", n)
    return _alpha(tau, dt, name), r * dt / tau, dt / tau * v_leak


# --- LIF (plain) and CUBA LIF ----------------------------------------------------------------------
def _lif_extension(cell) -> Optional[str]:
    return None if cell.reset == "zero" else f"reset '{cell.reset}' (NIR neurons reset to v_reset, i.e. 'zero')"


def _lif_to_node(cell, dt: float) -> NeuronNode:
    p = cell.params(masked=False)
    alpha, alpha_s = (None if a is None else _f64(a) for a in _lif.decays(p, cell.options()))
    n = cell.hidden_size
    zeros = np.zeros(n, np.float32)
    thr = _np(p.threshold)
    meta = _neuron_meta(cell, dt) | {"reset": cell.reset, "spikerec_kind": "cuba" if cell.cuba else "lif"}
    tau_m = _tau(alpha, dt)
    if cell.cuba:
        tau_s = _tau(alpha_s, dt)
        return NeuronNode(nir.CubaLIF(tau_syn=tau_s, tau_mem=tau_m, r=(tau_m / dt).astype(np.float32), v_leak=zeros,
                                      v_threshold=thr, v_reset=zeros.copy(), w_in=(tau_s / dt).astype(np.float32),
                                      metadata=meta))
    # r = tau/dt folded into the incoming weights (Norse ignores r of LIF)
    meta["r_folded"] = True
    return NeuronNode(nir.LIF(tau=tau_m, r=np.ones(n, np.float32), v_leak=zeros, v_threshold=thr,
                              v_reset=zeros.copy(), metadata=meta), gain=tau_m.astype(np.float64) / dt)


def _lif_builder(thr: np.ndarray, alpha: np.ndarray, tau_syn, reset: str, name: str):
    def build(input_size: int, n: int, bias: np.ndarray, recurrent: bool):
        if reset not in _lif.RESET_MODES:
            raise NIRImportError(f"node '{name}': unknown reset '{reset}' in metadata")
        return LIF(input_size, n, tau_mem=_model_tau(alpha), tau_syn=tau_syn,
                   threshold=torch.tensor(thr, dtype=torch.get_default_dtype()), reset=reset, bias=True,
                   recurrent=recurrent, zero_diagonal=False)
    return build


def _lif_from_node(node, name: str, n: int, dt: float, meta: dict) -> NeuronRead:
    thr = _spiking_checks(node, name, n)
    alpha, g, offset = _leaky_read(node, name, n, dt)
    return NeuronRead(g, offset, _lif_builder(thr, alpha, None, meta.get("reset", "zero"), name))


def _cuba_from_node(node, name: str, n: int, dt: float, meta: dict) -> NeuronRead:
    thr = _spiking_checks(node, name, n)
    ts, tm = _arr(node, name, "tau_syn", n), _arr(node, name, "tau_mem", n)
    r, w_in = _arr(node, name, "r", n), _arr(node, name, "w_in", n)
    if np.any(_arr(node, name, "v_leak", n) != 0):
        raise NIRImportError(f"node '{name}': field 'v_leak' of a CubaLIF must be 0 (spikerec's CUBA LIF has no leak "
                             "potential); got non-zero values")
    alpha, alpha_s = _alpha(tm, dt, name), _alpha(ts, dt, name)
    g = (r * dt / tm) * (w_in * dt / ts)
    return NeuronRead(g, np.zeros(n), _lif_builder(thr, alpha, _model_tau(alpha_s), meta.get("reset", "zero"), name))


# --- ALIF (spikerec extension) -----------------------------------------------------------------------
def _alif_to_node(cell, dt: float) -> NeuronNode:
    p = cell.params(masked=False)
    alpha, rho = (_f64(a) for a in _alif.decays(p, cell.options()))
    n = cell.hidden_size
    zeros = np.zeros(n, np.float32)
    tau_m = _tau(alpha, dt)
    meta = _neuron_meta(cell, dt) | {"reset": "subtract", "spikerec_kind": "alif", "extension": "spikerec.alif",
                                     "tau_adapt": _tau(rho, dt), "beta": _np(p.beta), "b": _np(p.b)}
    return NeuronNode(nir.LIF(tau=tau_m, r=(tau_m / dt).astype(np.float32), v_leak=zeros, v_threshold=_np(p.b),
                              v_reset=zeros.copy(), metadata=meta))


def _alif_from_node(node, name: str, n: int, dt: float, meta: dict) -> NeuronRead:
    _spiking_checks(node, name, n)  # the threshold of an ALIF is b + beta a: b is in the metadata
    alpha, g, offset = _leaky_read(node, name, n, dt)

    def build(input_size: int, n: int, bias: np.ndarray, recurrent: bool):
        rho = _alpha(np.asarray(meta["tau_adapt"], np.float64).reshape(-1), dt, name)
        cell = ALIF(input_size, n, init_spread=0.0, bias=bool(np.any(bias != 0)), recurrent=recurrent,
                    zero_diagonal=False)
        assign_params(cell, log_tau_mem=_model_tau(alpha).log(), log_tau_adapt=_model_tau(rho).log(),
                      b=torch.tensor(np.asarray(meta["b"], np.float64).reshape(-1)),
                      beta=torch.tensor(np.asarray(meta["beta"], np.float64).reshape(-1)))
        return cell
    return NeuronRead(g, offset, build)


# --- LI readout ------------------------------------------------------------------------------------
def _readout_to_node(ro, dt: float) -> Optional[NeuronNode]:
    alpha = _readout.decay(ro.params(), ro.options())
    if alpha is None:
        return None
    tau = _tau(_f64(alpha), dt)
    return NeuronNode(nir.LI(tau=tau, r=(tau / dt).astype(np.float32), v_leak=np.zeros(ro.output_size, np.float32),
                             metadata={"dt": dt, "model_dt": float(ro.dt)}))


def _readout_from_node(node, name: str, n: int, dt: float, meta: dict) -> NeuronRead:
    tau, r = _arr(node, name, "tau", n), _arr(node, name, "r", n)
    v_leak = _arr(node, name, "v_leak", n)
    alpha = _alpha(tau, dt, name)
    leaky = bool(np.any(alpha > 0))

    def build(input_size: int, n: int, bias: np.ndarray, recurrent: bool):
        return LeakyReadout(input_size, n, tau=_model_tau(alpha) if leaky else None)
    return NeuronRead(r * dt / tau, dt / tau * v_leak, build)


def _kind(meta) -> str | None:
    return (meta or {}).get("spikerec_kind")


#: ``{kind: NIRMapping}``; the first entry whose ``matches``/``claims`` accepts a cell/node maps it
MAPPINGS: dict[str, NIRMapping] = {
    "lif": NIRMapping(
        "lif", "lif", (nir.LIF, nir.IF),
        matches=lambda c: isinstance(c, LIF) and not c.cuba,
        claims=lambda node, meta: isinstance(node, (nir.LIF, nir.IF)) and _kind(meta) != "alif",
        extension=_lif_extension, to_node=_lif_to_node, from_node=_lif_from_node),
    "cuba": NIRMapping(
        "cuba", "lif", (nir.CubaLIF,),
        matches=lambda c: isinstance(c, LIF) and c.cuba,
        claims=lambda node, meta: isinstance(node, nir.CubaLIF),
        extension=_lif_extension, to_node=_lif_to_node, from_node=_cuba_from_node),
    "alif": NIRMapping(
        "alif", "alif", (nir.LIF,),
        matches=lambda c: isinstance(c, ALIF),
        claims=lambda node, meta: isinstance(node, nir.LIF) and _kind(meta) == "alif",
        extension=lambda c: "ALIF (adaptive threshold) has no NIR node",
        to_node=_alif_to_node, from_node=_alif_from_node),
    "readout": NIRMapping(
        "readout", "readout", (nir.LI,),
        matches=lambda c: isinstance(c, LeakyReadout),
        claims=lambda node, meta: isinstance(node, nir.LI),
        extension=lambda c: None, to_node=_readout_to_node, from_node=_readout_from_node),
}

#: NIR node types of the spiking kinds (every mapping but the readout)
SPIKING_NODE_TYPES = tuple(dict.fromkeys(t for k, m in MAPPINGS.items() if k != "readout" for t in m.node_types))


def mapping_for_cell(cell) -> Optional[NIRMapping]:
    """The entry that writes ``cell`` (None: the cell has no NIR form)."""
    return next((m for m in MAPPINGS.values() if m.matches(cell)), None)


def mapping_for_node(node) -> Optional[NIRMapping]:
    """The entry that reads ``node`` (None: no kind reads it)."""
    meta = dict(getattr(node, "metadata", {}) or {})
    return next((m for m in MAPPINGS.values() if m.claims(node, meta)), None)


_TEST = "tests/test_nir.py::test_mapping_round_trip_per_kind"
neurons.register_backend("lif", "hardware.export.nir_map (NIR LIF, both directions)", MAPPINGS["lif"].to_node, test=_TEST)
neurons.register_backend("lif", "hardware.export.nir_map (NIR CubaLIF, both directions)", MAPPINGS["cuba"].to_node, test=_TEST)
neurons.register_backend("alif", "hardware.export.nir_map (NIR LIF + spikerec.alif extension, both directions)",
                         MAPPINGS["alif"].to_node, test=_TEST)
neurons.register_backend("readout", "hardware.export.nir_map (NIR LI, both directions)", MAPPINGS["readout"].to_node,
                         test=_TEST)

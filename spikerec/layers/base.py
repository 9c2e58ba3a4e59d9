"""The cell protocol shared by every recurrent layer (LIF, ALIF, LRU, GRU, readout).

A cell maps an input sequence ``x[T, B, C_in]`` to an output sequence ``out[T, B, C_out]``
through a state that is a NamedTuple of ``[B, ...]`` tensors:

* ``initial_state(batch, device, dtype) -> State``
* ``step(x_t, state) -> (out_t, new_state)``: one time step, a pure function of its inputs
  and parameters (so ``torch.func`` can differentiate it);
* ``output(x_t, state) -> out_t``: the output read off a state (``step`` returns
  ``output(x_t, new_state)``); the depth Jacobian of a stack goes through it;
* ``forward(x, state=None) -> (out, final_state)``: the whole sequence on the fast path;
  it equals the ``step`` loop (the tests say so);
* ``state_vector(state) -> [B, S]`` and ``state_from_vector(vec) -> State``;
* ``stability_groups() -> {"time": [...], "depth": [...]}``: the parameters the LSC
  clipped weight multiplier scales, derived from ``param_specs()``;
* ``param_specs() -> {attribute: ParamSpec}``: the role of each parameter
  (:mod:`spikerec.neurons.roles`).

The protocol is written once, as :class:`CellProtocol`; :class:`Cell` is the base class that
implements its shared parts. The dynamics of each kind live in :mod:`spikerec.neurons`.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

from ..errors import DataError
from ..neurons.roles import ParamSpec, stability_groups_from_specs

__all__ = ["Cell", "CellProtocol", "PROTOCOL_METHODS", "protocol_missing", "check_sequence", "match_input_dtype",
           "check_time_constant", "glorot_uniform_", "init_weight_", "value_checks"]


@runtime_checkable
class CellProtocol(Protocol):
    """What every recurrent layer provides (module docstring). ``isinstance(x, CellProtocol)`` checks
    that the members exist; :func:`protocol_missing` names the missing ones."""

    input_size: int
    output_size: int

    def initial_state(self, batch: int, device=None, dtype=None): ...

    def step(self, x_t: torch.Tensor, state): ...

    def output(self, x_t: torch.Tensor, state) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor, state=None): ...

    def state_vector(self, state) -> torch.Tensor: ...

    def state_from_vector(self, vec: torch.Tensor): ...

    def stability_groups(self) -> dict[str, list[nn.Parameter]]: ...

    def param_specs(self) -> dict[str, ParamSpec]: ...


#: the methods a cell must have to be stepped and differentiated (``param_specs`` is optional: a cell
#: without it has no roles, and its ``stability_groups`` must then be written by hand)
PROTOCOL_METHODS = ("initial_state", "step", "output", "state_vector", "state_from_vector", "stability_groups")


def protocol_missing(cell, methods: tuple[str, ...] = PROTOCOL_METHODS) -> list[str]:
    """Names of ``methods`` (default: :data:`PROTOCOL_METHODS`) that ``cell`` lacks (empty when it has them)."""
    return [m for m in methods if not callable(getattr(cell, m, None))]

# Checks that read the data (NaN) cost a pass over the input and, on CUDA, a host sync per call:
# off by default; ``value_checks(True)`` or ``SPIKEREC_CHECK_VALUES=1`` turns them on. The trainer
# names a batch with non-finite values when its loss becomes non-finite, where the check is free.
_VALUE_CHECKS = [os.environ.get("SPIKEREC_CHECK_VALUES", "0") not in ("", "0")]


@contextlib.contextmanager
def value_checks(enabled: bool = True):
    """Within this block, every forward also checks its input sequence for NaN (an error naming the tensor)."""
    old = _VALUE_CHECKS[0]
    _VALUE_CHECKS[0] = bool(enabled)
    try:
        yield
    finally:
        _VALUE_CHECKS[0] = old


def check_sequence(x: torch.Tensor, features: int, name: str = "x", *, allow_complex: bool = False,
                   check_values: bool | None = None) -> None:
    """Raise a clear error unless ``x`` is a real ``[T, B, features]`` tensor.

    Shape and dtype checks are free and always run. The NaN check reads the data, so it runs
    only with ``check_values=True`` or inside :func:`value_checks` (or ``SPIKEREC_CHECK_VALUES=1``).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape [T, B, {features}], got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name}: expected shape [T, B, {features}] (time-first), got {tuple(x.shape)}")
    if x.shape[-1] != features:
        raise ValueError(f"{name}: expected {features} features in the last dimension, got {x.shape[-1]}")
    if x.is_complex() and not allow_complex:
        raise TypeError(f"{name}: expected a real tensor, got dtype {x.dtype}")
    if check_values is None:
        check_values = _VALUE_CHECKS[0]
    if check_values and x.is_floating_point() and torch.isnan(x).any():
        raise ValueError(f"{name}: contains NaN values")


def match_input_dtype(x: torch.Tensor, dtype: torch.dtype, name: str = "x") -> torch.Tensor:
    """``x`` in the floating dtype of the parameters: integer and boolean inputs (spike
    counts, event frames) are cast, which is exact; a floating input of another precision
    (float64 into a float32 model) raises :class:`~spikerec.errors.DataError` naming both
    dtypes, since a silent cast would change the precision the caller chose."""
    if x.dtype == dtype:
        return x
    if not (x.is_floating_point() or x.is_complex()):
        return x.to(dtype)
    raise DataError(f"{name}: dtype {x.dtype} but the model's parameters are {dtype}; convert the input "
                    f"(x.to({dtype})) or the model (model.to({x.dtype}))")


def check_step_input(x_t: torch.Tensor, features: int, name: str = "x_t") -> None:
    if x_t.dim() != 2 or x_t.shape[-1] != features:
        raise ValueError(f"{name}: expected shape [B, {features}], got {tuple(x_t.shape)}")


def check_time_constant(value, name: str) -> torch.Tensor:
    """Tensor of a positive time constant; ``tau <= 0`` or NaN is an error naming ``name``."""
    t = torch.as_tensor(value, dtype=torch.get_default_dtype())
    if torch.isnan(t).any() or (t <= 0).any():
        raise ValueError(f"{name}: time constants must be > 0, got {value!r}")
    return t


def glorot_uniform_(w: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Glorot/Xavier uniform, ``U(-a, a)`` with ``a = sqrt(6 / (fan_in + fan_out))``."""
    fan_out, fan_in = w.shape
    a = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return w.uniform_(-a, a, generator=generator)


def init_weight_(w: torch.Tensor, scheme: str, name: str = "init") -> torch.Tensor:
    """Initialise a 2-D weight in place: ``glorot_uniform``, ``orthogonal``, ``kaiming_uniform`` or ``zeros``."""
    with torch.no_grad():
        if scheme == "glorot_uniform":
            return glorot_uniform_(w)
        if scheme == "orthogonal":
            return nn.init.orthogonal_(w)
        if scheme == "kaiming_uniform":
            return nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        if scheme == "zeros":
            return w.zero_()
    raise ValueError(f"{name}: unknown initialisation '{scheme}'; expected glorot_uniform, orthogonal, kaiming_uniform or zeros")


class Cell(nn.Module):
    """Base class of the cell protocol. Subclasses set ``input_size``, ``output_size``,
    ``State`` (a NamedTuple class) and implement ``initial_state``, ``step``, ``output``
    and ``param_specs``; ``forward`` defaults to the ``step`` loop and ``stability_groups`` to the
    groups the parameter roles give.
    """

    State: type = NamedTuple
    input_size: int
    output_size: int

    # --- protocol -----------------------------------------------------------------
    def initial_state(self, batch: int, device=None, dtype=None):
        raise NotImplementedError

    def step(self, x_t: torch.Tensor, state):
        raise NotImplementedError

    def output(self, x_t: torch.Tensor, state) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def param_specs() -> dict[str, ParamSpec]:
        return {}

    def stability_groups(self) -> dict[str, list[nn.Parameter]]:
        """LSC groups from the roles: ``time`` = role time, ``depth`` = the others (multiplier on)."""
        if not self.param_specs():
            raise NotImplementedError(f"{type(self).__name__}: declares no parameter roles; define param_specs() "
                                      "(or override stability_groups())")
        return stability_groups_from_specs(self)

    def forward(self, x: torch.Tensor, state=None):
        return self.step_loop(x, state)

    # --- shared helpers -------------------------------------------------------------
    def step_loop(self, x: torch.Tensor, state=None):
        """Reference path: ``step`` applied for ``t = 0..T-1``."""
        check_sequence(x, self.input_size, f"{type(self).__name__} input")
        if state is None:
            state = self.initial_state(x.shape[1], x.device, x.dtype)
        outs = []
        for t in range(x.shape[0]):
            o, state = self.step(x[t], state)
            outs.append(o)
        return torch.stack(outs), state

    def state_vector(self, state) -> torch.Tensor:
        """Concatenate the state's fields into ``[B, S]`` (field order of ``State``)."""
        return torch.cat([s.reshape(s.shape[0], -1) for s in state], dim=-1)

    def state_from_vector(self, vec: torch.Tensor):
        """Inverse of :meth:`state_vector`."""
        sizes = self.state_sizes()
        if vec.shape[-1] != sum(sizes):
            raise ValueError(f"state vector: expected {sum(sizes)} entries, got {vec.shape[-1]}")
        return self.State(*torch.split(vec, sizes, dim=-1))

    def state_sizes(self) -> list[int]:
        """Width of each state field."""
        st = self.initial_state(1, device=torch.device("cpu"), dtype=torch.float32)
        return [s.reshape(1, -1).shape[-1] for s in st]

    @property
    def state_size(self) -> int:
        return sum(self.state_sizes())

    @property
    def spiking(self) -> bool:
        """True for cells whose output is spikes."""
        return False

    def detach_state(self, state):
        return type(state)(*(s.detach() for s in state))

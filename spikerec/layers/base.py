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
  clipped weight multiplier scales.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import NamedTuple

import torch
from torch import nn

__all__ = ["Cell", "check_sequence", "check_time_constant", "glorot_uniform_", "init_weight_", "value_checks"]

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
    and ``stability_groups``; ``forward`` defaults to the ``step`` loop.
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

    def stability_groups(self) -> dict[str, list[nn.Parameter]]:
        raise NotImplementedError

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

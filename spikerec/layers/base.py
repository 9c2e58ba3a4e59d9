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

import math
from typing import NamedTuple

import torch
from torch import nn

from ..errors import DataError

__all__ = ["Cell", "check_sequence", "match_input_dtype", "check_time_constant", "glorot_uniform_", "init_weight_"]


def check_sequence(x: torch.Tensor, features: int, name: str = "x", *, allow_complex: bool = False) -> None:
    """Raise a clear error unless ``x`` is a real ``[T, B, features]`` tensor without NaN."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape [T, B, {features}], got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name}: expected shape [T, B, {features}] (time-first), got {tuple(x.shape)}")
    if x.shape[-1] != features:
        raise ValueError(f"{name}: expected {features} features in the last dimension, got {x.shape[-1]}")
    if x.is_complex() and not allow_complex:
        raise TypeError(f"{name}: expected a real tensor, got dtype {x.dtype}")
    if x.is_floating_point() and torch.isnan(x).any():
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

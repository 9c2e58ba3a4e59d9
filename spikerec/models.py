"""Stacks of cells with a readout, built from a plain config.

A :class:`RecurrentStack` is a list of cells (any kinds, any order) followed by a
readout cell. Its ``step(x_t, states)`` advances every layer one time step, which is
what the stability module differentiates (time, depth, input and readout
Jacobians all come from this one function); ``forward`` runs each layer's fast
sequence path, layer after layer, and equals the ``step`` loop.

Config form (as in the TOML presets)::

    {"input_size": 64,
     "layers": [{"kind": "alif", "size": 128, "tau_adapt": 100.0}, {"kind": "lif", "size": 128}],
     "readout": {"size": 10, "tau": null, "mode": "mean"},
     "dropout": 0.0}
"""
from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from .layers.base import Cell, check_sequence, match_input_dtype, protocol_missing
from .layers.readout import READOUT_MODES, LeakyReadout, aggregate

__all__ = ["RecurrentStack", "build_model", "CELL_KINDS", "cell_class", "register_cell"]

# kind -> (module, class). Modules are imported on first use.
CELL_KINDS: dict[str, tuple[str, str]] = {
    "lif": ("spikerec.layers.lif", "LIF"),
    "alif": ("spikerec.layers.alif", "ALIF"),
    "lru": ("spikerec.layers.lru", "LRU"),
    "gru": ("spikerec.layers.gru", "GRU"),
    "wcrnn": ("spikerec.layers.wcrnn", "WCRNN"),
}


# what a stack needs of each layer (the Jacobian tools also need ``state_from_vector``)
_STACK_METHODS = ("initial_state", "step", "output", "state_vector", "stability_groups")


def register_cell(kind: str, module: str, cls: str) -> None:
    """Make a new cell kind available to :func:`build_model`."""
    CELL_KINDS[kind] = (module, cls)


def cell_class(kind: str) -> type[Cell]:
    if kind not in CELL_KINDS:
        raise ValueError(f"unknown layer kind '{kind}'; expected one of: {', '.join(sorted(CELL_KINDS))}")
    mod, cls = CELL_KINDS[kind]
    return getattr(importlib.import_module(mod), cls)


class RecurrentStack(nn.Module):
    """Cells in series plus a readout; time-first ``[T, B, C]``."""

    def __init__(self, cells: list[Cell], readout: Cell, *, readout_mode: str = "mean", dropout: float = 0.0):
        super().__init__()
        if not cells:
            raise ValueError("RecurrentStack: needs at least one cell")
        for i, c in enumerate(list(cells) + [readout]):
            missing = protocol_missing(c, _STACK_METHODS)
            if missing:
                raise TypeError(f"layer {i} ({type(c).__name__}) does not follow the cell protocol: missing {missing}")
        for i in range(1, len(cells)):
            if cells[i].input_size != cells[i - 1].output_size:
                raise ValueError(f"layer {i}: input_size {cells[i].input_size} != layer {i-1} output_size {cells[i-1].output_size}")
        if readout.input_size != cells[-1].output_size:
            raise ValueError(f"readout: input_size {readout.input_size} != last layer output_size {cells[-1].output_size}")
        if readout_mode not in READOUT_MODES:
            raise ValueError(f"readout_mode must be one of {READOUT_MODES}, got {readout_mode!r}")
        self.cells = nn.ModuleList(cells)
        self.readout = readout
        self.readout_mode = readout_mode
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        self.input_size = cells[0].input_size
        self.output_size = readout.output_size

    @property
    def layers(self) -> list[Cell]:
        """All cells including the readout, in order."""
        return list(self.cells) + [self.readout]

    def initial_state(self, batch: int, device=None, dtype=None) -> tuple:
        p = next(self.parameters())
        device = device if device is not None else p.device
        dtype = dtype if dtype is not None else p.dtype
        return tuple(c.initial_state(batch, device, dtype) for c in self.layers)

    def step(self, x_t: torch.Tensor, states: tuple):
        """One time step of every layer: returns ``(readout_t, new_states)``."""
        new = []
        h = x_t
        for c, s in zip(self.layers, states):
            h, s = c.step(h, s)
            new.append(s)
        return h, tuple(new)

    def forward(self, x: torch.Tensor, states: tuple | None = None, *, record: bool = False):
        """Run the whole sequence. Returns ``(y[T, B, K], final_states)``, plus the list of
        every hidden layer's output sequence when ``record``."""
        check_sequence(x, self.input_size, "model input")
        x = match_input_dtype(x, next(self.parameters()).dtype, "model input")
        if states is None:
            states = self.initial_state(x.shape[1], x.device, x.dtype)
        finals, hidden = [], []
        h = x
        for i, (c, s) in enumerate(zip(self.layers, states)):
            h, s = c(h, s)
            finals.append(s)
            if i < len(self.cells):
                if record:
                    hidden.append(h)
                if self.dropout is not None:
                    h = self.dropout(h)
        return (h, tuple(finals), hidden) if record else (h, tuple(finals))

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """Aggregate the readout sequence with ``readout_mode``."""
        return aggregate(y, self.readout_mode)

    def step_loop(self, x: torch.Tensor, states=None):
        """Reference path: :meth:`step` for every t."""
        x = match_input_dtype(x, next(self.parameters()).dtype, "model input")
        if states is None:
            states = self.initial_state(x.shape[1], x.device, x.dtype)
        ys = []
        for t in range(x.shape[0]):
            y, states = self.step(x[t], states)
            ys.append(y)
        return torch.stack(ys), states


def build_model(config: dict[str, Any]) -> RecurrentStack:
    """Build a :class:`RecurrentStack` from a config dict (see the module docstring)."""
    cfg = dict(config)
    if "input_size" not in cfg or "layers" not in cfg or "readout" not in cfg:
        raise ValueError("model config: needs 'input_size', 'layers' and 'readout'")
    cells = []
    width = int(cfg["input_size"])
    for i, spec in enumerate(cfg["layers"]):
        spec = dict(spec)
        kind = spec.pop("kind", None)
        size = spec.pop("size", None)
        if kind is None or size is None:
            raise ValueError(f"model config: layers[{i}] needs 'kind' and 'size', got {sorted(spec)}")
        cls = cell_class(kind)
        try:
            cell = cls(width, int(size), **spec)
        except TypeError as e:
            raise ValueError(f"model config: layers[{i}] ({kind}): {e}") from None
        cells.append(cell)
        width = cell.output_size
    ro = dict(cfg["readout"])
    mode = ro.pop("mode", "mean")
    size = ro.pop("size", None)
    if size is None:
        raise ValueError("model config: readout needs 'size' (number of classes/outputs)")
    readout = LeakyReadout(width, int(size), **ro)
    return RecurrentStack(cells, readout, readout_mode=mode, dropout=float(cfg.get("dropout", 0.0)))

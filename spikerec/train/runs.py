"""Run folders and loading a trained model.

A run folder holds::

    config.json          the resolved config (its "model" section is the build_model dict)
    model.safetensors    final weights            model.json   metadata (sizes, data, metrics)
    metrics.jsonl        every record (step, epoch, lsc, test)   metrics.csv  one row per epoch
    checkpoints/         step-XXXXXXXX/{state.safetensors, state.json}, latest.json
    curves.png, raster.png, lsc.json, lsc.png (when LSC ran), summary.json
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..errors import CheckpointError, ConfigError
from ..lru_model import LRUModel
from ..models import RecurrentStack, build_model
from .checkpoint import atomic_write_json, load_checkpoint, save_tensors_atomic

__all__ = ["build_from_config", "new_run_dir", "write_config", "read_config", "save_model", "load_model", "read_weights", "load_weights", "RunError"]


class RunError(CheckpointError):
    """The folder given as a run is not one (``config.json`` missing or unresolved): a bad
    command-line argument, exit code 2. Files of a real run that cannot be used raise
    :class:`~spikerec.errors.CheckpointError` (exit code 5)."""

    exit_code = 2


def build_from_config(model_cfg: dict):
    """``build_model`` for stacks; ``kind = "lru_deep"`` builds :class:`spikerec.lru_model.LRUModel`."""
    m = dict(model_cfg)
    if m.get("kind", "stack") == "lru_deep":
        m.pop("kind")
        return LRUModel(int(m.pop("input_size")), int(m.pop("output_size")), **m)
    m.pop("kind", None)
    return build_model(m)


def new_run_dir(preset: str, out: str | os.PathLike | None = None, root: str | os.PathLike = "runs") -> Path:
    """``out`` if given, else ``runs/<preset>-<YYYYmmdd-HHMMSS>`` (suffixed if it exists)."""
    if out is not None:
        p = Path(out)
    else:
        base = Path(root) / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        p, i = base, 1
        while p.exists():
            p, i = Path(f"{base}-{i}"), i + 1
    p.mkdir(parents=True, exist_ok=True)
    return p


def write_config(run_dir, cfg: dict) -> None:
    atomic_write_json(Path(run_dir) / "config.json", cfg)


def read_config(run_dir) -> dict:
    p = Path(run_dir) / "config.json"
    if not p.is_file():
        raise RunError(f"'{run_dir}' is not a spikerec run folder: {p.name} is missing "
                       f"(runs are made by 'spikerec train', default folder runs/<preset>-<time>)")
    try:
        with open(p) as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"'{p}' is not valid JSON ({e}); restore it from a copy or re-run 'spikerec train'") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"'{p}' must hold a JSON object (the resolved config), got {type(cfg).__name__}")
    return cfg


def _state_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items()}


def save_model(run_dir, model: RecurrentStack, cfg: dict, extra: dict | None = None) -> Path:
    """``model.safetensors`` (weights) and ``model.json`` (what built them), both atomic."""
    run_dir = Path(run_dir)
    path = run_dir / "model.safetensors"
    save_tensors_atomic(path, _state_tensors(model), metadata={"format": "spikerec-model", "version": "1"})
    meta = {
        "format": "spikerec-model", "version": 1, "model": cfg["model"], "data": cfg.get("data", {}),
        "preset": cfg.get("preset", ""), "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "layers": [type(c).__name__ for c in getattr(model, "layers", [model])], "torch": torch.__version__,
        **(extra or {}),
    }
    atomic_write_json(run_dir / "model.json", meta)
    return path


def load_model(run_dir, *, map_location="cpu", checkpoint: bool = False):
    """Rebuild the model of a run from ``config.json`` and load ``model.safetensors``: a
    :class:`~spikerec.models.RecurrentStack` (or an ``LRUModel`` for ``kind = "lru_deep"``).

    With ``checkpoint=True`` (or when the run has no final weights yet) the weights of the
    newest checkpoint are loaded instead.
    """
    run_dir = Path(run_dir)
    cfg = read_config(run_dir)
    if cfg.get("model", {}).get("input_size", "auto") == "auto":
        raise RunError(f"'{run_dir}/config.json' has no resolved model input size")
    model = build_from_config(cfg["model"])
    weights = run_dir / "model.safetensors"
    if checkpoint or not weights.is_file():
        if not (run_dir / "checkpoints").is_dir():
            raise RunError(f"'{run_dir}' has neither model.safetensors nor checkpoints/ (the run did not finish a step)")
        tensors, _ = load_checkpoint(run_dir / "checkpoints")
        state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    else:
        state = read_weights(weights)
    load_weights(model, state, weights, run_dir / "config.json")
    return model.to(map_location)


def read_weights(path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; a truncated, pickled or otherwise unreadable file raises
    :class:`~spikerec.errors.CheckpointError` naming it (nothing is ever unpickled)."""
    path = Path(path)
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"'{path}' is missing") from None
    except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad header
        raise CheckpointError(f"'{path}' is not a readable safetensors file ({type(e).__name__}: {e}); it is "
                              f"truncated or in another format (spikerec never loads pickles). Restore the file "
                              f"or re-run the training") from None


def load_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], weights, config) -> None:
    """``model.load_state_dict(state)`` with one clear error naming the file and the first tensor
    whose name or shape does not match the model that ``config`` describes."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise CheckpointError(f"'{weights}' does not match the model of '{config}': missing tensors {missing[:4]}, "
                              f"unexpected tensors {unexpected[:4]} (was the config edited after training?)")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(f"'{weights}': tensor '{k}' has shape {list(state[k].shape)} but the model of "
                                  f"'{config}' needs {list(v.shape)} (a layer size in the config differs from the "
                                  f"trained one; restore config.json or retrain)")
    model.load_state_dict(state)

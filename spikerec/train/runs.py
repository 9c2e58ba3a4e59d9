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

from ..models import RecurrentStack, build_model
from .checkpoint import atomic_write_json, save_tensors_atomic

__all__ = ["build_from_config", "new_run_dir", "write_config", "read_config", "save_model", "load_model", "RunError"]


class RunError(FileNotFoundError):
    """A run folder that is missing or incomplete (names the file)."""


def build_from_config(model_cfg: dict):
    """``build_model`` for stacks; ``kind = "lru_deep"`` builds :class:`spikerec.lru_model.LRUModel`."""
    m = dict(model_cfg)
    if m.get("kind", "stack") == "lru_deep":
        from ..lru_model import LRUModel

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
    with open(p) as f:
        return json.load(f)


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
        from .checkpoint import load_checkpoint

        if not (run_dir / "checkpoints").is_dir():
            raise RunError(f"'{run_dir}' has neither model.safetensors nor checkpoints/ (the run did not finish a step)")
        tensors, _ = load_checkpoint(run_dir / "checkpoints")
        state = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    else:
        state = load_file(str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RunError(f"'{weights}': weights do not match config.json's model (missing {missing}, unexpected {unexpected})")
    return model.to(map_location)

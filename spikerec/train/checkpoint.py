"""Checkpoints: tensors in safetensors, everything else in JSON, written atomically.

A checkpoint is a folder ``checkpoints/step-XXXXXXXX/`` with ``state.safetensors``
(model weights ``model/*``, best weights ``best/*``, optimiser moments ``optim/<i>/<name>``,
RNG states ``rng/*``) and ``state.json`` (step, epoch, optimiser hyper-parameters, scalar
optimiser state, scheduler step, numpy/python RNG, metrics file offsets, ...). Both files
are written into a hidden temporary folder which is then renamed into place, and
``checkpoints/latest.json`` (itself replaced atomically) names the newest complete one; an
interrupted write therefore never touches the previous checkpoint. Nothing is unpickled.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path, atomic_write_text
from ..errors import CheckpointError

__all__ = ["atomic_write_text", "atomic_write_json", "save_tensors_atomic", "save_checkpoint", "load_checkpoint",
           "latest_checkpoint", "pack_optimizer", "unpack_optimizer", "get_rng_state", "set_rng_state",
           "CheckpointError", "checkpoints_newest_first", "load_newest_intact", "settle_checkpoints"]


def atomic_write_json(path, obj: Any) -> None:
    """JSON (numpy and one-element tensors allowed) written atomically and durably."""
    atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, torch.Tensor) and o.numel() == 1:
        return o.item()
    if isinstance(o, (tuple, set)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def save_tensors_atomic(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """``safetensors`` file written to a temporary name and renamed."""
    with atomic_path(path) as tmp:
        save_file(_contiguous(tensors), str(tmp), metadata=metadata)


# --- optimiser and RNG state ------------------------------------------------------------------
def pack_optimizer(opt: torch.optim.Optimizer, prefix: str = "optim") -> tuple[dict, dict]:
    """``opt.state_dict()`` as ``(tensors, json)``: tensor entries by name, the rest as JSON."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{prefix}/{idx}/{k}"] = v
            else:
                scalars.setdefault(str(idx), {})[k] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars,
                     "indices": [int(i) for i in sd["state"]]}


def unpack_optimizer(opt: torch.optim.Optimizer, tensors: dict, meta: dict, prefix: str = "optim") -> None:
    state: dict[int, dict] = {int(i): {} for i in meta["indices"]}
    for key, v in tensors.items():
        if not key.startswith(prefix + "/"):
            continue
        _, idx, name = key.split("/", 2)
        state.setdefault(int(idx), {})[name] = v.clone()  # never alias the caller's tensors
    for idx, sc in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(sc)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    opt.load_state_dict({"state": state, "param_groups": groups})


def get_rng_state() -> tuple[dict, dict]:
    """Torch (CPU, CUDA), numpy and Python RNG states as ``(tensors, json)``."""
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng/cuda/{i}"] = s
    name, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["rng/numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    meta = {"numpy": [name, int(pos), int(has_gauss), float(cached)], "python": _py_state()}
    return tensors, meta


def _py_state():
    v, st, gauss = random.getstate()
    return [v, list(st), gauss]


def set_rng_state(tensors: dict, meta: dict) -> None:
    torch.set_rng_state(tensors["rng/torch"])
    cuda = sorted(k for k in tensors if k.startswith("rng/cuda/"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    name, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((name, tensors["rng/numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    v, st, gauss = meta["python"]
    random.setstate((v, tuple(st), gauss))


# --- checkpoint folders ------------------------------------------------------------------------
def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def save_checkpoint(root, step: int, tensors: dict[str, torch.Tensor], meta: dict, keep: int = 2) -> Path:
    """Write ``root/step-XXXXXXXX`` atomically, point ``root/latest.json`` at it, prune to ``keep``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-step-", dir=root))
    final = _step_dir(root, step)
    try:
        save_file(_contiguous(tensors), str(tmp / "state.safetensors"))
        with open(tmp / "state.json", "w") as f:
            json.dump({**meta, "step": int(step)}, f, indent=1, default=_json_default)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    settle_checkpoints(root, final, keep)
    return final


def settle_checkpoints(root, newest: Path, keep: int) -> None:
    """Point ``latest.json`` at ``newest`` and remove the step folders older than it beyond the
    ``keep`` newest (newer ones are left alone). A resumed run calls it with the checkpoint it
    resumed from: a write that a kill interrupted after the rename is finished."""
    root, newest = Path(root), Path(newest)
    pointer = {"checkpoint": newest.name, "step": int(newest.name.split("-")[-1])}
    try:
        current = json.loads((root / "latest.json").read_text())
    except (OSError, ValueError):
        current = None
    if current != pointer:
        atomic_write_json(root / "latest.json", pointer)
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name <= newest.name)
    for old in done[: max(0, len(done) - int(keep))]:
        shutil.rmtree(old, ignore_errors=True)


def _readable(d: Path) -> bool:
    return (d / "state.safetensors").is_file() and (d / "state.json").is_file()


def latest_checkpoint(root) -> Path | None:
    """The newest complete checkpoint folder under ``root`` (``latest.json``, else the highest step)."""
    root = Path(root)
    if not root.is_dir():
        return None
    try:
        with open(root / "latest.json") as f:
            d = root / json.load(f)["checkpoint"]
        if _readable(d):
            return d
    except (OSError, ValueError, KeyError):
        pass
    done = sorted(p for p in root.glob("step-*") if p.is_dir() and _readable(p))
    return done[-1] if done else None


def checkpoints_newest_first(root) -> list[Path]:
    """Every complete-looking ``step-*`` folder under ``root``, highest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if p.is_dir() and _readable(p)), reverse=True)


def load_newest_intact(root, check=None) -> tuple[dict[str, torch.Tensor], dict, list[tuple[Path, str]]]:
    """The newest checkpoint under ``root`` that can be read (and passes ``check(tensors, meta)``,
    which raises on a bad one): ``(tensors, meta, skipped)`` with ``skipped`` the newer
    ``(folder, reason)`` pairs that could not be used. Raises :class:`CheckpointError` when none can."""
    skipped: list[tuple[Path, str]] = []
    for d in checkpoints_newest_first(root):
        try:
            tensors, meta = load_checkpoint(d)
            if check is not None:
                check(tensors, meta)
        except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: fall back to an older one
            skipped.append((d, str(e).splitlines()[0][:200]))
            continue
        return tensors, meta, skipped
    why = "; ".join(f"{p.name}: {r}" for p, r in skipped) or "none found"
    raise CheckpointError(f"no intact checkpoint in '{root}' ({why})")


def load_checkpoint(path) -> tuple[dict[str, torch.Tensor], dict]:
    """``(tensors, meta)`` of a checkpoint folder, or of the newest one under a ``checkpoints/`` folder."""
    path = Path(path)
    if not _readable(path):
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"no complete checkpoint in '{path}' (expected step-*/state.safetensors + state.json)")
        path = found
    try:
        tensors = load_file(str(path / "state.safetensors"))
        with open(path / "state.json") as f:
            meta = json.load(f)
    except Exception as e:  # noqa: BLE001 - report any reader error with the folder name
        raise CheckpointError(f"checkpoint '{path}' cannot be read: {e}") from None
    meta["path"] = str(path)
    return tensors, meta

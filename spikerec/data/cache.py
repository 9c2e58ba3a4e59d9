"""On-disk cache of binned data: safetensors tensors + JSON metadata, written atomically.

The cache name holds a hash of everything the result depends on (the recipe, the source
file's name, size and modification time, and ``CACHE_VERSION``), so a changed recipe or a
replaced file never hits a stale entry. A failed write leaves no file behind.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from .fileio import atomic_path

__all__ = ["CACHE_VERSION", "cache_key", "save_cache", "load_cache"]

CACHE_VERSION = 3  # 2: exact integer-microsecond binning; 3: the stored value is the time (no edge snapping)


def cache_key(recipe: dict, source: str | os.PathLike | None) -> str:
    meta = {"recipe": recipe, "version": CACHE_VERSION}
    if source is not None:
        st = Path(source).stat()
        meta["source"] = [Path(source).name, st.st_size, st.st_mtime_ns]
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:20]


def save_cache(path: str | os.PathLike, tensors: dict[str, torch.Tensor], meta: dict) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                  metadata={"spikerec": json.dumps(meta, sort_keys=True, default=str)})
    return path


def load_cache(path: str | os.PathLike):
    """``(tensors, meta)`` or ``None`` when absent or unreadable (a broken entry is ignored and rebuilt)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("spikerec", "{}"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception:  # corrupt cache: treat as a miss
        return None
    return tensors, meta

"""Atomic file writes: write to a temporary file in the target folder, then rename.

A crash or an exception mid-write never leaves a partial file under the final name, and the
previous file (a checkpoint, a cache entry, a report) stays readable until the rename.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_json", "atomic_save_figure"]


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path next to ``path``; rename it onto ``path`` only if the block
    succeeds, otherwise remove it. The file gets the usual mode (``0o666`` less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` durably (flushed and fsynced before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent))


def atomic_save_figure(fig, path: str | os.PathLike, **savefig_kwargs) -> Path:
    """``fig.savefig`` to ``path`` atomically (PNG unless ``format`` is given)."""
    savefig_kwargs.setdefault("format", "png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **savefig_kwargs)
    return Path(path)

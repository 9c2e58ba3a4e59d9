"""Small file helpers: atomic writes, checksums, IDX (MNIST) files."""
from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np

from ..atomic import atomic_path  # noqa: F401  (re-exported)
from .home import DataError

__all__ = ["atomic_path", "file_checksum", "read_idx", "write_idx"]


def file_checksum(path: str | os.PathLike, algo: str = "sha256", chunk: int = 1 << 22) -> str:
    """Hex checksum of a file (``sha256`` or ``md5``)."""
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or ``.gz``): 2 zero bytes, a type byte, ``ndim``, ``ndim`` big-endian
    int32 sizes, then the data in C order (LeCun's MNIST format)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read IDX file ({e}); the file is truncated or not gzip/IDX") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic bytes {data[:4]!r})")
    ndim = data[3]
    head = 4 + 4 * ndim
    if len(data) < head:
        raise DataError(f"{path}: IDX header truncated")
    shape = tuple(int(v) for v in np.frombuffer(data, ">i4", ndim, 4))
    dt = np.dtype(_IDX_TYPES[data[2]])
    n = int(np.prod(shape)) if shape else 1
    if len(data) - head != n * dt.itemsize:
        raise DataError(f"{path}: IDX body has {len(data) - head} bytes, expected {n * dt.itemsize} for shape {shape}")
    return np.frombuffer(data, dt, n, head).reshape(shape).astype(dt.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (``.gz`` compresses); atomic."""
    path = Path(path)
    a = np.asarray(array)
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int16): 0x0B,
             np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D, np.dtype(np.float64): 0x0E}
    if a.dtype not in codes:
        raise ValueError(f"write_idx: unsupported dtype {a.dtype}")
    head = bytes([0, 0, codes[a.dtype], a.ndim]) + np.asarray(a.shape, ">i4").tobytes()
    body = a.astype(a.dtype.newbyteorder(">")).tobytes()
    with atomic_path(path) as tmp:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wb") as f:
            f.write(head + body)
    return path

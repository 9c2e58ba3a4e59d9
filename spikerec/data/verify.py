"""``spikerec datasets --verify``: open every data file found and check its layout.

A file that merely has the right name is not "available": an SHD (or SSC) file must open as HDF5 and
hold the SHD layout (``/spikes/times``, ``/spikes/units``, ``/labels``, ...; checked by
:func:`spikerec.data.shd_file.read_shd`) with at least one sample; a compressed copy must
decompress completely (its CRC checks); MNIST IDX files must hold ``[N, 28, 28]`` images or
``[N]`` labels.
"""
from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

from .fileio import read_idx
from .home import DataError, DatasetMissingError
from .shd_file import HEIDELBERG_SETS, read_shd

__all__ = ["verify_layout"]


def _stream_gzip(path: Path) -> int:
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += len(chunk)
    return n


def verify_layout(kind: str, path) -> tuple[bool, str]:
    """``(ok, words)`` for one file of data set ``kind`` (``"shd"``, ``"ssc"`` or ``"mnist"``); never raises
    for a bad file (the words say what is wrong and name the file)."""
    path = Path(path)
    try:
        if kind in HEIDELBERG_SETS:
            hs = HEIDELBERG_SETS[kind]
            if path.suffix == ".gz":
                return True, f"{path.name}: gzip complete ({_stream_gzip(path)} bytes unpacked)"
            if path.suffix == ".zip":
                with zipfile.ZipFile(path) as z:
                    bad = z.testzip()
                if bad is not None:
                    return False, f"{path}: zip member {bad} is corrupt; delete the file and download again"
                return True, f"{path.name}: zip complete"
            arr = read_shd(path, hs=hs)
            if len(arr.labels) == 0:
                return False, f"{path}: holds 0 samples; an {hs.title} file holds thousands: delete it and download again"
            return True, f"{path.name}: {hs.title} layout ok, {len(arr.labels)} samples, {arr.times.size} spikes"
        if kind == "mnist":
            a = read_idx(path)
            want = 1 if "labels" in path.name else 3
            if a.ndim != want or len(a) == 0 or (want == 3 and a.shape[1:] != (28, 28)):
                return False, (f"{path}: expected {'labels [N]' if want == 1 else 'images [N, 28, 28]'}, "
                               f"got shape {tuple(a.shape)}")
            return True, f"{path.name}: IDX layout ok, shape {tuple(a.shape)}"
        raise ValueError(f"verify_layout: unknown data set kind {kind!r} (expected 'shd', 'ssc' or 'mnist')")
    except (DataError, DatasetMissingError, OSError, EOFError, zipfile.BadZipFile) as e:
        return False, f"{path}: {str(e).removeprefix(str(path) + ': ')}"

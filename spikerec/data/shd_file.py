"""Finding, unpacking, validating and reading the Spiking Heidelberg Digits HDF5 files.

Layout (Cramer et al. 2022): ``/spikes/times`` (ragged float, seconds), ``/spikes/units``
(ragged int, 0..699), ``/labels`` (0..19), ``/extra/speaker``, ``/extra/keys`` (class names),
``/extra/meta_info/{gender, age, body_height}``. Train 8156 and test 2264 samples.
"""
from __future__ import annotations

import gzip
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .fileio import atomic_path, file_checksum
from .home import DataError, DatasetMissingError, dataset_dir

__all__ = ["SHD_URL", "SHD_ZIP_MD5", "SHD_SIZES", "find_shd", "read_shd", "ShdArrays", "shd_missing_message"]

SHD_URL = "https://zenkelab.org/datasets/"
SHD_MIRRORS = ("https://compneuro.net/datasets/", "https://ieee-dataport.org/open-access/heidelberg-spiking-datasets")
# md5 of the zip files at SHD_URL, as checked by tonic.datasets.SHD.
SHD_ZIP_MD5 = {"shd_train.h5.zip": "f3252aeb598ac776c1b526422d90eecb", "shd_test.h5.zip": "1503a5064faa34311c398fb0a1ed0a6f"}
SHD_SIZES = {"train": 8156, "test": 2264}
N_UNITS, N_CLASSES = 700, 20


def _dirs(root) -> list[Path]:
    base = dataset_dir("shd", root)
    return [base, base / "SHD"]  # tonic unpacks into <save_to>/SHD


def shd_missing_message(part: str, root=None) -> str:
    base = dataset_dir("shd", root)
    return (f"SHD {part} file not found: looked for shd_{part}.h5 (or .h5.gz / .h5.zip) in {base} and {base / 'SHD'}.\n"
            f"  Either pass download=True (needs internet; uses tonic), e.g. "
            f"spikerec.data.get_dataset('shd', '{part}', download=True),\n"
            f"  or download shd_{part}.h5.gz (or .h5.zip) from {SHD_URL} (mirrors: {', '.join(SHD_MIRRORS)}) "
            f"into {base}/,\n  or set SPIKEREC_DATA to a folder holding shd/. Licence: CC BY 4.0.")


def _unpack(src: Path, dst: Path, verify: bool) -> Path:
    if src.suffix == ".zip":
        if verify and src.name in SHD_ZIP_MD5:
            got = file_checksum(src, "md5")
            if got != SHD_ZIP_MD5[src.name]:
                raise DataError(f"{src}: md5 {got} differs from the published {SHD_ZIP_MD5[src.name]}; "
                                f"the download is incomplete or corrupt: delete it and download again")
        try:
            with zipfile.ZipFile(src) as z:
                member = next((m for m in z.namelist() if m.endswith(dst.name)), None)
                if member is None:
                    raise DataError(f"{src}: the archive holds no {dst.name} (members: {z.namelist()[:5]})")
                with atomic_path(dst) as tmp, z.open(member) as fi, open(tmp, "wb") as fo:
                    shutil.copyfileobj(fi, fo, 1 << 22)
        except zipfile.BadZipFile as e:
            raise DataError(f"{src}: not a valid zip file ({e}); delete it and download again") from None
    else:
        try:
            with atomic_path(dst) as tmp, gzip.open(src, "rb") as fi, open(tmp, "wb") as fo:
                shutil.copyfileobj(fi, fo, 1 << 22)
        except (OSError, EOFError) as e:
            raise DataError(f"{src}: cannot decompress ({e}); the download is truncated or corrupt: "
                            f"delete it and download again") from None
    return dst


def find_shd(part: str, root=None, *, download: bool = False, verify: bool = True) -> Path:
    """Path of ``shd_{part}.h5`` (``part`` = train/test), unpacking ``.gz``/``.zip`` next to it
    on first use and downloading through tonic when ``download``."""
    name = f"shd_{part}.h5"
    for d in _dirs(root):
        if (d / name).is_file():
            return d / name
    for d in _dirs(root):
        for ext in (".gz", ".zip"):
            if (d / (name + ext)).is_file():
                return _unpack(d / (name + ext), d / name, verify)
    if download:
        base = dataset_dir("shd", root)
        base.mkdir(parents=True, exist_ok=True)
        try:
            import tonic

            tonic.datasets.SHD(save_to=str(base), train=(part == "train"))
        except Exception as e:  # network errors come in many types
            raise DatasetMissingError(f"SHD download failed ({type(e).__name__}: {e}).\n{shd_missing_message(part, root)}") from None
        return find_shd(part, root, download=False, verify=verify)
    raise DatasetMissingError(shd_missing_message(part, root))


@dataclass
class ShdArrays:
    """One SHD file in memory: concatenated spikes and per-sample arrays."""

    times: np.ndarray      # [S] seconds, in the file's float dtype
    units: np.ndarray      # [S] unit indices, in the file's int dtype
    lengths: np.ndarray    # [N] int64
    labels: np.ndarray     # [N] int64
    speakers: np.ndarray | None  # [N] int64
    keys: list[str]
    path: Path

    def sample(self, i: int):
        o = np.concatenate([[0], np.cumsum(self.lengths)])
        return self.times[o[i]:o[i + 1]], self.units[o[i]:o[i + 1]]


def _decode(k) -> str:
    return k.decode("utf-8", "replace") if isinstance(k, (bytes, np.bytes_)) else str(k)


def read_shd(path, *, n_units: int = N_UNITS, n_classes: int = N_CLASSES) -> ShdArrays:
    """Read and validate an SHD-format file; every problem raises :class:`DataError` naming the file."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise DatasetMissingError(f"{path}: no such file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"{path}: not a readable HDF5 file ({e}); it is truncated or corrupt: "
                        f"delete it and download again") from None
    with f:
        missing = [k for k in ("spikes/times", "spikes/units", "labels") if k not in f]
        if missing:
            raise DataError(f"{path}: not in the SHD layout: missing {missing}; expected /spikes/times, "
                            f"/spikes/units, /labels, /extra/speaker, /extra/keys; found top-level keys {sorted(f.keys())}")
        try:
            keys = [_decode(k) for k in f["extra/keys"][()]] if "extra/keys" in f else []
            t_obj, u_obj = f["spikes/times"][()], f["spikes/units"][()]
            labels = np.asarray(f["labels"][()])
            speakers = np.asarray(f["extra/speaker"][()]).astype(np.int64) if "extra/speaker" in f else None
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise DataError(f"{path}: cannot read the SHD arrays ({type(e).__name__}: {e}); the file is truncated "
                            f"or corrupt: delete it and download again") from None
    if keys and len(keys) != n_classes:
        hint = " (this looks like the Spiking Speech Commands (SSC) file, which has 35 classes)" if len(keys) == 35 else ""
        raise DataError(f"{path}: /extra/keys lists {len(keys)} classes, SHD has {n_classes}{hint}")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: /labels must be a 1-d integer array, got {labels.dtype} {labels.shape}")
    n = len(labels)
    if n == 0:
        raise DataError(f"{path}: the file holds no samples (0 labels, {len(t_obj)} spike-time rows); an SHD file "
                        f"has {SHD_SIZES['train']} (train) or {SHD_SIZES['test']} (test): it was written incompletely "
                        f"or is not the data set file: delete it and download again")
    if len(t_obj) != n or len(u_obj) != n:
        raise DataError(f"{path}: {n} labels but {len(t_obj)} spike-time rows and {len(u_obj)} unit rows")
    if speakers is not None and len(speakers) != n:
        raise DataError(f"{path}: {n} labels but {len(speakers)} speakers")
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if bad.size:
        hint = " (labels up to 34 suggest the SSC file)" if labels.max() < 35 and labels.max() >= n_classes else ""
        raise DataError(f"{path}: {bad.size} labels outside 0..{n_classes - 1}, first at sample {bad[0]} "
                        f"(label {labels[bad[0]]}){hint}")
    if t_obj.dtype != object:  # fixed-size 2-d arrays instead of ragged rows
        t_obj, u_obj = list(t_obj), list(u_obj)
    lengths = np.fromiter((len(t) for t in t_obj), np.int64, n)
    ulen = np.fromiter((len(u) for u in u_obj), np.int64, n)
    if (lengths != ulen).any():
        i = int(np.flatnonzero(lengths != ulen)[0])
        raise DataError(f"{path}: sample {i} has {lengths[i]} spike times but {ulen[i]} units")
    times = np.concatenate([np.asarray(t) for t in t_obj]) if n else np.zeros(0)  # stored dtype (float16 in SHD)
    if times.size and not np.issubdtype(times.dtype, np.floating):
        times = times.astype(np.float64)
    units_raw = np.concatenate([np.asarray(u) for u in u_obj]) if n else np.zeros(0, np.int64)
    if units_raw.size and not np.issubdtype(units_raw.dtype, np.integer):
        raise DataError(f"{path}: /spikes/units must hold integers, got {units_raw.dtype}")
    units = units_raw if units_raw.size else units_raw.astype(np.int64)
    sample_of = lambda j: int(np.searchsorted(np.cumsum(lengths), j, side="right"))  # noqa: E731
    badu = np.flatnonzero((units < 0) | (units >= n_units))
    if badu.size:
        raise DataError(f"{path}: unit index {units[badu[0]]} in sample {sample_of(badu[0])} is outside 0..{n_units - 1} "
                        f"({badu.size} such spikes); SHD has {n_units} channels")
    badt = np.flatnonzero(~np.isfinite(times) | (times < 0))
    if badt.size:
        raise DataError(f"{path}: spike time {times[badt[0]]} in sample {sample_of(badt[0])} is not a finite "
                        f"non-negative number of seconds ({badt.size} such spikes)")
    return ShdArrays(times, units, lengths, labels.astype(np.int64), speakers, keys, path)

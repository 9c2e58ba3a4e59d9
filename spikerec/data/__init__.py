"""Data sets for spikerec; everything comes out time-first ``[T, B, C]``.

``get_dataset(name, split, **options)`` with names ``digits`` (embedded offline default),
``shd``, ``slmnist``, ``smnist``, ``psmnist``, ``copy``, ``adding``, ``teacher_student`` and
splits ``train``/``valid``/``test``; ``dataset_info(name, **options)``; ``collate_time_first``;
``make_loader(dataset, batch_size, shuffle, seed, drop_last=False)``. See ``docs/data.md``.
"""
from .core import ArrayDataset, LatencyDataset, SparseSpikeDataset, collate_time_first, make_loader
from .home import DataError, DatasetMissingError, data_home
from .registry import DATASETS, dataset_info, dataset_options, get_dataset

__all__ = [
    "get_dataset", "dataset_info", "dataset_options", "collate_time_first", "make_loader", "DATASETS",
    "data_home", "DataError", "DatasetMissingError", "ArrayDataset", "LatencyDataset", "SparseSpikeDataset",
]

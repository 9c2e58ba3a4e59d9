"""Training: presets and configs, the trainer (LSC phase, BPTT or online), run folders,
checkpoints, metrics, plots and data-parallel launch (the commands are in :mod:`spikerec.cli`).
See ``docs/training.md``.

``Trainer(cfg_or_preset, run_dir).fit()`` trains from Python; data sets of your own go in with
:func:`spikerec.data.register_dataset`."""
from .config import ConfigError, list_presets, load_config, resolve_sizes  # noqa: F401
from .runs import load_model  # noqa: F401
from .trainer import Trainer  # noqa: F401

__all__ = ["load_config", "list_presets", "ConfigError", "load_model", "resolve_sizes", "Trainer"]

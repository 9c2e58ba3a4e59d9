"""Training: presets and configs, the trainer (LSC phase, BPTT or online), run folders,
checkpoints, metrics, plots and data-parallel launch (the commands are in :mod:`spikerec.cli`).
See ``docs/training.md``."""
from .config import ConfigError, list_presets, load_config  # noqa: F401
from .runs import load_model  # noqa: F401

__all__ = ["load_config", "list_presets", "ConfigError", "load_model"]

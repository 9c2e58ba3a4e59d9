"""Training: presets and configs, the trainer (LSC phase, BPTT or online), run folders,
checkpoints, metrics, plots and data-parallel launch (the commands are in :mod:`spikerec.cli`).
See ``docs/training.md``.

``Trainer(cfg_or_preset, run_dir).fit()`` trains from Python; data sets of your own go in with
:func:`spikerec.data.register_dataset`."""
import importlib

# public name -> the submodule that defines it, imported on first access (``spikerec train --list``
# reads the presets without importing torch)
_LAZY = {"load_config": "config", "list_presets": "presets", "ConfigError": "config", "load_model": "runs",
         "resolve_sizes": "config", "Trainer": "trainer"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value

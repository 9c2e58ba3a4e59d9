"""spikerec: spiking and recurrent neural networks for neuromorphic research.

Time-first ``[T, B, C]`` everywhere; every cell follows the protocol of
:mod:`spikerec.layers.base`.

``import spikerec`` itself is light (torch is imported on first use of a name below), so that
``spikerec --help`` answers at once.
"""
import importlib

__version__ = "0.1.0"

# public name -> the module that defines it (imported on first access)
_LAZY = {
    "surrogate": "spikerec.surrogate",
    "LIF": "spikerec.layers",
    "ALIF": "spikerec.layers",
    "LeakyReadout": "spikerec.layers",
    "RecurrentStack": "spikerec.models",
    "build_model": "spikerec.models",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'spikerec' has no attribute '{name}'")
    module = importlib.import_module(_LAZY[name])
    value = module if module.__name__ == f"spikerec.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

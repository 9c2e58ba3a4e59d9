"""Fused kernels, one file per kernel, named for what it runs.

* ``lif_sequence``, ``alif_sequence``: the LIF/CUBA and ALIF time loops with hand-written
  backwards (torch; the CUDA path), ``lif_sequence_numba``: the compiled CPU kernel of the
  feed-forward LIF loop;
* ``scan_triton`` (CUDA; on the CPU under ``TRITON_INTERPRET=1`` for tests) and ``scan_numba``
  (compiled CPU) for :func:`spikerec.scan.linear_scan`.

Each has a plain-torch twin (the fallback when numba, Triton or CUDA is missing) and tests that
compare them on fresh random inputs. numba and Triton are imported on first use only. The numba
kernels are serial (no thread pool): a process that ran them can fork (DataLoader workers,
forked servers) and the child runs them again.
"""
from __future__ import annotations

import functools

__all__ = ["triton_available"]

@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when ``triton`` imports (kernels then run on CUDA tensors, or on CPU tensors
    when ``TRITON_INTERPRET=1`` was set before the import)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install without a driver
        return False
    return True

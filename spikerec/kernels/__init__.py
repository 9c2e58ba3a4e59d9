"""Fused kernels, one file per kernel, named for what it runs.

* ``lif_sequence``, ``alif_sequence``: the LIF/CUBA and ALIF time loops with hand-written
  backwards (torch; the CUDA path), ``lif_sequence_numba``: the compiled CPU kernel of the
  feed-forward LIF loop;
* ``scan_triton`` (CUDA; on the CPU under ``TRITON_INTERPRET=1`` for tests) and ``scan_numba``
  (compiled CPU) for :func:`spikerec.scan.linear_scan`.

Each has a plain-torch twin (the fallback when numba, Triton or CUDA is missing) and tests that
compare them on fresh random inputs. numba and Triton are imported on first use only.
"""
from __future__ import annotations

import functools

__all__ = ["triton_available", "forksafe_numba", "numba_usable_here"]

_NUMBA_PID: int | None = None  # the process that started numba's parallel thread pool


def numba_usable_here() -> bool:
    """False in a process forked after its parent ran a parallel numba kernel: numba's thread pools
    do not survive a fork (the child dies or hangs), so such a child takes the torch path."""
    import os

    return _NUMBA_PID is None or _NUMBA_PID == os.getpid()


def forksafe_numba():
    """``numba`` with a fork-safe threading layer for its parallel (``prange``) kernels.

    With GNU OpenMP (numba's default ``omp`` layer on Linux) a process that forks after a
    parallel kernel ran kills the child on its first parallel kernel ("fork() called from a
    process already using GNU OpenMP"): DataLoader workers, ``os.fork`` test harnesses and
    forked servers would die. Unless the user chose a layer (``NUMBA_THREADING_LAYER``), numba
    is asked for its ``forksafe`` class (TBB when installed, else its own work queue). Call it
    before the first parallel kernel runs; returns the ``numba`` module."""
    import os

    import numba

    global _NUMBA_PID
    if "NUMBA_THREADING_LAYER" not in os.environ and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "forksafe"
    if _NUMBA_PID is None:
        _NUMBA_PID = os.getpid()
    return numba


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

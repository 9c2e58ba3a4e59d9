"""Fused kernels, one file per kernel, named for what it runs.

* ``lif_sequence``, ``alif_sequence``: the LIF/CUBA and ALIF time loops with hand-written
  backwards (autograd Functions choosing among their implementations; the torch loops);
  ``lif_sequence_numba``: the compiled CPU kernel of the feed-forward LIF loop;
  ``alif_sequence_numba``: the compiled CPU steps of the ALIF loop; ``lif_triton``, ``alif_triton``:
  the Triton kernels of both loops on CUDA, with ``surrogate_triton``, the surrogates' Triton forms;
* ``scan_triton`` (CUDA; on the CPU under ``TRITON_INTERPRET=1`` for tests) and ``scan_numba``
  (compiled CPU) for :func:`spikerec.scan.linear_scan`.
* ``surrogate_numba``: the compiled CPU forms of the surrogate derivatives, one per formula, called by
  every numba kernel that needs one;
* ``lif_online``, ``alif_online``, ``lru_online``: the compiled CPU kernels of exact online learning
  per kind (trace steps, chunked blocks, spatial backwards), with ``trace_numba`` (the matrix
  eligibility trace and the one-state block, shared by the kinds) and ``trace_triton`` (its Triton form).

Each has a plain-torch twin (the fallback when numba, Triton or CUDA is missing) and tests that
compare them on fresh random inputs. numba and Triton are imported on first use only.

The numba kernels are parallel (``prange``) on numba's thread pool, which does not survive a fork:
a child forked from a process that started the pool (DataLoader workers, forked servers and test
harnesses) would be killed (GNU OpenMP) or hang on its first parallel kernel. Such a child takes
the torch twins instead (:func:`numba_usable_here`); every other process is unaffected.
"""
from __future__ import annotations

import functools

__all__ = ["triton_available", "numba_available", "numba_usable_here", "numba_for_kernels", "numpy_dtype", "as_numpy"]

_POOL_PID: int | None = None  # the process that started numba's thread pool
LIF_BLOCK = 512  # neurons per parallel work item of the compiled LIF loops (contiguous in memory)


def numpy_dtype(dtype):
    """The numpy dtype of the torch ``dtype`` (the kernels' scratch arrays and constants)."""
    import torch

    return torch.empty(0, dtype=dtype).numpy().dtype


def as_numpy(t):
    """The numpy view of a CPU tensor for a compiled kernel: detached and made contiguous only where it is not
    already (each torch call on the way costs more than the check)."""
    if t.requires_grad or not t.is_contiguous():
        t = t.detach().contiguous()
    return t.numpy()


def numba_usable_here() -> bool:
    """False in a process forked after its parent started numba's thread pool (see above)."""
    import os

    return _POOL_PID is None or _POOL_PID == os.getpid()


@functools.lru_cache(maxsize=1)
def _numba_imports() -> bool:
    try:
        import numba  # noqa: F401
    except Exception:
        return False
    return True


def numba_available() -> bool:
    """True when numba imports and this process may use its thread pool (:func:`numba_usable_here`)."""
    return _numba_imports() and numba_usable_here()


def numba_for_kernels():
    """``numba``, with its thread count set to torch's (at most numba's own limit); records this
    process as the one whose thread pool the kernels use. Call right before a parallel kernel."""
    import os

    import numba
    import torch

    global _POOL_PID
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    if _POOL_PID is None:
        _POOL_PID = os.getpid()
        # starting the pool under numba's OpenMP layer sets the OpenMP thread count that torch shares
        # (NUMBA_NUM_THREADS, one per core): give torch back the count it had
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
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

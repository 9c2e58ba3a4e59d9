"""Triton kernels (CUDA; on the CPU they run under ``TRITON_INTERPRET=1`` for tests).

Each kernel has a plain-torch twin that is the fallback when Triton or CUDA is missing.
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

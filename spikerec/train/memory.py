"""The C allocator's bytes in use (glibc ``mallinfo2``): where torch's CPU tensors live, so the
measure of the online learner's memory (``spikerec bench online``, the tests, a stream run's
records; ``tracemalloc`` does not see torch's allocations and the resident set counts pages the
allocator has freed)."""
from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["alloc_in_use"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = lib.mallinfo2
        fn.restype = _MallInfo2
        return fn
    except (OSError, AttributeError):
        return None


_MALLINFO2 = _libc()


def alloc_in_use() -> int | None:
    """Bytes the C allocator has handed out and not taken back (``uordblks + hblkhd`` of glibc's
    ``mallinfo2``), or ``None`` where it is not available."""
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return int(m.uordblks + m.hblkhd)

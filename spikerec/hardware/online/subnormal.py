"""Subnormal floats flushed to zero while the online learner computes.

The eligibility trace of an input that stays silent decays geometrically (``e <- alpha e`` with
the membrane's leak ``alpha < 1``, as e-prop's eligibility vectors do; Bellec et al. 2020) until
it falls below the smallest normal float (``1.18e-38`` in float32) and becomes subnormal. On x86
CPUs an operation on a subnormal operand takes a microcode assist of tens to hundreds of cycles:
with 1-2 % of the ALIF layers' matrix-trace entries subnormal after a few hundred steps of the
benchmark's spike input, the whole-stack stream step ran measurably slower (docs/online.md).

The learner therefore runs its steps with the thread's flush-to-zero and denormals-are-zero
modes on (``torch.set_flush_denormal``, which sets both on x86; the compiled kernels run on the
same thread and follow it) and restores the caller's setting afterwards. A trace entry below the
smallest normal float becomes zero: a change below ``1.18e-38`` (float32) or ``2.2e-308``
(float64) in one entry. Where the CPU has no such mode (``set_flush_denormal`` returns False),
nothing changes.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["flush_subnormals", "flushing_subnormals", "with_flushed_subnormals"]

_SUBNORMAL = 5e-324  # the smallest subnormal double (module globals: the product is not folded away)
_ONE = 1.0


def flushing_subnormals() -> bool:
    """Whether this thread flushes subnormal floats to zero now (either mode): a subnormal
    times one gives zero only then (Python's float product runs on the same SSE unit)."""
    return _SUBNORMAL * _ONE == 0.0


class flush_subnormals:
    """Context manager: subnormal floats flushed to zero on this thread inside, the caller's
    setting restored on exit (nothing is changed where the mode is on already or the CPU has
    none). Nested uses are no-ops."""

    __slots__ = ("_switched",)

    def __enter__(self):
        self._switched = not flushing_subnormals() and torch.set_flush_denormal(True)
        return self

    def __exit__(self, *exc) -> bool:
        if self._switched:
            torch.set_flush_denormal(False)
        return False


def with_flushed_subnormals(fn):
    """Decorator: ``fn`` runs inside :class:`flush_subnormals` (written out without a context
    manager object: the learner's step is called once per time step)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _SUBNORMAL * _ONE == 0.0:  # flushing already (flushing_subnormals())
            return fn(*args, **kwargs)
        switched = torch.set_flush_denormal(True)
        try:
            return fn(*args, **kwargs)
        finally:
            if switched:
                torch.set_flush_denormal(False)

    return wrapper

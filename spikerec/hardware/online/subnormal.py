"""Subnormal floats flushed to zero while the online learner computes.

A silent input's eligibility trace decays geometrically (``e <- alpha e``, as e-prop's do; Bellec et al. 2020) until
it is subnormal, and on x86 CPUs an operation on a subnormal operand takes a microcode assist of tens to hundreds of
cycles (docs/online.md, Subnormal floats). The learner runs its steps with
flush-to-zero and denormals-are-zero on (``torch.set_flush_denormal``; the compiled kernels run on the same thread)
and restores the caller's setting: a trace entry below the smallest normal float (``1.18e-38`` float32, ``2.2e-308``
float64) becomes zero. Without such a mode (``set_flush_denormal`` returns False) nothing changes.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["flush_subnormals", "flushing_subnormals", "with_flushed_subnormals"]

_SUBNORMAL = 5e-324  # the smallest subnormal double (module globals: the product is not folded away)
_ONE = 1.0


def flushing_subnormals() -> bool:
    """Whether this thread flushes subnormal floats to zero now (either mode): a subnormal times one is 0."""
    return _SUBNORMAL * _ONE == 0.0


class flush_subnormals:
    """Context manager: subnormal floats flushed to zero on this thread inside, the caller's setting
    restored on exit (nothing changed where the mode is on already or the CPU has none; nested: no-op)."""

    __slots__ = ("_switched",)

    def __enter__(self):
        self._switched = not flushing_subnormals() and torch.set_flush_denormal(True)
        return self

    def __exit__(self, *exc) -> bool:
        if self._switched:
            torch.set_flush_denormal(False)
        return False


def with_flushed_subnormals(fn):
    """Decorator: ``fn`` runs inside :class:`flush_subnormals` (written out: called once per step)."""

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

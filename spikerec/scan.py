"""Scans for diagonal linear recurrences ``x_t = a_t * x_{t-1} + b_t`` (real or complex).

``scan_loop`` is the sequential reference. ``linear_scan`` is the log-depth
(Hillis-Steele) parallel scan: it composes the affine maps ``(a, b)`` pairwise, so
only products of the ``a`` (never their inverses) appear: no overflow for ``|a| < 1``.
"""
from __future__ import annotations

import torch

__all__ = ["scan_loop", "linear_scan"]


def _check(a, b, x0):
    if a.shape != b.shape:
        raise ValueError(f"scan: a and b must have the same shape [T, ...], got {tuple(a.shape)} and {tuple(b.shape)}")
    if x0 is not None and x0.shape != b.shape[1:]:
        raise ValueError(f"scan: x0 must have shape {tuple(b.shape[1:])}, got {tuple(x0.shape)}")


def scan_loop(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
    """Sequential reference: returns all ``x_t`` (``[T, ...]``)."""
    _check(a, b, x0)
    x = torch.zeros_like(b[0]) if x0 is None else x0
    out = []
    for t in range(b.shape[0]):
        x = a[t] * x + b[t]
        out.append(x)
    return torch.stack(out)


def linear_scan(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
    """Parallel inclusive scan over the leading (time) dimension; differentiable by autograd."""
    _check(a, b, x0)
    T = b.shape[0]
    if x0 is not None:
        b = torch.cat([(a[0] * x0 + b[0]).unsqueeze(0), b[1:]], 0)
    A, X = a, b
    offset = 1
    while offset < T:
        X = torch.cat([X[:offset], X[offset:] + A[offset:] * X[:-offset]], 0)
        A = torch.cat([A[:offset], A[offset:] * A[:-offset]], 0)
        offset *= 2
    return X

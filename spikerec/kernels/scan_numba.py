"""Compiled CPU scan (numba) for a diagonal linear recurrence with coefficients constant in time.

``x_t = a * x_{t-1} + b_t`` forward, and the reverse pass of :func:`spikerec.scan.linear_scan`'s
backward, ``Gam_t = G_t + conj(a) Gam_{t+1}``, with ``dL/da = sum_t Gam_t conj(x_{t-1})``
accumulated inside the same loop (nothing of size ``T`` written besides ``Gam``). Work-efficient
(``O(T M)``) with one parallel region per call: the per-step torch calls of the sequential torch
pass pay one thread barrier per step, which dominates on a loaded machine.

``numba`` is imported on the first call; compilation is cached on disk.
"""
from __future__ import annotations

import torch

from . import numba_available

__all__ = ["available", "supported", "scan_forward", "scan_backward"]

DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def available() -> bool:
    """True when numba imports and this process may use its thread pool
    (:func:`spikerec.kernels.numba_available`)."""
    return numba_available()


def supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    """CPU tensors of one supported dtype, ``a`` constant in time (``a.shape[0] == 1``)."""
    return (b.device.type == "cpu" and b.dtype in DTYPES and a.dtype == b.dtype and a.shape[0] == 1
            and b.dim() >= 1 and available())


def _kernels():
    from . import numba_for_kernels, scan_numba_kernels as k  # numba on first use only

    nb = numba_for_kernels()
    return k, nb.get_num_threads()


def _flat_a(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[0].expand(b.shape[1:]).reshape(-1).contiguous()


def scan_forward(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None) -> torch.Tensor:
    """All states ``x[T, ...]`` (no autograd)."""
    k, threads = _kernels()
    T = b.shape[0]
    b2 = b.detach().contiguous().reshape(T, -1)
    out = torch.empty(b.shape, dtype=b.dtype)
    x0f = x0.detach().contiguous().reshape(-1) if x0 is not None else torch.zeros(1, dtype=b.dtype)
    k.fwd(_flat_a(a.detach(), b).numpy(), b2.numpy(), x0f.numpy(), x0 is not None, out.view(T, -1).numpy(),
          k.block_size(b2.shape[1], threads))
    return out


def scan_backward(a, g, x, x0, need_ga: bool):
    """``(dL/da summed to a's shape or None, Gam)`` for incoming gradient ``g`` and saved states ``x``."""
    k, threads = _kernels()
    T = g.shape[0]
    ac = _flat_a(a.detach(), g)
    if ac.is_complex():
        ac = ac.conj().resolve_conj()
    gam = torch.empty(g.shape, dtype=g.dtype)
    ga = torch.empty(g.shape[1:], dtype=g.dtype)
    x0f = x0.detach().contiguous().reshape(-1) if x0 is not None else torch.zeros(1, dtype=g.dtype)
    k.bwd(ac.numpy(), g.detach().contiguous().reshape(T, -1).numpy(), x.detach().contiguous().reshape(T, -1).numpy(),
          x0f.numpy(), x0 is not None, bool(need_ga), gam.view(T, -1).numpy(), ga.view(-1).numpy(),
          k.block_size(gam[0].numel(), threads))
    return (ga.unsqueeze(0).sum_to_size(a.shape) if need_ga else None), gam

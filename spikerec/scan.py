"""Scans for diagonal linear recurrences ``x_t = a_t * x_{t-1} + b_t`` (real or complex).

All tensors are time-first: ``b[T, ...]``; ``a`` broadcasts against ``b`` (``a[T, ...]``
varying in time, or e.g. ``a[C]`` / ``a[1, 1, C]`` constant in time, as the LRU's
``lambda``); ``x0[...]`` (shape ``b.shape[1:]``) is the state before ``t = 0`` (zero
when omitted). Every function returns all states ``x[T, ...]``.

* :func:`scan_loop` is the sequential reference (plain autograd).
* :func:`linear_scan` is the fast path. It uses a *blocked* (radix-``L``) scan, the
  CPU-friendly form of the associative scan with operator
  ``(a_i, b_i) . (a_j, b_j) = (a_j a_i, a_j b_i + b_j)`` (LRU paper, App. A):

  1. cut time into ``K`` chunks of ``L`` steps; run the recurrence inside all chunks
     at once (vectorised over chunks) from a zero state, keeping only each chunk's
     end state ``E_k`` and product ``P_k = prod a`` (nothing of size ``T`` is written);
  2. scan the chunk carries ``c_k = P_k c_{k-1} + E_k`` (``c_{-1} = x0``) with the same
     routine, recursively, so the depth is ``O(L log T / log L)``: log-depth in ``T``;
  3. re-run every chunk from its true carry, writing ``x`` once.

  Only products of ``a`` appear (never ``a^{-k}``: the ``cumsum(b / a^k)`` shortcut
  overflows, e.g. ``0.9^-1024 ~ 7e46``). On CUDA tensors the three phases are Triton
  kernels (:mod:`spikerec.kernels.scan_triton`, complex numbers as split Re/Im);
  without Triton the torch version runs.

  On the CPU with ``a`` constant in time (the LRU's ``lambda``) and numba installed, the
  default is a compiled work-efficient pass (:mod:`spikerec.kernels.scan_numba`): one
  parallel region per call instead of one thread barrier per step. Without numba,
  once a step covers >= ``SEQUENTIAL_MIN_WIDTH`` channels, each step is
  already compute-bound and the blocked scan's second pass costs more than the
  per-step overhead it saves; there ``linear_scan`` runs the work-efficient in-place
  sequential pass instead (same custom backward; docs/decisions.md, Kernels and benchmarks 3).

Gradients come from a custom autograd function whose backward is itself a reverse
scan with ``conj(a)`` (PyTorch's convention ``z.grad = dL/dRe z + i dL/dIm z``)::

    G_t   = dL/dx_t                                  (incoming gradient)
    Gam_t = G_t + conj(a_{t+1}) Gam_{t+1},  Gam_T = 0   (reverse scan)
    dL/db_t = Gam_t,   dL/da_t = Gam_t conj(x_{t-1}),   dL/dx0 = conj(a_0) Gam_0

so memory is the saved ``a`` and ``x`` only (the backward of a linear recurrence is the
same recurrence run in reverse; Martin & Cundy 2018, Sec. 3). On the CPU's sequential
path ``dL/da`` is accumulated inside that reverse loop, step by step, so neither
``conj(x)`` nor the product ``Gam * conj(x)`` is written for the whole sequence. Under
``torch.func`` transforms a pure-autograd Hillis-Steele scan is used instead.
"""
from __future__ import annotations

import math
import os

import torch

from .kernels import scan_numba as _nb

__all__ = ["scan_loop", "linear_scan", "scan_hillis_steele", "chunk_length"]

IMPLS = ("auto", "torch", "numba", "blocked", "sequential", "triton", "hillis_steele", "loop")


# --------------------------------------------------------------------------- inputs
def _prepare(a, b, x0, name="linear_scan"):
    """Validate and bring ``a`` to ``b.dim()`` dims, everything to one dtype."""
    for n, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: '{n}' must be a torch.Tensor, got {type(t).__name__}")
    if x0 is not None and not isinstance(x0, torch.Tensor):
        raise TypeError(f"{name}: 'x0' must be a torch.Tensor or None, got {type(x0).__name__}")
    if b.dim() < 1:
        raise ValueError(f"{name}: 'b' must have a leading time dimension [T, ...], got a scalar")
    if a.dim() > b.dim():
        raise ValueError(f"{name}: 'a' {tuple(a.shape)} has more dimensions than 'b' {tuple(b.shape)}")
    if a.dim() < b.dim():  # trailing-dims broadcasting: constant in time
        a = a.reshape((1,) * (b.dim() - a.dim()) + tuple(a.shape))
    try:
        full = torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        full = None
    if full != b.shape:
        raise ValueError(f"{name}: 'a' {tuple(a.shape)} must broadcast to the shape of 'b' {tuple(b.shape)} "
                         "([T, ...] or constant in time)")
    if x0 is not None and tuple(x0.shape) != tuple(b.shape[1:]):
        raise ValueError(f"{name}: 'x0' must have shape {tuple(b.shape[1:])} (b.shape[1:]), got {tuple(x0.shape)}")
    tensors = [a, b] + ([x0] if x0 is not None else [])
    for n, t in zip(("a", "b", "x0"), tensors):
        if not (t.is_floating_point() or t.is_complex()):
            raise TypeError(f"{name}: '{n}' must be a real floating or complex tensor, got {t.dtype}")
    dtype = b.dtype
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    a, b = a.to(dtype), b.to(dtype)
    x0 = x0.to(dtype) if x0 is not None else None
    return a, b, x0


def _functorch_active(*tensors) -> bool:
    try:
        from torch._C._functorch import is_functorch_wrapped_tensor
    except ImportError:  # pragma: no cover
        return False
    return any(t is not None and is_functorch_wrapped_tensor(t) for t in tensors)


# --------------------------------------------------------------------------- references
def scan_loop(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
    """Sequential reference ``x_t = a_t x_{t-1} + b_t``: returns all ``x_t`` (``[T, ...]``)."""
    a, b, x0 = _prepare(a, b, x0, "scan_loop")
    x = torch.zeros_like(b[0]) if x0 is None else x0
    const = a.shape[0] == 1
    a_t = [a[0]] * b.shape[0] if const else a.unbind(0)  # unbind: one backward node, not T full-size zeros
    out = []
    for at, bt in zip(a_t, b.unbind(0)):
        x = at * x + bt
        out.append(x)
    return torch.stack(out)


def scan_hillis_steele(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
    """Log-depth Hillis-Steele scan (``O(T log T)`` work) in plain autograd; works under ``torch.func``."""
    a, b, x0 = _prepare(a, b, x0, "scan_hillis_steele")
    T = b.shape[0]
    A = a.expand_as(b)
    if x0 is not None:
        b = torch.cat([(A[0] * x0 + b[0]).unsqueeze(0), b[1:]], 0)
    X = b
    offset = 1
    while offset < T:
        X = torch.cat([X[:offset], X[offset:] + A[offset:] * X[:-offset]], 0)
        A = torch.cat([A[:offset], A[offset:] * A[:-offset]], 0)
        offset *= 2
    return X


# --------------------------------------------------------------------------- torch blocked scan
def chunk_length(T: int, width: int = 1 << 20) -> int:
    """Chunk length ``L`` of the blocked scan for ``T`` steps of ``width`` channels.

    Large problems are memory-bound and ``L`` barely matters (measured on CPU: 64 up to
    ``T ~ 8k``, then 128). Small ones (``T * width < 2^22``) are bound by the per-op
    overhead of the ``~2L + T/L`` torch calls, minimised near ``L = sqrt(T / 2)``.
    """
    if T * width < (1 << 22):
        return max(8, 1 << max(0, round(math.log2(math.sqrt(T / 2)))))
    return 64 if T <= 8192 else 128


def _seq(a, b, out, x, order, const):
    """Sequential recurrence over ``order`` writing ``out[t]``; returns the last state."""
    for t in order:
        at = a[0] if const else a[t]
        if x is None:
            out[t].copy_(b[t])
        else:
            torch.addcmul(b[t], at, x, out=out[t])
        x = out[t]
    return x


# On the CPU a step over >= this many channels is compute-bound: the blocked scan's second
# pass then costs more than the per-step overhead it saves (docs/decisions.md, Kernels and benchmarks 3).
SEQUENTIAL_MIN_WIDTH = 2048


def _strategy(b, strategy: str) -> str:
    if strategy != "auto":
        return strategy
    if b.device.type == "cpu" and b[0].numel() >= SEQUENTIAL_MIN_WIDTH:
        return "sequential"
    return "blocked"


def _scan_torch(a, b, x0=None, reverse=False, strategy="auto"):
    """Scan without autograd. ``reverse``: ``y_t = a_t y_{t+1} + b_t``, ``y_T = x0``.

    ``strategy``: ``blocked`` (the log-depth blocked scan), ``sequential`` (one in-place
    ``addcmul`` per step, work-efficient), or ``auto`` (sequential for wide inputs on the
    CPU, blocked otherwise). ``a`` has ``b.dim()`` dims with ``a.shape[0]`` in ``(1, T)``.
    """
    T = b.shape[0]
    rest = b.shape[1:]
    out = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    const = a.shape[0] == 1
    L = chunk_length(T, b[0].numel())
    K = T // L
    if K < 2 or _strategy(b, strategy) == "sequential":
        order = range(T - 1, -1, -1) if reverse else range(T)
        _seq(a, b, out, x0, order, const)
        return out
    n = K * L
    main = slice(T - n, T) if reverse else slice(0, n)
    tail = range(T - n - 1, -1, -1) if reverse else range(n, T)
    bm = b[main].view(K, L, *rest)
    am = a[0] if const else a[main].view(K, L, *a.shape[1:])
    om = out[main].view(K, L, *rest)
    lorder = range(L - 1, -1, -1) if reverse else range(L)

    # phase 1: per-chunk end state from zero and chunk product (vectorised over chunks)
    s, p = None, None
    buf = [torch.empty((K,) + tuple(rest), dtype=b.dtype, device=b.device) for _ in range(2)]
    for i, l in enumerate(lorder):
        al = am if const else am[:, l]
        if s is None:
            s = bm[:, l]
            p = al
        else:
            s = torch.addcmul(bm[:, l], al, s, out=buf[i % 2])
            p = p * al
    if const:
        p = p.unsqueeze(0)  # [1, ...] constant over chunks
    # phase 2: carries c_k = P_k c_{k-1} + E_k in processing order (recursive scan)
    if reverse:  # processing order is k = K-1 .. 0
        s, p = s.flip(0), (p if const else p.flip(0))
    c = _scan_torch(p, s, x0, False, "blocked")
    carry = torch.empty_like(c)
    if x0 is None:
        carry[0].zero_()
    else:
        carry[0].copy_(x0)
    carry[1:].copy_(c[:-1])
    if reverse:
        carry = carry.flip(0)
    # phase 3: every chunk from its carry, writing x once
    x = carry
    for l in lorder:
        al = am if const else am[:, l]
        x = torch.addcmul(bm[:, l], al, x, out=om[:, l])
    # remainder (< L steps) continues from the last chunk
    last = c[-1]
    _seq(a, b, out, last, tail, const)
    return out


def _triton_ok(b) -> bool:
    if not b.is_cuda:
        return False
    from .kernels import triton_available

    return triton_available()


def _check_triton(b) -> None:
    from .kernels import triton_available

    if not triton_available():
        raise RuntimeError("linear_scan(impl='triton'): the 'triton' package is not importable; use impl='torch'")
    if not b.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("linear_scan(impl='triton'): needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                         f"importing triton, to run the kernels on the CPU); got a tensor on {b.device}")


def _scan_dispatch(a, b, x0, reverse, impl):
    if impl == "triton":
        _check_triton(b)
    if impl == "triton" or (impl == "auto" and _triton_ok(b)):
        from .kernels.scan_triton import scan_triton

        return scan_triton(a, b, x0, reverse)
    return _scan_torch(a, b, x0, reverse, impl if impl in ("blocked", "sequential") else "auto")


def _use_numba(a, b, impl) -> bool:
    if impl == "numba":
        if b.device.type != "cpu":
            raise ValueError(f"linear_scan(impl='numba'): needs CPU tensors, got {b.device}")
        if not _nb.available():
            raise RuntimeError("linear_scan(impl='numba'): the 'numba' package is not importable; use impl='torch'")
        if not _nb.supported(a, b):
            raise ValueError("linear_scan(impl='numba'): needs 'a' constant in time and a float32/64 or "
                             f"complex64/128 dtype; got a {tuple(a.shape)}, dtype {b.dtype}")
        return True
    return impl == "auto" and os.environ.get("SPIKEREC_NUMBA", "1") != "0" and _nb.supported(a, b)


class _LinearScan(torch.autograd.Function):
    """``x = scan(a, b, x0)`` with the reverse-scan backward (module docstring)."""

    @staticmethod
    def forward(ctx, a, b, x0, impl):
        ctx.numba = _use_numba(a, b, impl)
        with torch.no_grad():
            x = _nb.scan_forward(a, b, x0) if ctx.numba else _scan_dispatch(a, b, x0, False, impl)
        ctx.save_for_backward(a, x, x0 if x0 is not None else torch.empty(0))
        ctx.has_x0 = x0 is not None
        ctx.impl = impl
        return x

    @staticmethod
    def backward(ctx, g):
        a, x, x0 = ctx.saved_tensors
        x0 = x0 if ctx.has_x0 else None
        g = g.contiguous()
        const = a.shape[0] == 1
        if ctx.numba:
            ga, gam = _nb.scan_backward(a, g, x, x0, ctx.needs_input_grad[0])
            gx0 = None
            if ctx.has_x0 and ctx.needs_input_grad[2]:
                gx0 = (a[0].conj() * gam[0]).sum_to_size(x0.shape)
            return ga, (gam if ctx.needs_input_grad[1] else None), gx0, None
        if ctx.impl in ("auto", "torch", "sequential") and not _triton_ok(g) and _strategy(g, ctx.impl) == "sequential":
            ga, gam = _seq_backward(a, g, x, x0, ctx.needs_input_grad[0])
            gx0 = None
            if ctx.has_x0 and ctx.needs_input_grad[2]:
                gx0 = (a[0].conj() * gam[0]).sum_to_size(x0.shape)
            return ga, (gam if ctx.needs_input_grad[1] else None), gx0, None
        if const:
            c = a.conj().resolve_conj()
        else:  # c_t = conj(a_{t+1}); c_{T-1} multiplies the zero final adjoint
            c = torch.cat([a[1:], torch.zeros_like(a[:1])], 0).conj().resolve_conj()
        gam = _scan_dispatch(c, g, None, True, ctx.impl)
        ga = gb = gx0 = None
        if ctx.needs_input_grad[0]:
            if const:
                ga = (gam[1:] * x[:-1].conj()).sum(0, keepdim=True)
                if x0 is not None:
                    ga = ga + gam[0] * x0.conj()
            else:
                ga = torch.empty_like(gam)
                torch.mul(gam[1:], x[:-1].conj(), out=ga[1:])
                if x0 is not None:
                    torch.mul(gam[0], x0.conj(), out=ga[0])
                else:
                    ga[0].zero_()
            ga = ga.sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            gb = gam
        if ctx.has_x0 and ctx.needs_input_grad[2]:
            gx0 = (a[0].conj() * gam[0]).sum_to_size(x0.shape)
        return ga, gb, gx0, None


def _seq_backward(a, g, x, x0, need_ga: bool):
    """Work-efficient reverse pass (CPU, wide steps): ``Gam_t = G_t + conj(a_{t+1}) Gam_{t+1}``,
    with ``dL/da`` accumulated inside the same loop (``sum_t Gam_t conj(x_{t-1})`` for an ``a``
    constant in time), so no ``conj(x)`` and no product of size ``T`` is ever written.
    Returns ``(dL/da summed to a's shape or None, Gam)``."""
    T = g.shape[0]
    const = a.shape[0] == 1
    cplx = g.is_complex()
    gam = torch.empty_like(g)
    ac = a.conj().resolve_conj() if cplx else a  # [1, ...] or [T, ...]: small when constant
    acc = torch.zeros(g.shape[1:], dtype=g.dtype, device=g.device) if (need_ga and const) else None
    GA = torch.empty_like(g) if (need_ga and not const) else None
    buf = torch.empty(g.shape[1:], dtype=g.dtype, device=g.device) if (need_ga and cplx) else None
    prev = None
    for t in range(T - 1, -1, -1):
        if prev is None:
            gam[t].copy_(g[t])
        else:
            torch.addcmul(g[t], ac[0] if const else ac[t + 1], prev, out=gam[t])
        prev = gam[t]
        if not need_ga:
            continue
        xp = x[t - 1] if t > 0 else x0
        if xp is None:
            if GA is not None:
                GA[t].zero_()
            continue
        if cplx:
            xp = torch.conj_physical(xp, out=buf)
        if const:
            acc.addcmul_(prev, xp)
        else:
            torch.mul(prev, xp, out=GA[t])
    ga = None
    if need_ga:
        ga = (acc.unsqueeze(0) if const else GA).sum_to_size(a.shape)
    return ga, gam


def linear_scan(a: torch.Tensor, b: torch.Tensor, x0: torch.Tensor | None = None, *, impl: str = "auto") -> torch.Tensor:
    """All states of ``x_t = a_t * x_{t-1} + b_t`` over the leading time dim (real or complex).

    Args:
        a: coefficients, broadcastable to ``b`` (``[T, ...]`` or constant in time).
        b: inputs ``[T, ...]``.
        x0: state before the first step, shape ``b.shape[1:]`` (zeros if ``None``).
        impl: ``auto`` (Triton on CUDA when available; on the CPU the compiled kernel of
            :mod:`spikerec.kernels.scan_numba` when numba is installed and ``a`` is constant
            in time; else ``torch``); ``numba`` to force that kernel; ``torch`` (the
            blocked scan, or on the CPU for >= ``SEQUENTIAL_MIN_WIDTH`` channels per step the
            in-place sequential pass, which is faster there); ``blocked`` or ``sequential``
            to force one; ``triton`` (also on CPU tensors under ``TRITON_INTERPRET=1``);
            ``hillis_steele`` or ``loop`` (references). All but the references share the
            reverse-scan backward.
    Returns:
        ``x[T, ...]`` in the promoted dtype of the inputs.
    """
    if impl not in IMPLS:
        raise ValueError(f"linear_scan: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "loop":
        return scan_loop(a, b, x0)
    a, b, x0 = _prepare(a, b, x0)
    if b.shape[0] == 0:
        return b.clone()
    if impl == "hillis_steele" or _functorch_active(a, b, x0):
        return scan_hillis_steele(a, b, x0)
    return _LinearScan.apply(a, b, x0, impl)

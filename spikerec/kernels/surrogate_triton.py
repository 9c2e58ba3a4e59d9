"""Triton forms of the surrogate derivatives of :mod:`spikerec.surrogate`.

A surrogate owns its compiled form: :meth:`spikerec.surrogate.Surrogate.compiled_form` gives the
formula's code and constants, and the fused spiking kernels evaluate ``sigma'(x)`` inside their
reverse loop through :func:`surrogate_derivative`, one ``constexpr`` branch per formula. A surrogate
without a compiled form (``multi_gaussian``, or a user's own class) makes the kernels step aside:
the layer then runs its torch loop, with a one-time warning naming the surrogate.

The branches are the formulas of the surrogates' ``derivative``; a test compares every form with
``Surrogate.derivative`` on fresh random inputs in float64.
"""
from __future__ import annotations

import functools
import math
import warnings

import triton
import triton.language as tl

from ..surrogate import COMPILED_CODES, Surrogate

__all__ = ["triton_form", "surrogate_constants", "surrogate_derivative", "CODES"]

#: the codes of :meth:`Surrogate.compiled_form` with a branch in :func:`surrogate_derivative`
CODES = frozenset(COMPILED_CODES.values())
_WARNED: set[str] = set()


def triton_form(sur: Surrogate, *, warn: bool = True):
    """``(code, constants)`` of ``sur`` for :func:`surrogate_derivative`, or None (with a one-time
    warning naming the surrogate) when it has no compiled form. ``constants`` are ``(p, scale, q)``:
    ``p`` the slope or the width, ``q`` a product the formula needs (``pi/2 slope`` for the
    arc-tangent, ``sqrt(2 pi) width`` for the Gaussian), formed in double precision here."""
    form = sur.compiled_form() if callable(getattr(sur, "compiled_form", None)) else None
    if form is None or form[0] not in CODES:
        name = getattr(sur, "name", None) or type(sur).__name__
        if warn and name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"surrogate {name!r} ({type(sur).__name__}) has no compiled form: the spiking layers "
                          "run their torch loop on CUDA", RuntimeWarning, stacklevel=3)
        return None
    code, p, scale = form
    q = math.pi / 2.0 * p if code == 2 else (math.sqrt(2.0 * math.pi) * p if code == 4 else 0.0)
    return code, (float(p), float(scale), q)


@functools.lru_cache(maxsize=64)
def surrogate_constants(form, dtype, device):
    """The constants of a Triton form as a tensor of the kernel's state ``dtype`` (scalar arguments
    of a Triton kernel are float32; float64 kernels read these at full precision). Made once per
    form, dtype and device."""
    import torch

    return torch.tensor(form[1], dtype=dtype, device=device)


@triton.jit
def surrogate_derivative(x, c_ptr, CODE: tl.constexpr):
    """``sigma'(x)`` of the surrogate with code ``CODE`` (:data:`spikerec.surrogate.COMPILED_CODES`) and constants at ``c_ptr``
    (:func:`surrogate_constants`), in the dtype of ``x``."""
    p = tl.load(c_ptr).to(x.dtype)
    scale = tl.load(c_ptr + 1).to(x.dtype)
    if CODE == 1:  # fast sigmoid: scale / (1 + slope |x|)^2
        d = 1.0 + p * tl.abs(x)
        out = scale / (d * d)
    elif CODE == 2:  # arc-tangent: scale (slope / 2) / (1 + (pi/2 slope x)^2)
        u = tl.load(c_ptr + 2).to(x.dtype) * x
        out = scale * (p / 2.0) / (1.0 + u * u)
    elif CODE == 3:  # triangle: scale max(0, 1 - |x| / width) / width
        out = scale * tl.maximum(1.0 - tl.abs(x) / p, 0.0) / p
    elif CODE == 4:  # Gaussian: scale exp(-x^2 / (2 width^2)) / (sqrt(2 pi) width)
        u = x / p
        out = scale * tl.exp(-0.5 * u * u) / tl.load(c_ptr + 2).to(x.dtype)
    elif CODE == 5:  # logistic: scale slope s (1 - s), s = sigmoid(slope x)
        s = 1.0 / (1.0 + tl.exp(-p * x))
        out = scale * p * s * (1.0 - s)
    else:  # single exponential: scale exp(-|x| / width) / (2 width)
        out = scale * tl.exp(-tl.abs(x) / p) / (2.0 * p)
    return out.to(x.dtype)

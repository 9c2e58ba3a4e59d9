"""A one-launch Triton kernel that evaluates a surrogate's Triton form
(:func:`spikerec.kernels.surrogate_triton.surrogate_derivative`) over a tensor, so that a test can
compare every form with ``Surrogate.derivative``. Kept with the tests: the package's kernels evaluate
the forms inside their own loops."""
import triton
import triton.language as tl

from spikerec.kernels.surrogate_triton import surrogate_constants, surrogate_derivative, triton_form


@triton.jit
def _derivative_kernel(x_ptr, out_ptr, M, c_ptr, CODE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, surrogate_derivative(x, c_ptr, CODE), mask=mask)


def derivative(sur, x):
    """``sur.derivative(x)`` through its Triton form (one launch over a contiguous ``x``)."""
    import torch

    form = triton_form(sur)
    if form is None:
        raise ValueError(f"surrogate {sur.name!r} has no Triton form")
    x = x.contiguous()
    out = torch.empty_like(x)
    M = x.numel()
    _derivative_kernel[(triton.cdiv(M, 256),)](x, out, M, surrogate_constants(form, x.dtype, x.device),
                                               CODE=form[0], BLOCK=256)
    return out

"""Parallel scan == sequential loop (values, gradients; real and complex), the reverse-scan
backward, fp32 accuracy, broadcasting, errors, and the Triton kernels under TRITON_INTERPRET=1."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from spikerec.kernels import scan_numba
from spikerec.scan import _scan_torch, linear_scan, scan_hillis_steele, scan_loop

F64, C128 = torch.float64, torch.complex128


def _coeffs(shape, dtype, g, lo=0.05, hi=0.98):
    mag = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)
    if dtype.is_complex:
        return torch.polar(mag, 6.28 * torch.rand(shape, generator=g, dtype=F64))
    return mag * torch.where(torch.rand(shape, generator=g) < 0.2, -1.0, 1.0).to(F64)


def _randn(shape, dtype, g):
    x = torch.randn(shape, generator=g, dtype=F64)
    return torch.complex(x, torch.randn(shape, generator=g, dtype=F64)) if dtype.is_complex else x


def _grads(fn, a, b, x0, w):
    ins = [t.detach().clone().requires_grad_() for t in (a, b, x0)]
    x = fn(*ins)
    (x * w).real.sum().backward()
    return x.detach(), [t.grad for t in ins]


# random lengths incl. non powers of two; >= 128 uses the blocked path, 8300 the recursive carries
_g = torch.Generator().manual_seed(1234)
LENGTHS = [1, 2, 64, 127, 128, 129] + [int(t) for t in torch.randint(3, 2000, (3,), generator=_g)] + [8300]


@pytest.mark.parametrize("dtype", [F64, C128], ids=["real", "complex"])
@pytest.mark.parametrize("a_time", ["const", "varying"])
@pytest.mark.parametrize("T", LENGTHS)
def test_scan_equals_loop_values_and_gradients(dtype, a_time, T):
    if T == 8300 and a_time == "varying":
        pytest.skip("one long case per dtype is enough")
    g = torch.Generator().manual_seed(T)
    b = _randn((T, 2, 3), dtype, g)
    a = _coeffs((1 if a_time == "const" else T, 1, 3), dtype, g)  # broadcast over batch
    x0 = _randn((2, 3), dtype, g)
    w = _randn((T, 2, 3), dtype, g)
    x1, g1 = _grads(linear_scan, a, b, x0, w)
    if T > 4096:  # long case: values against the loop, gradients against the autograd Hillis-Steele scan
        torch.testing.assert_close(x1, scan_loop(a, b, x0), rtol=1e-12, atol=1e-12)
        x2, g2 = _grads(scan_hillis_steele, a, b, x0, w)
    else:
        x2, g2 = _grads(scan_loop, a, b, x0, w)
    torch.testing.assert_close(x1, x2, rtol=1e-12, atol=1e-12)
    for name, u, v in zip(("a", "b", "x0"), g1, g2):
        scale = v.abs().max().clamp_min(1.0)
        torch.testing.assert_close(u / scale, v / scale, rtol=0, atol=1e-12, msg=f"grad {name}")


@pytest.mark.parametrize("dtype", [F64, C128], ids=["real", "complex"])
@pytest.mark.parametrize("impl", ["torch", "blocked", "sequential"])
def test_wide_inputs_all_strategies(dtype, impl):
    """Wide steps (>= SEQUENTIAL_MIN_WIDTH channels) take the sequential pass on the CPU under
    impl='torch'; every strategy equals the loop in values and gradients."""
    g = torch.Generator().manual_seed(21)
    T = 257
    b, x0 = _randn((T, 2, 1100), dtype, g), _randn((2, 1100), dtype, g)
    a = _coeffs((1, 1, 1100), dtype, g)
    w = _randn((T, 2, 1100), dtype, g)
    x1, g1 = _grads(lambda a, b, x0: linear_scan(a, b, x0, impl=impl), a, b, x0, w)
    x2, g2 = _grads(scan_loop, a, b, x0, w)
    torch.testing.assert_close(x1, x2, rtol=1e-12, atol=1e-12)
    for u, v in zip(g1, g2):
        scale = v.abs().max().clamp_min(1.0)
        torch.testing.assert_close(u / scale, v / scale, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [F64, C128], ids=["real", "complex"])
@pytest.mark.parametrize("a_time,with_x0", [("varying", True), ("varying", False), ("const", False)])
def test_sequential_backward_accumulates_grad_a_in_the_reverse_pass(dtype, a_time, with_x0):
    """The CPU sequential path's backward (dL/da summed inside the reverse loop) equals the loop's
    autograd, for a constant or time-varying ``a``, with or without ``x0``, and a per-batch ``a``."""
    g = torch.Generator().manual_seed(33)
    T, B, C = 97, 3, 800
    b = _randn((T, B, C), dtype, g)
    a = _coeffs((1 if a_time == "const" else T, B if a_time == "const" else 1, C), dtype, g)
    x0 = _randn((B, C), dtype, g) if with_x0 else None
    w = _randn((T, B, C), dtype, g)
    ins = [t.detach().clone().requires_grad_() for t in (a, b)] + ([x0.clone().requires_grad_()] if with_x0 else [])
    outs = []
    for fn in (lambda *z: linear_scan(*z, impl="sequential"), lambda *z: linear_scan(*z, impl="auto"), scan_loop):
        for t in ins:
            t.grad = None
        x = fn(*ins)
        (x * w).real.sum().backward()
        outs.append([x.detach()] + [t.grad.clone() for t in ins])
    for got in outs[:-1]:
        for u, v in zip(got, outs[-1]):
            scale = v.abs().max().clamp_min(1.0)
            torch.testing.assert_close(u / scale, v / scale, rtol=0, atol=1e-12)


@pytest.mark.skipif(not scan_numba.available(), reason="numba not installed")
@pytest.mark.parametrize("dtype", [torch.float32, F64, torch.complex64, C128])
@pytest.mark.parametrize("T,shape", [(1, (3,)), (130, (2, 700)), (1000, (5,))])
def test_numba_scan_equals_loop(dtype, T, shape):
    """The compiled CPU scan (a constant in time) equals the loop: values and all gradients."""
    g = torch.Generator().manual_seed(T)
    b = _randn((T,) + shape, C128 if dtype.is_complex else F64, g).to(dtype)
    a = _coeffs((1,) + shape, C128 if dtype.is_complex else F64, g).to(dtype)
    x0 = _randn(shape, C128 if dtype.is_complex else F64, g).to(dtype)
    w = _randn((T,) + shape, C128 if dtype.is_complex else F64, g).to(dtype)
    x1, g1 = _grads(lambda a, b, x0: linear_scan(a, b, x0, impl="numba"), a, b, x0, w)
    x2, g2 = _grads(scan_loop, a, b, x0, w)
    tol = 1e-12 if dtype in (F64, C128) else 2e-5
    torch.testing.assert_close(x1, x2, rtol=tol, atol=tol)
    for u, v in zip(g1, g2):
        scale = v.abs().max().clamp_min(1.0)
        torch.testing.assert_close(u / scale, v / scale, rtol=0, atol=tol * 10)
    x3 = linear_scan(a, b, impl="numba")  # no x0
    torch.testing.assert_close(x3, scan_loop(a, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("T", [5, 130])
def test_gradcheck_complex_convention(T):
    """Finite differences check the custom backward (PyTorch's complex-gradient convention)."""
    g = torch.Generator().manual_seed(3)
    a = _coeffs((1, 2), C128, g).requires_grad_()
    b = _randn((T, 2), C128, g).requires_grad_()
    x0 = _randn((2,), C128, g).requires_grad_()
    fast = T > 64  # random-projection check on the blocked path keeps it quick
    assert torch.autograd.gradcheck(lambda a, b, x0: linear_scan(a, b, x0), (a, b, x0), fast_mode=fast)
    a2 = _coeffs((T, 2), F64, g).requires_grad_()  # real, time-varying a with complex b
    assert torch.autograd.gradcheck(lambda a, b: linear_scan(a, b), (a2, b), fast_mode=fast)


def test_reverse_scan_equals_reverse_loop():
    g = torch.Generator().manual_seed(5)
    for T in (7, 300):
        for const in (True, False):
            a = _coeffs((1 if const else T, 4), C128, g)
            b, y0 = _randn((T, 4), C128, g), _randn((4,), C128, g)
            y = y0
            ref = torch.empty_like(b)
            for t in range(T - 1, -1, -1):
                y = (a[0] if const else a[t]) * y + b[t]
                ref[t] = y
            for strategy in ("blocked", "sequential"):
                torch.testing.assert_close(_scan_torch(a, b, y0, True, strategy), ref, rtol=1e-12, atol=1e-12)


def test_broadcast_forms_and_mixed_dtypes():
    g = torch.Generator().manual_seed(6)
    b = _randn((200, 3, 4), C128, g)
    lam = _coeffs((4,), C128, g)  # [C]: constant in time
    torch.testing.assert_close(linear_scan(lam, b), scan_loop(lam.expand(200, 3, 4), b), rtol=1e-12, atol=1e-12)
    a_real = _coeffs((200, 3, 4), F64, g)  # real a with complex b -> complex x, real grad for a
    a_req = a_real.clone().requires_grad_()
    x = linear_scan(a_req, b)
    assert x.dtype == C128
    x.abs().sum().backward()
    assert a_req.grad.dtype == F64
    ar = a_real.clone().requires_grad_()
    scan_loop(ar, b).abs().sum().backward()
    torch.testing.assert_close(a_req.grad, ar.grad, rtol=1e-10, atol=1e-12)
    # the readout's form: a stride-0 expansion of a per-channel decay
    decay = torch.rand(4, dtype=F64)
    J = torch.randn(150, 3, 4, dtype=F64)
    torch.testing.assert_close(linear_scan(decay.expand_as(J), J), scan_loop(decay, J), rtol=1e-12, atol=1e-12)


def test_float32_accuracy_long_sequence():
    """float32 scan vs float64 loop: error / max|x| <= 1e-4 at L = 16384, ring [0.999, 0.9999], phase in
    [0, pi/10] (the PathX phase of Orvieto et al. 2023, "Resurrecting recurrent neural networks for long
    sequences", §3.4)."""
    g = torch.Generator().manual_seed(8)
    T, C = 16384, 8
    mag = 0.999 + 0.0009 * torch.rand(C, generator=g, dtype=F64)
    lam = torch.polar(mag, 0.314 * torch.rand(C, generator=g, dtype=F64))
    b = _randn((T, 1, C), C128, g)
    ref = scan_loop(lam, b)
    x32 = linear_scan(lam.to(torch.complex64), b.to(torch.complex64))
    err = (x32.to(C128) - ref).abs().max() / ref.abs().max()
    assert err < 1e-4, err


def test_no_overflow_with_small_coefficients():
    """The cumsum(b / a^k) shortcut overflows here (0.5^-3000); the scan only multiplies a's."""
    b = torch.randn(3000, 16)
    a = torch.full((16,), 0.5)
    x = linear_scan(a, b)
    assert torch.isfinite(x).all()
    torch.testing.assert_close(x, scan_loop(a, b), rtol=1e-5, atol=1e-5)


def test_hillis_steele_and_torch_func_fallback():
    g = torch.Generator().manual_seed(9)
    a, b, x0 = _coeffs((1, 3), C128, g), _randn((45, 3), C128, g), _randn((3,), C128, g)
    torch.testing.assert_close(scan_hillis_steele(a, b, x0), scan_loop(a, b, x0), rtol=1e-12, atol=1e-12)

    def loss(b_):
        return linear_scan(a, b_, x0).abs().pow(2).sum()

    gf = torch.func.grad(loss)(b)  # functorch-wrapped tensors take the autograd Hillis-Steele path
    bb = b.clone().requires_grad_()
    loss(bb).backward()
    torch.testing.assert_close(gf, bb.grad, rtol=1e-10, atol=1e-12)


def test_bad_inputs():
    b = torch.randn(10, 2, 3)
    with pytest.raises(ValueError, match="must broadcast"):
        linear_scan(torch.rand(10, 2, 4), b)
    with pytest.raises(ValueError, match="x0"):
        linear_scan(torch.rand(3), b, torch.zeros(3))
    with pytest.raises(TypeError, match="floating"):
        linear_scan(torch.ones(3, dtype=torch.int64), b)
    with pytest.raises(ValueError, match="impl"):
        linear_scan(torch.rand(3), b, impl="cuda")
    with pytest.raises(ValueError, match="more dimensions"):
        linear_scan(torch.rand(1, 10, 2, 3), b)
    assert linear_scan(torch.rand(3), b, impl="auto").shape == b.shape  # CPU: torch fallback
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises((ValueError, RuntimeError), match="impl='triton'"):
            linear_scan(torch.rand(3), b, impl="triton")  # CPU tensors without the interpreter


_TRITON_SCRIPT = textwrap.dedent(r"""
    import os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    try:
        import triton  # noqa: F401
    except Exception as e:
        print("NO_TRITON", repr(e)); sys.exit(0)
    import torch
    from spikerec.kernels.scan_triton import scan_triton
    from spikerec.scan import _scan_torch, linear_scan, scan_loop
    g = torch.Generator().manual_seed(int(sys.argv[1]))
    worst = 0.0
    for cplx in (False, True):
        for const, rev, x0_on in ((True, False, True), (False, True, False), (False, False, True)):
            dt = torch.complex128 if cplx else torch.float64
            T, M = 19, 3
            b = torch.randn(T, M, dtype=torch.float64, generator=g)
            a = 0.05 + 0.9 * torch.rand(1 if const else T, M, dtype=torch.float64, generator=g)
            if cplx:
                b = torch.complex(b, torch.randn(T, M, dtype=torch.float64, generator=g))
                a = torch.polar(a, 6.28 * torch.rand(a.shape, dtype=torch.float64, generator=g))
            x0 = torch.randn(M, dtype=torch.float64, generator=g).to(dt) if x0_on else None
            r1 = scan_triton(a, b, x0, rev, chunk=4, block=2)
            r2 = _scan_torch(a, b, x0, rev)
            worst = max(worst, (r1 - r2).abs().max().item())
    # autograd through the Triton path (forward + reverse-scan backward) vs the loop
    b = torch.complex(torch.randn(21, 3, dtype=torch.float64, generator=g), torch.randn(21, 3, dtype=torch.float64, generator=g))
    lam = torch.polar(0.5 + 0.4 * torch.rand(3, dtype=torch.float64, generator=g), torch.rand(3, dtype=torch.float64, generator=g))
    grads = []
    for impl in ("triton", "loop"):
        bb, ll = b.clone().requires_grad_(), lam.clone().requires_grad_()
        linear_scan(ll, bb, impl=impl).abs().pow(2).sum().backward()
        grads.append((bb.grad, ll.grad))
    worst = max(worst, max((u - v).abs().max().item() for u, v in zip(*grads)))
    print("WORST", worst)
""")


def test_triton_kernel_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    seed = str(int(torch.randint(0, 10_000, (1,))))
    r = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT, seed], env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    if "NO_TRITON" in r.stdout:
        pytest.skip(f"triton is not importable: {r.stdout.strip()}")
    worst = float(r.stdout.split("WORST")[-1])
    assert worst < 1e-12, worst


@pytest.mark.skipif(not scan_numba.available(), reason="numba not installed")
def test_numba_scan_block_split_is_exact():
    """Channel blocks of any size (a remainder block included) give the same bits: the channels
    are independent, so splitting them changes no arithmetic."""
    from spikerec.kernels import scan_numba_kernels as K

    assert K.block_size(256, 2) == K.BLOCK and K.block_size(12288, 2) == 6144
    assert K.block_size(10 ** 6, 2) == K.MAX_BLOCK and K.block_size(5000, 0) == 5000
    g = torch.Generator().manual_seed(11)
    T, M = 37, 1400
    b = _randn((T, M), C128, g).to(torch.complex64)
    a = _coeffs((M,), C128, g).to(torch.complex64)
    x0 = _randn((M,), C128, g).to(torch.complex64)
    gr = _randn((T, M), C128, g).to(torch.complex64)
    outs = []
    for block in (512, 700, M):
        x = torch.empty_like(b)
        K.fwd(a.numpy(), b.numpy(), x0.numpy(), True, x.numpy(), block)
        gam, ga = torch.empty_like(b), torch.empty_like(a)
        K.bwd(a.conj().resolve_conj().numpy(), gr.numpy(), x.numpy(), x0.numpy(), True, True, gam.numpy(),
              ga.numpy(), block)
        outs.append((x, gam, ga))
    for got in outs[:-1]:
        for u, v in zip(got, outs[-1]):
            assert torch.equal(u, v)
    ref = scan_loop(a.unsqueeze(0).to(C128), b.to(C128), x0.to(C128))
    torch.testing.assert_close(outs[-1][0].to(C128), ref, rtol=2e-5, atol=2e-5)

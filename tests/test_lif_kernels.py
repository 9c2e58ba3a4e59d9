"""LIF/ALIF sequence kernels: the compiled CPU kernel (numba) and the torch loop equal each other and the
step loop (values and gradients, float64), the compiled surrogate formulas equal :mod:`spikerec.surrogate`,
and the backward keeps only one byte per spike."""
import itertools

import pytest
import torch

from spikerec.kernels import alif_sequence_numba as nb_alif
from spikerec.kernels import lif_sequence_numba as nb
from spikerec.kernels.alif_sequence import ALIFSequence
from spikerec.kernels.lif_sequence import LIFSequence
from spikerec.layers import ALIF, LIF
from spikerec.surrogate import get_surrogate

needs_numba = pytest.mark.skipif(not nb.available(), reason="numba not installed")
F64 = torch.float64


def _grads(impl, I, v0, i0, alpha, alpha_s, thr, sur, reset, detach, gz, gv, gi):
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (I, v0, i0, alpha, alpha_s, thr)]
    Z, vT, iT = LIFSequence.apply(*leaves, None, sur, reset, detach, impl)
    loss = (Z * gz).sum() + (vT * gv).sum() + ((iT * gi).sum() if iT is not None else 0.0)
    loss.backward()
    return [Z.detach(), vT.detach()] + [t.grad for t in leaves if t is not None]


@needs_numba
@pytest.mark.parametrize("reset,syn,detach,sur", list(itertools.product(
    ["subtract", "zero", "none"], [False, True], [True, False], ["fast_sigmoid", "atan", "gaussian"])))
def test_numba_kernel_equals_torch_loop(reset, syn, detach, sur):
    T, B, N = 23, 3, 600  # N * B > one block of the compiled kernel
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, dtype=F64, generator=g)  # noqa: E731
    I = r(T, B, N) * 0.8 + 0.3
    v0, i0 = r(B, N) * 0.5, (r(B, N) * 0.3 if syn else None)
    alpha = torch.rand(N, dtype=F64, generator=g) * 0.5 + 0.45
    alpha_s = torch.rand(N, dtype=F64, generator=g) * 0.5 + 0.3 if syn else None
    thr = torch.rand(N, dtype=F64, generator=g) + 0.5
    gz, gv, gi = r(T, B, N), r(B, N), r(B, N)
    s = get_surrogate(sur)
    a = _grads("numba", I, v0, i0, alpha, alpha_s, thr, s, reset, detach, gz, gv, gi)
    b = _grads("torch", I, v0, i0, alpha, alpha_s, thr, s, reset, detach, gz, gv, gi)
    assert torch.equal(a[0], b[0]) and 0 < a[0].mean() < 1
    for u, v in zip(a[1:], b[1:]):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


@needs_numba
def test_numba_kernel_float32_close_to_float64():
    T, B, N = 40, 4, 64
    I = torch.randn(T, B, N, dtype=F64) * 0.5 + 0.2
    alpha, thr = torch.full((N,), 0.9, dtype=F64), torch.ones(N, dtype=F64)
    s = get_surrogate("fast_sigmoid")
    z32, v32, _ = LIFSequence.apply(I.float(), torch.zeros(B, N), None, alpha.float(), None, thr.float(), None, s,
                                    "subtract", True, "numba")
    z64, v64, _ = LIFSequence.apply(I, torch.zeros(B, N, dtype=F64), None, alpha, None, thr, None, s,
                                    "subtract", True, "torch")
    assert z32.dtype == torch.float32
    assert (z32.double() != z64).float().mean() < 1e-3
    torch.testing.assert_close(v32.double(), v64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["fast_sigmoid", "atan"])
def test_compiled_surrogate_formulas_match(name):
    """The compiled backward evaluates these two surrogates inline: same values as the Python definition."""
    code, p1, p2 = nb.surrogate_code(get_surrogate(name, slope=3.0, scale=0.7))
    assert code in (1, 2) and (p1, p2) == (3.0, 0.7)
    if not nb.available():
        pytest.skip("numba not installed")
    from spikerec.kernels.surrogate_numba import sd_consts, sd_typed

    x = torch.randn(1000, dtype=F64) * 2
    ref = get_surrogate(name, slope=3.0, scale=0.7).derivative(x)
    c1, c2 = sd_consts(code, p1, p2)
    got = torch.tensor([sd_typed(float(v), code, c1, c2, 1.0) for v in x], dtype=F64)
    torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-15)
    assert nb.surrogate_code(get_surrogate("triangle"))[0] == 0


def test_a_surrogate_without_a_compiled_form_is_named_once():
    """The surrogate owns its compiled form: one without a CPU form (the Gaussian's is Triton only; the
    multi-Gaussian has none) takes the torch derivative, with a warning naming it the first time only."""
    import warnings

    assert get_surrogate("multi_gaussian").compiled_form() is None
    assert get_surrogate("gaussian").compiled_form()[0] not in (1, 2)
    nb._WARNED.discard("gaussian")
    with pytest.warns(UserWarning, match="surrogate 'gaussian' has no compiled CPU form"):
        assert nb.surrogate_code(get_surrogate("gaussian")) == (0, 0.0, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert nb.surrogate_code(get_surrogate("gaussian", width=0.3))[0] == 0


@pytest.mark.parametrize("name", ["fast_sigmoid", "atan"])
def test_compiled_surrogate_in_float32_matches_torch_float32(name):
    """The online kernels evaluate the surrogate in the arrays' dtype (``sd_typed``): in float32 it
    agrees with torch's float32 formula to float32 rounding, and its results are float32 values."""
    if not nb.available():
        pytest.skip("numba not installed")
    import numpy as np

    from spikerec.kernels.surrogate_numba import sd_consts, sd_typed

    sur = get_surrogate(name, slope=3.0, scale=0.7)
    code, p1, p2 = nb.surrogate_code(sur)
    c1, c2 = (np.float32(c) for c in sd_consts(code, p1, p2))
    x = torch.randn(1000, dtype=torch.float32) * 2
    got = [sd_typed(np.float32(v), code, c1, c2, np.float32(1)) for v in x.tolist()]
    assert all(float(np.float32(v)) == v for v in got)  # float32 values (boxed as Python floats)
    torch.testing.assert_close(torch.tensor(got), sur.derivative(x), rtol=2e-6, atol=1e-7)


def _saved_bytes(fn):
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


@pytest.mark.parametrize("impl", ["torch"] + (["numba"] if nb.available() else []))
def test_lif_kernel_saves_no_input_currents_and_byte_spikes(impl):
    T, B, N = 50, 4, 32
    I = torch.randn(T, B, N, requires_grad=True)
    alpha = torch.full((N,), 0.9, requires_grad=True)
    s = get_surrogate("fast_sigmoid")
    nbytes = _saved_bytes(lambda: LIFSequence.apply(I, torch.zeros(B, N), None, alpha, None, torch.ones(N), None, s,
                                                    "subtract", True, impl))
    per = T * B * N
    assert nbytes <= per * 4 + 4 * 4 * B * N  # membranes only (4 B; spikes are recomputed) + O(B N)


@pytest.mark.parametrize("impl", ["torch"] + (["numba"] if nb.available() else []))
@pytest.mark.parametrize("spiking_start", [False, True])
def test_lif_kernel_saves_membranes_only_when_nothing_else_is_read(impl, spiking_start):
    # alpha and thr fixed, detached subtract reset, feed-forward: the backward reads the membranes,
    # the constants and the initial spikes (bool, only if there are any), never v0 itself
    T, B, N = 50, 4, 32
    g = torch.Generator().manual_seed(5)
    I = torch.randn(T, B, N, generator=g, dtype=F64) * 0.8 + 0.3
    v0 = (torch.rand(B, N, generator=g, dtype=F64) * 2.0) if spiking_start else torch.zeros(B, N, dtype=F64)
    alpha = torch.full((N,), 0.9, dtype=F64)
    thr = torch.ones(N, dtype=F64)
    s = get_surrogate("fast_sigmoid")
    Il = I.clone().requires_grad_()
    nbytes = _saved_bytes(lambda: LIFSequence.apply(Il, v0, None, alpha, None, thr, None, s, "subtract", True, impl))
    expected = T * B * N * 8 + 2 * N * 8 + (B * N if spiking_start else 0)  # V, alpha, thr (+ z0 as bool)
    assert nbytes == expected
    gz, gv = torch.randn(T, B, N, generator=g, dtype=F64), torch.randn(B, N, generator=g, dtype=F64)
    lean = _grads_fixed(impl, I, v0, alpha, thr, s, gz, gv)
    full = _grads(impl, I, v0, None, alpha, None, thr, s, "subtract", True, gz, gv, None)  # alpha learnt: v0 kept
    assert bool((v0 > thr).any()) == spiking_start
    for u, v in zip(lean, full[:4]):
        torch.testing.assert_close(u, v, rtol=1e-13, atol=1e-15)


def _grads_fixed(impl, I, v0, alpha, thr, sur, gz, gv):
    Il, vl = I.clone().requires_grad_(), v0.clone().requires_grad_()
    Z, vT, _ = LIFSequence.apply(Il, vl, None, alpha, None, thr, None, sur, "subtract", True, impl)
    ((Z * gz).sum() + (vT * gv).sum()).backward()
    return [Z.detach(), vT.detach(), Il.grad, vl.grad]


def test_alif_kernel_saves_no_input_currents_and_byte_spikes():
    T, B, N = 50, 4, 32
    cell = ALIF(N, N)
    I = torch.randn(T, B, N, requires_grad=True)
    alpha, rho = cell.decays()
    st = cell.initial_state(B)
    nbytes = _saved_bytes(lambda: ALIFSequence.apply(I, st.v, st.a, alpha, rho, cell.b, cell.beta,
                                                     cell.effective_recurrent_weight(), cell.surrogate, True))
    assert nbytes <= T * B * N * 9 + 8 * 4 * (B * N + N * N)  # v, a (4 B each) + spikes (1 B) + O(B N + N^2)


@needs_numba
def test_lif_layer_uses_the_compiled_kernel_on_cpu_and_matches_the_torch_loop(monkeypatch):
    cell = LIF(6, 9, tau_mem=torch.rand(9) * 10 + 2, learn_threshold=True).double()
    x = torch.randn(30, 4, 6, dtype=F64) * 2
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv("SPIKEREC_NUMBA", env)
        cell.zero_grad()
        z, (v,) = cell(x)
        (z.sum() + v.sum()).backward()
        outs.append([z.detach(), v.detach()] + [p.grad.clone() for p in cell.parameters() if p.grad is not None])
    for u, w in zip(*outs):
        torch.testing.assert_close(u, w, rtol=1e-10, atol=1e-12)


def _alif_grads(impl, I, v0, a0, alpha, rho, b, beta, w, sur, detach, gz, gv, ga):
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (I, v0, a0, alpha, rho, b, beta, w)]
    Z, vT, aT = ALIFSequence.apply(*leaves, sur, detach, impl)
    ((Z * gz).sum() + (vT * gv).sum() + (aT * ga).sum()).backward()
    return [Z.detach(), vT.detach(), aT.detach()] + [t.grad for t in leaves if t is not None]


def _alif_inputs(g, T, B, N, recurrent, dtype=F64):
    r = lambda *s: torch.randn(*s, dtype=dtype, generator=g)  # noqa: E731
    u = lambda *s: torch.rand(*s, dtype=dtype, generator=g)  # noqa: E731
    return dict(I=r(T, B, N) * 0.6 + 0.35, v0=r(B, N) * 0.5, a0=u(B, N) * 0.5, alpha=u(N) * 0.5 + 0.45,
                rho=u(N) * 0.3 + 0.65, b=u(N) * 0.5 + 0.4, beta=r(N) * 0.4,
                w=(r(N, N) * 0.3 / N ** 0.5) if recurrent else None)


@needs_numba
@pytest.mark.parametrize("recurrent,detach,sur", list(itertools.product(
    [True, False], [True, False], ["fast_sigmoid", "atan", "gaussian"])))
def test_alif_numba_kernel_equals_torch_loop(recurrent, detach, sur):
    T, B, N = 31, 3, 40
    g = torch.Generator().manual_seed(5)
    x = _alif_inputs(g, T, B, N, recurrent)
    gz, gv, ga = (torch.randn(*s, dtype=F64, generator=g) for s in ((T, B, N), (B, N), (B, N)))
    s = get_surrogate(sur)
    a = _alif_grads("numba", *x.values(), s, detach, gz, gv, ga)
    b = _alif_grads("torch", *x.values(), s, detach, gz, gv, ga)
    assert torch.equal(a[0], b[0]) and 0.02 < a[0].mean() < 0.9
    assert len(a) == len(b) == 3 + (8 if recurrent else 7)
    for u, v in zip(a[1:], b[1:]):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


@needs_numba
def test_alif_numba_kernel_float32_and_saved_bytes():
    T, B, N = 60, 4, 48
    g = torch.Generator().manual_seed(6)
    x64 = _alif_inputs(g, T, B, N, True)
    x32 = {k: v.float() for k, v in x64.items()}
    s = get_surrogate("fast_sigmoid")
    z32, v32, _ = ALIFSequence.apply(*x32.values(), s, True, "numba")
    z64, v64, _ = ALIFSequence.apply(*x64.values(), s, True, "torch")
    assert z32.dtype == torch.float32 and (z32.double() != z64).float().mean() < 2e-3
    I = x32["I"].clone().requires_grad_()
    rest = [v for k, v in x32.items() if k != "I"]
    nbytes = _saved_bytes(lambda: ALIFSequence.apply(I, *rest, s, True, "numba"))
    assert nbytes <= T * B * N * 9 + 8 * 4 * (B * N + N * N)  # v, a (4 B each), spikes as bool


@needs_numba
def test_alif_layer_uses_the_compiled_kernel_on_cpu_and_matches_the_torch_loop(monkeypatch):
    cell = ALIF(6, 9, tau_mem=4.0, tau_adapt=30.0, b=0.3, beta=0.6, recurrent=True).double()
    x = torch.randn(40, 4, 6, dtype=F64) * 2
    calls = []
    real = nb_alif.alif_forward
    monkeypatch.setattr(nb_alif, "alif_forward", lambda *a: calls.append(1) or real(*a))
    outs = []
    for env in ("1", "0"):
        monkeypatch.setenv("SPIKEREC_NUMBA", env)
        cell.zero_grad()
        z, st = cell(x)
        (z.sum() + st.v.sum()).backward()
        outs.append([z.detach(), st.v.detach()] + [p.grad.clone() for p in cell.parameters() if p.grad is not None])
    assert calls == [1]  # the compiled kernel ran once (SPIKEREC_NUMBA=1), the torch loop once
    assert len(outs[0]) == len(outs[1]) == 2 + sum(p.requires_grad for p in cell.parameters())
    for u, w in zip(*outs):
        torch.testing.assert_close(u, w, rtol=1e-10, atol=1e-12)


def test_alif_kernel_bad_impl_is_named():
    cell = ALIF(3, 4)
    alpha, rho = cell.decays()
    st = cell.initial_state(2)
    with pytest.raises(ValueError, match="impl"):
        ALIFSequence.apply(torch.randn(5, 2, 4), st.v, st.a, alpha, rho, cell.b, cell.beta, None,
                           cell.surrogate, True, "fast")


@needs_numba
def test_alif_recurrent_input_inline_equals_the_matmul_between_steps():
    T, B, N = 40, 3, 50
    g = torch.Generator().manual_seed(8)
    x = _alif_inputs(g, T, B, N, True)
    outs = [nb_alif.alif_forward(x["I"], x["v0"], x["a0"], x["alpha"], x["rho"], x["b"], x["beta"], x["w"],
                                 rec_inline=inline) for inline in (True, False)]
    assert torch.equal(outs[0][0], outs[1][0]) and 0.02 < float(outs[0][0].mean()) < 0.9
    for u, v in zip(outs[0][2:], outs[1][2:]):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-13)


@needs_numba
@pytest.mark.parametrize("M", [5, 512, 1100])
@pytest.mark.parametrize("mode,syn", [(0, False), (1, True), (2, False)])
def test_serial_forward_kernel_equals_the_parallel_one(M, mode, syn):
    """``forward_kernel(serial=True)`` (the same loop body on the calling thread) writes exactly
    what the parallel kernel writes, for one block of neurons and for several."""
    import numpy as np

    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    T = 7
    I = torch.randn(T, M, generator=g).numpy()
    v0 = torch.randn(M, generator=g).numpy()
    i0 = torch.randn(M, generator=g).numpy()
    alpha, alpha_s = (torch.rand(M, generator=g).numpy() for _ in range(2))
    thr = (0.5 + torch.rand(M, generator=g)).numpy()
    outs = []
    for serial in (False, True):
        V, Z, S = (np.empty((T, M), I.dtype) for _ in range(3))
        vT, iT = np.empty(M, I.dtype), np.empty(M, I.dtype)
        nb.forward_kernel(serial=serial)(I, v0, i0, alpha, alpha_s, thr, mode, syn, V, Z, S if syn else I[:1, :1].copy(),
                                         vT, iT)
        outs.append((V, Z, vT) + ((S, iT) if syn else ()))
    for a, b in zip(*outs):
        assert np.array_equal(a, b)
    assert outs[0][1].any() and not outs[0][1].all()

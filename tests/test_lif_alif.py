"""LIF / ALIF cells: fused sequence path == step loop (values and gradients), protocol, errors."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.layers.base import value_checks

F64 = torch.float64


def _run(cell, x, s0, path):
    cell.zero_grad()
    xx = x.clone().requires_grad_()
    s = type(s0)(*[t.clone().requires_grad_() for t in s0])
    z, sT = (cell(xx, s) if path == "fused" else cell.step_loop(xx, s))
    w = torch.randn(z.shape, dtype=z.dtype, generator=torch.Generator().manual_seed(7))
    loss = (z * w).sum() + sum(((k + 1.3) * t).sum() for k, t in enumerate(sT))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in cell.named_parameters() if p.grad is not None}
    return z.detach(), [t.detach() for t in sT], xx.grad, [t.grad for t in s], grads


def assert_paths_equal(cell, T=17, B=3):
    cell = cell.double()
    x = torch.randn(T, B, cell.input_size, dtype=F64) * 1.5
    s0 = type(cell.initial_state(B))(*[torch.randn(B, cell.hidden_size, dtype=F64) * 0.7 for _ in cell.initial_state(B)])
    a, b = _run(cell, x, s0, "fused"), _run(cell, x, s0, "loop")
    assert torch.equal(a[0], b[0]), "spikes differ"
    assert 0 < a[0].mean() < 1, "degenerate test: no or only spikes"
    for u, v in zip(a[1], b[1]):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a[2], b[2], rtol=1e-10, atol=1e-12)
    for u, v in zip(a[3], b[3]):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)
    assert a[4].keys() == b[4].keys()
    for k in a[4]:
        torch.testing.assert_close(a[4][k], b[4][k], rtol=1e-10, atol=1e-12, msg=k)
    return a


@pytest.mark.parametrize("reset,recurrent,tau_syn,detach", list(itertools.product(
    ["subtract", "zero", "none"], [False, True], [None, 4.0], [True, False])))
def test_lif_fused_equals_step_loop(reset, recurrent, tau_syn, detach):
    cell = LIF(5, 7, tau_mem=torch.rand(7) * 10 + 1, tau_syn=tau_syn, reset=reset, recurrent=recurrent,
               detach_reset=detach, learn_threshold=True, threshold=0.6, surrogate="atan")
    out = assert_paths_equal(cell)
    # every learnable parameter receives a gradient
    names = {n for n, p in cell.named_parameters() if p.requires_grad}
    assert names <= set(out[4]) and all(out[4][n].abs().sum() > 0 for n in names)


@pytest.mark.parametrize("recurrent,detach,beta_init", list(itertools.product([False, True], [True, False], ["truncnormal", "centered"])))
def test_alif_fused_equals_step_loop(recurrent, detach, beta_init):
    cell = ALIF(5, 7, tau_mem=3.0, tau_adapt=20.0, b=0.3, beta=0.5, recurrent=recurrent,
                detach_reset=detach, beta_init=beta_init)
    out = assert_paths_equal(cell)
    names = {n for n, p in cell.named_parameters() if p.requires_grad}
    assert names <= set(out[4]) and all(out[4][n].abs().sum() > 0 for n in names)


def test_lif_dynamics_by_hand():
    cell = LIF(1, 1, tau_mem=2.0, threshold=1.0, reset="subtract", bias=False).double()
    with torch.no_grad():
        cell.weight.fill_(1.0)
    a = cell.decays()[0].item()
    assert a == pytest.approx(0.6065306597, abs=1e-7)  # exp(-dt/tau) = exp(-1/2)
    x = torch.tensor([0.8, 0.8, 0.0, 0.0], dtype=F64).view(4, 1, 1)
    z, st = cell(x)
    v1 = 0.8
    v2 = a * v1 + 0.8            # 1.285 > 1: spike
    v3 = a * v2 - 1.0            # subtract at the next step
    v4 = a * v3
    assert z.flatten().tolist() == [0.0, 1.0, 0.0, 0.0]
    assert st.v.item() == pytest.approx(v4, abs=1e-14)
    # strict threshold: v == thr does not spike
    cell2 = LIF(1, 1, tau_mem=1e9, threshold=1.0, bias=False).double()
    with torch.no_grad():
        cell2.weight.fill_(1.0)
    assert cell2(torch.ones(1, 1, 1, dtype=F64))[0].item() == 0.0


def test_alif_threshold_adapts():
    cell = ALIF(1, 1, tau_mem=0.1, tau_adapt=10.0, b=0.5, beta=1.0, init_spread=0.0, recurrent=False).double()
    with torch.no_grad():
        cell.weight.fill_(1.0)
    x = torch.full((40, 1, 1), 0.9, dtype=F64)
    z, st = cell(x)
    rho = torch.exp(torch.tensor(-0.1, dtype=F64))
    # a follows a_t = rho a + (1-rho) z_{t-1}; recompute from the spike train
    a = torch.zeros((), dtype=F64)
    zp = torch.zeros((), dtype=F64)
    for t in range(40):
        a = rho * a + (1 - rho) * zp
        zp = z[t, 0, 0]
    torch.testing.assert_close(st.a[0, 0], a)
    # with adaptation, a constant drive spikes less often later than at first
    assert z[:10].sum() > z[-10:].sum() > 0


def test_alif_initialisation_statistics():
    torch.manual_seed(3)
    cell = ALIF(10, 4000, tau_mem=0.1, tau_adapt=250.0, b=0.01, beta=1.8)
    for name, mu in [("b", 0.01), ("beta", 1.8)]:
        p = getattr(cell, name).detach()
        assert p.min() >= mu / 7 - 1e-6 and p.max() <= 13 * mu / 7 + 1e-6
        assert p.mean().item() == pytest.approx(mu, rel=0.03)
    tau = cell.log_tau_adapt.exp().detach()
    assert tau.min() >= 250 / 7 - 1e-3 and tau.max() <= 13 * 250 / 7 + 1e-3
    # truncated at 2 std: std = sigma * 0.8796 for a +-2 sigma truncation
    assert tau.std().item() == pytest.approx(250 * 3 / 7 * 0.8796, rel=0.05)
    cen = ALIF(100, 4000, beta=1.8, beta_init="centered")
    assert abs(cen.beta.mean().item()) < 0.01 and cen.beta.std().item() == pytest.approx(0.18, rel=0.05)


def test_zero_diagonal_and_stability_groups():
    cell = LIF(3, 6, recurrent=True)
    w = cell.effective_recurrent_weight()
    assert torch.all(w.diagonal() == 0) and w.abs().sum() > 0
    has = lambda group, p: any(q is p for q in group)  # noqa: E731
    g = cell.stability_groups()
    assert has(g["time"], cell.recurrent_weight) and has(g["depth"], cell.weight)
    a = ALIF(3, 6)
    g = a.stability_groups()
    assert has(g["time"], a.recurrent_weight) and has(g["time"], a.log_tau_adapt) and has(g["depth"], a.weight)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 9), B=st.integers(1, 4), C=st.integers(1, 6), N=st.integers(1, 6),
       kind=st.sampled_from(["lif", "cuba", "alif", "readout"]), recurrent=st.booleans())
def test_shapes_and_state_vector_roundtrip(T, B, C, N, kind, recurrent):
    if kind == "lif":
        cell = LIF(C, N, recurrent=recurrent)
    elif kind == "cuba":
        cell = LIF(C, N, tau_syn=5.0, recurrent=recurrent)
    elif kind == "alif":
        cell = ALIF(C, N, recurrent=recurrent)
    else:
        cell = LeakyReadout(C, N, tau=5.0 if recurrent else None)
    x = torch.randn(T, B, C)
    out, st_ = cell(x)
    assert out.shape == (T, B, N)
    vec = cell.state_vector(st_)
    assert vec.shape == (B, cell.state_size)
    back = cell.state_from_vector(vec)
    assert all(torch.equal(a, b) for a, b in zip(back, st_))
    ref, st2 = cell.step_loop(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_dtype_and_device_follow_the_module():
    cell = LIF(4, 5, tau_syn=3.0).double()
    z, st_ = cell(torch.rand(6, 2, 4, dtype=F64))
    assert z.dtype == F64 and st_.v.dtype == F64 and st_.i.dtype == F64
    assert cell.initial_state(2).v.device.type == "cpu"


@pytest.mark.gpu
def test_cuda_matches_cpu():
    cell = ALIF(8, 16, tau_mem=3.0, b=0.3, beta=0.5)
    x = torch.randn(20, 4, 8)
    z_cpu, _ = cell(x)
    z_gpu, _ = cell.cuda()(x.cuda())
    assert torch.equal(z_cpu, z_gpu.cpu())


@pytest.mark.parametrize("make,match", [
    (lambda: LIF(3, 4, tau_mem=0.0), "tau_mem: time constants must be > 0"),
    (lambda: LIF(3, 4, tau_mem=-2.0), "tau_mem"),
    (lambda: LIF(3, 4, tau_syn=float("nan")), "tau_syn"),
    (lambda: LIF(3, 4, reset="soft"), "reset must be one of"),
    (lambda: LIF(3, 4, surrogate="nope"), "unknown surrogate 'nope'"),
    (lambda: LIF(3, 4, threshold=0.0), "threshold must be > 0"),
    (lambda: LIF(3, 4, init="he"), "unknown initialisation 'he'"),
    (lambda: ALIF(3, 4, tau_adapt=0.0), "tau_adapt"),
    (lambda: ALIF(3, 4, beta_init="x"), "beta_init"),
    (lambda: LIF(0, 4), "input_size and hidden_size must be positive"),
])
def test_bad_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("x,match", [
    (torch.randn(4, 3), r"expected shape \[T, B, 3\]"),
    (torch.randn(4, 2, 5), "expected 3 features"),
    (torch.full((4, 2, 3), float("nan")), "contains NaN"),
    (torch.randn(4, 2, 3, dtype=torch.complex64), "expected a real tensor"),
])
def test_bad_input(x, match):
    for cell in (LIF(3, 4), ALIF(3, 4)):
        with pytest.raises((ValueError, TypeError), match=match), value_checks(True):  # NaN: an explicit option
            cell(x)
    with pytest.raises(ValueError, match=r"expected shape \[B, 3\]"):
        LIF(3, 4).step(torch.randn(3), LIF(3, 4).initial_state(1))


def test_nan_check_is_off_the_hot_path_by_default():
    """Without the option a forward never reads the data to look for NaN (no host sync on CUDA); with it, it does."""
    x = torch.full((4, 2, 3), float("nan"))
    z, _ = LIF(3, 4)(x)
    assert z.shape == (4, 2, 4)
    with value_checks(True), pytest.raises(ValueError, match="LIF input: contains NaN"):
        LIF(3, 4)(x)
    LIF(3, 4)(x)  # the option ends with its block

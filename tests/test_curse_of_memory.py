"""Curse of memory (Zucchet & Orvieto 2024, "Recurrent neural networks: vanishing and exploding gradients
are not the end of the story", NeurIPS, §2.2, §3 and App. B): closed forms, the eq. 59 erratum, Monte Carlo,
scaling laws, normalisation/reparametrisation, and measurements on spikerec cells."""
import math

import numpy as np
import pytest
import torch

from spikerec.analysis import curse_of_memory as cm
from spikerec.analysis import model_memory as mm
from spikerec.analysis import plots


pytestmark = pytest.mark.usefixtures("one_thread")


# --- closed forms: anchors (eq. 48; eqs. 57-58 with the corrected eq. 57 denominator; App. B.2) ---
@pytest.mark.parametrize("lam,rho,expected", [(0.9 * np.exp(0.7j), 0.5, 8.16383), (0.9, 0.5, 13.8756),
                                              (0.99, 0.9, 871.79), (0.9, 0.99, 91.3085)])
def test_forward_second_moment_anchors(lam, rho, expected):
    assert cm.second_moment_h(lam, rho) == pytest.approx(expected, rel=2e-5)


@pytest.mark.parametrize("lam,rho,expected", [(0.9, 0.0, 263.887), (0.9, 0.5, 778.117), (0.9, 0.9, 3756.95),
                                              (0.9, 1.0, 1e4), (0.99, 0.5, 7.5364e5), (0.999, 0.99, 4.93669e10)])
def test_real_sensitivity_anchors(lam, rho, expected):
    got = cm.second_moment_dh_dlam(lam, rho)
    assert got == pytest.approx(expected, rel=2e-5)
    l = lam  # eq. 58 (App. B.2.2) differentiated in closed form for real lambda (not the printed eq. 59)
    real = ((1 + l**2) * (1 - rho**2 * l**2) + 2 * rho * l * (1 - l**2)) / ((1 - l**2) ** 3 * (1 - rho * l) ** 2)
    assert got == pytest.approx(real, rel=1e-12)


@pytest.mark.parametrize("lam,rho,expected", [(0.9 * np.exp(0.7j), 0.5, 411.1824), (0.95 * np.exp(2j), 0.8, 321.0513),
                                              (0.99 * np.exp(1j * np.pi / 4), 0.9, 88908.95)])
def test_complex_sensitivity_anchors(lam, rho, expected):
    assert cm.second_moment_dh_dlam(lam, rho) == pytest.approx(expected, rel=1e-6)


def test_two_argument_kernel_anchor_and_direct_double_sum():
    a, b = 0.9 * np.exp(0.7j), 0.8 * np.exp(-0.3j)
    S = cm.sensitivity_kernel(a, b, 0.5)
    assert S.real == pytest.approx(-27.6989, abs=2e-4) and S.imag == pytest.approx(29.7411, abs=2e-4)
    # independent check: truncated double sum  sum_{n,m>=1} n m a^(n-1) b^(m-1) rho^|n-m|  (eq. 54)
    rng = np.random.default_rng(0)
    for _ in range(3):
        a = rng.uniform(0.3, 0.8) * np.exp(1j * rng.uniform(-3, 3))
        b = rng.uniform(0.3, 0.8) * np.exp(1j * rng.uniform(-3, 3))
        rho = rng.uniform(0.05, 0.95)
        n = np.arange(1, 400)
        tab = (n * a ** (n - 1))[:, None] * (n * b ** (n - 1))[None, :] * rho ** np.abs(n[:, None] - n[None, :])
        assert cm.sensitivity_kernel(a, b, rho) == pytest.approx(tab.sum(), rel=1e-9)


def test_paper_eq59_is_wrong_only_for_intermediate_rho():
    assert cm.paper_eq59(0.9, 0.5) == pytest.approx(519.66, rel=1e-4)
    assert abs(cm.paper_eq59(0.9, 0.5) / cm.second_moment_dh_dlam(0.9, 0.5) - 1) > 0.3
    for lam in (0.9, 0.7 * np.exp(1.1j)):
        for rho in (0.0, 1.0):
            assert cm.paper_eq59(lam, rho) == pytest.approx(cm.second_moment_dh_dlam(lam, rho), rel=1e-10)


def test_general_acf_forms_reduce_to_closed_forms():
    for lam, rho in [(0.9 * np.exp(0.7j), 0.5), (0.95, 0.8), (0.8 * np.exp(2j), 0.0)]:
        acf = cm.ar1_acf(rho, 3000)
        assert cm.second_moment_h_acf(lam, acf) == pytest.approx(cm.second_moment_h(lam, rho), rel=1e-9)
        assert cm.second_moment_dh_dlam_acf(lam, acf) == pytest.approx(cm.second_moment_dh_dlam(lam, rho), rel=1e-9)


# --- Monte Carlo (AR(1) input, R(D) = rho^|D|, App. B.2): the corrected form within 5%, eq. 59 not ---
@pytest.mark.parametrize("lam,rho", [(0.9, 0.5), (0.9 * np.exp(0.7j), 0.5), (0.7, 1.0), (0.8, 0.9)])
def test_monte_carlo_matches_corrected_closed_form(lam, rho):
    mc = cm.monte_carlo_moments(lam, rho, n_chains=20000, seed=1)
    assert mc["h2"] == pytest.approx(cm.second_moment_h(lam, rho), rel=0.05)
    assert mc["dh2"] == pytest.approx(cm.second_moment_dh_dlam(lam, rho), rel=0.05)
    if 0 < rho < 1:
        assert abs(mc["dh2"] / cm.paper_eq59(lam, rho) - 1) > 0.15


# --- scaling laws as lambda -> 1 (derived from eqs. 48 and 58) ------------------------------------
@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_sensitivity_grows_as_one_minus_lambda_cubed(rho):
    lam = 1 - 10.0 ** -np.arange(2, 5)
    x = 1 - lam
    assert cm.loglog_slope(x, cm.second_moment_h(lam, rho)) == pytest.approx(-1, abs=0.02)
    assert cm.loglog_slope(x, cm.second_moment_dh_dlam(lam, rho)) == pytest.approx(-3, abs=0.02)
    pre = cm.asymptotic_prefactors(rho)
    l = 1 - 1e-5
    assert (1 - l) ** 3 * cm.second_moment_dh_dlam(l, rho) == pytest.approx(pre["dh2"], rel=1e-3)
    ratio = cm.second_moment_dh_dlam(l, rho) / cm.second_moment_h(l, rho)
    assert (1 - l) ** 2 * ratio == pytest.approx(0.5, rel=1e-3)


def test_constant_input_slopes():
    lam = 1 - 10.0 ** -np.arange(2, 5)
    assert cm.loglog_slope(1 - lam, cm.second_moment_h(lam, 1.0)) == pytest.approx(-2, abs=1e-6)
    assert cm.loglog_slope(1 - lam, cm.second_moment_dh_dlam(lam, 1.0)) == pytest.approx(-4, abs=1e-6)


# --- normalisation and reparametrisation (§3.1, App. B.3) -----------------------------------------
def test_gamma_normalisation_and_exp_parametrisation_keep_white_noise_sensitivity_bounded():
    lam = 1 - np.logspace(-6, -0.5, 40)
    assert np.allclose(cm.normalized_h2(lam, 0.0, "detached"), 1.0)
    s = cm.param_sensitivity(lam, 0.0, param="exp", gamma="detached")
    assert s.max() < 0.51 and s.min() > 0.1
    assert cm.param_sensitivity(0.99, 0.0, "exp", "detached") == pytest.approx(0.495008, rel=1e-5)
    assert np.allclose(cm.param_sensitivity(lam, 0.0, "tanh", "detached"), 1 + lam**2)
    # without the mitigations the same quantity explodes
    assert cm.param_sensitivity(lam, 0.0, "direct", "none").max() > 1e15
    # correlated inputs are only partly fixed: the limit is (1+rho)/(2(1-rho))
    assert cm.param_sensitivity(1 - 1e-7, 0.9, "exp", "detached") == pytest.approx(9.5, rel=1e-3)
    assert cm.param_sensitivity(0.99, 0.9, "exp", "detached") == pytest.approx(9.334, rel=1e-3)


def test_autograd_on_a_module_matches_normalised_closed_form():
    lam, n, T = 0.95, 6000, 450
    mod = cm.ScalarRecurrence(torch.full((n,), lam), param="exp", gamma="detached")
    x = torch.randn(T, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    h = mod(x)
    (g,) = torch.autograd.grad(h[-1].sum(), mod.omega)
    expected = cm.param_sensitivity(lam, 0.0, "exp", "detached")
    assert float((g**2).mean()) == pytest.approx(expected, rel=0.05)
    assert float((h[-1].detach() ** 2).mean()) == pytest.approx(1.0, rel=0.05)


def test_gate_coupled_moments_anchors_and_monte_carlo():
    for lam, rho, h2, dl2 in [(0.5, 0.0, 1 / 3, 1.185185), (0.8, 0.0, 0.11111, 1.714678), (0.95, 0.9, 0.328028, 46.4984)]:
        got = cm.gated_moments(lam, rho)
        assert float(got[0]) == pytest.approx(h2, rel=1e-4)
        assert float(got[1]) == pytest.approx(dl2, rel=1e-5)
        assert float(got[2]) == pytest.approx((lam * (1 - lam)) ** 2 * dl2, rel=1e-5)
    mc = cm.monte_carlo_moments(0.8, 0.0, gamma="one_minus_lambda", n_chains=20000, seed=2)
    assert mc["dh2"] == pytest.approx(1.714678, rel=0.05)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="lambda"):
        cm.second_moment_h(1.0, 0.0)
    with pytest.raises(ValueError, match="rho"):
        cm.second_moment_dh_dlam(0.5, 1.5)
    with pytest.raises(ValueError, match="param"):
        cm.dlam_domega(0.5, "cubic")
    with pytest.raises(ValueError, match="gamma"):
        cm.monte_carlo_moments(0.5, 0.0, gamma="sqrt")


# --- measurements on spikerec cells --------------------------------------------------------------
def test_lif_subthreshold_measurement_matches_theory():
    from spikerec.layers import LIF

    torch.manual_seed(0)
    lif = LIF(3, 6, tau_mem=torch.linspace(4, 9, 6), threshold=1e6, bias=False).double()
    x = torch.randn(110, 1500, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    alpha = lif.decays()[0].detach().numpy()
    ev = mm.effective_eigenvalues(lif, x[:5, :4])
    assert np.allclose(np.sort(ev.real), np.sort(alpha), atol=1e-12) and np.allclose(ev.imag, 0)
    got = mm.unit_sensitivity(lif, x, "log_tau_mem")
    w2 = (lif.weight.detach() ** 2).sum(1).numpy()  # variance of the white drive W x
    pred = mm.predicted_moments(alpha, [1.0])
    # log-tau is the exp parametrisation: d alpha / d log tau = -alpha ln alpha
    ratio = got["dh2"] / (w2 * (alpha * np.log(alpha)) ** 2 * pred["dh2"])
    assert ratio.mean() == pytest.approx(1.0, rel=0.05)
    assert (got["h2"] / (w2 * pred["h2"])).mean() == pytest.approx(1.0, rel=0.05)


def test_lru_measurement_matches_theory():
    lru_mod = pytest.importorskip("spikerec.layers.lru")
    lru = lru_mod.LRU(1, 6, r_min=0.5, r_max=0.85, generator=torch.Generator().manual_seed(0)).double()
    x = torch.randn(150, 1500, 1, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    lam = lru.lam().detach().numpy()
    ev = mm.effective_eigenvalues(lru, x[:3, :2])
    expect = np.concatenate([lam, lam.conj()])
    assert np.allclose(np.sort_complex(ev), np.sort_complex(expect), atol=1e-10)
    got = mm.unit_sensitivity(lru, x, "nu_log")
    n = lam.size
    dh2 = got["dh2"][:n] + got["dh2"][n:]  # |d x / d nu|^2 = (d Re)^2 + (d Im)^2
    g2 = (lru.gamma() ** 2 * (lru.B_re[:, 0] ** 2 + lru.B_im[:, 0] ** 2)).detach().numpy()
    dlam = np.abs(lam * np.log(np.abs(lam))) ** 2  # d lambda / d nu_log = lambda ln|lambda|
    pred = g2 * dlam * cm.second_moment_dh_dlam(lam, 0.0)
    assert (dh2 / pred).mean() == pytest.approx(1.0, rel=0.05)


def test_gru_with_constant_gates_has_sigmoid_bias_eigenvalues():
    gru_mod = pytest.importorskip("spikerec.layers.gru")
    gru = gru_mod.GRU(2, 5).double()
    with torch.no_grad():
        gru.rnn.weight_hh_l0.zero_()
        gru.rnn.weight_ih_l0.zero_()
    x = torch.randn(6, 3, 2, dtype=torch.float64)
    ev = mm.effective_eigenvalues(gru, x)
    H = 5
    bz = (gru.rnn.bias_ih_l0[H:2 * H] + gru.rnn.bias_hh_l0[H:2 * H]).detach()
    assert np.allclose(np.sort(ev.real), np.sort(torch.sigmoid(bz).numpy()), atol=1e-12)


def test_empirical_acf_and_group_gradients():
    x = cm.ar1_inputs(400, 300, 0.8, generator=torch.Generator().manual_seed(0)).unsqueeze(-1)
    acf = mm.empirical_acf(x, 3, normalize=True)
    assert np.allclose(acf, 0.8 ** np.arange(4), atol=0.02)
    from spikerec.models import build_model

    model = build_model({"input_size": 1, "layers": [{"kind": "lif", "size": 8, "recurrent": True}],
                         "readout": {"size": 2, "mode": "mean"}}).double()
    target = torch.randn(400, 2, dtype=torch.float64)
    loss_fn = lambda y, t: ((y.mean(0) - t) ** 2).mean()  # noqa: E731
    got = mm.group_gradient_moments(model, x[:50, :400] * 3, target, loss_fn)
    model.zero_grad()
    loss_fn(model(x[:50, :400] * 3)[0], target).backward()
    w = model.cells[0].recurrent_weight.grad
    ltau = model.cells[0].log_tau_mem.grad
    manual = float(torch.cat([w.reshape(-1), ltau.reshape(-1)]).pow(2).mean())
    assert got["0/time"] == pytest.approx(manual, rel=1e-10)
    assert set(got) >= {"0/time", "0/depth", "1/depth"}
    moms = mm.layer_state_moments(model, x[:50, :10])
    assert len(moms) == 1 and moms[0] >= 0


def test_curse_of_memory_plots_write_png(tmp_path):
    oml = np.logspace(-3, -0.3, 20)
    lam = 1 - oml
    p1 = plots.plot_sensitivity_scaling(oml, {f"rho={r}": cm.second_moment_dh_dlam(lam, r) for r in (0, 0.9, 1)},
                                        tmp_path / "fig1.png", h2_reference=cm.second_moment_h(lam, 1.0))
    p2 = plots.plot_normalized_sensitivity(oml, {"rho=0": cm.normalized_h2(lam, 0.0)},
                                           {"rho=0": cm.param_sensitivity(lam, 0.0, "exp", "detached")},
                                           tmp_path / "sub" / "fig2.png")
    p3 = plots.plot_teacher_student([0.5, 0.9, 0.99], {"dense": [1e-3, 1e-1, 10.0], "LRU": [1e-4, 1e-3, 1e-2]},
                                    tmp_path / "ts.png")
    for p in (p1, p2, p3):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(ValueError, match="png"):
        plots.plot_teacher_student([0.5], {"a": [1.0]}, tmp_path / "x.jpg")
    assert not [q for q in tmp_path.rglob("*.png") if q.name.startswith("tmp")]


def test_teacher_eigen_init_and_sampling():
    from spikerec.analysis.teacher_student import LinearTeacher, eigen_init

    g = torch.Generator().manual_seed(0)
    A = eigen_init(12, 0.9, theta0=math.pi / 10, generator=g)
    ev = np.linalg.eigvals(A.numpy())
    assert np.all(np.abs(ev) >= 0.9 - 1e-9) and np.all(np.abs(ev) < 1)
    assert np.all(np.abs(np.angle(ev)) <= math.pi / 10 + 1e-9)
    assert np.allclose(np.sort_complex(ev), np.sort_complex(ev.conj()))
    te = LinearTeacher(6, 0.95, seed=1)
    x, y = te.sample(3, 40)
    h = torch.zeros(3, 6, dtype=torch.float64)
    ref = []
    for t in range(40):
        h = h @ te.A.t() + x[t].double() @ te.B.t()
        ref.append(h @ te.C.t() + x[t].double() @ te.D.t())
    assert torch.allclose(torch.stack(ref).float(), y, atol=1e-4)

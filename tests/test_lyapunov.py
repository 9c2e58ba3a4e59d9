"""Lyapunov spectra by the QR method (Dubinin & Effenberger 2024, "Fading memory as inductive bias in residual
recurrent networks", App. A, Algorithm 1; weak-coupling prediction eq. 13) for WCRNN and other cells."""
import math

import numpy as np
import pytest
import torch

from spikerec.analysis.lyapunov import (classify_criticality, jacrev_time_jacobian, lyapunov_spectrum,
                                        memory_timescales, residual_lyapunov_prediction, resolve_time_jacobian)
from spikerec.analysis.wcrnn import WCRNN, make_residual


pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(T, B, C=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, B, C, generator=g) < 0.3).double() * torch.rand(T, B, C, generator=g, dtype=torch.float64)


def test_zero_coupling_scaled_identity_is_exact_every_step():
    cell = WCRNN(1, 8, residual="identity", r=0.97, gamma=0.0)
    res = lyapunov_spectrum(cell, _inputs(50, 2), return_log_diag=True, return_running=True, jacobian="analytic")
    lr = math.log(cell.residual[0, 0].item())  # 0.97 as stored in the cell's dtype
    assert lr == pytest.approx(math.log(0.97), abs=1e-7)
    assert torch.allclose(res.log_diag, torch.full_like(res.log_diag, lr), atol=1e-12, rtol=0)
    assert torch.allclose(res.running, torch.full_like(res.running, lr), atol=1e-12, rtol=0)


@pytest.mark.parametrize("residual", ["informed", "heterogeneous", "orthogonal", "random_rotation"])
def test_zero_coupling_gives_log_abs_eig_of_residual(residual):
    cell = WCRNN(1, 12, residual=residual, gamma=0.0, seed=4)
    res = lyapunov_spectrum(cell, _inputs(1500, 1), jacobian="analytic")
    pred = residual_lyapunov_prediction(cell.residual)
    assert np.abs(res.exponents[0].numpy() - pred).max() < 2e-3
    assert res.exponents.sum().item() == pytest.approx(res.mean_logdet.item(), abs=1e-10)


@pytest.mark.parametrize("gamma", [1e-3, 1e-2])
def test_weak_coupling_stays_within_the_perturbation_bound(gamma):
    """Derived from eq. 11 (J_t = R + g D_t W, |tanh'| <= 1): every finite-time exponent lies in
    [log(r - g||W||), log(r + g||W||)] (R = r * orthogonal)."""
    r = 0.995
    cell = WCRNN(1, 16, residual="rotation", phi=2 * math.pi / 28, r=r, gamma=gamma, seed=1).double()
    res = lyapunov_spectrum(cell, _inputs(300, 2), jacobian="analytic")
    wn = torch.linalg.matrix_norm(cell.weight_xx.detach(), ord=2).item()
    assert res.exponents.max().item() <= math.log(r + gamma * wn) + 1e-12
    assert res.exponents.min().item() >= math.log(r - gamma * wn) - 1e-12


def test_deviation_from_residual_prediction_shrinks_linearly_with_gamma():
    devs = []
    for gamma in (1e-2, 1e-3):
        cell = WCRNN(1, 16, residual="identity", r=0.995, gamma=gamma, seed=2).double()
        res = lyapunov_spectrum(cell, _inputs(400, 1, seed=3), jacobian="analytic")
        devs.append((res.exponents - math.log(0.995)).abs().max().item())
    assert 3 < devs[0] / devs[1] < 30
    assert devs[1] < 1e-3


def test_volume_identity_for_several_cells():
    """Follows from eq. (A.3): the exponents sum to the average log|det J_t| (QR bookkeeping), any cell."""
    from spikerec.layers import ALIF, LIF

    cells = [WCRNN(2, 10, residual="informed", gamma=0.05, variant="B", seed=0),
             WCRNN(2, 10, residual="orthogonal", gamma=0.05, variant="A", seed=0),
             LIF(2, 6, recurrent=True, tau_mem=8.0, threshold=0.3), ALIF(2, 5, tau_mem=5.0)]
    from spikerec.layers.gru import GRU

    cells.append(GRU(2, 5))
    for cell in cells:
        x = torch.randn(25, 3, 2, dtype=torch.float64)
        res = lyapunov_spectrum(cell, x)
        assert torch.isfinite(res.exponents).all()
        assert torch.allclose(res.exponents.sum(-1), res.mean_logdet, atol=1e-9, rtol=0), type(cell).__name__


def test_jacobian_sources_agree():
    cell = WCRNN(2, 6, residual="informed", gamma=0.2, variant="linear", seed=5).double()
    x = torch.randn(3, 4, 2, dtype=torch.float64)
    state = cell.initial_state(4)
    _, state = cell.step(x[0], state)
    J_a = cell.time_jacobian(x[1], state)
    J_r = jacrev_time_jacobian(cell, x[1], state)
    J_auto = resolve_time_jacobian()(cell, x[1], state)
    assert torch.allclose(J_a, J_r, atol=1e-14) and torch.allclose(J_a, J_auto, atol=1e-14)
    r1 = lyapunov_spectrum(cell, x, jacobian="jacrev").exponents
    r2 = lyapunov_spectrum(cell, x, jacobian="analytic").exponents
    assert torch.allclose(r1, r2, atol=1e-12)


def test_lru_exponents_are_log_abs_lambda_twice():
    lru_mod = pytest.importorskip("spikerec.layers.lru")
    lru = lru_mod.LRU(2, 5, r_min=0.6, r_max=0.99, generator=torch.Generator().manual_seed(1))
    res = lyapunov_spectrum(lru, torch.randn(60, 2, 2))
    ll = torch.log(lru.lam().abs().double()).detach()
    expect = torch.sort(torch.cat([ll, ll]), descending=True).values
    assert torch.allclose(res.exponents, expect.expand_as(res.exponents), atol=1e-6)


def test_subthreshold_lif_exponents_are_log_alpha():
    from spikerec.layers import LIF

    lif = LIF(2, 4, tau_mem=torch.tensor([3.0, 5.0, 10.0, 20.0]), threshold=1e6)
    res = lyapunov_spectrum(lif, torch.randn(30, 2, 2))
    la = torch.sort(torch.log(lif.decays()[0].double()).detach(), descending=True).values
    assert torch.allclose(res.exponents, la.expand_as(res.exponents), atol=1e-10)


def test_thin_frame_and_sparse_reorthonormalisation():
    cell = WCRNN(1, 10, residual="heterogeneous", r0=0.9, dr=0.1, gamma=0.02, seed=7).double()
    x = _inputs(800, 1)
    full = lyapunov_spectrum(cell, x, jacobian="analytic").exponents
    thin = lyapunov_spectrum(cell, x, k=3, jacobian="analytic")
    assert thin.mean_logdet is None and thin.exponents.shape == (1, 3)
    assert torch.allclose(thin.exponents, full[:, :3], atol=2e-3)
    sparse = lyapunov_spectrum(cell, x, reortho_every=4, jacobian="analytic").exponents
    assert torch.allclose(sparse, full, atol=1e-10)


def test_classification_and_timescales():
    assert classify_criticality(make_residual("rotation", 6, phi=0.3)[0], kind="residual") == "critical"
    assert classify_criticality(make_residual("orthogonal", 6, seed=0)[0], kind="residual") == "critical"
    assert classify_criticality(make_residual("identity", 6, r=0.95)[0], kind="residual") == "subcritical"
    assert classify_criticality(make_residual("identity", 6, r=1.01)[0], kind="residual") == "supercritical"
    assert classify_criticality([-0.01, -0.2], tol=1e-3) == "subcritical"
    assert classify_criticality([0.0004, -0.2], tol=1e-3) == "critical"
    assert classify_criticality(torch.tensor([[0.01, -0.2]]), tol=1e-3) == "supercritical"
    ts = memory_timescales([math.log(0.995), math.log(0.95)])
    assert ts == pytest.approx([199.5, 19.5], abs=0.01)
    with pytest.raises(ValueError, match="square"):
        classify_criticality([0.1, 0.2], kind="residual")


def test_bad_arguments():
    cell = WCRNN(1, 4, gamma=0.0)
    with pytest.raises(ValueError, match="input features"):
        lyapunov_spectrum(cell, torch.zeros(5, 1, 3))
    with pytest.raises(ValueError, match="k"):
        lyapunov_spectrum(cell, torch.zeros(5, 1, 1), k=9)
    with pytest.raises(ValueError, match="jacobian"):
        lyapunov_spectrum(cell, torch.zeros(5, 1, 1), jacobian="numeric")
    from spikerec.layers import LIF

    with pytest.raises(TypeError, match="time_jacobian"):
        lyapunov_spectrum(LIF(1, 2), torch.zeros(5, 1, 1), jacobian="analytic")

"""WCRNN cell, residual constructions and the weakly coupled Elman initialisation (Dubinin & Effenberger 2024,
"Fading memory as inductive bias in residual recurrent networks", Sec. 3-4, eqs. 11 and 16-19)."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from spikerec.analysis import plots
from spikerec.analysis.lyapunov import jacrev_time_jacobian
from spikerec.analysis.wcrnn import (VARIANTS, WCRNN, block_rotation, characteristic_frequency, haar_orthogonal,
                                     heterogeneous_diagonal, informed_heterogeneous, make_residual,
                                     weakly_coupled_elman_init)


pytestmark = pytest.mark.usefixtures("one_thread")


# --- residuals (eq. 16, eq. 17, the informed heterogeneous residual of Sec. 4.3) ------------------
def test_block_rotation_is_a_rotation_with_the_right_eigenvalues():
    phis = torch.tensor([0.1, 1.0, 2.5])
    R = block_rotation(phis)
    assert torch.allclose(R @ R.t(), torch.eye(6, dtype=torch.float64), atol=1e-14)
    assert torch.linalg.det(R).item() == pytest.approx(1.0, abs=1e-12)
    ev = np.linalg.eigvals(R.numpy())
    expect = np.exp(1j * np.concatenate([phis.numpy(), -phis.numpy()]))
    assert np.allclose(np.sort_complex(ev), np.sort_complex(expect), atol=1e-12)
    with pytest.raises(ValueError, match="even"):
        make_residual("rotation", 5, phi=0.3)
    with pytest.raises(ValueError, match="phi"):
        make_residual("rotation", 4)


def test_heterogeneous_haar_and_informed_residuals():
    R = heterogeneous_diagonal(200, r0=0.96, dr=0.04, seed=0)
    r = torch.diagonal(R)
    assert (r >= 0.94).all() and (r <= 0.98).all() and r.max() > 0.975
    Q = haar_orthogonal(7, seed=1)
    assert torch.allclose(Q @ Q.t(), torch.eye(7, dtype=torch.float64), atol=1e-12)
    R, g = informed_heterogeneous(40, seed=2)
    ev = np.linalg.eigvals(R.numpy())
    assert np.all(np.abs(ev) >= 0.99 - 1e-12) and np.all(np.abs(ev) <= 1 + 1e-12)
    assert np.all(np.abs(np.angle(ev)) <= math.pi / 4 + 1e-12)
    assert g.shape == (40,) and (g >= 0.005).all() and (g <= 0.05).all()
    cell = WCRNN(1, 40, residual="informed", seed=2)
    assert torch.allclose(cell.gamma.double(), g.float().double())


# --- the cell ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_step_loop_forward_and_analytic_jacobian(variant):
    cell = WCRNN(3, 8, residual="informed", variant=variant, seed=3).double()
    x = torch.randn(7, 4, 3, dtype=torch.float64)
    y1, s1 = cell(x)
    y2, s2 = cell.step_loop(x)
    assert torch.allclose(y1, y2, atol=1e-14) and torch.allclose(s1.x, s2.x, atol=1e-14)
    state = cell.initial_state(4)
    for t in range(3):
        _, state = cell.step(x[t], state)
    assert torch.allclose(cell.time_jacobian(x[3], state), jacrev_time_jacobian(cell, x[3], state), atol=1e-13)


def test_type_b_equals_elman_rnn():
    cell = WCRNN(2, 10, residual="rotation", phi=0.4, r=1.01, gamma=0.05, variant="B", seed=0).double()
    rnn = cell.to_elman()
    x = torch.randn(30, 5, 2, dtype=torch.float64)
    y_cell, _ = cell(x)
    y_rnn, _ = rnn(x)
    assert torch.allclose(y_cell, y_rnn, atol=1e-12)
    assert y_cell.abs().max() < 1  # eq. 19 applies tanh last: type B states live in (-1, 1)
    with pytest.raises(ValueError, match="type-B"):
        WCRNN(2, 4, variant="linear").to_elman()


def test_elman_sgd_with_lr_gamma_squared_follows_the_same_iterates():
    """Derived from eq. 19 (Sec. 4.4): training W in W_hh = R + g W at lr eta == training W_hh directly at lr eta g^2."""
    g, eta = 0.05, 0.3
    cell = WCRNN(2, 6, residual="identity", r=0.99, gamma=g, variant="B", seed=1).double()
    rnn = cell.to_elman()
    x = torch.randn(12, 4, 2, dtype=torch.float64)
    target = torch.randn(4, 6, dtype=torch.float64)
    opt_c = torch.optim.SGD(cell.parameters(), lr=eta, momentum=0.9)
    opt_r = torch.optim.SGD(rnn.parameters(), lr=eta * g**2, momentum=0.9)
    for _ in range(3):
        for model, opt in ((cell, opt_c), (rnn, opt_r)):
            opt.zero_grad()
            ((model(x)[0][-1] - target) ** 2).sum().backward()
            opt.step()
    assert torch.allclose(cell.to_elman().weight_hh_l0, rnn.weight_hh_l0, atol=1e-12)
    assert torch.allclose(cell.to_elman().bias_ih_l0, rnn.bias_ih_l0, atol=1e-12)


def test_weakly_coupled_elman_init():
    rnn = weakly_coupled_elman_init(nn.RNN(3, 16, num_layers=2).double(), "rotation", 0.01, phi=0.2, seed=0)
    R = block_rotation(torch.full((8,), 0.2))
    for layer in range(2):
        dW = (getattr(rnn, f"weight_hh_l{layer}") - R) / 0.01
        assert dW.abs().max() <= 1 / math.sqrt(16) + 1e-9 and dW.abs().max() > 0.15
        wi = getattr(rnn, f"weight_ih_l{layer}")
        assert wi.abs().max() <= 0.01 / math.sqrt(wi.shape[1]) + 1e-12
    x = torch.randn(20, 2, 3, dtype=torch.float64)
    assert torch.isfinite(rnn(x)[0]).all()
    with pytest.raises(TypeError, match="nn.RNN"):
        weakly_coupled_elman_init(nn.GRU(3, 4))


def test_linear_state_bounds_and_no_tanh_superposition():
    """Derived from eq. 11 with R = diag(r) (eq. 17), r < 1: |x_t| <= g (1 - r^t)/(1 - r); and the no-tanh
    WCRNN of Table 2 is affine in the input."""
    r = torch.linspace(0.8, 0.99, 8)
    cell = WCRNN(1, 8, residual="diagonal", r=r, gamma=0.02, seed=2).double()
    x = torch.randn(100, 3, 1, dtype=torch.float64) * 5
    y, _ = cell(x)
    t = torch.arange(1, 101, dtype=torch.float64).view(-1, 1, 1)
    rr = cell.residual.diagonal()
    bound = 0.02 * (1 - rr**t) / (1 - rr)
    assert (y.abs() <= bound + 1e-12).all()
    lin = WCRNN(2, 6, residual="informed", variant="no_tanh", seed=3).double()
    s1, s2 = torch.randn(15, 2, 2, dtype=torch.float64), torch.randn(15, 2, 2, dtype=torch.float64)
    f = lambda s: lin(s)[0]  # noqa: E731
    z = torch.zeros_like(s1)
    assert torch.allclose(f(s1 + s2) - f(z), (f(s1) - f(z)) + (f(s2) - f(z)), atol=1e-12)


def test_build_model_registers_wcrnn_and_parameter_counts():
    """Counted from eq. 11 with trainable biases and fixed R, gamma (Sec. 3-4): 11,310 trainable parameters for
    N = 100 on sMNIST (1 input, 10 classes), 10,501 on ADD."""
    import spikerec.analysis.wcrnn  # noqa: F401  (registers the kind)
    from spikerec.models import CELL_KINDS, build_model

    assert "wcrnn" in CELL_KINDS
    m = build_model({"input_size": 1, "layers": [{"kind": "wcrnn", "size": 100, "residual": "identity", "r": 0.995}],
                     "readout": {"size": 10, "mode": "last"}})
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == 11310
    m = build_model({"input_size": 2, "layers": [{"kind": "wcrnn", "size": 100, "residual": "informed", "variant": "B"}],
                     "readout": {"size": 1, "mode": "last"}})
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == 10501
    y, _ = m(torch.randn(5, 3, 2))
    assert y.shape == (5, 3, 1)
    groups = m.cells[0].stability_groups()
    assert groups["time"][0] is m.cells[0].weight_xx and groups["depth"][0] is m.cells[0].weight_sx


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="variant"):
        WCRNN(1, 4, variant="C")
    with pytest.raises(ValueError, match="gamma"):
        WCRNN(1, 4, gamma=[0.1, 0.2])
    with pytest.raises(ValueError, match="residual"):
        WCRNN(1, 4, residual="spiral")
    with pytest.raises(ValueError, match="r"):
        WCRNN(1, 4, residual="identity", r=-1.0)
    with pytest.raises(ValueError, match="features"):
        WCRNN(2, 4)(torch.zeros(3, 1, 5))


def test_characteristic_frequency():
    t = np.arange(112)
    seqs = np.sin(2 * math.pi * t / 28)[None, :] + 0.1 * np.random.default_rng(0).standard_normal((20, 112))
    assert characteristic_frequency(seqs)[0] == pytest.approx(2 * math.pi / 28)
    from spikerec.analysis.experiments import digits_sequences

    xtr, ytr, xte, yte = digits_sequences(n_test=100)
    assert xtr.shape == (64, 1697, 1) and xte.shape == (64, 100, 1) and 0 <= xtr.min() and xtr.max() <= 1
    assert characteristic_frequency(xtr[:, :, 0].t().numpy())[0] == pytest.approx(2 * math.pi / 8)


def test_sequence_classifier_learns_something_quickly():
    from spikerec.analysis.experiments import digits_sequences, train_sequence_classifier
    from spikerec.layers import LeakyReadout
    from spikerec.models import RecurrentStack

    xtr, ytr, xte, yte = digits_sequences(n_test=200)
    torch.manual_seed(0)
    m = RecurrentStack([WCRNN(1, 32, residual="rotation", phi=2 * math.pi / 8, gamma=0.1, seed=0)],
                       LeakyReadout(32, 10, init="kaiming_uniform"), readout_mode="last")
    h = train_sequence_classifier(m, xtr, ytr, xte, yte, epochs=2, lr=0.1, max_train=600)
    assert h["epoch"] == [0, 1, 2] and all(0 <= a <= 1 for a in h["test_accuracy"])
    assert h["train_loss"][2] < h["train_loss"][1] and h["test_accuracy"][2] > 0.2


def test_lyapunov_plots_write_png(tmp_path):
    les = {"r=0.995": np.log(0.995) + 0.001 * np.random.default_rng(0).standard_normal(10)}
    p1 = plots.plot_lyapunov_spectrum(les, tmp_path / "le.png", predicted={"r=0.995": np.full(10, np.log(0.995))})
    p2 = plots.plot_running_exponents(np.log(0.99) + np.random.default_rng(1).standard_normal((50, 4)) / np.arange(1, 51)[:, None],
                                      tmp_path / "run.png", predicted=np.full(4, np.log(0.99)))
    p3 = plots.plot_training_curves({"a": ([0, 1, 2], [0.1, 0.5, 0.7])}, tmp_path / "acc.png")
    for p in (p1, p2, p3):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

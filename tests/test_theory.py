"""Theory of the LSC paper (Herranz-Celotti & Rouat 2024, "Stabilizing RNN gradients through pre-training"):
Theorem 1 (Sec. II-B), Lemma 1 and Corollary 1 (Sec. II-C, App. B, eqs. 24-26), Lemma 2 (Sec. III-B, App. C,
eqs. 27-33) and the toy d-RNN of Fig. 1c (Sec. III-B)."""
import math
from math import comb

import numpy as np
import pytest
import torch

from spikerec.stability.theory import (
    expected_radius,
    grid_path_count,
    kostlan_chi_mean,
    pascal_rnn,
    pascal_rnn_gradient,
    path_sum,
    thm1_bound_rho1,
    thm1_bound_rho_half,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_grid_path_counts_and_lemma2_identity():
    assert grid_path_count(3, 2) == 10 and grid_path_count(0, 5) == 1
    for T in range(0, 12):
        for dl in range(0, 8):
            assert path_sum(T, dl) == comb(T + dl + 2, T)
    with pytest.raises(ValueError):
        grid_path_count(-1, 2)


def test_theorem1_bounds():
    # magnitudes of (1/T) C(T + dl + 2, T), eq. 29 (App. C), evaluated
    assert math.isclose(thm1_bound_rho1(100, 5), 2.61e8, rel_tol=5e-3)
    assert math.isclose(thm1_bound_rho1(20, 20), 2.57e10, rel_tol=5e-3)
    assert math.isclose(thm1_bound_rho1(40, 40), 1.04e22, rel_tol=5e-3)
    assert thm1_bound_rho_half(9) == 5.0
    # joint limit T = dl: exponential for rho = 1 (ratio grows), linear for rho = 0.5
    r = [thm1_bound_rho1(n + 1, n + 1) / thm1_bound_rho1(n, n) for n in range(10, 30)]
    assert min(r) > 3.5
    with pytest.raises(ValueError):
        thm1_bound_rho1(0, 3)


def test_pascal_rnn_gradient_is_binomial_for_rho_one():
    x = torch.randn(100, dtype=torch.float64) * 2
    _, g = pascal_rnn(x, L=10, rho=1.0)
    T, L = 100, 10
    expected = np.array([comb(L + (T - tp) - 1, L) for tp in range(T)], dtype=np.float64)
    np.testing.assert_array_equal(g.numpy(), expected)
    assert g[0].item() == 42634215112710.0
    np.testing.assert_allclose(pascal_rnn_gradient(T, L, 1.0), expected, rtol=1e-15)


def test_pascal_rnn_half_is_bounded_by_one():
    _, g = pascal_rnn(torch.randn(100) * 2, L=10, rho=0.5)
    assert (g <= 1 + 1e-12).all()
    assert abs(g[0].item() - 1.0) < 1e-9 and abs(g[90].item() - 0.5) < 1e-12 and g[-1].item() == 2.0 ** -10
    assert (g[1:] <= g[:-1] + 1e-15).all()  # non-increasing in t'
    np.testing.assert_allclose(pascal_rnn_gradient(100, 10, 0.5), g.numpy(), rtol=1e-12, atol=1e-15)


def test_pascal_rnn_eq1_convention():
    # every link consumes one step; from the input the first link must go up, so
    # d h_{t,L} / d x_{t'} = rho^(t-t') C(t-t'-1, L-1)
    T, L = 30, 4
    _, g = pascal_rnn(torch.randn(T), L=L, rho=1.0, convention="eq1")
    expected = [sum(comb(t - tp - 1, L - 1) for t in range(tp + 1, T)) for tp in range(T)]
    np.testing.assert_array_equal(g.numpy(), np.array(expected, dtype=np.float64))


def test_expected_radius_of_initialisations():
    # Corollary 1 (Sec. II-C, App. B, eq. 24): E rho ~ 1; measured means (seed 0): Glorot 1.065/1.047,
    # He+ReLU mask 1.050/1.057 (n = 64/128; 200 draws)
    for n, draws, glorot_ref, he_ref in ((64, 200, 1.065, 1.050), (128, 100, 1.047, 1.057)):
        m, _ = expected_radius("glorot_uniform", n, draws=draws, seed=0)
        assert abs(m - 1) < 0.1 and abs(m - glorot_ref) < 0.02
        m, _ = expected_radius("he_normal_relu", n, draws=draws, seed=0)
        assert abs(m - 1) < 0.12 and abs(m - he_ref) < 0.03
    m, s = expected_radius("orthogonal", 64, draws=50)
    assert abs(m - 1) < 1e-6 and s < 1e-6
    with pytest.raises(ValueError):
        expected_radius("lecun", 8)


def test_kostlan_chi_mean():
    for n, v in ((16, 3.938), (32, 5.613), (64, 7.969), (128, 11.292), (256, 15.984)):
        assert abs(kostlan_chi_mean(n) - v) < 1e-3
    assert abs(kostlan_chi_mean(2) - math.sqrt(math.pi / 2)) < 1e-12

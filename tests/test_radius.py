"""Spectral-radius estimators against numpy's eig."""
import math

import numpy as np
import pytest
import torch

from spikerec.layers.alif import ALIF
from spikerec.layers.lif import LIF
from spikerec.stability import spectral_radius, transition_jacobians, transition_operators
from spikerec.stability.radius import square


pytestmark = pytest.mark.usefixtures("one_thread")


def _np_radius(M):
    return np.abs(np.linalg.eigvals(M)).max(-1)


def test_exact_matches_numpy_on_random_linear_rnns():
    g = torch.Generator().manual_seed(0)
    for n in (3, 17, 40):
        W = torch.randn(6, n, n, generator=g, dtype=torch.float64) / math.sqrt(n)
        np.testing.assert_allclose(spectral_radius(W).numpy(), _np_radius(W.numpy()), rtol=1e-12)
    W32 = torch.randn(5, 20, 20, generator=g) / math.sqrt(20)
    r = spectral_radius(W32)
    assert r.dtype == torch.float32
    np.testing.assert_allclose(r.numpy(), _np_radius(W32.numpy().astype(np.float64)), rtol=1e-5)
    single = spectral_radius(W32[0])
    assert single.shape == () and abs(single.item() - r[0].item()) < 1e-6


def _rotation_pair(r1=0.97, theta=2.1, rest=0.5, n=12, seed=0):
    """Dominant complex-conjugate pair r1 * exp(+-i theta) hidden by a random similarity transform."""
    rng = np.random.default_rng(seed)
    D = np.zeros((n, n))
    D[:2, :2] = r1 * np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    D[2:, 2:] = np.diag(rng.uniform(-rest, rest, n - 2))
    S = rng.normal(size=(n, n)) + 3 * np.eye(n)
    return S @ D @ np.linalg.inv(S)


def test_complex_conjugate_dominant_pair_where_power_iteration_fails():
    M = _rotation_pair()
    true = _np_radius(M)
    assert abs(true - 0.97) < 1e-12
    # plain power iteration's Rayleigh quotient oscillates and misses it
    v = np.ones(12)
    ests = []
    for _ in range(200):
        w = M @ v
        ests.append(abs(v @ w) / (v @ v))
        v = w / np.linalg.norm(w)
    assert max(abs(e - true) for e in ests[-20:]) > 0.05
    Mt = torch.tensor(M)[None]
    assert abs(spectral_radius(Mt).item() - true) < 1e-12
    assert abs(spectral_radius(Mt, "arnoldi", n_iter=12).item() - true) < 1e-9
    assert abs(spectral_radius(Mt, "arnoldi", n_iter=8).item() - true) < 1e-3
    assert abs(spectral_radius(Mt, "gelfand", n_iter=400).item() - true) < 0.01 * true


def test_arnoldi_within_one_percent_on_256_wide_random_matrices():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(4, 256, 256, generator=g, dtype=torch.float64) / 16.0
    exact = spectral_radius(W)
    np.testing.assert_allclose(exact.numpy(), _np_radius(W.numpy()), rtol=1e-10)
    est = spectral_radius(W, "arnoldi", n_iter=64, generator=g)
    assert ((est - exact).abs() / exact).max() < 0.01


def test_arnoldi_matrix_free_within_one_percent_on_256_wide_alif_and_lif_layers():
    torch.manual_seed(2)
    B = 3
    alif = ALIF(64, 256, tau_mem=2.0, tau_adapt=20.0).double()
    lif = LIF(64, 256, recurrent=True, tau_mem=10.0, threshold=0.5).double()
    for cell, state in (
        (alif, alif.State(torch.randn(B, 256, dtype=torch.float64) * 0.3, torch.rand(B, 256, dtype=torch.float64) * 0.1)),
        (lif, lif.State(torch.randn(B, 256, dtype=torch.float64) * 0.5)),
    ):
        x = (torch.rand(B, 64) < 0.3).double()
        J = transition_jacobians(cell, x, (state,), which=("time",))
        op = transition_operators(cell, x, (state,), which=("time",))["time/0"]
        exact = torch.tensor(_np_radius(J["time/0"].detach().numpy()))
        est = spectral_radius(op, "arnoldi", n_iter=64, generator=torch.Generator().manual_seed(0))
        assert ((est - exact).abs() / exact).max() < 0.01, (type(cell).__name__, est, exact)


def test_square_modes():
    g = torch.Generator().manual_seed(3)
    M = torch.randn(2, 6, 9, generator=g, dtype=torch.float64)
    sub = square(M, "subsample", torch.Generator().manual_seed(7))
    idx = torch.randperm(9, generator=torch.Generator().manual_seed(7))[:6].sort().values
    torch.testing.assert_close(sub, M[:, :, idx])
    torch.testing.assert_close(square(M, "topleft"), M[:, :, :6])
    torch.testing.assert_close(square(M.transpose(1, 2), "topleft"), M.transpose(1, 2)[:, :6, :])
    # zero padding to square has the leading block's non-zero eigenvalues
    padded = torch.cat([M, torch.zeros(2, 3, 9, dtype=M.dtype)], 1)
    torch.testing.assert_close(spectral_radius(M, square_mode="pad"), spectral_radius(padded))
    torch.testing.assert_close(spectral_radius(M, square_mode="svd"), torch.linalg.matrix_norm(M, ord=2))
    # the matrix-free restriction uses the same rule
    torch.manual_seed(0)
    cell = ALIF(40, 8).double()
    x = (torch.rand(2, 40) < 0.5).double()
    J = transition_jacobians(cell, x, None, which=("input",))["input/0"]  # [2, 16, 40]
    op = transition_operators(cell, x, None, which=("input",))["input/0"]
    for mode in ("subsample", "topleft"):
        dense = spectral_radius(J, square_mode=mode, generator=torch.Generator().manual_seed(5))
        free = spectral_radius(op, "arnoldi", square_mode=mode, n_iter=16, generator=torch.Generator().manual_seed(5))
        torch.testing.assert_close(free, dense, rtol=1e-8, atol=1e-10)


def test_radius_properties():
    g = torch.Generator().manual_seed(4)
    A = torch.randn(3, 30, 30, generator=g, dtype=torch.float64) / math.sqrt(30)
    torch.testing.assert_close(spectral_radius(-2.5 * A), 2.5 * spectral_radius(A))
    assert (spectral_radius(A) <= torch.linalg.matrix_norm(A, ord=2) + 1e-12).all()
    Q, _ = torch.linalg.qr(torch.randn(30, 30, generator=g, dtype=torch.float64))
    assert abs(spectral_radius(Q).item() - 1.0) < 1e-10


def test_exact_gradient_passes_gradcheck():
    g = torch.Generator().manual_seed(5)
    A = (torch.randn(2, 5, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: spectral_radius(a), (A,))
    assert torch.autograd.gradcheck(lambda a: spectral_radius(a, "arnoldi", n_iter=5), (A,))


def test_clear_errors():
    with pytest.raises(FloatingPointError, match="NaN"):
        spectral_radius(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="method"):
        spectral_radius(torch.eye(3), method="power")
    with pytest.raises(ValueError, match="square_mode"):
        spectral_radius(torch.eye(3), square_mode="crop")
    with pytest.raises(ValueError, match="matrix"):
        spectral_radius(torch.ones(3))


def test_lru_time_radius_is_max_abs_lambda_exactly():
    from spikerec.layers.lru import LRU

    torch.manual_seed(6)
    cell = LRU(5, 24, r_min=0.3, r_max=0.95).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    st = cell.State(torch.randn(3, 24, dtype=torch.float64), torch.randn(3, 24, dtype=torch.float64))
    J = transition_jacobians(cell, x, (st,), which=("time",))["time/0"]
    A, _, _, _ = cell.to_dense_real()
    torch.testing.assert_close(J, A.detach().expand(3, 48, 48), rtol=0, atol=1e-14)
    lam_max = cell.lam().abs().max().item()
    assert abs(lam_max - cell.spectral_radius().item()) < 1e-14
    np.testing.assert_allclose(spectral_radius(J).detach().numpy(), lam_max, rtol=1e-12)
    op = transition_operators(cell, x, (st,), which=("time",))["time/0"]
    np.testing.assert_allclose(spectral_radius(op, "arnoldi", n_iter=48).detach().numpy(), lam_max, rtol=1e-10)


def test_gru_jacobian_radius_matches_numpy():
    from spikerec.layers.gru import GRU

    torch.manual_seed(7)
    cell = GRU(6, 20).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    st = cell.State(torch.randn(4, 20, dtype=torch.float64) * 0.5)
    J = transition_jacobians(cell, x, (st,), which=("time",))["time/0"]
    ref = torch.autograd.functional.jacobian(lambda h: cell.step(x, cell.State(h))[0], st.h)
    torch.testing.assert_close(J, torch.stack([ref[b, :, b, :] for b in range(4)]))
    np.testing.assert_allclose(spectral_radius(J).detach().numpy(), _np_radius(J.detach().numpy()), rtol=1e-12)
    op = transition_operators(cell, x, (st,), which=("time",))["time/0"]
    np.testing.assert_allclose(spectral_radius(op, "arnoldi", n_iter=20).detach().numpy(),
                               _np_radius(J.detach().numpy()), rtol=1e-9)


def test_arnoldi_without_graph_equals_differentiable_arnoldi():
    """Under no_grad (verification passes) Arnoldi runs on an in-place basis buffer; its radii equal
    the differentiable path's, dense and matrix-free; with m = n the gradient is the exact one."""
    from spikerec.stability.radius import arnoldi_radius

    g = torch.Generator().manual_seed(5)
    n = 40
    A = torch.randn(3, n, n, generator=g, dtype=torch.float64) / n ** 0.5
    Ag = A.clone().requires_grad_(True)
    for m in (7, 20):
        r_graph = spectral_radius(Ag, "arnoldi", n_iter=m, generator=torch.Generator().manual_seed(1))
        assert r_graph.requires_grad
        with torch.no_grad():
            r_free = spectral_radius(Ag, "arnoldi", n_iter=m, generator=torch.Generator().manual_seed(1))
            r_mv = arnoldi_radius(lambda v: torch.einsum("bij,bj->bi", A, v), 3, n, m, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(r_free, r_graph.detach(), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(r_mv, r_graph.detach(), rtol=1e-10, atol=1e-12)
    ref = A.clone().requires_grad_(True)
    spectral_radius(ref).sum().backward()
    d = A.clone().requires_grad_(True)
    spectral_radius(d, "arnoldi", n_iter=n, generator=torch.Generator().manual_seed(1)).sum().backward()
    torch.testing.assert_close(d.grad, ref.grad, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("method", ["arnoldi", "gelfand"])
def test_dense_products_gather_the_same_gradient_as_autograd(method):
    """On a dense block the Krylov products give the block its gradient once (``sum_j g_j v_j^T``, one batched
    product) instead of one outer product per product added up by autograd: the same radius and gradient as plain
    autograd products, float64, fresh random blocks; a second backward of a retained graph gives it again."""
    from spikerec.stability.radius import _batched_matvec, arnoldi_radius, gelfand_radius

    seed = int(torch.randint(0, 10_000, ()))
    A = torch.randn(4, 30, 30, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) / 30 ** 0.5
    w = torch.rand(4, dtype=torch.float64) + 0.5
    fast = A.clone().requires_grad_(True)
    r = spectral_radius(fast, method, n_iter=9, generator=torch.Generator().manual_seed(seed))
    (r * w).sum().backward(retain_graph=True)
    first = fast.grad.clone()
    (r * w).sum().backward()
    plain = A.clone().requires_grad_(True)
    fn = arnoldi_radius if method == "arnoldi" else gelfand_radius
    r_ref = fn(lambda v: _batched_matvec(plain, v), 4, 30, 9, dtype=torch.float64,
               generator=torch.Generator().manual_seed(seed))
    (r_ref * w).sum().backward()
    torch.testing.assert_close(r.detach(), r_ref.detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(first, plain.grad, rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(fast.grad, 2 * plain.grad, rtol=1e-10, atol=1e-13)

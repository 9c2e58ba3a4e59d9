"""Transition Jacobians: analytic blocks (derived from the cell updates, e.g. the ALIF of Herranz-Celotti &
Rouat 2024, "Stabilizing RNN gradients through pre-training", App. H, eq. 49), chain-rule references through
``model.step``, the matrix-free operators, gradients, and clear errors."""
import pytest
import torch
from torch import nn

from spikerec.layers.alif import ALIF
from spikerec.layers.lif import LIF
from spikerec.layers.readout import LeakyReadout
from spikerec.models import RecurrentStack
from spikerec.stability import cell_time_jacobian, spectral_radius, transition_jacobians, transition_operators
from spikerec.stability.jacobians import parse_key


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _f64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _random_alif_state(cell, B):
    return cell.State(torch.randn(B, cell.hidden_size) * 0.3, torch.rand(B, cell.hidden_size) * 0.2)


def test_alif_time_jacobian_matches_the_analytic_block():
    torch.manual_seed(1)
    c = ALIF(5, 7, tau_mem=3.0, tau_adapt=20.0)
    B = 4
    x = (torch.rand(B, 5) < 0.5).double()
    st = _random_alif_state(c, B)
    J = cell_time_jacobian(c, x, st)
    alpha, rho = c.decays()
    s = c.surrogate.derivative(st.v - c.b - c.beta * st.a)
    W = c.effective_recurrent_weight()
    for b in range(B):
        top = torch.cat([torch.diag(alpha) + W @ torch.diag(s[b]), -W @ torch.diag(c.beta * s[b])], 1)
        bot = torch.cat([(1 - rho) * torch.diag(s[b]), torch.diag(rho - (1 - rho) * c.beta * s[b])], 1)
        torch.testing.assert_close(J[b], torch.cat([top, bot], 0), rtol=1e-12, atol=1e-12)


def test_lif_without_recurrence_has_time_jacobian_alpha_identity():
    torch.manual_seed(2)
    c = LIF(4, 6, tau_mem=torch.linspace(2.0, 9.0, 6), recurrent=False, detach_reset=True)
    x = torch.randn(3, 4)
    st = c.State(torch.randn(3, 6))
    J = cell_time_jacobian(c, x, st)
    alpha, _ = c.decays()
    torch.testing.assert_close(J, torch.diag(alpha).expand(3, 6, 6), rtol=0, atol=1e-15)
    torch.testing.assert_close(spectral_radius(J), alpha.max().expand(3))


def _stack():
    torch.manual_seed(3)
    cells = [ALIF(5, 6, tau_mem=2.0, tau_adapt=15.0), LIF(6, 4, recurrent=True, tau_mem=5.0, threshold=0.3)]
    return RecurrentStack(cells, LeakyReadout(4, 3, tau=4.0))


def _states(m, B):
    c0, c1, r = m.layers
    return (_random_alif_state(c0, B), c1.State(torch.randn(B, 4) * 0.3), r.State(torch.randn(B, 3)))


def _full_step_jacobian(m, x, states, wrt_layer):
    """Reference: d(new state vectors, y) / d(state vector of layer wrt_layer at t-1) through model.step,
    by autograd.functional.jacobian on the batched step, diagonal blocks per sample."""
    layers = m.layers
    B = x.shape[0]
    base = [c.state_vector(s) for c, s in zip(layers, states)]

    def f(vec):
        st = list(states)
        st[wrt_layer] = layers[wrt_layer].state_from_vector(vec)
        y, new = m.step(x, tuple(st))
        return tuple(c.state_vector(s) for c, s in zip(layers, new)) + (y,)

    outs = torch.autograd.functional.jacobian(f, base[wrt_layer])
    return [torch.stack([o[b, :, b, :] for b in range(B)]) for o in outs]


def test_stack_blocks_match_chain_rule_through_model_step():
    m = _stack()
    B = 3
    x = (torch.rand(B, 5) < 0.5).double()
    states = _states(m, B)
    J = transition_jacobians(m, x, states)
    assert sorted(J) == ["depth/1", "input/0", "readout/2", "time/0", "time/1"]
    assert J["time/0"].shape == (B, 12, 12) and J["depth/1"].shape == (B, 4, 12)
    assert J["input/0"].shape == (B, 12, 5) and J["readout/2"].shape == (B, 3, 4)
    ref0 = _full_step_jacobian(m, x, states, 0)  # d(.)/d s^0_{t-1}
    ref1 = _full_step_jacobian(m, x, states, 1)  # d(.)/d s^1_{t-1}
    torch.testing.assert_close(J["time/0"], ref0[0])
    torch.testing.assert_close(J["time/1"], ref1[1])
    # d s^1_t / d s^0_{t-1} = depth/1 @ time/0 ; d y_t / d s^1_{t-1} = readout/2 @ time/1
    torch.testing.assert_close(J["depth/1"] @ J["time/0"], ref0[1])
    torch.testing.assert_close(J["readout/2"] @ J["time/1"], ref1[3])
    # input: d s^0_t / d x_t through model.step
    def g(xx):
        _, new = m.step(xx, states)
        return m.layers[0].state_vector(new[0])

    jx = torch.autograd.functional.jacobian(g, x)
    torch.testing.assert_close(J["input/0"], torch.stack([jx[b, :, b, :] for b in range(B)]))


def test_depth_jacobian_is_not_trivially_zero():
    m = _stack()
    x = (torch.rand(3, 5) < 0.5).double()
    J = transition_jacobians(m, x, _states(m, 3), which=("depth",))
    assert list(J) == ["depth/1"] and J["depth/1"].abs().sum() > 0


def test_matrix_free_operators_equal_dense_blocks():
    m = _stack()
    B = 3
    x = (torch.rand(B, 5) < 0.5).double()
    states = _states(m, B)
    J = transition_jacobians(m, x, states)
    ops = transition_operators(m, x, states)
    for k, op in ops.items():
        torch.testing.assert_close(op.dense(), J[k])
        u = torch.randn(B, op.shape[1])
        torch.testing.assert_close(op.rmatvec(u), torch.einsum("boi,bo->bi", J[k], u))


def test_states_returned_equal_model_step():
    m = _stack()
    x = (torch.rand(3, 5) < 0.5).double()
    states = _states(m, 3)
    _, new = transition_jacobians(m, x, states, which=("time",), return_states=True)
    _, ref = m.step(x, states)
    for a, b in zip(new, ref):
        for u, v in zip(a, b):
            torch.testing.assert_close(u, v)


def test_radius_gradient_flows_to_parameters_and_matches_finite_differences():
    torch.manual_seed(4)
    c = ALIF(3, 5, tau_mem=2.0, tau_adapt=10.0)
    x = (torch.rand(2, 3) < 0.5).double()
    st = _random_alif_state(c, 2)

    def radius():
        return spectral_radius(cell_time_jacobian(c, x, st)).sum()

    r = radius()
    r.backward()
    g = c.recurrent_weight.grad.clone()
    assert g.abs().sum() > 0
    i, j = 1, 3
    eps = 1e-6
    with torch.no_grad():
        c.recurrent_weight[i, j] += eps
        up = radius().item()
        c.recurrent_weight[i, j] -= 2 * eps
        dn = radius().item()
        c.recurrent_weight[i, j] += eps
    assert abs((up - dn) / (2 * eps) - g[i, j].item()) < 1e-6 * max(1.0, abs(g[i, j].item()))


def test_matrix_free_arnoldi_gradient_equals_exact_gradient_at_full_krylov_dimension():
    torch.manual_seed(5)
    c = ALIF(3, 5, tau_mem=2.0, tau_adapt=10.0)
    x = (torch.rand(2, 3) < 0.5).double()
    st = _random_alif_state(c, 2)
    spectral_radius(cell_time_jacobian(c, x, st)).sum().backward()
    g_exact = c.recurrent_weight.grad.clone()
    c.zero_grad()
    op = transition_operators(c, x, (st,), which=("time",))["time/0"]
    spectral_radius(op, "arnoldi", n_iter=10).sum().backward()
    torch.testing.assert_close(c.recurrent_weight.grad, g_exact, rtol=1e-6, atol=1e-9)


class _NotACell(nn.Module):
    def forward(self, x):
        return x


def test_clear_errors():
    with pytest.raises(TypeError, match="cell protocol"):
        transition_jacobians(_NotACell(), torch.zeros(2, 3))
    m = _stack()
    with pytest.raises(ValueError, match="which"):
        transition_jacobians(m, torch.zeros(2, 5), which=("sideways",))
    with pytest.raises(ValueError, match="x_t"):
        transition_jacobians(m, torch.zeros(4, 2, 5))
    with pytest.raises(ValueError, match="states"):
        transition_jacobians(m, torch.zeros(2, 5), states=(None,))
    with torch.no_grad():
        m.cells[0].recurrent_weight[0, 1] = float("nan")
    with pytest.raises(FloatingPointError, match="time/0"):
        transition_jacobians(m, torch.zeros(2, 5), _states(m, 2), which=("time",))
    with pytest.raises(ValueError):
        parse_key("sideways/1")
    assert parse_key("depth/3") == ("depth", 3)


def test_all_finite_reads_the_sum_first_and_every_entry_where_it_must():
    """``all_finite``: a NaN, inf or -inf entry anywhere is found (it makes the sum one); finite entries whose
    float32 sum overflows are still finite; a tensor that requires a gradient is read without a graph."""
    from spikerec.stability.jacobians import all_finite

    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    x = torch.randn(7, 33, 33, generator=g)
    assert all_finite(x) and all_finite(torch.empty(0))
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y.view(-1)[int(torch.randint(0, y.numel(), (), generator=g))] = bad
        assert not all_finite(y), bad
    big = torch.full((4,), 3e38, dtype=torch.float32)
    assert not torch.isfinite(big.sum()) and all_finite(big)
    w = x.clone().requires_grad_(True)
    assert all_finite(w) and w.grad_fn is None and w.grad is None

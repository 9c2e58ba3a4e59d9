"""GRU cell: step == torch.nn.GRU, forward == step loop, protocol, errors."""
import pytest
import torch

from spikerec.layers.gru import GRU, GRUState

F64 = torch.float64


def test_step_equals_torch_gru():
    cell = GRU(7, 11)
    x = torch.randn(5, 7) * 2
    h = torch.randn(5, 11)
    y, s = cell.step(x, GRUState(h))
    ref, hn = cell.rnn(x[None], h[None])
    torch.testing.assert_close(y, ref[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(s.h, hn[0], rtol=0, atol=1e-6)
    # a whole sequence stepped by hand vs one nn.GRU call
    xs = torch.randn(30, 5, 7)
    ys, sT = cell.step_loop(xs, GRUState(h))
    ref, hn = cell.rnn(xs, h[None])
    torch.testing.assert_close(ys, ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(sT.h, hn[0], rtol=0, atol=1e-6)


def test_forward_equals_step_loop_with_gradients():
    cell = GRU(4, 6).double()
    x = torch.randn(25, 3, 4, dtype=F64)
    h0 = torch.randn(3, 6, dtype=F64)
    res = []
    for path in ("forward", "loop"):
        cell.zero_grad()
        xx, hh = x.clone().requires_grad_(), h0.clone().requires_grad_()
        y, s = cell(xx, GRUState(hh)) if path == "forward" else cell.step_loop(xx, GRUState(hh))
        ((y * torch.linspace(-1, 1, 6, dtype=F64)).sum() + 2 * s.h.sum()).backward()
        res.append((y.detach(), s.h.detach(), xx.grad, hh.grad, [p.grad.clone() for p in cell.parameters()]))
    a, b = res
    for u, v in zip(a[:4] + tuple(a[4]), b[:4] + tuple(b[4])):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_step_jacobian_matches_torch_gru():
    cell = GRU(3, 5).double()
    x = torch.randn(1, 3, dtype=F64)
    h = torch.randn(5, dtype=F64)
    J = torch.func.jacrev(lambda v: cell.step(x, cell.state_from_vector(v[None]))[1].h[0])(h)
    J_ref = torch.autograd.functional.jacobian(lambda v: cell.rnn(x[None], v[None, None])[1][0, 0], h)
    torch.testing.assert_close(J, J_ref, rtol=1e-10, atol=1e-12)


def test_protocol():
    cell = GRU(3, 5)
    assert cell.stability_groups()["time"][0] is cell.rnn.weight_hh_l0
    assert cell.stability_groups()["depth"][0] is cell.rnn.weight_ih_l0
    assert cell.state_size == 5 and cell.output_size == 5 and not cell.spiking
    s = GRUState(torch.randn(2, 5))
    assert torch.equal(cell.state_from_vector(cell.state_vector(s)).h, s.h)
    assert torch.equal(cell.output(torch.randn(2, 3), s), s.h)
    assert sum(p.numel() for p in cell.parameters()) == 3 * 5 * (3 + 5) + 6 * 5


def test_bad_inputs():
    cell = GRU(3, 5)
    with pytest.raises(ValueError, match="expected 3 features"):
        cell(torch.randn(4, 2, 6))
    with pytest.raises(TypeError, match="real tensor"):
        cell(torch.randn(4, 2, 3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="real tensor"):
        cell.step(torch.randn(2, 3, dtype=torch.complex64), cell.initial_state(2))
    with pytest.raises(ValueError, match=r"expected shape \[B, 3\]"):
        cell.step(torch.randn(2, 4), cell.initial_state(2))
    with pytest.raises(ValueError, match="state.h"):
        cell.step(torch.randn(2, 3), GRUState(torch.zeros(2, 4)))
    with pytest.raises(ValueError, match="hidden_size"):
        GRU(3, 0)

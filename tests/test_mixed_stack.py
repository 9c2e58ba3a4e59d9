"""Stacks mixing spiking (LIF, ALIF) and non-spiking (LRU, GRU) cells: fast forward == step loop."""
import pytest
import torch

from spikerec.layers.gru import GRU
from spikerec.layers.lru import LRU
from spikerec.models import build_model

F64 = torch.float64

STACKS = {
    "alif-lru-gru-lif": [{"kind": "alif", "size": 12}, {"kind": "lru", "size": 8, "r_min": 0.5, "r_max": 0.99},
                         {"kind": "gru", "size": 10}, {"kind": "lif", "size": 9}],
    "lru-lif-lru-gru": [{"kind": "lru", "size": 6}, {"kind": "lif", "size": 11, "recurrent": True},
                        {"kind": "lru", "size": 5, "output_size": 7}, {"kind": "gru", "size": 4}],
}


def _run(model, x, path):
    model.zero_grad()
    xx = x.clone().requires_grad_()
    y, states = model(xx) if path == "forward" else model.step_loop(xx)
    (y * torch.linspace(-1, 1, y.shape[-1], dtype=F64)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return y.detach(), [t.detach() for s in states for t in s], xx.grad, grads


@pytest.mark.parametrize("name", list(STACKS))
def test_mixed_stack_forward_equals_step_loop(name):
    cfg = {"input_size": 5, "layers": STACKS[name], "readout": {"size": 3, "tau": 5.0, "mode": "mean"}}
    model = build_model(cfg).double()
    kinds = [type(c).__name__ for c in model.cells]
    assert "LRU" in kinds and "GRU" in kinds
    x = (torch.rand(60, 4, 5, dtype=F64) < 0.3).to(F64) * 2.0  # spike-like input
    a, b = _run(model, x, "forward"), _run(model, x, "loop")
    torch.testing.assert_close(a[0], b[0], rtol=1e-10, atol=1e-10)
    for u, v in zip(a[1], b[1]):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a[2], b[2], rtol=1e-9, atol=1e-10)
    assert a[3].keys() == b[3].keys()
    for k in a[3]:
        torch.testing.assert_close(a[3][k], b[3][k], rtol=1e-9, atol=1e-10, msg=k)
    # the spiking layers really spike (not a degenerate all-zero stack)
    _, _, hidden = model(x, record=True)
    for c, h in zip(model.cells, hidden):
        if c.spiking:
            assert 0 < h.mean() < 1


def test_mixed_stack_layer_widths_and_state_sizes():
    model = build_model({"input_size": 5, "layers": STACKS["alif-lru-gru-lif"], "readout": {"size": 3}})
    lru, gru = model.cells[1], model.cells[2]
    assert isinstance(lru, LRU) and isinstance(gru, GRU)
    assert lru.input_size == lru.output_size == 12 and lru.state_size == 16
    assert gru.input_size == 12 and gru.state_size == 10
    states = model.initial_state(2)
    assert [c.state_vector(s).shape[-1] for c, s in zip(model.layers, states)] == [c.state_size for c in model.layers]

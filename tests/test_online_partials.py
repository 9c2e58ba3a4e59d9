"""Issue 12 item 2: the online-learning partials are a backend of the one neuron step. The
hand-written per-neuron Jacobians and immediate partials of the trace classes equal the ones
derived with ``torch.func.jvp`` over ``spikerec.neurons.<kind>.step`` (float64), and the trace
classes' state updates equal that step."""
import pytest
import torch

from spikerec import neurons
from spikerec.hardware.online.derived import derived_partials
from spikerec.hardware.online.kinds import online_trace
from spikerec.layers import ALIF, LIF, LeakyReadout
from spikerec.neurons import alif as _alif
from spikerec.neurons import lif as _lif
from spikerec.neurons import readout as _readout

from online_helpers import _fp64_one_thread  # noqa: F401

SURR = {"name": "fast_sigmoid", "slope": 2.0, "scale": 0.5}
CASES = [
    ("lif", dict(reset="subtract", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=False, learn_threshold=True)),
    ("lif", dict(reset="zero", detach_reset=True)),
    ("lif", dict(reset="none", tau_syn=3.0)),
    ("lif", dict(reset="subtract", tau_syn=3.0, detach_reset=False, learn_threshold=True)),
    ("alif", dict(recurrent=False, detach_reset=False, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("alif", dict(recurrent=False, detach_reset=True, tau_adapt=10.0, b=0.5, beta=0.5)),
    ("readout", dict(tau=4.0)),
]
MODULE = {"lif": (LIF, _lif), "alif": (ALIF, _alif), "readout": (LeakyReadout, _readout)}


def make(kind, kw, H=4, N=6):
    cls, mod = MODULE[kind]
    cell = cls(H, N, **kw) if kind == "readout" else cls(H, N, surrogate=SURR, tau_mem=5.0, **kw)
    with torch.no_grad():
        for n, p in cell.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # heterogeneous per-neuron values
    return cell, mod


def random_state(cell, B):
    s = cell.initial_state(B)
    return type(s)(*(torch.randn_like(f) + 0.8 for f in s))


@pytest.mark.parametrize("kind,kw", CASES)
def test_hand_written_partials_equal_derived_ones(kind, kw):
    B = 5
    cell, mod = make(kind, kw)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x = torch.rand(B, 4) * 2
    prev = random_state(cell, B)
    new = tr.step(x, prev)
    P = tr.partials(x, prev, new)
    per_neuron = tuple(n for n in P.vec if getattr(cell, n, None) is not None)
    J, vec = derived_partials(lambda p, s, x_: mod.step(p, s, x_, cell.options())[1], cell.params(), prev, x,
                              per_neuron)
    Jh = P.J.expand_as(J)
    assert torch.allclose(Jh, J, rtol=1e-12, atol=1e-12)
    assert float(J.abs().sum()) > 0
    for n in per_neuron:
        assert torch.allclose(P.vec[n], vec[n], rtol=1e-12, atol=1e-12), n
    assert per_neuron, "vacuous: no per-neuron parameter compared"
    assert "online_partials" in neurons.backends_of(kind)


@pytest.mark.parametrize("kind,kw", CASES)
def test_trace_state_update_equals_the_neuron_step(kind, kw):
    B = 4
    cell, mod = make(kind, kw)
    tr = online_trace(cell, "full", 0)
    tr.prepare()
    x, prev = torch.rand(B, 4) * 2, random_state(cell, B)
    ref = mod.step(cell.params(), prev, x, cell.options())[1]
    got = tr.step(x, prev)
    for a, b in zip(got, ref):
        assert torch.equal(a, b.detach()) or torch.allclose(a, b.detach(), rtol=1e-14, atol=1e-14)

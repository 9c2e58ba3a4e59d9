"""loihi2 profile vs hand-computed steps of Lava 0.10.0's ``PyLifModelBitAcc`` rules
(``src/lava/proc/lif/models.py``; Lava does not install on Python >= 3.11, so the table is the oracle):

    u <- wrap(sign(u) ((|u| (4096 - d_u)) >> 12) + (a_in << 6))   into (-2^23, 2^23]
    v <- clip(sign(v) ((|v| (4096 - d_v)) >> 12) + u + bias, -(2^23 - 1), 2^23 - 1)
    s  = v > vth << 6;   v <- 0 where s   (right after the spike; u is not reset)

spikerec's weight shift includes Lava's ``<< 6``; ``d_u`` is Lava's ``du + 1`` (``ds_offset``).
"""
import pytest
import torch

from spikerec.hardware.export.intsim import decay, overflow, simulate
from intsim_reference import simulate_reference
from spikerec.hardware.export.profiles import get_profile
from spikerec.hardware.export.quantized_network import QLayer, QuantizedNetwork

P = get_profile("loihi2")


def _net(w: int, shift: int, d_u: int, d_v: int, thr: int, bias: int = 0) -> QuantizedNetwork:
    t = lambda v: torch.tensor([v], dtype=torch.long)  # noqa: E731
    hidden = QLayer(kind="lif", name="cells.0", weight=torch.tensor([[w]]), shift=shift, bias=t(bias), decay_i=t(d_u),
                    decay_v=t(d_v), scale=1.0, threshold=t(thr), reset_amount=t(thr), reset="zero", cuba=True)
    ro = QLayer(kind="readout", name="readout", weight=torch.tensor([[1]]), shift=0, bias=t(0), decay_i=t(4096),
                decay_v=t(4096), scale=1.0)
    return QuantizedNetwork(P, [hidden, ro], "mean", 1)


def _run(net, counts):
    x = torch.tensor(counts, dtype=torch.float).reshape(-1, 1, 1)
    res = simulate(net, x)
    ys, spikes = simulate_reference(net, x)
    assert torch.equal(res.y[:, 0, 0], torch.tensor([s[0][0] for s in ys]))
    assert res.spikes[0][:, 0, 0].long().tolist() == [s[0][0] for s in spikes[0]]
    return res.spikes[0][:, 0, 0].long().tolist()


def test_cuba_steps_by_hand():
    # w = 100 << 6 = 6400 per input spike; d_u = 1024 (u keeps 3072/4096), d_v = 2048 (v halves); vth = 157 << 6 = 10048
    #   t0  x=1: u = 0 + 6400 = 6400;                  v = 0 + 6400 = 6400 (no spike)
    #   t1  x=1: u = 6400*3072>>12 + 6400 = 11200;    v = 3200 + 11200 = 14400 > 10048: spike, v <- 0
    #   t2  x=0: u = 11200*3072>>12 = 8400;            v = 0 + 8400 = 8400
    #   t3  x=0: u = 6300;                             v = 4200 + 6300 = 10500 > 10048: spike
    #   t4  x=0: u = 4725;                             v = 0 + 4725
    net = _net(100, 6, 1024, 2048, 10048)
    assert _run(net, [1, 1, 0, 0, 0]) == [0, 1, 0, 1, 0]


def test_decay_rounds_toward_zero():
    # Lava: sign(x) * (|x| * (4096 - d) >> 12): -4097 * 3072 / 4096 = -3072.75 -> -3072 (a floor would give -3073)
    assert decay(torch.tensor([4097, -4097, 1, -1]), torch.tensor(1024), P).tolist() == [3072, -3072, 0, 0]


@pytest.mark.parametrize("x,expected", [
    (2**23, 2**23),                  # the top of (-2^23, 2^23] stays (two's complement would give -2^23)
    (2**23 + 1, -(2**23) + 1),       # above it: minus 2^24
    (-(2**23), 2**23),               # the bottom is excluded: plus 2^24
    (-(2**23) + 1, -(2**23) + 1),
    (3 * 2**22, 3 * 2**22 - 2**24),
])
def test_current_wrap_boundary(x, expected):
    assert overflow(torch.tensor([x]), 24, P.current_overflow).tolist() == [expected]


def test_wrap_boundary_in_the_simulator():
    # plain LIF synapse (d_u = 4096: u holds this step's input only), w = 64 << 13 = 524288 per spike.
    #   t0  x=16: u = 16 * 524288 = 2^23 -> stays 2^23;   v = clip(2^23) = 2^23 - 1 > vth: spike
    #   t1  x=17: u = 17 * 524288 = 2^23 + 2^19 -> wraps to -2^23 + 2^19; v = 0 + u (negative): no spike
    net = _net(64, 13, 4096, 4096, 64 << 6)
    assert _run(net, [16, 17]) == [1, 0]
    neg = _net(-64, 13, 4096, 4096, 64 << 6)
    #   t0  x=16: u = -2^23 -> wraps to +2^23 (Lava's "<= -2^23" rule); v = 2^23 - 1: spike
    assert _run(neg, [16]) == [1]

"""Integer simulator: bit-exact with the plain-Python reference; overflow rules; float agreement."""
import pytest
import torch

from spikerec.hardware.export.intsim import decay, overflow, simulate
from intsim_reference import simulate_reference
from spikerec.hardware.export.profiles import get_profile
from spikerec.hardware.export.quantize import quantize
from spikerec.models import build_model


def _model(seed, *, reset="zero", cuba=None, recurrent=True, alif=False, readout_tau=5.0, bias=True, cuba_all=False):
    torch.manual_seed(seed)
    first = {"kind": "alif", "size": 6, "b": 0.3, "beta": 0.5, "tau_mem": 8.0, "tau_adapt": 20.0} if alif else \
        {"kind": "lif", "size": 6, "recurrent": recurrent, "reset": reset, "tau_syn": cuba, "threshold": 0.4, "bias": bias}
    cfg = {"input_size": 5, "layers": [first, {"kind": "lif", "size": 4, "reset": reset, "threshold": 0.3, "bias": bias,
                                                       "tau_syn": cuba if cuba_all else None}],
           "readout": {"size": 3, "tau": readout_tau}}
    m = build_model(cfg)
    with torch.no_grad():
        for c in m.cells:
            c.weight.mul_(2.0)
            if getattr(c, "bias", None) is not None:
                c.bias.uniform_(-0.05, 0.2)
    return m


def _inputs(seed, T=14, B=3, C=5, counts=False):
    g = torch.Generator().manual_seed(seed)
    if counts:
        return torch.randint(0, 4, (T, B, C), generator=g).float()
    return (torch.rand(T, B, C, generator=g) < 0.4).float()


def _assert_bit_exact(q, x):
    res = simulate(q, x)
    ys, spikes = simulate_reference(q, x)
    assert torch.equal(res.y, torch.tensor(ys, dtype=torch.long))
    for k, (a, b) in enumerate(zip(res.spikes, spikes)):
        assert torch.equal(a.long(), torch.tensor(b, dtype=torch.long)), f"layer {k} spikes differ"
    return res


CASES = [
    ("generic", {}, dict(reset="zero")),
    ("generic", {}, dict(reset="subtract", cuba=4.0)),
    ("generic", {"reset_timing": "immediate", "decay": "bitshift", "decay_bits": 4}, dict(reset="subtract")),
    ("generic", {"bias_into": "voltage", "strict_threshold": False}, dict(reset="none", cuba=3.0)),
    ("generic", {}, dict(alif=True, reset="subtract")),
    ("generic", {"weight_bits": 4, "state_bits": 12, "current_bits": 12, "threshold_bits": 10}, dict(reset="zero", readout_tau=None)),
    ("loihi2", {}, dict(reset="zero", cuba=4.0)),
    ("loihi2", {}, dict(reset="zero", recurrent=False, readout_tau=None)),
    # Xylo runs CUBA LIF only; v1 has no bias
    ("xylo", {}, dict(reset="subtract", cuba=4.0, cuba_all=True, recurrent=False, bias=False)),
    ("xylo", {}, dict(reset="subtract", cuba=4.0, cuba_all=True, recurrent=True, bias=False)),
    ("xylo2", {}, dict(reset="subtract", cuba=4.0, cuba_all=True, recurrent=True)),
]


@pytest.mark.parametrize("profile,overrides,spec", CASES)
def test_bit_exact_with_reference(profile, overrides, spec):
    for seed in range(2):
        m = _model(seed, **spec)
        q, _ = quantize(m, profile, **overrides)
        res = _assert_bit_exact(q, _inputs(seed, counts=seed == 1))
        assert sum(int(z.sum()) for z in res.spikes) > 0  # the case exercises spiking


@pytest.mark.parametrize("mode", ["wrap", "saturate"])
def test_bit_exact_under_overflow(mode):
    """Narrow states and large count inputs: the state hits the limits; both paths agree."""
    m = _model(3, reset="zero", cuba=6.0)
    with torch.no_grad():
        m.cells[0].weight.abs_()
    p = dict(weight_bits=4, state_bits=10, current_bits=9, threshold_bits=8, state_overflow=mode, current_overflow=mode,
             weight_shift_range=(0, 0))
    q, _ = quantize(m, "generic", **p)
    x = torch.full((12, 2, 5), 40.0)
    res = _assert_bit_exact(q, x)
    # the unbounded sum exceeds the 9-bit current range, so the rule was exercised
    acc = (x[0].long() @ q.layers[0].weight.t()) << q.layers[0].shift
    assert int(acc.abs().max()) > 2**8


def test_overflow_and_decay_rules():
    x = torch.tensor([-130, -129, -128, 127, 128, 300])
    assert overflow(x, 8, "wrap").tolist() == [126, 127, -128, 127, -128, 44]
    assert overflow(x, 8, "saturate").tolist() == [-127, -127, -127, 127, 127, 127]
    p = get_profile("loihi2")
    v = torch.tensor([4096, -4096, 3, -3])
    # sign-magnitude, rounding toward zero: (|v| * (4096 - 1024)) >> 12
    assert decay(v, torch.tensor(1024), p).tolist() == [3072, -3072, 2, -2]
    px = get_profile("xylo")
    assert decay(torch.tensor([100, -100, 1, -1]), torch.tensor(2), px).tolist() == [75, -75, 1, 0]


def test_generic_profile_matches_float_spikes():
    m = _model(5, reset="subtract", cuba=4.0).double()
    x = _inputs(7, T=40, B=8)
    q, rep = quantize(m, "generic", weight_bits=12, calibration=x)
    for row in rep.layers[:-1]:
        assert row["spike_agreement"] > 0.97, row
    res = simulate(q, x)
    _, _, hidden = m(x.double(), record=True)
    assert abs(res.firing_rates[0] - float(hidden[0].mean())) < 0.02


def test_non_integer_input_is_rejected():
    q, _ = quantize(_model(0), "generic")
    with pytest.raises(ValueError, match="integer"):
        simulate(q, torch.full((3, 1, 5), 0.5))
    with pytest.raises(ValueError, match=r"\[T, B, 5\]"):
        simulate(q, torch.zeros(3, 5))

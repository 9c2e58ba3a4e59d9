"""Quantiser: profiles, per-layer error report, silent-layer warning, clear errors, save/load."""
import pytest
import torch

from spikerec.hardware.export.intsim import simulate
from spikerec.hardware.export.profiles import PROFILES, get_profile
from spikerec.hardware.export.quantize import (
    QuantizationError, QuantizedNetwork, SilentLayerWarning, code_alpha, decay_code, fake_quant_params, quantize,
)
from spikerec.models import build_model


def _model(kind="lif", reset="zero", **kw):
    torch.manual_seed(0)
    layer = {"kind": kind, "size": 8}
    if kind == "lif":
        layer |= {"reset": reset, "threshold": 0.5, **kw}
    else:
        layer |= {"b": 0.3, **kw}
    return build_model({"input_size": 6, "layers": [layer], "readout": {"size": 3, "tau": 4.0}})


def test_profiles_are_data():
    for name, p in PROFILES.items():
        d = p.to_dict()
        assert type(p).from_dict(d) == p
        assert p.description
    assert get_profile("loihi2").resets == ("zero",)
    assert get_profile("xylo").decay == "bitshift"
    assert get_profile("generic", weight_bits=4).weight_max == 7
    with pytest.raises(ValueError, match="unknown target profile"):
        get_profile("truenorth")
    with pytest.raises(ValueError, match="unknown field"):
        get_profile("generic", weight_bit=4)
    with pytest.raises(ValueError, match="decay"):
        get_profile("generic", decay="exp")


def test_decay_codes():
    p, px = get_profile("loihi2"), get_profile("xylo")
    alpha = torch.tensor([0.0, 0.5, 0.9, 0.95, 1.0])
    assert decay_code(alpha, p).tolist() == [4096, 2048, 410, 205, 0]
    assert torch.allclose(code_alpha(decay_code(alpha, p), p), alpha.double(), atol=2**-12)
    # xylo: alpha = 1 - 2^-dash; exp(-1/20) -> dash 4 (Rockpool's round(log2(tau/dt)) = 4)
    assert decay_code(torch.tensor([0.0, 0.5, 0.75, float(torch.exp(torch.tensor(-1 / 20)))]), px).tolist() == [0, 1, 2, 4]


def test_report_errors_are_small_and_named():
    m = _model(tau_syn=3.0, recurrent=True)
    q, rep = quantize(m, "generic")
    names = [r["name"] for r in rep.layers]
    assert names == ["cells.0", "readout"]
    r = rep.layers[0]
    # 8-bit mantissa: relative rounding error at most half a step of max|W| / 127
    assert 0 < r["weight_rel_err"] < 0.02 and r["recurrent_rel_err"] < 0.02
    assert r["threshold_rel_err"] < 1e-3 and r["decay_v_err"] < 2**-12 and r["decay_i_err"] < 2**-12
    assert "cells.0" in rep.table()
    # coarser weights -> larger error
    _, rep4 = quantize(m, "generic", weight_bits=4)
    assert rep4.layers[0]["weight_rel_err"] > 4 * r["weight_rel_err"]


def test_unsupported_layer_names_it():
    with pytest.raises(QuantizationError, match=r"cells\.0 \(ALIF\).*'loihi2'.*'alif'"):
        quantize(_model("alif"), "loihi2")
    with pytest.raises(QuantizationError, match=r"cells\.0.*reset 'subtract'.*adapt_reset"):
        quantize(_model(reset="subtract"), "loihi2")
    q, _ = quantize(_model(reset="subtract"), "loihi2", adapt_reset=True)
    assert q.layers[0].reset == "zero"


def test_unrepresentable_weights_name_the_layer():
    m = _model(reset="subtract", tau_syn=3.0)  # Xylo runs CUBA LIF only
    with torch.no_grad():
        m.cells[0].threshold.fill_(1e4)  # ratio threshold / max|W| far beyond 16-bit state
    with pytest.raises(QuantizationError, match=r"layer cells\.0: weights cannot be represented on 'xylo'"):
        quantize(m, "xylo")
    m = _model()
    with torch.no_grad():
        m.cells[0].weight[0, 0] = float("nan")
    with pytest.raises(QuantizationError, match=r"cells\.0: weight has NaN"):
        quantize(m, "generic")
    m = _model()
    with torch.no_grad():
        m.cells[0].weight.zero_()
    with pytest.raises(QuantizationError, match="all weights are zero"):
        quantize(m, "generic")


def test_silent_layer_warning():
    m = _model()
    with torch.no_grad():
        w = torch.full_like(m.cells[0].weight, 0.3)
        w[0, 0] = 40.0  # one huge weight: with 2-bit mantissas every other weight rounds to 0
        m.cells[0].weight.copy_(w)
        m.cells[0].bias.zero_()
    x = torch.zeros(20, 4, 6)
    x[:, :, 1:] = 1.0  # never drives the big weight's input
    _, _, hidden = m(x, record=True)
    assert hidden[0].sum() > 0
    with pytest.warns(SilentLayerWarning, match=r"cells\.0 is silent"):
        q, rep = quantize(m, "generic", weight_bits=2, calibration=x)
    assert rep.layers[0]["rate_int"] == 0 and rep.warnings


def test_save_load_roundtrip(tmp_path):
    m = _model("alif")
    q, _ = quantize(m, "generic")
    q.save(str(tmp_path))
    q2 = QuantizedNetwork.load(str(tmp_path))
    x = (torch.rand(10, 2, 6) < 0.5).float()
    assert torch.equal(simulate(q, x).y, simulate(q2, x).y)
    (tmp_path / "quantized.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a spikerec quantised network"):
        QuantizedNetwork.load(str(tmp_path))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_fake_quant_ste_forward_and_gradient():
    m = _model(tau_syn=3.0)
    params = fake_quant_params(m, get_profile("generic", weight_bits=4))
    w = params["cells.0.weight"]
    q, _ = quantize(m, "generic", weight_bits=4)
    step = 2 ** q.layers[0].shift / q.layers[0].scale
    assert torch.allclose(w.double(), q.layers[0].weight.double() * step, atol=1e-6)
    w.sum().backward()  # straight through: d/dW = 1
    assert torch.equal(m.cells[0].weight.grad, torch.ones_like(m.cells[0].weight))


def test_non_positive_alif_threshold_is_named():
    from spikerec.hardware.export.quantize import QuantizationError, quantize as _quantize
    from spikerec.models import build_model as _build

    m = _build({"input_size": 6, "layers": [{"kind": "alif", "size": 5, "tau_mem": 3.0, "b": 0.3}],
                "readout": {"size": 2}})
    with torch.no_grad():
        m.cells[0].b[1] = -0.01
    with pytest.raises(QuantizationError, match=r"1 of 5 neurons have a non-positive threshold \(min -0\.01\)"):
        _quantize(m, "generic")

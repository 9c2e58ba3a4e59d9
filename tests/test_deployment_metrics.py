"""Deployment metrics through NeuroBench's own implementations equal a hand count on a tiny network."""
import math

import pytest
import torch

pytest.importorskip("neurobench", reason="neurobench is not installed (pip install -e '.[metrics]')")

from spikerec.analysis.deployment_metrics import deployment_metrics, profile_footprint  # noqa: E402
from spikerec.data import ArrayDataset, make_loader  # noqa: E402
from spikerec.hardware.export.profiles import PROFILES  # noqa: E402
from spikerec.models import build_model  # noqa: E402
from hand_count import hand_count  # noqa: E402


def _tiny(seed=0):
    torch.manual_seed(seed)
    m = build_model({"input_size": 6, "layers": [{"kind": "alif", "size": 5, "tau_mem": 4.0},
                                                 {"kind": "lif", "size": 4, "tau_mem": 3.0}],
                     "readout": {"size": 3}})
    with torch.no_grad():
        for c in m.cells:
            c.weight.mul_(4.0)                 # make the layers spike
            c.weight[:, 0] = 0.0               # absent connections: a whole input column
        m.cells[0].weight[1, 2] = 0.0
        m.readout.weight[0, 1] = 0.0
    return m.eval()


@pytest.mark.parametrize("binary_input", [True, False])
def test_neurobench_metrics_equal_hand_count(binary_input):
    model = _tiny()
    g = torch.Generator().manual_seed(1)
    N, T = 10, 7
    x = torch.rand(N, T, 6, generator=g)
    x = (x < 0.5).float() if binary_input else x * (torch.rand(N, T, 6, generator=g) < 0.7)
    ds = ArrayDataset(x, torch.randint(0, 3, (N,), generator=g))
    loader = make_loader(ds, 4, False, 0)  # batches of 4, 4, 2
    m = deployment_metrics(model, loader, profiles={"loihi2": PROFILES["loihi2"]})
    xt = x.transpose(0, 1)
    ref = hand_count(model, xt)
    assert ref["act"] not in (0.0, 1.0)  # the layers spike, but not always
    s = m["synaptic_operations"]
    assert s["effective_acs"] == pytest.approx(ref["ac"], rel=1e-9)
    assert s["effective_macs"] == pytest.approx(ref["mac"], rel=1e-9)
    assert (s["effective_macs"] > 0) == (not binary_input)
    assert s["dense"] == pytest.approx(ref["dense"], rel=1e-9)
    assert m["connection_sparsity"] == pytest.approx(ref["conn"], abs=5e-5)  # NeuroBench rounds to 4 decimals
    assert m["activation_sparsity"] == pytest.approx(ref["act"], rel=1e-9)
    assert m["activation_sparsity_by_layer"] == pytest.approx(ref["per_layer"], rel=1e-9)
    n_par = sum(p.numel() for p in model.parameters())
    assert m["parameters"] == n_par and m["samples"] == N
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) + \
        sum(b.numel() * b.element_size() for b in model.buffers())
    assert m["footprint_bytes"]["float"] == nbytes
    assert m["footprint_bytes"]["loihi2"] == profile_footprint(model, PROFILES["loihi2"])


def test_profile_footprint_by_role():
    model = _tiny()
    p = PROFILES["loihi2"]
    bits = 0
    for name, t in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("weight", "recurrent_weight"):
            bits += t.numel() * p.weight_bits
        elif leaf == "bias":
            bits += t.numel() * (p.bias_bits + p.bias_exp_bits)
        elif "tau" in leaf:
            bits += t.numel() * p.decay_bits
        else:
            bits += t.numel() * p.threshold_bits
    assert profile_footprint(model, p) == math.ceil(bits / 8)
    assert profile_footprint(model, p) < sum(t.numel() * 4 for t in model.parameters())


def test_max_batches_and_unsupported_model():
    model = _tiny()
    ds = ArrayDataset((torch.rand(9, 5, 6) < 0.3).float(), torch.zeros(9, dtype=torch.long))
    m = deployment_metrics(model, make_loader(ds, 4, False, 0), max_batches=1)
    assert m["samples"] == 4
    gru = build_model({"input_size": 6, "layers": [{"kind": "gru", "size": 4}], "readout": {"size": 3}})
    with pytest.raises(ValueError, match="layer 0 .*GRU.* no 2-d input weight"):
        deployment_metrics(gru, make_loader(ds, 4, False, 0))

"""Deployment metrics through NeuroBench's own implementations equal a hand count on a tiny network."""
import math

import pytest
import torch

pytest.importorskip("neurobench", reason="neurobench is not installed (pip install -e '.[metrics]')")

from spikerec.analysis.deployment_metrics import deployment_metrics, profile_footprint  # noqa: E402
from spikerec.data import ArrayDataset, make_loader  # noqa: E402
from spikerec.hardware.profiles import PROFILES  # noqa: E402
from spikerec.models import build_model  # noqa: E402


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


def _hand_count(model, x):
    """Per sample: ACs/MACs by the definition (nnz weights in the column of every non-zero input)."""
    with torch.no_grad():
        _, _, hidden = model(x, record=True)
    T, B = x.shape[:2]
    layers = []
    for i, c in enumerate(model.cells):
        inp = x if i == 0 else hidden[i - 1]
        layers.append((c.weight, inp))
        rec = c.effective_recurrent_weight()
        if rec is not None:
            prev = torch.cat([torch.zeros_like(hidden[i][:1]), hidden[i][:-1]])
            layers.append((rec, prev))
    layers.append((model.readout.weight, hidden[-1]))
    ac = mac = dense = 0.0
    for w, inp in layers:
        nnz_col = (w != 0).sum(0).to(torch.float64)               # [in]
        ops = ((inp != 0).to(torch.float64) * nnz_col).sum().item()
        binary = bool(((inp == 0) | (inp == 1) | (inp == -1)).all())
        # NeuroBench decides AC vs MAC per call (per step); x is either binary or not at every step here
        if binary:
            ac += ops
        else:
            mac += ops
        dense += T * w.shape[0] * w.shape[1] * B
    zeros = sum(int((w == 0).sum()) for w, _ in layers)
    total = sum(w.numel() for w, _ in layers)
    spikes = torch.cat([h.reshape(-1) for h in hidden])
    per_layer = {f"layer{i}": 1 - h.count_nonzero().item() / h.numel() for i, h in enumerate(hidden)}
    return dict(ac=ac / B, mac=mac / B, dense=dense / B, conn=zeros / total,
                act=1 - spikes.count_nonzero().item() / spikes.numel(), per_layer=per_layer)


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
    ref = _hand_count(model, xt)
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

"""Xylo: spikerec's integer simulator of the chip vs SynSense's bit-accurate ``xylosim``, step by step.

Every state xylosim records (hidden spike counts, ``Vmem``, ``Isyn``, output spikes, ``Vmem_out``,
``Isyn_out``) must be identical, on fresh random networks (feed-forward, recurrent, two-layer, with
and without bias, v1 and v2; every regime at once: strong recurrence, input up to the event cap,
shifts 0-7 with saturation, dashes 0-15, thresholds 1-32767, 1-3 layers, 16-bit biases), on
quantised spikerec models, and (v2) against Rockpool's own ``XyloSim`` loader. Chip limits are enforced with errors
naming the limit and the layer.
"""
import zlib

import pytest
import torch

from spikerec.hardware.export.quantize import QuantizationError
from spikerec.hardware.export.xylo.spec import XyloLimitError, XyloSpec, check_limits, simulate_spec
from spikerec.hardware.export.xylo.arithmetic import accumulate, integrate_v1, integrate_v2, multi_spike, xylo_decay
from spikerec.hardware.export.xylo.quantize import quantize_xylo
from spikerec.hardware.export.xylo.xylosim_bridge import run_xylosim, xylosim_available
from spikerec.models import build_model

needs_xylosim = pytest.mark.skipif(not xylosim_available(),
                                   reason="xylosim (SynSense's Xylo simulator) is not installed: pip install 'spikerec[xylo]'")

FIELDS = ("spikes", "vmem", "isyn", "out_spikes", "vmem_out", "isyn_out")


def _assert_same(a, b):
    for k in FIELDS:
        x, y = getattr(a, k), getattr(b, k)
        assert x.shape == y.shape, k
        bad = (x != y).nonzero()
        assert len(bad) == 0, f"{k} differs first at [t, b, n] = {bad[0].tolist()}: {int(x[tuple(bad[0])])} vs {int(y[tuple(bad[0])])}"


def _rand_spec(g, *, version, sizes=(9,), n_in=6, n_out=3, recurrent=True, bias=False, big=False):
    def ri(lo, hi, shape, p=1.0):
        return torch.randint(lo, hi, shape, generator=g) * (torch.rand(shape, generator=g) < p)

    N = sum(sizes)
    w_rec = torch.zeros(N, N, dtype=torch.long)
    offs = [sum(sizes[:k]) for k in range(len(sizes))]
    for k, (o, n) in enumerate(zip(offs, sizes)):
        if recurrent:
            w_rec[o:o + n, o:o + n] = ri(-128, 128, (n, n), 0.5)
        if k:
            p = offs[k - 1]
            w_rec[p:p + sizes[k - 1], o:o + n] = ri(-128, 128, (sizes[k - 1], n), 0.7)
    w_in = torch.zeros(n_in, N, dtype=torch.long)
    w_in[:, :sizes[0]] = ri(-128, 128, (n_in, sizes[0]), 0.7)
    w_out = torch.zeros(N, n_out, dtype=torch.long)
    w_out[offs[-1]:] = ri(-128, 128, (sizes[-1], n_out), 0.7)
    shifts = torch.randint(0, 8 if big else 3, (3,), generator=g).tolist()
    return XyloSpec(weights_in=w_in, weights_rec=w_rec, weights_out=w_out,
                    dash_mem=ri(1, 16, (N,)), dash_syn=ri(1, 16, (N,)), dash_mem_out=ri(0, 16, (n_out,)),
                    dash_syn_out=ri(1, 16, (n_out,)), threshold=ri(1 if big else 50, 200 if big else 2000, (N,)),
                    threshold_out=ri(50, 3000, (n_out,)), weight_shift_in=shifts[0], weight_shift_rec=shifts[1],
                    weight_shift_out=shifts[2], bias=ri(-300, 300, (N,)) if bias else None,
                    bias_out=ri(-300, 300, (n_out,)) if bias else None, version=version, layer_sizes=list(sizes))


CASES = [
    dict(version=1, recurrent=False),
    dict(version=1, recurrent=True),
    dict(version=1, sizes=(7, 5), recurrent=True),
    dict(version=2, recurrent=False),
    dict(version=2, recurrent=True, bias=True),
    dict(version=2, sizes=(7, 5), recurrent=False, bias=True),
    dict(version=2, sizes=(6, 4, 3), recurrent=True),
]


@needs_xylosim
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_random_networks_bit_exact_with_xylosim(case):
    g = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    for _ in range(3):
        spec = _rand_spec(g, **case)
        x = torch.randint(0, 20, (25, 3, spec.n_in), generator=g) * (torch.rand(25, 3, spec.n_in, generator=g) < 0.3)
        ours = simulate_spec(spec, x)
        _assert_same(ours, run_xylosim(spec, x))
        assert int(ours.spikes.sum()) > 0 and int((ours.spikes > 1).sum()) > 0  # spiking and multi-spiking exercised
        assert int((x > 15).sum()) > 0  # the input event cap is exercised


def _regime_spec(g, version):
    """A random core over every regime at once: 1-3 layers, recurrence from none to dense, weight shifts 0-7,
    dashes 0-15, thresholds 1-32767 (log-uniform), 16-bit biases on v2."""
    def ri(lo, hi, shape, p=1.0):
        return torch.randint(lo, hi, shape, generator=g) * (torch.rand(shape, generator=g) < p)

    sizes = torch.randint(1, 7, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
    n_in, n_out = int(torch.randint(1, 17, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    N, offs, p_rec = sum(sizes), [sum(sizes[:k]) for k in range(len(sizes))], float(torch.rand(1, generator=g))
    w_rec = torch.zeros(N, N, dtype=torch.long)
    for k, (o, n) in enumerate(zip(offs, sizes)):
        w_rec[o:o + n, o:o + n] = ri(-128, 128, (n, n), p_rec)
        if k:
            w_rec[offs[k - 1]:o, o:o + n] = ri(-128, 128, (sizes[k - 1], n), 0.8)
    w_in, w_out = torch.zeros(n_in, N, dtype=torch.long), torch.zeros(N, n_out, dtype=torch.long)
    w_in[:, :sizes[0]] = ri(-128, 128, (n_in, sizes[0]), 0.8)
    w_out[offs[-1]:] = ri(-128, 128, (sizes[-1], n_out), 0.8)
    thr = lambda n: torch.exp(torch.rand(n, generator=g) * 10.397).round().long().clamp(1, 32767)  # noqa: E731
    bias = version == 2 and bool(torch.rand(1, generator=g) < 0.6)
    rb = lambda n: torch.randint(-2**15, 2**15, (n,), generator=g) >> torch.randint(0, 16, (n,), generator=g)  # noqa: E731
    sh = torch.randint(0, 8, (3,), generator=g).tolist()
    return XyloSpec(weights_in=w_in, weights_rec=w_rec, weights_out=w_out, dash_mem=ri(0, 16, (N,)),
                    dash_syn=ri(0, 16, (N,)), dash_mem_out=ri(0, 16, (n_out,)), dash_syn_out=ri(0, 16, (n_out,)),
                    threshold=thr(N), threshold_out=thr(n_out), weight_shift_in=sh[0], weight_shift_rec=sh[1],
                    weight_shift_out=sh[2], bias=rb(N) if bias else None, bias_out=rb(n_out) if bias else None,
                    version=version, layer_sizes=sizes)


@needs_xylosim
@pytest.mark.parametrize("version", [1, 2])
def test_every_regime_bit_exact_with_xylosim(version):
    """Many small random cores in one process; the regimes are checked to have been reached: saturated
    currents and membranes, the 15-event input cap, the 31-spike cap, dashes 0, three layers, and on v2
    networks where the v1 membrane rule would differ and the 16-bit wrap of the leak at -2^15."""
    from spikerec.hardware.export.xylo import spec as X
    from spikerec.hardware.export.xylo.arithmetic import integrate_v1

    g = torch.Generator().manual_seed(100 + version)
    seen = dict(isyn_sat=0, vmem_sat=0, cap=0, spike_cap=0, three_layers=0, v1_rule_differs=0, leak_wrap=0)
    for _ in range(120):
        spec = _regime_spec(g, version)
        T = 12
        x = torch.randint(0, 21, (T, 2, spec.n_in), generator=g)
        x = x * (torch.rand(T, 2, spec.n_in, generator=g) < float(torch.rand(1, generator=g)))
        ours = simulate_spec(spec, x)
        _assert_same(ours, run_xylosim(spec, x))
        seen["isyn_sat"] += int((ours.isyn.abs() >= 2**15 - 1).any())
        seen["vmem_sat"] += int((ours.vmem == -2**15).any() or (ours.vmem_out.abs() >= 2**15 - 1).any())
        seen["cap"] += int((x > 15).any())
        seen["spike_cap"] += int((ours.spikes == 31).any())
        seen["three_layers"] += int(len(spec.layer_sizes) == 3)
        if version == 2:
            seen["leak_wrap"] += int(((ours.vmem[:-1] == -2**15) & (spec.dash_mem == 0)).any())
            hidden, out = X.ARITHMETIC[2]
            saved = hidden._integrate, out._integrate
            hidden._integrate = out._integrate = integrate_v1
            try:
                seen["v1_rule_differs"] += int(not torch.equal(simulate_spec(spec, x).vmem, ours.vmem))
            finally:
                hidden._integrate, out._integrate = saved
    assert all(n > 0 for k, n in seen.items() if version == 2 or k not in ("v1_rule_differs", "leak_wrap")), seen


def _one_neuron(w, shift, thr, dash_mem, dash_syn, version):
    return XyloSpec(weights_in=torch.tensor(w).reshape(len(w), 1), weights_rec=torch.zeros(1, 1, dtype=torch.long),
                    weights_out=torch.zeros(1, 1, dtype=torch.long), dash_mem=[dash_mem], dash_syn=[dash_syn],
                    dash_mem_out=[1], dash_syn_out=[1], threshold=[thr], threshold_out=[100], weight_shift_in=shift,
                    version=version)


@pytest.mark.parametrize("w,shift,thr,dash_syn,counts,step,v1,v2", [
    ([-95, 125], 5, 26759, 13, [[7, 2], [11, 13], [6, 0], [14, 10], [15, 1]], 4, -28764, -25537),
    ([51, 38, -24], 7, 19171, 12, [[13, 15, 2], [2, 15, 1], [14, 3, 12], [14, 3, 1], [5, 4, 1]], 3, 10517, 9501),
])
def test_v2_integrates_a_saturated_increment(w, shift, thr, dash_syn, counts, step, v1, v2):
    """Two cases read off xylosim: v1 and v2 agree on Isyn throughout and differ in Vmem once ``-L + i``
    leaves 16 bits (case 1: v = 7231, i = -28764: v1 -28764, v2 7231 + sat(-7231 - 28764) = -25537)."""
    x = torch.tensor(counts).unsqueeze(1)
    r1, r2 = (simulate_spec(_one_neuron(w, shift, thr, 0, dash_syn, v), x) for v in (1, 2))
    assert torch.equal(r1.isyn, r2.isyn) and torch.equal(r1.vmem[:step], r2.vmem[:step])
    assert (int(r1.vmem[step, 0, 0]), int(r2.vmem[step, 0, 0])) == (v1, v2)
    if xylosim_available():
        for v, r in ((1, r1), (2, r2)):
            _assert_same(r, run_xylosim(_one_neuron(w, shift, thr, 0, dash_syn, v), x))


def test_v2_leak_is_negated_in_16_bits():
    """dash_mem 0 at -2^15: the leak -(-2^15) wraps to -2^15, so the membrane stays at -2^15 unless the
    current and the bias together exceed 2^15 (v1 would restart from 0 + i)."""
    v, zero = torch.full((4,), -2**15), torch.tensor(0)
    i = torch.tensor([0, 2**15 - 1, 30000, 30000])
    assert integrate_v2(v, zero, i, torch.tensor([0, 0, 2768, 30000])).tolist() == [-2**15, -2**15, -2**15, -5536]
    assert integrate_v1(v, zero, i, None).tolist() == i.tolist()
    assert integrate_v2(torch.tensor([30000]), torch.tensor(4), torch.tensor([30000]), torch.tensor([30000])).tolist() == [
        2**15 - 1]


@needs_xylosim
def test_rockpool_xylosim_v2_loads_the_spec_as_spikerec_does(monkeypatch):
    """Rockpool's own Xylo Audio 2 simulator (``syns61201.XyloSim.from_specification``) records the same
    states as spikerec's simulator. Rockpool's ``devices.xylo`` package imports samna (not installable
    here), so the package is bypassed and its ``syns61201.xylo_sim`` module imported alone."""
    import importlib
    import os
    import sys
    import types

    devices = pytest.importorskip("rockpool.devices", reason="Rockpool is not installed (pip install 'spikerec[rockpool]')")
    stub = types.ModuleType("rockpool.devices.xylo")
    stub.__path__ = [os.path.join(os.path.dirname(devices.__file__), "xylo")]
    monkeypatch.setitem(sys.modules, "rockpool.devices.xylo", stub)
    for name in [m for m in sys.modules if m.startswith("rockpool.devices.xylo.")]:
        monkeypatch.delitem(sys.modules, name)
    XyloSim = importlib.import_module("rockpool.devices.xylo.syns61201.xylo_sim").XyloSim
    g = torch.Generator().manual_seed(5)
    for _ in range(6):
        spec = _regime_spec(g, 2)
        x = torch.randint(0, 21, (10, 1, spec.n_in), generator=g) * (torch.rand(10, 1, spec.n_in, generator=g) < 0.6)
        zeros = lambda n: torch.zeros(n, dtype=torch.long)  # noqa: E731
        sim = XyloSim.from_specification(
            weights_in=spec.weights_in.numpy(), weights_rec=spec.weights_rec.numpy(), weights_out=spec.weights_out.numpy(),
            dash_mem=spec.dash_mem.numpy(), dash_syn=spec.dash_syn.numpy(), dash_syn_2=spec.dash_syn.numpy(),
            dash_mem_out=spec.dash_mem_out.numpy(), dash_syn_out=spec.dash_syn_out.numpy(), threshold=spec.threshold.numpy(),
            threshold_out=spec.threshold_out.numpy(),
            bias=(spec.bias if spec.bias is not None else zeros(spec.n_hidden)).numpy(),
            bias_out=(spec.bias_out if spec.bias_out is not None else zeros(spec.n_out)).numpy(),
            weight_shift_in=spec.weight_shift_in, weight_shift_rec=spec.weight_shift_rec,
            weight_shift_out=spec.weight_shift_out)
        out, _, rec = sim.evolve(x[:, 0].numpy(), record=True)
        ours = simulate_spec(spec, x)
        for key, theirs in (("spikes", rec["Spikes"]), ("vmem", rec["Vmem"]), ("isyn", rec["Isyn"]),
                            ("out_spikes", out), ("vmem_out", rec["Vmem_out"]), ("isyn_out", rec["Isyn_out"])):
            assert torch.equal(getattr(ours, key)[:, 0], torch.as_tensor(theirs, dtype=torch.long).reshape(10, -1)), key


@needs_xylosim
def test_saturation_multi_spike_cap_bit_exact_with_xylosim_v1():
    """Large shifts and counts: the 16-bit saturation after every event and the 31-spike cap are hit."""
    g = torch.Generator().manual_seed(7)
    for _ in range(4):
        spec = _rand_spec(g, version=1, big=True)
        x = torch.randint(0, 25, (25, 2, spec.n_in), generator=g) * (torch.rand(25, 2, spec.n_in, generator=g) < 0.5)
        ours = simulate_spec(spec, x)
        _assert_same(ours, run_xylosim(spec, x))
    assert int((ours.isyn.abs() >= 2**15 - 64).sum()) > 0 and int((ours.spikes == 31).sum()) > 0


def test_decay_and_event_rules():
    x = torch.tensor([7, 6, 1, 0, -1, -7, 100, -100])
    # x - (x >> 3); a positive value loses at least 1; floor shift for negatives
    assert xylo_decay(x, torch.tensor(3)).tolist() == [6, 5, 0, 0, 0, -6, 88, -87]
    assert xylo_decay(x, torch.tensor(0)).tolist() == [0] * 8  # dash 0 removes everything
    i = torch.tensor([[32000, -32000]])
    w = torch.tensor([[100, -100], [-50, 50]])
    # source 0 saturates (+2 events), then source 1 comes back from the limit
    assert accumulate(i, torch.tensor([[10, 1]]), w, 0).tolist() == [[32767 - 50, -32768 + 50]]
    assert multi_spike(torch.tensor([99, 100, 250, 10**5]), torch.tensor(100)).tolist() == [0, 1, 2, 31]


def _cuba_model(seed, *, layers=1, recurrent=True, bias=False, n_in=10, hidden=12, out=4):
    torch.manual_seed(seed)
    cells = [{"kind": "lif", "size": hidden, "recurrent": recurrent, "reset": "subtract", "tau_syn": 4.0, "tau_mem": 10.0,
              "threshold": 0.5, "bias": bias}]
    if layers == 2:
        cells.append({"kind": "lif", "size": 8, "reset": "subtract", "tau_syn": 3.0, "threshold": 0.4, "bias": bias})
    m = build_model({"input_size": n_in, "layers": cells, "readout": {"size": out, "tau": 5.0}})
    with torch.no_grad():
        for c in m.cells:
            c.weight.mul_(3.0)
            if bias:
                c.bias.uniform_(-0.05, 0.1)
        if m.readout.bias is not None:
            m.readout.bias.uniform_(-0.1, 0.1) if bias else m.readout.bias.zero_()
    return m


@needs_xylosim
@pytest.mark.parametrize("version,layers,recurrent,bias", [(1, 1, False, False), (1, 2, True, False),
                                                          (2, 1, True, True), (2, 2, False, True)])
def test_quantised_models_bit_exact_with_xylosim(version, layers, recurrent, bias):
    m = _cuba_model(version * 10 + layers, layers=layers, recurrent=recurrent, bias=bias)
    spec, rep = quantize_xylo(m, version)
    assert (spec.bias is not None) == bias
    x = (torch.rand(30, 3, 10, generator=torch.Generator().manual_seed(1)) < 0.3).long()
    ours = simulate_spec(spec, x)
    _assert_same(ours, run_xylosim(spec, x))
    assert int(ours.spikes.sum()) > 0


def test_quantised_model_follows_the_float_model():
    """The 1/a_s fold makes the chip's synapse the float one: the first layer's firing rate stays close."""
    m = _cuba_model(3, recurrent=False).double()
    spec, _ = quantize_xylo(m, 1)
    x = (torch.rand(60, 8, 10, generator=torch.Generator().manual_seed(2)) < 0.3).long()
    _, _, hidden = m(x.double(), record=True)
    rate_int = float((simulate_spec(spec, x).spikes > 0).double().mean())
    assert abs(rate_int - float(hidden[0].detach().mean())) < 0.1


def test_chip_limits_name_the_limit_and_layer():
    with pytest.raises(XyloLimitError, match=r"layer cells\.0: 40 input channels exceed the limit of 16 inputs"):
        quantize_xylo(_cuba_model(0, n_in=40), 1)
    with pytest.raises(XyloLimitError, match=r"layer cells\.0: 1100 hidden neurons .* limit of 1000"):
        quantize_xylo(_cuba_model(0, hidden=1100), 1)
    with pytest.raises(XyloLimitError, match=r"layer readout: 10 output neurons exceed the limit of 8"):
        quantize_xylo(_cuba_model(0, out=10), 1)
    with pytest.raises(XyloLimitError, match=r"layer cells\.0: a bias is not supported on Xylo v1"):
        quantize_xylo(_cuba_model(0, bias=True), 1)
    spec, _ = quantize_xylo(_cuba_model(0, bias=True), 2)
    spec.weight_shift_rec = 9
    with pytest.raises(XyloLimitError, match=r"weight_shift_rec = 9 outside the one-shift-per-matrix range 0\.\.7"):
        check_limits(spec)
    spec.weight_shift_rec = 0
    spec.bias_out = torch.full((spec.n_out,), 40000)
    with pytest.raises(XyloLimitError, match=r"layer readout: bias_out outside the 16-bit range \[-32768, 32767\]"):
        check_limits(spec)


def test_layers_the_chip_cannot_run_are_refused():
    m = build_model({"input_size": 4, "layers": [{"kind": "lif", "size": 5, "reset": "subtract"}], "readout": {"size": 2}})
    with pytest.raises(QuantizationError, match=r"cells\.0 \(LIF\).*synaptic current.*tau_syn"):
        quantize_xylo(m, 1)
    m = build_model({"input_size": 4, "layers": [{"kind": "lif", "size": 5, "reset": "zero", "tau_syn": 3.0, "bias": False}],
                     "readout": {"size": 2}})
    with pytest.raises(QuantizationError, match=r"reset 'zero'.*adapt_reset"):
        quantize_xylo(m, 1)
    spec, _ = quantize_xylo(m, 2, adapt_reset=True)
    assert spec.n_hidden == 5


def test_spec_round_trips_through_json(tmp_path):
    spec, _ = quantize_xylo(_cuba_model(1, layers=2, bias=True), 2)
    spec.save(str(tmp_path / "xylo.json"))
    back = XyloSpec.load(str(tmp_path / "xylo.json"))
    x = (torch.rand(10, 2, 10, generator=torch.Generator().manual_seed(0)) < 0.4).long()
    _assert_same(simulate_spec(spec, x), simulate_spec(back, x))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json: not a Xylo specification"):
        XyloSpec.load(str(tmp_path / "bad.json"))


def test_step_backend_equals_plain_python_reference():
    """The core through neurons.lif.step equals the event-by-event plain-Python reference (no xylosim needed)."""
    from intsim_reference import simulate_xylo_reference

    g = torch.Generator().manual_seed(3)
    for case in (dict(version=1, sizes=(5, 4)), dict(version=2, recurrent=True, bias=True), dict(version=1, big=True)):
        spec = _rand_spec(g, n_in=4, **case)
        x = torch.randint(0, 20, (12, 2, 4), generator=g) * (torch.rand(12, 2, 4, generator=g) < 0.4)
        ours, ref = simulate_spec(spec, x), simulate_xylo_reference(spec, x)
        for k in FIELDS:
            assert torch.equal(getattr(ours, k), torch.tensor(ref[k], dtype=torch.long)), k


def test_digits_pooled_for_xylo():
    """The Xylo preset's input: 2x2 pixel blocks summed to 16 channels, digits 0-7 only."""
    from spikerec.data import dataset_info, get_dataset

    full, pooled = get_dataset("digits", "test"), get_dataset("digits", "test", pool=2)
    x, y = full[5]
    xp, yp = pooled[5]
    assert xp.shape == (x.shape[0], 16) and y == yp
    blocks = x.reshape(x.shape[0], 4, 2, 4, 2).sum((2, 4)).reshape(x.shape[0], 16)  # rows, cols of 8x8 pixels
    assert torch.equal(xp, blocks)
    eight = get_dataset("digits", "train", pool=2, classes=8)
    assert max(int(eight[i][1]) for i in range(len(eight))) == 7 and dataset_info("digits", pool=2, classes=8)["num_classes"] == 8
    with pytest.raises(ValueError, match="pool must be 1, 2, 4 or 8"):
        get_dataset("digits", "test", pool=3)

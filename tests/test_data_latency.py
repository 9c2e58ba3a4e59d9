"""Latency code, sl-MNIST / s-MNIST from IDX files, and the embedded digits set."""
import itertools
import math

import numpy as np
import pytest
import torch
from snntorch import spikegen

from spikerec.data import dataset_info, get_dataset
from spikerec.data.digits import digits_dataset
from spikerec.data.fileio import read_idx, write_idx
from spikerec.data.home import DataError, DatasetMissingError
from spikerec.data.latency import LATENCY_PRESETS, LatencyCode, latency_encode, latency_steps, latency_times, snntorch_latency


def test_latency_formula_and_rules():
    x = torch.tensor([1.0, 0.5, 0.4, 0.25, 0.2, 0.1, 0.0], dtype=torch.float64)
    t = latency_times(x, 0.05, 0.2)
    ref = [0.05 * math.log(v / (v - 0.2)) for v in (1.0, 0.5, 0.4, 0.25)]
    assert torch.allclose(t[:4], torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.isinf(t[4:]).all()                                    # x <= theta never spikes
    assert abs(ref[0] - 0.01116) < 1e-4 and abs(ref[3] - 0.08047) < 1e-4  # T(1), T(0.25); Herranz-Celotti & Rouat 2024, Sec. II-F
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        latency_times(torch.tensor([1.5]), 1.0, 0.2)


def test_latency_monotone_one_spike_and_below_theta_silent():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(500, generator=g, dtype=torch.float64)
    code = LatencyCode(tau_eff=0.05, theta=0.2, dt=0.001, steps=100)
    r = latency_encode(x, code)
    assert r.shape == (100, 500) and r.sum(0).max() <= 1
    assert r[:, x <= 0.2].sum() == 0
    k = latency_steps(x, code)
    fired = k >= 0
    xs, ks = x[fired], k[fired]
    order = torch.argsort(xs)
    assert torch.all(torch.diff(ks[order]) <= 0)                      # brighter -> not later
    assert torch.equal(r.argmax(0)[fired], k[fired])


def test_latency_equals_snntorch_for_matched_options():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(32, 40, generator=g)
    x[0, :3] = torch.tensor([0.0, 1.0, 0.5])
    for steps, th, tau in itertools.product([25, 100], [0.05, 0.2], [1.0, 5.0, 20.0]):
        xm = torch.where(x == th, x + 1e-3, x)                        # snnTorch lets x == threshold fire
        ref = spikegen.latency(xm, num_steps=steps, threshold=th, tau=tau, clip=True, bypass=True)
        ours = latency_encode(xm, LatencyCode(tau_eff=tau, theta=th, dt=1.0, steps=steps))
        assert torch.equal(ref, ours), (steps, th, tau)


@pytest.mark.parametrize("linear,normalize,clip,first", list(itertools.product([False, True], [False, True], [False, True], [0, 3])))
def test_snntorch_latency_compat(linear, normalize, clip, first):
    g = torch.Generator().manual_seed(2)
    x = torch.rand(16, 30, generator=g)
    x[0, :2] = torch.tensor([0.0, 1.0])
    for tau in (2.0, 7.0):
        ref = spikegen.latency(x, num_steps=30, threshold=0.1, tau=tau, first_spike_time=first, clip=clip,
                               normalize=normalize, linear=linear, bypass=True)
        assert torch.equal(ref, snntorch_latency(x, 30, 0.1, tau, first, clip, normalize, linear))


def test_lsc_preset_is_the_code_convention_without_reshape():
    code = LATENCY_PRESETS["lsc"]
    x = torch.rand(200, dtype=torch.float64)
    xp = 50 * x
    code_steps = torch.where(xp > 0.2, torch.round(500 * torch.log(xp / (xp - 0.2))), torch.full_like(x, 1e9))
    code_steps = torch.where(code_steps < 100, code_steps, torch.full_like(x, -1)).long()
    assert torch.equal(latency_steps(x, code), code_steps)
    r = latency_encode(x.view(2, 100), code)
    assert r.shape == (200, 2, 100) and torch.equal(r[0::2], r[1::2])  # time_repeat 2
    assert r.sum(0).max() <= 2                                          # one spike per channel, repeated


def test_idx_roundtrip_and_errors(tmp_path):
    a = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        assert np.array_equal(read_idx(write_idx(tmp_path / name, a)), a)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    raw = (tmp_path / "a-idx3-ubyte").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-5])
    with pytest.raises(DataError, match="bytes, expected"):
        read_idx(tmp_path / "short")


def _fake_mnist(root, n_train=30, n_test=10):
    rng = np.random.default_rng(0)
    d = root / "mnist"
    write_idx(d / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8))
    write_idx(d / "train-labels-idx1-ubyte.gz", rng.integers(0, 10, n_train).astype(np.uint8))
    write_idx(d / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8))
    write_idx(d / "t10k-labels-idx1-ubyte", rng.integers(0, 10, n_test).astype(np.uint8))
    return d


def test_mnist_family_from_idx(tmp_path, monkeypatch):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    with pytest.raises(DatasetMissingError, match="(?s)download=True.*ossci-datasets"):
        get_dataset("slmnist", "train")
    d = _fake_mnist(tmp_path)
    imgs = read_idx(d / "train-images-idx3-ubyte.gz").reshape(30, -1)
    tr = get_dataset("slmnist", "train", valid_size=6)
    va = get_dataset("slmnist", "valid", valid_size=6)
    assert len(tr) == 24 and len(va) == 6 and len(get_dataset("slmnist", "test")) == 10
    x, y = tr[3]
    assert x.shape == (100, 784) and x.sum(0).max() <= 1
    ref = latency_encode(torch.from_numpy(imgs[3]).float() / 255, "stork")
    assert torch.equal(x, ref)
    xs, _ = get_dataset("smnist", "valid", valid_size=6)[0]
    assert xs.shape == (784, 1) and torch.allclose(xs[:, 0], torch.from_numpy(imgs[24]).float() / 255)
    p1 = get_dataset("psmnist", "valid", valid_size=6)[0][0][:, 0]
    p2 = get_dataset("psmnist", "valid", valid_size=6)[0][0][:, 0]
    assert torch.equal(p1, p2) and not torch.equal(p1, xs[:, 0]) and torch.equal(p1.sort().values, xs[:, 0].sort().values)
    assert dataset_info("slmnist", preset="spytorch", steps=50)["steps"] == 50


def test_digits_embedded_split_and_encoding():
    info = dataset_info("digits")
    parts = {s: digits_dataset(s) for s in ("train", "valid", "test")}
    assert {s: len(d) for s, d in parts.items()} == info["samples"]
    x, y = parts["train"].tensors()
    assert x.shape == (1078, info["steps"], 64) and x.sum(1).max() <= 1
    for d in parts.values():
        assert torch.bincount(d.labels, minlength=10).min() >= 30       # stratified
    from spikerec.data.digits import load_digits_arrays
    from spikerec.data.splits import stratified_split
    images, labels = load_digits_arrays()
    idx = stratified_split(labels, (0.6, 0.2, 0.2), 0)
    assert len(set(idx["train"]) & set(idx["test"])) == 0 and sum(len(v) for v in idx.values()) == 1797
    # every non-zero pixel spikes, zero pixels never do
    assert torch.equal(x.sum(1) > 0, torch.from_numpy(images[idx["train"]] > 0))
    xp, _ = digits_dataset("test", population=3).tensors()
    assert xp.shape[-1] == 192 and xp.sum(1).max() <= 1
    assert digits_dataset("test", time_repeat=2).tensors()[0].shape[1] == 2 * info["steps"]

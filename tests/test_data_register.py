"""Your own data in the trainer: register_dataset (mapping or factory), EncodedDataset, Trainer export."""
import json

import numpy as np
import pytest
import torch

from spikerec.data import (ArrayDataset, EncodedDataset, dataset_info, get_dataset, make_loader, register_dataset,
                           unregister_dataset)
from spikerec.data.latency import LATENCY_PRESETS, latency_encode
from spikerec.train import Trainer, load_config


def _toy(n, seed, T=10, C=12, classes=3):
    """Class c fires channels 4c..4c+3 at random steps: easy to learn."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = (torch.rand(n, T, C, generator=g) < 0.05).float()
    for i in range(n):
        c = int(y[i])
        x[i, :, 4 * c: 4 * c + 4] = (torch.rand(T, 4, generator=g) < 0.6).float()
    return ArrayDataset(x, y)


@pytest.fixture
def toy_name():
    name = "toy-spikes"
    register_dataset(name, {"train": _toy(96, 0), "valid": _toy(48, 1), "test": _toy(48, 2)},
                     description="three-class toy rasters")
    yield name
    unregister_dataset(name)


def test_registered_mapping_trains_with_sizes_resolved(toy_name, tmp_path):
    assert dataset_info(toy_name) == dict(input_size=12, steps=10, num_classes=3, task="classification")
    cfg = load_config("quickstart", [f"data.name={toy_name}", "train.epochs=4", "lsc.enabled=false",
                                     "model.layers.0.size=16", "data.batch_size=16"])
    assert cfg["model"]["input_size"] == "auto"
    summary = Trainer(cfg, tmp_path / "run", quiet=True, echo=lambda s: None).fit()
    assert cfg["model"]["input_size"] == 12 and cfg["model"]["readout"]["size"] == 3
    assert summary["data"] == toy_name
    assert summary["test_accuracy"] > 0.8  # chance is 1/3
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["test_accuracy"] == summary["test_accuracy"]


def test_registered_data_through_the_cli(toy_name, tmp_path):
    from spikerec.cli import main

    rc = main(["train", "quickstart", "--quiet", "--lsc", "off", "--epochs", "1", "--out", str(tmp_path / "r"),
               "--set", f"data.name={toy_name}", "--set", "model.layers.0.size=8"])
    assert rc in (0, None)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["data"] == toy_name


def test_encoded_dataset_is_lazy_and_equals_the_encoder():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 5, 5), dtype=np.uint8)
    labels = rng.integers(0, 4, 20)
    ds = EncodedDataset(images, labels, encoder="latency", preset="spytorch", steps=30)
    assert ds.images.dtype == torch.uint8 and ds.images.shape == (20, 25)  # stored as pixels, not rasters
    code = LATENCY_PRESETS["spytorch"].with_options(steps=30)
    for i in (0, 7, 19):
        x, y = ds[i]
        ref = latency_encode(torch.from_numpy(images[i].reshape(-1)).float() / 255.0, code)
        assert torch.equal(x, ref) and y == int(labels[i]) and x.shape == (30, 25)
    rate = EncodedDataset(images.astype(np.float32) / 255, labels, encoder="rate", steps=8, seed=3)
    assert torch.equal(rate[4][0], rate[4][0]) and not torch.equal(rate[4][0], rate[5][0])
    xb, yb = next(iter(make_loader(ds, 8, False, 0)))
    assert xb.shape == (30, 8, 25) and yb.shape == (8,)
    with pytest.raises(ValueError, match=r"float images must lie in \[0, 1\]"):
        EncodedDataset(images.astype(np.float32), labels)
    with pytest.raises(ValueError, match="unknown encoder 'poisson'"):
        EncodedDataset(images, labels, encoder="poisson")


def test_factory_with_options_and_clear_errors(tmp_path):
    rng = np.random.default_rng(1)
    imgs, labs = rng.integers(0, 256, (30, 16), dtype=np.uint8), rng.integers(0, 2, 30)

    def factory(split, steps=20):
        part = {"train": slice(0, 20), "valid": slice(20, 25), "test": slice(25, 30)}[split]
        return EncodedDataset(imgs[part], labs[part], encoder="latency", preset="spytorch", steps=steps)

    register_dataset("toy-images", factory, options={"steps": 20})
    try:
        assert dataset_info("toy-images", steps=12)["steps"] == 12
        assert get_dataset("toy-images", "valid")[0][0].shape == (20, 16)
        with pytest.raises(ValueError, match=r"unknown option\(s\) \['tau'\]"):
            get_dataset("toy-images", "train", tau=3)
        with pytest.raises(ValueError, match="already registered"):
            register_dataset("toy-images", factory)
    finally:
        unregister_dataset("toy-images")
    with pytest.raises(ValueError, match="'digits' is a built-in data set"):
        register_dataset("digits", factory)
    with pytest.raises(ValueError, match="needs a 'train' split"):
        register_dataset("x", {"test": _toy(4, 0)})
    register_dataset("no-valid", {"train": _toy(8, 0), "test": _toy(8, 1)})
    try:
        with pytest.raises(ValueError, match="no 'valid' split was registered.*valid_split"):
            get_dataset("no-valid", "valid")
    finally:
        unregister_dataset("no-valid")
    register_dataset("images3d", {"train": [(torch.zeros(2, 3, 4), 0)]})
    try:
        with pytest.raises(ValueError, match=r"2-d x \(time-first\).*EncodedDataset"):
            dataset_info("images3d")
    finally:
        unregister_dataset("images3d")

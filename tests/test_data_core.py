"""Loader, collation and the dataset registry."""
import pytest
import torch

from spikerec.data import ArrayDataset, collate_time_first, dataset_info, get_dataset, make_loader, DATASETS
from spikerec.data.home import data_home


def _toy(n=23, T=5, C=3):
    x = torch.randn(n, T, C)
    return ArrayDataset(x, torch.arange(n) % 4), x


def _order(loader):
    return torch.cat([y for _, y in loader]).tolist()


def test_loader_shapes_and_time_first():
    ds, x = _toy()
    xb, yb = next(iter(make_loader(ds, 8, shuffle=False, seed=0)))
    assert xb.shape == (5, 8, 3) and yb.shape == (8,) and yb.dtype == torch.int64
    assert torch.equal(xb, x[:8].transpose(0, 1))


def test_loader_reproducible_per_epoch_and_resumable():
    ds, _ = _toy(n=40)
    ds.targets = torch.arange(40)
    a = make_loader(ds, 7, shuffle=True, seed=3)
    e0, e1, e2 = _order(a), _order(a), _order(a)
    assert sorted(e0) == list(range(40)) and e0 != e1 and e1 != e2
    b = make_loader(ds, 7, shuffle=True, seed=3)
    assert _order(b) == e0                       # same seed, same first epoch
    c = make_loader(ds, 7, shuffle=True, seed=3)
    c.set_epoch(2)                               # a resumed run sees epoch 2's batches
    assert _order(c) == e2 and c.epoch == 3
    assert _order(make_loader(ds, 7, shuffle=True, seed=4)) != e0
    assert _order(make_loader(ds, 7, shuffle=False, seed=3)) == list(range(40))


def test_drop_last():
    ds, _ = _toy(n=23)
    assert [len(y) for _, y in make_loader(ds, 10, True, 0, drop_last=True)] == [10, 10]
    assert [len(y) for _, y in make_loader(ds, 10, True, 0)] == [10, 10, 3]


def test_collate_pads_and_per_step_targets():
    a, b = torch.ones(3, 2), torch.ones(5, 2)
    x, y = collate_time_first([(a, 1), (b, 2)])
    assert x.shape == (5, 2, 2) and x[3:, 0].abs().sum() == 0 and x[:, 1].sum() == 10
    x, y = collate_time_first([(b, torch.zeros(5, 7)), (b, torch.ones(5, 7))])
    assert y.shape == (5, 2, 7) and y[:, 1].sum() == 35      # per-step targets come time-first
    x, y = collate_time_first([(b, torch.zeros(1)), (b, torch.ones(1))])
    assert y.shape == (2, 1)
    with pytest.raises(ValueError, match="channel"):
        collate_time_first([(torch.ones(3, 2), 0), (torch.ones(3, 4), 1)])
    with pytest.raises(ValueError, match=r"\[T, C\]"):
        collate_time_first([(torch.ones(3), 0)])


def test_registry_errors_list_valid_choices():
    with pytest.raises(ValueError, match="valid names: digits, shd"):
        get_dataset("mnist-ish", "train")
    with pytest.raises(ValueError, match="valid splits: train, valid, test"):
        get_dataset("digits", "training")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['tau'\]; valid: .*tau_eff"):
        get_dataset("digits", "train", tau=3)
    with pytest.raises(ValueError, match="unknown option"):
        dataset_info("shd", binz=3)
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(_toy()[0], 0, True, 0)


def test_dataset_info_for_every_name():
    for name in DATASETS:
        info = dataset_info(name)
        assert info["input_size"] > 0 and info["steps"] > 0 and info["task"]
        assert ("num_classes" in info) or ("output_size" in info)
    assert dataset_info("shd", preset="dcls10ms")["input_size"] == 140
    assert dataset_info("slmnist", preset="lsc")["steps"] == 200


def test_data_home_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("SPIKEREC_DATA", str(tmp_path))
    assert data_home() == tmp_path
    monkeypatch.delenv("SPIKEREC_DATA")
    assert data_home().name == "datasets"        # running from the checkout

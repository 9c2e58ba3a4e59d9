"""Checkpoints: atomic writes, optimiser/RNG state round trips (spikerec.train.checkpoint)."""
import json
import random

import numpy as np
import pytest
import torch

from spikerec.train import checkpoint as ck


def _opt_with_state():
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95))
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_optimizer_round_trip_continues_identically():
    model, opt = _opt_with_state()
    tensors, meta = ck.pack_optimizer(opt)
    meta = json.loads(json.dumps(meta))  # must survive JSON
    model2 = torch.nn.Linear(4, 3)
    model2.load_state_dict(model.state_dict())
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    ck.unpack_optimizer(opt2, tensors, meta)
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (model2, opt2)):
        m(x).pow(2).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_rng_round_trip():
    torch.manual_seed(3); np.random.seed(3); random.seed(3)
    tensors, meta = ck.get_rng_state()
    meta = json.loads(json.dumps(meta))
    a = (torch.rand(3), np.random.rand(3), random.random())
    torch.rand(7); np.random.rand(2); random.random()
    ck.set_rng_state(tensors, meta)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    w1 = {"model/w": torch.arange(6.0).reshape(2, 3)}
    ck.save_checkpoint(root, 10, w1, {"epoch": 1})

    real = ck.save_file

    def crash(tensors, path, metadata=None):
        with open(path, "wb") as f:  # a partial file, then the "kill"
            f.write(b"\x00" * 17)
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(ck, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(root, 20, {"model/w": torch.zeros(2, 3)}, {"epoch": 2})
    monkeypatch.setattr(ck, "save_file", real)
    tensors, meta = ck.load_checkpoint(root)
    assert meta["step"] == 10 and meta["epoch"] == 1
    assert torch.equal(tensors["model/w"], w1["model/w"])
    assert not (root / "step-00000020").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp")], "temporary folder left behind"
    # a later good write becomes the latest and old ones are pruned to `keep`
    for s in (30, 40, 50):
        ck.save_checkpoint(root, s, {"model/w": torch.full((2, 3), float(s))}, {"epoch": s}, keep=2)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000040", "step-00000050"]
    assert ck.load_checkpoint(root)[1]["step"] == 50


def test_broken_latest_pointer_falls_back(tmp_path):
    root = tmp_path / "checkpoints"
    ck.save_checkpoint(root, 5, {"model/w": torch.ones(2)}, {})
    (root / "latest.json").write_text("{not json")
    assert ck.load_checkpoint(root)[1]["step"] == 5
    with pytest.raises(ck.CheckpointError, match="no complete checkpoint"):
        ck.load_checkpoint(tmp_path / "nothing")


def test_atomic_json_interrupted(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    ck.atomic_write_json(p, {"x": 1})

    def boom(obj, **kw):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(ck.json, "dumps", boom)
    with pytest.raises(RuntimeError):
        ck.atomic_write_json(p, {"x": 2})
    assert json.loads(p.read_text()) == {"x": 1}
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]

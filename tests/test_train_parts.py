"""Trainer pieces: learning-rate schedule, parameter groups, losses, mode accuracy, other model kinds."""
import json
import math

import pytest
import torch

from spikerec.cli import main
from spikerec.models import build_model
from spikerec.train.metrics import accuracy_counts, mode_accuracy, sequence_loss, step_loss_fn
from spikerec.train.trainer import lr_factor, make_optimizer, param_groups

TC = {"lr": 1e-2, "recurrent_lr_factor": 0.25, "recurrent_weight_decay": 0.0, "weight_decay": 0.05,
      "optimizer": "adamw", "betas": [0.9, 0.999], "eps": 1e-8}


def test_warmup_cosine_schedule():
    total, w = 100, 0.1
    f = [lr_factor(s, total, w, "cosine", 0.01) for s in range(total)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warm-up over 10 steps
    assert f[10] == pytest.approx(1.0)
    mid = 10 + 45
    assert f[mid] == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # monotone decay after warm-up
    assert lr_factor(total, total, w, "cosine", 0.01) == pytest.approx(0.01)
    assert lr_factor(50, total, 0.0, "constant", 0.0) == 1.0


def test_param_groups_alif_and_lru():
    alif = build_model({"input_size": 5, "layers": [{"kind": "alif", "size": 6}], "readout": {"size": 3}})
    groups = {g["name"]: g for g in param_groups(alif, TC)}
    rec = {id(p) for p in groups["recurrent"]["params"]}
    cell = alif.cells[0]
    assert {id(cell.recurrent_weight), id(cell.log_tau_mem), id(cell.log_tau_adapt)} == rec
    assert groups["recurrent"]["lr"] == pytest.approx(2.5e-3) and groups["recurrent"]["weight_decay"] == 0.0
    assert id(cell.weight) in {id(p) for p in groups["other"]["params"]}
    lru = build_model({"input_size": 5, "layers": [{"kind": "lru", "size": 4, "output_size": 6}], "readout": {"size": 3}})
    names = {n for n, p in lru.named_parameters() if id(p) in {id(q) for q in param_groups(lru, TC)[0]["params"]}}
    assert names == {f"cells.0.{k}" for k in ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")}
    opt = make_optimizer(lru, TC)
    assert isinstance(opt, torch.optim.AdamW)
    assert sum(len(g["params"]) for g in opt.param_groups) == sum(1 for p in lru.parameters() if p.requires_grad)


def test_losses_against_formulas():
    torch.manual_seed(0)
    y = torch.randn(7, 4, 5, dtype=torch.float64)
    c = torch.tensor([0, 3, 1, 4])
    ce = torch.nn.functional.cross_entropy
    assert torch.allclose(sequence_loss(y, c, loss="cross_entropy", loss_on="mean", readout_mode="last"), ce(y.mean(0), c))
    assert torch.allclose(sequence_loss(y, c, loss="cross_entropy", loss_on="readout", readout_mode="last"), ce(y[-1], c))
    per = torch.stack([ce(y[t], c) for t in range(7)]).mean()
    assert torch.allclose(sequence_loss(y, c, loss="cross_entropy", loss_on="per_step", readout_mode="mean"), per)
    fn = step_loss_fn(loss="cross_entropy", loss_on="per_step", readout_mode="mean", steps=7)
    assert torch.allclose(sum(fn(y[t], c, t) for t in range(7)), per)
    # sum reduction = B x mean (the data-parallel weighting relies on it)
    for on in ("mean", "last", "per_step"):
        m = sequence_loss(y, c, loss="cross_entropy", loss_on=on, readout_mode="mean")
        s = sequence_loss(y, c, loss="cross_entropy", loss_on=on, readout_mode="mean", reduction="sum")
        assert torch.allclose(s, 4 * m)
    # per-step bit targets with ignore_index (copy task): 2 bits -> 4 outputs
    yb = torch.randn(3, 2, 4, dtype=torch.float64)
    tb = torch.tensor([[[-100, -100], [-100, -100]], [[0, 1], [1, 1]], [[1, 0], [0, 0]]])
    logits = yb.reshape(3, 2, 2, 2)
    mask = tb != -100
    ref = ce(logits[mask], tb[mask])
    assert torch.allclose(sequence_loss(yb, tb, loss="cross_entropy", loss_on="per_step", readout_mode="per_step"), ref)


def test_mode_accuracy_is_argmax_of_time_mean():
    y = torch.zeros(4, 2, 3)
    y[:3, 0, 2] = 5.0   # sample 0: class 2 has the larger time mean ...
    y[3, 0, 1] = 1.0    # ... but class 1 wins the last step
    y[:, 1, 0] = 1.0
    target = torch.tensor([2, 0])
    assert mode_accuracy(y, target) == 1.0
    assert accuracy_counts(y, target, kind="mode", readout_mode="last", loss="cross_entropy") == (2, 2)
    assert accuracy_counts(y, target, kind="readout", readout_mode="last", loss="cross_entropy") == (1, 2)


def test_deep_lru_and_gru_train_on_digits(tmp_path, capsys):
    small = ["--quiet", "--epochs", "1", "--set", "data.batch_size=256", "--set", "train.threads=1"]
    run = tmp_path / "lru"
    rc = main(["train", "lru-deep", *small, "--out", str(run), "--set", 'data.name="digits"',
               "--set", "model.d_model=16", "--set", "model.d_state=8", "--set", "model.n_layers=2"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((run / "summary.json").read_text())
    assert s["test_accuracy"] is not None and s["steps"] == 5
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json"]) == 0  # load_model rebuilds the LRUModel
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(s["test_accuracy"])
    run = tmp_path / "gru"
    rc = main(["train", "slmnist-gru-lsc", *small, "--out", str(run), "--set", 'data.name="digits"',
               "--set", "data.options={}", "--set", "lsc.max_steps=2", "--set", "lsc.batch_size=4",
               "--set", "model.layers.0.size=8", "--set", "model.layers.1.size=8"])
    assert rc == 0, capsys.readouterr().err
    assert (run / "lsc.json").is_file() and json.loads((run / "summary.json").read_text())["lsc"]

"""NaN input: layers skip the data check on the hot path; the trainer still names the bad batch."""
import re

import spikerec.train.trainer as trainer_mod
from spikerec.cli import main

TINY = ["--quiet", "--lsc", "off", "--set", "train.epochs=1", "--set", "model.layers.0.size=16",
        "--set", "data.batch_size=128", "--set", "train.threads=1"]


def test_trainer_names_a_batch_with_nan_input(tmp_path, monkeypatch, capsys):
    real = trainer_mod.Trainer._train_step
    calls = {"n": 0}

    def poisoned(self, x, y):
        calls["n"] += 1
        if calls["n"] == 3:
            x = x.clone().float()
            x[0, 0, 0] = float("nan")
        return real(self, x, y)

    monkeypatch.setattr(trainer_mod.Trainer, "_train_step", poisoned)
    rc = main(["train", "quickstart", *TINY, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc != 0
    assert re.search(r"training data: batch 3 of epoch 1 \(step 3\) contains NaN", err), err

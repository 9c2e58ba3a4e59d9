"""Bad input gives clear errors and leaves nothing corrupted (spikerec train)."""
import json

import pytest

import spikerec.train.trainer as trainer_mod
from spikerec.cli import main
from spikerec.train.checkpoint import load_checkpoint

TINY = ["--quiet", "--lsc", "off", "--set", "train.epochs=2", "--set", "model.layers.0.size=16",
        "--set", "data.batch_size=128", "--set", "train.checkpoint_every=5", "--set", "train.threads=1"]


def test_nan_loss_stops_reports_step_and_keeps_checkpoint(tmp_path, capsys, monkeypatch):
    real = trainer_mod.forward_sequence
    calls = {"n": 0}

    def poisoned(model, x, record=False):
        y, h = real(model, x, record)
        if model.training:
            calls["n"] += 1
            if calls["n"] >= 12:
                y = y * float("nan")
        return y, h

    monkeypatch.setattr(trainer_mod, "forward_sequence", poisoned)
    run = tmp_path / "nan"
    rc = main(["train", "quickstart", *TINY, "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == 4
    assert "nan" in err and "step 12" in err and "last good checkpoint" in err and "step-00000010" in err
    tensors, meta = load_checkpoint(run / "checkpoints")
    assert meta["step"] == 10
    assert all(bool(v.isfinite().all()) for k, v in tensors.items() if k.startswith("model/"))
    assert not (run / "model.safetensors").exists()


def test_missing_dataset_gives_instructions(tmp_path, capsys):
    out = tmp_path / "shd-run"
    rc = main(["train", "shd-alif-lsc", "--quiet", "--out", str(out), "--set", f'data.options.root="{tmp_path / "none"}"'])
    err = capsys.readouterr().err
    assert rc == 3
    assert "not available" in err and "zenkelab.org" in err and "spikerec datasets" in err
    assert not out.exists()  # nothing left behind


@pytest.mark.parametrize("args, words", [
    (["quickstrat"], ["unknown preset", "quickstart"]),
    (["quickstart", "--set", "train.epochs=abc"], ["train.epochs", "integer"]),
    (["quickstart", "--set", "train.warmpu=0.1"], ["train.warmpu", "warmup"]),
    (["quickstart", "--lsc", "targett=1"], ["lsc.targett"]),
    (["quickstart", "--lsc", "target"], ["KEY=VALUE"]),
])
def test_bad_arguments_exit_2_with_message(args, words, capsys):
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err or w in str(err), (w, err)


def test_resume_rejects_overrides_and_bad_folders(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path), "--epochs", "3"]) == 2
    assert "do not give a preset or overrides" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "not a spikerec run folder" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path)]) == 2
    assert "config.json is missing" in capsys.readouterr().err


def test_show_config_resolves_sizes(capsys):
    assert main(["train", "--show-config", "--set", "model.layers.0.size=7"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["model"]["input_size"] == 64 and cfg["model"]["layers"][0]["size"] == 7
    assert cfg["model"]["readout"]["size"] == 10 and cfg["lsc"]["enabled"] is True

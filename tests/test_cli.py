"""The spikerec command: every subcommand explains itself; lsc and evaluate work on run folders."""
import json

import pytest

from spikerec.cli import COMMANDS, main
from spikerec.train.runs import load_model


def test_top_level_help_lists_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "evaluate", "lsc", "export", "bench", "datasets"):
        assert name in out


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_command_has_help(cmd, capsys):
    try:
        rc = main([cmd, "--help"])
    except SystemExit as e:  # argparse exits after printing help
        rc = e.code
    out = capsys.readouterr().out
    assert rc in (0, None)
    assert len(out) > 80 and ("usage" in out.lower() or cmd in out)


def test_train_help_explains_presets_and_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for w in ("--set", "--resume", "--lsc", "--learning", "--nproc-per-node", "--quiet", "quickstart"):
        assert w in out
    assert main(["train", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "quickstart" in listing and "shd-alif-lsc" in listing


def test_lsc_command_writes_a_loadable_run(tmp_path, capsys):
    out = tmp_path / "lsc"
    rc = main(["lsc", "quickstart", "--quiet", "--out", str(out), "--set", "lsc.max_steps=3",
               "--set", "lsc.batch_size=4", "--set", "model.layers.0.size=16"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "radii:" in text and str(out) in text
    rep = json.loads((out / "lsc.json").read_text())
    assert rep["steps"] >= 1 and "time/0" in rep["targets"]
    assert (out / "lsc.png").is_file()
    model = load_model(out)
    assert model.cells[0].hidden_size == 16
    # the saved weights are the pre-trained ones, usable by evaluate
    assert main(["evaluate", str(out), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["samples"] == 359 and 0.0 <= ev["accuracy"] <= 1.0
    assert main(["lsc", "quickstrat"]) == 2
    assert "unknown preset" in capsys.readouterr().err

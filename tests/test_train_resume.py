"""--resume after a kill mid-epoch gives bit-identical final weights and metrics."""
import json

import pytest
import torch
from safetensors.torch import load_file

from spikerec.cli import main

SMALL = ["quickstart", "--quiet", "--set", "train.epochs=2", "--set", "model.layers.0.size=24",
         "--set", "model.dropout=0.2",          # dropout: the RNG state must be restored too
         "--set", "train.checkpoint_every=5", "--set", "train.log_every=1", "--set", "data.batch_size=128",
         "--set", "lsc.max_steps=2", "--set", "lsc.batch_size=4", "--set", "train.threads=1"]


def _records(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("time_s", None)
        if r.get("kind") != "lsc":
            out.append(r)
    return out


def test_resume_after_kill_is_bit_identical(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", *SMALL, "--out", str(a)]) == 0
    # 9 steps per epoch (1078 / 128): stop at step 13, in the middle of epoch 2; the newest
    # checkpoint is step 10, so 3 steps are replayed after the resume.
    assert main(["train", *SMALL, "--out", str(b), "--stop-after-steps", "13"]) == 0
    out = capsys.readouterr().out
    assert "stopped after 13 steps" in out and f"continue with: spikerec train --resume {b}" in out
    assert not (b / "model.safetensors").exists()
    state = json.loads((b / "checkpoints" / "latest.json").read_text())
    assert state["step"] == 13  # the stop wrote a checkpoint
    # Corrupt that newest checkpoint (as a crash of the disk could): the resume falls back to the
    # intact step-10 checkpoint, says so, and replays 3 steps.
    bad = b / "checkpoints" / "step-00000013" / "state.safetensors"
    bad.write_bytes(bad.read_bytes()[:100])
    assert main(["train", "--resume", str(b), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "test accuracy" in out
    assert "step-00000013 cannot be used" in out and "step-00000010" in out
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ra, rb = _records(a), _records(b)
    assert ra == rb  # no duplicated or missing rows after the resume
    assert sum(r["kind"] == "epoch" for r in rb) == 2
    assert (b / "metrics.csv").read_text().count("\n") == 3


@pytest.mark.parametrize("step,epoch", [(9, 1), (0, 0)])
def test_resume_from_an_epoch_end_checkpoint_is_bit_identical(tmp_path, step, epoch):
    """A checkpoint written at an epoch's end precedes the next epoch's DataLoader iterator, whose
    creation draws from the global RNG; the resume must restore the RNG before that draw. Step 0 is
    the checkpoint written right after LSC: the first training step must not see LSC's gradients."""
    import shutil

    a = tmp_path / "a"
    assert main(["train", *SMALL, "--set", "train.keep_checkpoints=100", "--out", str(a)]) == 0
    c = tmp_path / "c"
    shutil.copytree(a, c)
    # 9 steps per epoch: step-00000009 is the checkpoint of epoch 1's end (batch_in_epoch 0)
    name = f"step-{step:08d}"
    state = json.loads((c / "checkpoints" / name / "state.json").read_text())
    assert state["epoch"] == epoch and state["batch_in_epoch"] == 0 and state["lsc_done"]
    for p in (c / "checkpoints").glob("step-*"):
        if p.name > name:
            shutil.rmtree(p)
    for f in ("model.safetensors", "model.json", "summary.json", "checkpoints/latest.json"):
        (c / f).unlink(missing_ok=True)
    assert main(["train", "--resume", str(c), "--quiet"]) == 0
    wa, wc = load_file(str(a / "model.safetensors")), load_file(str(c / "model.safetensors"))
    for k in wa:
        assert torch.equal(wa[k], wc[k]), k
    assert _records(a) == _records(c)

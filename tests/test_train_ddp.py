"""Data-parallel training: 2 CPU processes (torchrun, gloo) follow the same loss curve as 1 process
with the same global batch (without dropout: each process draws the masks of its own shard)."""
import json
import os
import subprocess
import sys

import pytest

ARGS = ["quickstart", "--quiet", "--lsc", "off", "--set", "train.epochs=1", "--set", "model.layers.0.size=32",
        "--set", "train.log_every=1", "--set", "data.batch_size=128", "--set", "train.threads=1", "--set", "model.dropout=0"]


def _losses(run):
    recs = [json.loads(line) for line in open(run / "metrics.jsonl")]
    steps = [r["loss"] for r in recs if r["kind"] == "step"]
    epoch = [r for r in recs if r["kind"] == "epoch"][0]
    return steps, epoch


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="torchrun with gloo on POSIX")
def test_two_processes_match_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "spikerec.cli", "train", *ARGS]
    r1 = subprocess.run(cmd + ["--out", str(one)], env=env, capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0, r1.stderr[-2000:]
    r2 = subprocess.run(cmd + ["--out", str(two), "--nproc-per-node", "2"], env=env, capture_output=True, text=True,
                        timeout=300)
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-8000:]  # the ranks' own messages precede torchrun's
    assert r2.stdout.count("test accuracy:") == 1  # only rank 0 reports
    l1, e1 = _losses(one)
    l2, e2 = _losses(two)
    assert len(l1) == len(l2) == 9
    for a, b in zip(l1, l2):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (l1, l2)
    assert abs(e1["valid_loss"] - e2["valid_loss"]) < 1e-4
    assert abs(e1["train_acc"] - e2["train_acc"]) < 1e-9
    s1 = json.loads((one / "summary.json").read_text())
    s2 = json.loads((two / "summary.json").read_text())
    assert s2["world_size"] == 2 and s1["world_size"] == 1
    assert abs(s1["test_accuracy"] - s2["test_accuracy"]) < 0.01

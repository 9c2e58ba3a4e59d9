"""Fault injection: ``kill -9`` at random points of training (LSC phase, steps, checkpoint
writes, the final evaluation and plots), then ``--resume`` to the end. Every resumed run must
end bit-identical to an uninterrupted one (weights and every metrics record) with no
temporary files left behind.

The victims are forked from the test process (which has torch imported already), so that
20 kills fit in the test budget on a 2-core machine; ``SIGKILL`` ends a forked child exactly
as it ends ``spikerec train`` started from a shell.
"""
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cli_fork import run_cli, single_threaded_child, wait_child
from spikerec.cli import main

TINY = ["quickstart", "--quiet", "--set", "train.epochs=2", "--set", "model.layers.0.size=16",
        "--set", "data.batch_size=64", "--set", "train.checkpoint_every=3", "--set", "train.log_every=1",
        "--set", "model.dropout=0.2", "--set", "lsc.max_steps=3", "--set", "lsc.batch_size=4",
        "--set", "train.threads=1"]
KILLS = 20


def _fork(argv) -> int:
    pid = os.fork()
    if pid == 0:  # child: run the command, never return into pytest
        code = 1
        try:
            single_threaded_child()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")
            code = main(argv)
        finally:
            os._exit(int(code or 0))
    return pid


def _run(argv) -> int:
    return wait_child(_fork(argv), what=" ".join(argv))


def _records(run: Path):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("time_s", None)
        out.append(r)
    return out


def _debris(run: Path):
    return [p for p in run.rglob("*") if p.name.endswith(".part") or p.name.startswith(".tmp")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    torch.set_num_threads(1)
    ref = tmp_path_factory.mktemp("ref") / "run"
    t0 = time.perf_counter()
    assert _run(["train", *TINY, "--out", str(ref)]) == 0
    return ref, time.perf_counter() - t0


@pytest.mark.slow  # 20 kills and resumes: about 4 CPU-minutes
def test_kill_9_anywhere_then_resume_is_bit_identical(reference, tmp_path):
    ref, duration = reference
    wref = load_file(str(ref / "model.safetensors"))
    rref = _records(ref)
    rng = random.Random(1234)
    kinds = set()
    for i in range(KILLS):
        run = tmp_path / f"k{i}"
        pid = _fork(["train", *TINY, "--out", str(run)])
        time.sleep(rng.uniform(0.0, duration * 1.05))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        if not (run / "config.json").is_file():  # killed before the run folder was set up: start it again
            kinds.add("before config")
            left = sorted(p.name for p in run.iterdir()) if run.exists() else None
            code, _, err = run_cli(["train", *TINY, "--out", str(run)])
            assert code == 0, (i, left, err[-1000:])
        elif (run / "summary.json").is_file():
            kinds.add("finished")
        else:
            ck = run / "checkpoints" / "latest.json"
            kinds.add(f"step {json.loads(ck.read_text())['step']}" if ck.is_file() else "no checkpoint")
            assert _run(["train", "--resume", str(run), "--from-scratch", "--quiet"]) == 0, i
        assert killed or (run / "summary.json").is_file(), i
        w = load_file(str(run / "model.safetensors"))
        assert w.keys() == wref.keys()
        for k in w:
            assert torch.equal(w[k], wref[k]), (i, k)
        assert _records(run) == rref, i
        assert _debris(run) == [], (i, _debris(run))
    assert len(kinds) >= 4, kinds  # the kills landed at several different points

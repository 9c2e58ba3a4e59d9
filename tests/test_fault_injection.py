"""Fault injection: ``kill -9`` at every stage of a training run, then the same command again.

The stages are the run's own, named by what it is doing when it dies: the lock taken, the
TensorBoard folder made, each file's temporary written (empty, then complete before its rename),
the LSC steps, each record appended to ``metrics.jsonl``, every part of a checkpoint write (its
temporary folder, its tensors, the rename into place, ``latest.json``, the pruning of an old one,
also half done) in each of its contexts (after LSC, inside an epoch, at an epoch's end), the final
model, plots and summary, and the lock released. A reference run lists them in its order; then one
victim after another runs the same ``spikerec train ... --out RUN`` and kills itself with SIGKILL
at the first stage that no earlier victim died at. No stage is picked by time, so every stage is
covered on every machine, however fast or loaded.

Each victim's command must either continue the run (it holds a checkpoint) or start it afresh
(it holds none), with a note saying which, and never refuse; the last one ends with a run folder
bit-identical to the reference (weights, checkpoints, every metrics record) and no leftovers.

The victims are forked from the test process (torch and the run's code paths are loaded there by
the reference run), and the probes are patched into the primitives the run writes with, in the
test process only, so the package holds no test hook.
"""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import spikerec.train.checkpoint as ckpt
import spikerec.train.metrics as metrics_mod
import spikerec.train.trainer as trainer_mod
from cli_fork import fork_cli, wait_cli
from spikerec.cli import main
from spikerec.train.runs import RunLock
from spikerec.train.trainer import Trainer

TINY = ["quickstart", "--quiet", "--set", "train.epochs=2", "--set", "model.layers.0.size=8",
        "--set", "data.batch_size=64", "--set", "data.options.classes=2", "--set", "train.checkpoint_every=2",
        "--set", "train.log_every=1", "--set", "model.dropout=0.2", "--set", "lsc.max_steps=3",
        "--set", "lsc.batch_size=4", "--set", "train.threads=1", "--checkpoint-minutes", "0"]

PROBE = {"root": None, "record": None, "kill": (), "log": None, "context": "start"}


def _stage(what: str) -> None:
    """One stage of the run under test: recorded (reference) or, if it is the victim's, the end."""
    label = f"{PROBE['context']}: {what}"
    if PROBE["record"] is not None:
        if label not in PROBE["record"]:
            PROBE["record"].append(label)
    elif label in PROBE["kill"]:
        Path(PROBE["log"]).write_text(label)
        os.kill(os.getpid(), signal.SIGKILL)


def _ours(path) -> bool:
    return PROBE["root"] is not None and str(path).startswith(str(PROBE["root"]))


def _target(tmp: str) -> str:
    """``config.json`` for atomic_path's ``.config.json.x1y2.part``."""
    m = re.fullmatch(r"\.(.+)\.[^.]+\.part", os.path.basename(tmp))
    return m.group(1) if m else os.path.basename(tmp)


def _install_probes(monkeypatch) -> None:
    mkstemp, mkdtemp, replace, rename, rmtree = tempfile.mkstemp, tempfile.mkdtemp, os.replace, os.rename, shutil.rmtree
    save_file, lsc_pretrain = ckpt.save_file, trainer_mod.lsc_pretrain

    def probed_mkstemp(*a, **k):
        fd, path = mkstemp(*a, **k)
        if _ours(path):
            _stage(f"empty temporary of {_target(path)}")
        return fd, path

    def probed_mkdtemp(*a, **k):
        path = mkdtemp(*a, **k)
        if _ours(path):
            _stage("empty temporary checkpoint folder")
        return path

    def probed_replace(src, dst, *a, **k):
        if _ours(dst):
            _stage(f"complete temporary of {os.path.basename(dst)}, not renamed")
        return replace(src, dst, *a, **k)

    def probed_rename(src, dst, *a, **k):
        if _ours(dst) and os.path.basename(dst).startswith("step-"):
            _stage("complete temporary checkpoint folder, not renamed")
        return rename(src, dst, *a, **k)

    def probed_rmtree(path, *a, **k):
        if _ours(path) and os.path.basename(path).startswith("step-"):
            _stage("old checkpoint about to be pruned")
            Path(path, "state.json").unlink(missing_ok=True)
            _stage("old checkpoint half pruned")
        return rmtree(path, *a, **k)

    def probed_save_file(tensors, filename, *a, **k):
        save_file(tensors, filename, *a, **k)
        if _ours(filename) and os.path.basename(filename) == "state.safetensors":
            _stage("checkpoint tensors written, state.json not yet")

    def probed_lsc(model, data, options, progress=None):
        def step(*a):
            _stage("LSC step")
            return progress(*a)
        return lsc_pretrain(model, data, options, progress=step)

    monkeypatch.setattr(tempfile, "mkstemp", probed_mkstemp)
    monkeypatch.setattr(tempfile, "mkdtemp", probed_mkdtemp)
    monkeypatch.setattr(os, "replace", probed_replace)
    monkeypatch.setattr(os, "rename", probed_rename)
    monkeypatch.setattr(shutil, "rmtree", probed_rmtree)
    monkeypatch.setattr(ckpt, "save_file", probed_save_file)
    monkeypatch.setattr(trainer_mod, "lsc_pretrain", probed_lsc)

    def around(cls, name, context=None, before=None, after=None, keep=False):
        """Run the method in ``context`` (restored after it unless ``keep``), with stages before/after it."""
        original = getattr(cls, name)

        def wrapped(self, *a, **k):
            ours, outer = _ours(getattr(self, "run_dir", "")), PROBE["context"]
            if ours and context:
                PROBE["context"] = context(self) if callable(context) else context
            if ours and before:
                _stage(before)
            try:
                out = original(self, *a, **k)
            finally:
                if ours and context and not keep:
                    PROBE["context"] = outer
            if ours and after:
                _stage(after)
            return out
        monkeypatch.setattr(cls, name, wrapped)

    around(RunLock, "acquire", context="start", after="lock taken", keep=True)
    around(RunLock, "release", context="end", before="lock about to be released")
    around(Trainer, "_lsc", context="LSC")
    around(Trainer, "_train_step", context="training", keep=True)
    around(Trainer, "_end_epoch", context="epoch end")
    around(Trainer, "_finish", context="final")
    around(Trainer, "_checkpoint", context=lambda t: "checkpoint after LSC" if t.step == 0 else
           "epoch-end checkpoint" if t.batch_in_epoch == 0 else "mid-epoch checkpoint")
    logger_init = metrics_mod.MetricsLogger.__init__

    def probed_logger(self, run_dir, *a, **k):
        logger_init(self, run_dir, *a, **k)
        if _ours(run_dir) and self.tb is not None:
            _stage("tensorboard/ made")
    monkeypatch.setattr(metrics_mod.MetricsLogger, "__init__", probed_logger)
    log = metrics_mod.MetricsLogger.log

    def probed_log(self, record):
        if _ours(self.dir) and self.enabled:
            _stage(f"{record.get('kind')} record about to be appended")
        return log(self, record)
    monkeypatch.setattr(metrics_mod.MetricsLogger, "log", probed_log)
    try:  # the TensorBoard stage exists on every machine: a stand-in writer where tensorboard is missing
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=_EventWriter))


class _EventWriter:
    """Stands in for TensorBoard's ``SummaryWriter``: its folder and an event file of scalars."""

    def __init__(self, log_dir):
        os.makedirs(log_dir, exist_ok=True)
        self.path = Path(log_dir) / f"events.out.tfevents.{os.getpid()}"
        self.path.touch()

    def add_scalar(self, tag, value, step):
        with open(self.path, "a") as f:
            f.write(f"{tag} {step} {value}\n")

    def close(self):
        pass


def _records(run: Path):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("time_s", None)
        out.append(r)
    return out


def _files(run: Path):
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if "tensorboard" not in p.parts)


@pytest.mark.slow  # about 50 short runs: 10 CPU-seconds
def test_kill_9_at_every_stage_then_the_same_command_continues_bit_identically(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    # the torch loops in the reference and in every forked victim alike: a child forked after this
    # process started numba's thread pool takes the torch twins (spikerec.kernels.numba_usable_here),
    # so with numba on the reference and the victims could run different (equal, not bit-identical) paths
    monkeypatch.setenv("SPIKEREC_NUMBA", "0")
    _install_probes(monkeypatch)
    ref, stages = tmp_path / "ref", []
    PROBE.update(root=ref, record=stages, context="start")
    try:
        assert main(["train", *TINY, "--out", str(ref)]) == 0  # in this process: the victims fork from a warm one
    finally:
        torch.set_num_threads(threads)
    for kind in ("start: lock taken", "start: tensorboard/ made", "start: empty temporary of config.json",
                 "LSC: LSC step", "checkpoint after LSC: checkpoint tensors written, state.json not yet",
                 "mid-epoch checkpoint: old checkpoint half pruned", "epoch-end checkpoint: old checkpoint half pruned",
                 "epoch end: complete temporary of metrics.csv, not renamed", "training: step record about to be appended",
                 "final: complete temporary of summary.json, not renamed", "end: lock about to be released"):
        assert kind in stages, (kind, stages)

    pending, chains = list(stages), []
    while pending and len(chains) < len(stages):  # a stage passed by a resume (the rest of a checkpoint write
        run = tmp_path / f"run-{len(chains)}"     # killed early) is reached by the next chain, from a fresh start
        chains.append(_victims(run, pending, tmp_path))
        assert chains[-1], f"no victim reached any of {pending}"
        _assert_same_run(run, ref)
    assert pending == [], f"stages no victim reached: {pending}"
    assert sorted(sum(chains, [])) == sorted(stages)  # each stage killed one victim


def _victims(run: Path, pending: list[str], tmp_path: Path) -> list[str]:
    """Run the same command in ``run`` until it succeeds, each victim killing itself at the first
    stage of ``pending`` it reaches (removed from it); returns those stages in order."""
    log, chain = tmp_path / "killed-at", []
    PROBE.update(root=run, record=None, log=str(log), context="start")
    while True:
        held = {p.name for p in run.iterdir()} - {".lock"} if run.exists() else set()
        if (run / "summary.json").is_file():
            note = "nothing to do, nothing changed"  # the run had finished when it was killed
        elif any((run / "checkpoints").glob("step-*/state.json")):
            note = "holds this command's unfinished run (the same config): continuing it"
        elif held:
            note = "held an interrupted start without a checkpoint: removed"
        else:
            note = ""
        PROBE["kill"] = frozenset(pending)
        code, out, err = wait_cli(*fork_cli(["train", *TINY, "--out", str(run)], str(tmp_path)))
        assert note in out, (chain, sorted(held), out, err)
        if code != -signal.SIGKILL:
            assert code == 0, (chain, out, err)  # continued, started afresh or found finished: never refused
            return chain
        chain.append(log.read_text())
        log.unlink()
        pending.remove(chain[-1])


def _assert_same_run(run: Path, ref: Path) -> None:
    """``run`` ended as the reference did: the same files (no lock, no leftover of an interrupted
    write), weights, checkpoints and metrics records, bit for bit."""
    assert _files(run) == _files(ref), set(_files(run)) ^ set(_files(ref))
    for name in ["model.safetensors"] + [str(p.relative_to(ref)) for p in ref.glob("checkpoints/step-*/state.safetensors")]:
        a, b = load_file(str(ref / name)), load_file(str(run / name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert _records(run) == _records(ref)
    for name in ("config.json", "checkpoints/latest.json"):
        assert (run / name).read_bytes() == (ref / name).read_bytes(), name

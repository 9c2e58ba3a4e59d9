"""Run folders are never destroyed or shared (each case in a child process, asserting the
message and that the folder's previous contents are byte-identical afterwards)."""
import json
import os
import shutil
import signal
import time

import pytest
import torch

from cli_fork import DEADLINE_S, fork_cli, run_cli, snapshot, wait_cli
from spikerec.train.runs import RunFolderError, RunLock, remove_debris

TINY = ["quickstart", "--quiet", "--set", "train.epochs=2", "--set", "model.layers.0.size=16",
        "--set", "data.batch_size=64", "--set", "train.checkpoint_every=3", "--set", "lsc.max_steps=3",
        "--set", "lsc.batch_size=4", "--set", "train.threads=1", "--checkpoint-minutes", "0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished run and one stopped at step 5 (checkpoint written), made once."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    code, out, err = run_cli(["train", *TINY, "--out", str(root / "done")])
    assert code == 0, err
    code, out, err = run_cli(["train", *TINY, "--out", str(root / "half"), "--stop-after-steps", "5"])
    assert code == 0, err
    assert "stopped after 5 steps" in out and f"continue with: spikerec train --resume {root / 'half'}" in out
    assert json.loads((root / "half" / "checkpoints" / "latest.json").read_text())["step"] == 5
    return root


def _copy(runs, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(runs / name, dst)
    return dst


def test_out_onto_a_finished_run_is_refused(runs, tmp_path):
    run = _copy(runs, "done", tmp_path)
    before = snapshot(run)
    code, out, err = run_cli(["train", *TINY, "--seed", "1", "--out", str(run)])
    assert code == 2
    assert f"run folder '{run}' already exists and holds a finished run" in err
    assert "never overwritten" in err and "--sibling" in err and "Traceback" not in err
    assert f"Re-test it with 'spikerec evaluate {run}'" in err and "--resume" not in err
    code, out, err = run_cli(["train", *TINY, "--out", str(run)])  # the same command again: it has finished
    assert code == 0, err
    assert f"run '{run}' is a finished run" in out and "nothing to do, nothing changed" in out
    assert snapshot(run) == before


def test_out_onto_an_unfinished_run_continues_it_only_with_the_same_config(runs, tmp_path):
    run = _copy(runs, "half", tmp_path)
    before = snapshot(run)
    code, out, err = run_cli(["train", *TINY, "--seed", "1", "--out", str(run)])
    assert code == 2 and "an unfinished run with a checkpoint at step 5" in err
    assert f"Its config differs from this command's; continue it with its own by 'spikerec train --resume {run}'" in err
    assert snapshot(run) == before
    code, out, err = run_cli(["train", *TINY, "--out", str(run)])
    assert code == 0, err
    assert "holds this command's unfinished run (the same config): continuing it" in out
    assert f"resuming {run} at step 5" in out
    done = json.loads((runs / "done" / "summary.json").read_text())
    assert json.loads((run / "summary.json").read_text())["test_loss"] == done["test_loss"]


def test_sibling_starts_a_fresh_numbered_folder(runs, tmp_path):
    run = _copy(runs, "done", tmp_path)
    before = snapshot(run)
    code, out, err = run_cli(["train", *TINY, "--out", str(run), "--sibling", "--stop-after-steps", "1"])
    assert code == 0, err
    assert f"--resume {run}-2" in out
    assert (tmp_path / "done-2" / "checkpoints").is_dir()
    assert snapshot(run) == before


def test_a_locked_run_is_refused_with_the_holders_pid(runs, tmp_path):
    run = _copy(runs, "half", tmp_path)
    with RunLock(run, "test holder"):
        assert (run / ".lock").read_text() == f"{os.getpid()} test holder\n"
        before = snapshot(run)
        code, out, err = run_cli(["train", "--resume", str(run)])
        assert code == 2
        assert f"run '{run}' is in use by PID {os.getpid()} (test holder)" in err
        code, out, err = run_cli(["export", str(run), "--target", "generic"])
        assert code == 2 and f"run '{run}' is in use by PID {os.getpid()}" in err
        code, out, err = run_cli(["train", *TINY, "--seed", "1", "--out", str(run)])
        assert code == 2 and f"run folder '{run}' is in use by PID {os.getpid()} (test holder)" in err
        assert "--resume" not in err
        assert snapshot(run) == before
    assert not (run / ".lock").exists()  # released: the file is removed


def test_resume_of_a_finished_run_changes_nothing(runs, tmp_path):
    run = _copy(runs, "done", tmp_path)
    before = snapshot(run)
    code, out, err = run_cli(["train", "--resume", str(run)])
    assert code == 0, err
    assert "is a finished run" in out and "nothing to resume" in out
    assert snapshot(run) == before  # summary.json (wall time) untouched


def test_resume_with_nothing_to_resume_asks_for_confirmation(runs, tmp_path):
    run = _copy(runs, "half", tmp_path)
    shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    code, out, err = run_cli(["train", "--resume", str(run)])
    assert code == 2
    assert "has no checkpoint to resume from" in err and "--from-scratch" in err
    assert snapshot(run) == before


def test_debris_is_removed_and_the_resume_ends_like_the_uninterrupted_run(runs, tmp_path):
    run = _copy(runs, "half", tmp_path)
    (run / "checkpoints" / ".tmp-step-abc123").mkdir()
    (run / "checkpoints" / ".tmp-step-abc123" / "state.safetensors").write_bytes(b"x" * 100)
    (run / ".model.safetensors.xyz.part").write_bytes(b"partial")
    (run / "export" / "loihi2").mkdir(parents=True)
    code, out, err = run_cli(["train", "--resume", str(run), "--quiet"])
    assert code == 0, err
    assert "removed 4 leftover(s) of an interrupted write" in out
    assert not (run / "checkpoints" / ".tmp-step-abc123").exists() and not (run / "export").exists()
    assert not list(run.rglob("*.part"))
    done = json.loads((runs / "done" / "summary.json").read_text())
    again = json.loads((run / "summary.json").read_text())
    assert again["test_loss"] == done["test_loss"] and again["steps"] == done["steps"]
    assert remove_debris(run) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_write_a_checkpoint_and_print_the_resume_command(runs, tmp_path, sig):
    run = tmp_path / "run"
    pid, so, se = fork_cli(["train", *TINY, "--out", str(run), "--set", "train.epochs=200"], str(tmp_path))
    latest = run / "checkpoints" / "latest.json"
    deadline = time.monotonic() + DEADLINE_S  # only a guard against a hang: the moment is the checkpoint's
    while not latest.is_file() or json.loads(latest.read_text())["step"] < 3:  # training is under way
        assert time.monotonic() < deadline and not os.waitpid(pid, os.WNOHANG)[0], (so.read_text(), se.read_text())
        time.sleep(0.05)
    os.kill(pid, sig)
    code, out, err = wait_cli(pid, so, se)
    assert code == 130, (out, err)
    assert f"({signal.Signals(sig).name}); checkpoint written" in out
    hint = f"continue with: spikerec train --resume {run}"
    assert err.strip() == f"spikerec train: interrupted; {hint}" and hint not in out  # said once
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    step = json.loads(latest.read_text())["step"]
    assert f"stopped after {step} steps" in out


def test_ctrl_c_during_lsc_keeps_the_folder_and_the_same_command_starts_afresh(tmp_path, monkeypatch):
    """SIGINT at the first LSC step (raised by the step itself, not timed): no checkpoint exists yet, so
    the folder is kept with its config and the message says how to start again; the same command does."""
    import spikerec.train.trainer as trainer_module

    lsc_pretrain = trainer_module.lsc_pretrain

    def interrupted(model, data, options, progress=None):
        def step(*a):
            signal.raise_signal(signal.SIGINT)
            return progress(*a)
        return lsc_pretrain(model, data, options, progress=step)

    monkeypatch.setattr(trainer_module, "lsc_pretrain", interrupted)  # inherited by the forked command
    run = tmp_path / "run"
    code, out, err = run_cli(["train", *TINY, "--out", str(run)])
    assert code == 130, err
    assert err.strip() == f"spikerec train: interrupted; start it again with: spikerec train --resume {run} --from-scratch"
    assert "stopped after 0 steps (SIGINT) before the first checkpoint" in out and "--from-scratch" not in out
    assert (run / "config.json").is_file() and not any((run / "checkpoints").glob("step-*"))
    monkeypatch.undo()
    code, out, err = run_cli(["train", *TINY, "--out", str(run), "--stop-after-steps", "1"])
    assert code == 0, err
    assert f"'{run}' held an interrupted start without a checkpoint: removed " in out and "config.json" in out
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 1


def test_evaluate_names_its_weights_and_never_switches(runs, tmp_path):
    run = _copy(runs, "done", tmp_path)
    code, out, err = run_cli(["evaluate", str(run), "--no-metrics"])
    assert code == 0, err
    assert f"{run} (model.safetensors): test split" in out
    (run / "model.safetensors").unlink()
    before = snapshot(run)
    code, out, err = run_cli(["evaluate", str(run), "--no-metrics"])
    assert code == 5 and "model.safetensors' is missing" in err and "--checkpoint" in err
    code, out, err = run_cli(["evaluate", str(run), "--checkpoint", "--no-metrics"])
    assert code == 0, err
    assert f"{run} (checkpoint checkpoints/step-00000034): test split" in out
    assert snapshot(run) == before


def test_a_truncated_model_file_is_named(runs, tmp_path):
    run = _copy(runs, "done", tmp_path)
    w = run / "model.safetensors"
    w.write_bytes(w.read_bytes()[:50])
    code, out, err = run_cli(["evaluate", str(run), "--no-metrics"])
    assert code == 5 and f"'{w}' is not a readable safetensors file" in err and "Traceback" not in err
    assert f"or use the run's newest checkpoint: 'spikerec evaluate {run} --checkpoint'" in err


class _Clock:
    """``time`` for the trainer whose ``perf_counter`` advances one minute per reading."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += 60.0
        return self.now


def test_time_based_checkpoints(tmp_path, monkeypatch):
    import spikerec.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "time", _Clock())  # inherited by the forked command: no real clock
    run = tmp_path / "run"
    code, out, err = run_cli(["train", *TINY, "--out", str(run), "--set", "train.checkpoint_every=0",
                              "--set", "train.keep_checkpoints=10", "--checkpoint-minutes", "1",
                              "--stop-after-steps", "4"])
    assert code == 0, err
    steps = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    # after LSC (step 0), then after every step: each one is due by the clock
    assert steps == [f"step-{i:08d}" for i in range(5)], steps
    monkeypatch.undo()
    code, out, err = run_cli(["train", *TINY, "--out", str(tmp_path / "off"), "--set", "train.checkpoint_every=0",
                              "--set", "train.keep_checkpoints=10", "--checkpoint-minutes", "0", "--stop-after-steps", "4"])
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "off" / "checkpoints").glob("step-*")) == ["step-00000000", "step-00000004"]


def test_a_folder_left_by_a_start_killed_before_its_config_is_started_afresh(tmp_path):
    """kill -9 before config.json was written leaves the lock, the TensorBoard folder and a temporary
    file: the same --out is used again and emptied, with a note; a folder holding anything else is
    refused and left as it was."""
    from spikerec.train.runs import RunError, clear_unstarted, killed_start_leftovers, prepare_out, read_config

    out = tmp_path / "run"
    (out / "tensorboard").mkdir(parents=True)
    (out / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\0" * 40)
    (out / ".lock").write_text("123 spikerec train\n")
    (out / ".config.json.x1y2.part").write_text("{")
    assert killed_start_leftovers(out) == [".config.json.x1y2.part", "tensorboard/"]
    with pytest.raises(RunError, match="killed before writing its config.json"):
        read_config(out)  # --resume and evaluate say what the folder is
    code, stdout, err = run_cli(["train", *TINY, "--out", str(out), "--stop-after-steps", "1"])
    assert code == 0, err
    assert (f"'{out}' held an interrupted start without a checkpoint: removed .config.json.x1y2.part, tensorboard/; "
            f"starting afresh") in stdout
    assert (out / "checkpoints" / "step-00000001").is_dir() and not (out / "tensorboard" / "events.out.tfevents.1.host").exists()

    other = tmp_path / "other"
    (other / "tensorboard").mkdir(parents=True)
    (other / "tensorboard" / "notes.txt").write_text("mine")
    (other / "data.csv").write_text("1,2")
    before = snapshot(other)
    assert killed_start_leftovers(other) is None and clear_unstarted(other) == []
    with pytest.raises(RunFolderError, match="holds 2 entries"):
        prepare_out(other)
    assert snapshot(other) == before


def test_resume_finishes_an_interrupted_checkpoint_write(runs, tmp_path):
    """Killed after a checkpoint's rename but before latest.json and the pruning: the resume points
    latest.json at the checkpoint it continues from and prunes to keep_checkpoints."""
    run = _copy(runs, "half", tmp_path)
    ck = run / "checkpoints"
    shutil.copytree(ck / "step-00000005", ck / "step-00000001")
    shutil.copytree(ck / "step-00000005", ck / "step-00000002")
    (ck / "latest.json").write_text(json.dumps({"checkpoint": "step-00000002", "step": 2}))
    code, out, err = run_cli(["train", "--resume", str(run), "--stop-after-steps", "5"])
    assert code == 0, err
    assert json.loads((ck / "latest.json").read_text()) == {"checkpoint": "step-00000005", "step": 5}
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000003", "step-00000005"]

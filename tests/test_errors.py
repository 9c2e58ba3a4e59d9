"""One error style: every case of docs/errors.md, run as a user runs it (the ``spikerec``
command's ``main`` in a forked child; in a fresh interpreter where the case needs one, and once to
show that the installed command says the same), gives one line on stderr naming the file/option and
the exit code of the table; ``--debug`` gives the traceback instead."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli_fork import DEADLINE_S, run_cli
from spikerec.data import dataset_info
from spikerec.errors import EXIT_CODES, CheckpointError, ConfigError, DataError, ExportError, SpikerecError
from spikerec.models import build_model
from spikerec.train.config import load_config, resolve_sizes
from spikerec.train.runs import build_from_config, save_model, write_config
import spikerec.train.trainer  # noqa: F401  (the commands' import, once here rather than in every forked child)

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
TINY = ["--quiet", "--lsc", "off", "--set", "model.layers.0.size=8", "--set", "train.threads=1"]

# a wrapper that makes every atomic write fail the way the operating system would
FAULT = """
import errno, os, sys, tempfile
code = getattr(errno, sys.argv[1])
def fail(*a, **k):
    raise OSError(code, os.strerror(code), os.path.join(k.get("dir") or ".", "config.json"))
tempfile.mkstemp = fail
from spikerec.cli import main
sys.exit(main(sys.argv[2:]))
"""


def spikerec(*args, wrapper=None, timeout=600, fresh=False):
    """``spikerec <args>`` as a completed process: in a fresh interpreter (``python -m spikerec``, or the
    ``wrapper`` script) where the test needs one (``fresh``: a traceback, a signal, a patched write), else in a
    forked child of this process (the same ``main``, its exit code and streams, without importing torch again)."""
    if wrapper is None and not fresh:
        code, out, err = run_cli(list(args))
        return subprocess.CompletedProcess(["spikerec", *args], code, out, err)
    cmd = [sys.executable, "-m", "spikerec", *args] if wrapper is None else [sys.executable, "-c", wrapper, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)


def one_line(r) -> str:
    """The whole of stderr, which must be one line without a traceback."""
    err = r.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small run folder (config.json, model.safetensors, model.json) made without training."""
    d = tmp_path_factory.mktemp("run") / "run"
    cfg = load_config("quickstart", ["model.layers.0.size=8", "lsc.enabled=false"])
    resolve_sizes(cfg, dataset_info("digits"))
    d.mkdir()
    write_config(d, cfg)
    save_model(d, build_from_config(cfg["model"]), cfg)
    return d


def _copy(run: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in run.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_the_intact_run_evaluates(run):
    r = spikerec("evaluate", str(run), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["weights"] == "model.safetensors" and out["samples"] == 359


@pytest.mark.parametrize("case, args, code, words", [
    ("unknown preset", ["train", "quickstrat"], 2, ["unknown preset 'quickstrat'", "Did you mean quickstart"]),
    ("unknown command-line option", ["train", "quickstart", "--learnign", "online"], 2,
     ["unrecognized arguments: --learnign", "spikerec train --help"]),
    ("unknown config key", ["train", "quickstart", "--set", "train.lrr=1e-3"], 2, ["train.lrr", "did you mean lr"]),
    ("inf hyper-parameter", ["train", "quickstart", "--set", "train.lr=inf"], 2, ["train.lr", "finite number", "inf"]),
    ("nan hyper-parameter", ["train", "quickstart", "--set", "lsc.target=nan"], 2, ["lsc.target", "finite number"]),
    ("out-of-range value", ["train", "quickstart", "--set", "train.warmup=1.5"], 2, ["train.warmup", "< 1"]),
    ("wrong choice", ["lsc", "quickstart", "--set", "lsc.method=\"qr\""], 2, ["lsc.method", "auto, exact"]),
    ("not a run folder", ["evaluate", "/nonexistent/run"], 2, ["not a spikerec run folder", "config.json"]),
])
def test_bad_command_lines(case, args, code, words):
    r = spikerec(*args)
    err = one_line(r)
    assert r.returncode == code, (case, err)
    assert err.startswith(f"spikerec {args[0]}: "), err
    for w in words:
        assert w in err, (case, w, err)


@pytest.mark.parametrize("args, code, words", [
    (["train", "--epochs", "0"], 2, "argument --epochs: must be >= 1, got 0"),
    (["train", "--stop-after-steps", "-5"], 2, "argument --stop-after-steps: must be >= 0, got -5"),
    (["train", "--checkpoint-minutes", "-1"], 2, "argument --checkpoint-minutes: must be a finite number >= 0, got -1"),
    (["train", "--checkpoint-minutes", "nan"], 2, "argument --checkpoint-minutes: must be a finite number >= 0"),
    (["train", "--nproc-per-node", "0"], 2, "argument --nproc-per-node: must be >= 1, got 0"),
    (["train", "--set", "train.epochs=0"], 2, "'train.epochs' must be > 0"),
    (["evaluate", "RUN", "--batch-size", "0"], 2, "argument --batch-size: must be >= 1, got 0"),
    (["evaluate", "RUN", "--metrics-batches", "-1"], 2, "argument --metrics-batches: must be >= 1, got -1"),
    (["export", "RUN", "--target", "generic", "--samples", "0"], 2, "argument --samples: must be >= 1, got 0"),
    (["export", "RUN", "--target", "generic", "--samples", "-3"], 2, "argument --samples: must be >= 1, got -3"),
    (["export", "RUN", "--target", "generic", "--finetune-epochs", "-2"], 2, "argument --finetune-epochs: must be >= 0"),
    (["export", "RUN", "--target", "xylo", "--random-input"], 6, "64 input channels exceed the limit of 16 inputs on Xylo v1"),
    (["export", "RUN", "--target", "warp"], 2, "argument --target: invalid choice: 'warp'"),
    (["lsc", "--target", "nan"], 2, "'lsc.target' must be a finite number"),
    (["datasets", "--verfy"], 2, "unrecognized arguments: --verfy"),
])
def test_every_command_follows_the_exit_code_table(run, args, code, words):
    """Each command, export included, turns a bad option value or a model the target cannot take into
    one line and the documented exit code (run in a forked process, as from a shell)."""
    got, out, err = run_cli([str(run) if a == "RUN" else a for a in args])
    assert got == code, (args, err)
    assert err.startswith(f"spikerec {args[0]}: ") and len(err.strip().splitlines()) == 1, err
    assert words in err, (words, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("args", [["train", "quickstart", "--device", "cuda"], ["evaluate", "RUN", "--device", "cuda:0"]])
def test_device_cuda_without_cuda(run, args):
    r = spikerec(*[str(run) if a == "RUN" else a for a in args])
    err = one_line(r)
    assert r.returncode == 2
    assert "CUDA is not available" in err and "cpu" in err


def test_invalid_toml_preset(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nepochs = \n")
    r = spikerec("train", str(bad))
    err = one_line(r)
    assert r.returncode == 2 and str(bad) in err and "not valid TOML" in err


def test_invalid_json_config(run, tmp_path):
    d = _copy(run, tmp_path / "r")
    (d / "config.json").write_text('{"model": {"input_size": 64,')
    before = {f.name: f.read_bytes() for f in d.iterdir()}
    for args in (["evaluate", str(d)], ["train", "--resume", str(d)], ["export", str(d), "--target", "generic"]):
        r = spikerec(*args)
        err = one_line(r)
        assert r.returncode == 2, err
        assert "config.json" in err and "JSON" in err, err
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before  # nothing touched


def test_wrong_layer_size_in_config_json(run, tmp_path):
    d = _copy(run, tmp_path / "r")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model"]["layers"][0]["size"] = 9
    (d / "config.json").write_text(json.dumps(cfg))
    r = spikerec("evaluate", str(d))
    err = one_line(r)
    assert r.returncode == 5
    assert str(d / "model.safetensors") in err and "config.json" in err and "cells.0" in err and "[8" in err


@pytest.mark.parametrize("damage", ["truncated", "pickled", "text"])
def test_unreadable_model_file_is_named(run, tmp_path, damage):
    d = _copy(run, tmp_path / "r")
    w = d / "model.safetensors"
    if damage == "truncated":
        w.write_bytes(w.read_bytes()[:100])
    elif damage == "pickled":
        torch.save(build_model({"input_size": 64, "layers": [{"kind": "alif", "size": 8}],
                                "readout": {"size": 10}}).state_dict(), w)
    else:
        w.write_text("not weights\n")
    r = spikerec("evaluate", str(d))
    err = one_line(r)
    assert r.returncode == 5
    assert str(w) in err and "safetensors" in err and "never loads pickles" in err


def test_missing_final_weights_is_not_silently_replaced(run, tmp_path):
    d = _copy(run, tmp_path / "r")
    (d / "model.safetensors").unlink()
    r = spikerec("evaluate", str(d))
    err = one_line(r)
    assert r.returncode == 5 and "model.safetensors" in err and "--checkpoint" in err


@pytest.mark.parametrize("errno_name, words", [
    ("EROFS", ["cannot write", "config.json", "read-only", "--out"]),
    ("EACCES", ["cannot write", "config.json", "--out"]),
    ("ENOSPC", ["no space left", "config.json", "free some space"]),
])
def test_operating_system_refuses_a_write(tmp_path, errno_name, words):
    out = tmp_path / "run"
    r = spikerec(errno_name, "train", "quickstart", *TINY, "--out", str(out), wrapper=FAULT)
    err = one_line(r)
    assert r.returncode == 7, err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()  # nothing left behind


def test_debug_shows_the_traceback():
    r = spikerec("--debug", "train", "quickstart", "--set", "train.lr=inf", fresh=True)
    assert r.returncode != 0 and "Traceback" in r.stderr and "ConfigError" in r.stderr


def test_the_installed_command_gives_the_same_one_line():
    """The forked children above run the command's ``main``; the command itself, in a fresh interpreter."""
    for args, code in ((["train", "quickstrat"], 2), (["evaluate", "/nonexistent/run"], 2)):
        r, forked = spikerec(*args, fresh=True), spikerec(*args)
        assert r.returncode == forked.returncode == code, (r.stderr, forked.stderr)
        assert one_line(r) == one_line(forked)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_gives_one_line_and_the_resume_command(tmp_path, sig):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "spikerec", "train", "quickstart", *TINY, "--set", "train.epochs=500",
            "--set", "train.checkpoint_every=3", "--checkpoint-minutes", "0", "--out", str(out)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        deadline = time.monotonic() + DEADLINE_S  # only a guard against a hang: the moment is the checkpoint's
        while not list((out / "checkpoints").glob("step-*")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()
        p.send_signal(sig)
        _, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    r = subprocess.CompletedProcess(args, p.returncode, "", stderr)
    err = one_line(r)
    assert p.returncode == 130
    assert err == f"spikerec train: interrupted; continue with: spikerec train --resume {out}"


def test_error_classes_and_exit_codes():
    for cls in (ConfigError, DataError, CheckpointError, ExportError):
        assert issubclass(cls, SpikerecError) and issubclass(cls, ValueError)
        assert cls.exit_code in EXIT_CODES
    assert len({c.exit_code for c in (ConfigError, DataError, CheckpointError, ExportError)}) == 4
    doc = (ROOT / "docs" / "errors.md").read_text()
    for code in EXIT_CODES:
        assert f"| {code} |" in doc  # every exit code is documented


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_integer_input_is_cast_exactly(dtype):
    torch.manual_seed(0)
    m = build_model({"input_size": 5, "layers": [{"kind": "alif", "size": 6}], "readout": {"size": 3}})
    x = (torch.rand(7, 2, 5) < 0.3)
    y_int, _ = m(x.to(dtype))
    y_ref, _ = m(x.float())
    assert y_int.dtype == torch.float32
    assert torch.equal(y_int, y_ref)


def test_other_float_precision_is_a_clear_error():
    m = build_model({"input_size": 5, "layers": [{"kind": "lif", "size": 6}], "readout": {"size": 3}})
    with pytest.raises(DataError, match=r"model input: dtype torch.float64 but the model's parameters are torch.float32"):
        m(torch.zeros(4, 2, 5, dtype=torch.float64))
    y, _ = m.double()(torch.zeros(4, 2, 5, dtype=torch.float64))  # a float64 model takes float64 input
    assert y.dtype == torch.float64

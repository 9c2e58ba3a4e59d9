"""Every command of the README's "Beyond the quickstart" block (and the main job) works as
written, shortened only as the README says right below that block."""
import re
import shlex
from pathlib import Path

import pytest
import torch

from cli_fork import run_cli

README = Path(__file__).resolve().parents[1] / "README.md"
SHORT_TRAIN = ["--set", "train.epochs=1"]
SHORT = {  # what the README says the tests add (checked against its text below)
    ("train", "copy-online"): SHORT_TRAIN + ["--set", "data.options.n_samples=100"],
    ("train", "copy-stream"): SHORT_TRAIN + ["--set", "data.options.n_samples=100"],
    ("train",): SHORT_TRAIN,
    ("export",): ["--samples", "32"],
    ("bench", "lif"): ["--T", "50", "--reps", "1"],
}
RULE = ("`train` commands that start a run get\n`--set train.epochs=1` (and `copy-online` and `copy-stream` also "
        "`--set data.options.n_samples=100`),\n`export` gets `--samples 32`, `bench lif` gets `--T 50 --reps 1`.")


def _block() -> list[list[str]]:
    text = README.read_text()
    m = re.search(r"```bash\n(spikerec train --list.*?)```", text, re.S)
    assert m, "README: the 'Beyond the quickstart' command block is missing"
    cmds = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            cmds.append(shlex.split(line))
    return cmds


def _shortened(argv: list[str]) -> list[str]:
    if argv[1] == "train" and ("--resume" in argv or "--list" in argv):
        return argv  # these do not start a run
    for key, extra in SHORT.items():
        if tuple(argv[1:1 + len(key)]) == key:
            return argv + extra
    return argv


def test_readme_states_the_shortening_the_tests_use():
    text = " ".join(README.read_text().split())
    assert " ".join(RULE.split()) in text
    assert all(c[0] == "spikerec" for c in _block())


@pytest.mark.slow  # runs every README command: several minutes on 2 cores
def test_every_readme_command_works_as_written(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    # the main job (the first of the two commands), shortened like every train command
    code, out, err = run_cli(_shortened(["spikerec", "train"])[1:])
    assert code == 0, err
    run = re.search(r"run folder: +(\S+)", out).group(1)
    # a stopped run, for the --resume line (without LSC pre-training: the line resumes training)
    code, out, err = run_cli(["train", "quickstart", "--lsc", "off", "--set", "train.epochs=1", "--stop-after-steps", "3"])
    assert code == 0, err
    stopped = re.search(r"--resume (\S+)", out).group(1)
    made = {}  # preset -> the run folder its train command printed
    for argv in _block():
        def folder(a):
            if "--resume" in argv:
                return stopped
            preset = a[len("runs/"):].rstrip("…").rstrip("-")
            return made.get(preset, run)
        argv = [folder(a) if a.startswith("runs/") and a.endswith("…") else a for a in argv]
        code, out, err = run_cli(_shortened(argv)[1:])
        if argv[1] == "train" and "run folder:" in out:
            made[argv[2]] = re.search(r"run folder: +(\S+)", out).group(1)
        assert code == 0, (argv, out[-3000:], err[-8000:])
        assert "Traceback" not in err, (argv, err[-2000:])
    shd = README.read_text().split("Then run\n`", 1)[1].split("`", 1)[0]  # the SHD paragraph's command
    code, out, err = run_cli(_shortened(shlex.split(shd))[1:])
    if code == 3:  # the SHD files are not here: the message says where to put them
        assert "is not available" in err and "zenkelab.org" in err
    else:
        assert code == 0, err

"""The commands that need no tensors start without torch, and the default paths raise no
third-party warnings (DDP's find_unused_parameters is asked for only when a parameter is unused)."""
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sklearn", "mlxtend", "scipy", "matplotlib", "numba", "snntorch", "norse")


def _imported_after(argvs: list[list[str]]) -> tuple[list[str], str]:
    """Run ``python -m spikerec ARGS`` (each argv in turn, in one process) and list the heavy
    packages it imported; also return what it printed."""
    code = ("import json, runpy, sys\n"
            f"for argv in {argvs!r}:\n"
            "    sys.argv = ['spikerec', *argv]\n"
            "    try:\n"
            "        runpy.run_module('spikerec', run_name='__main__', alter_sys=True)\n"
            "    except SystemExit as e:\n"
            "        assert not e.code, (argv, e.code)\n"
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    *printed, last = r.stdout.strip().splitlines()
    return json.loads(last), "\n".join(printed)


def test_help_version_list_and_datasets_do_not_import_torch():
    heavy, out = _imported_after([["--help"], ["--version"], ["train", "--list"], ["datasets"]])
    assert heavy == [], heavy
    assert "usage: spikerec" in out and "quickstart" in out and "digits" in out and "data home:" in out


def test_the_check_can_fail():
    heavy, _ = _imported_after([["train", "--show-config"]])  # resolves data-set sizes: needs torch
    assert "torch" in heavy


def test_public_names_still_import():
    import spikerec
    import spikerec.data
    import spikerec.train

    assert spikerec.LIF.__name__ == "LIF" and callable(spikerec.build_model)
    assert set(spikerec.data.__all__) <= set(dir(spikerec.data)) | set(spikerec.data._LAZY)
    for name in spikerec.data.__all__ + spikerec.train.__all__:
        assert getattr(spikerec.data if name in spikerec.data.__all__ else spikerec.train, name) is not None
    try:
        spikerec.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("a missing name must raise AttributeError")


def test_unused_parameters_found_and_rng_untouched():
    from spikerec.models import build_model
    from spikerec.train.distributed import has_unused_parameters

    torch.manual_seed(0)
    m = build_model({"input_size": 5, "layers": [{"kind": "alif", "size": 6}, {"kind": "lru", "size": 4}],
                     "readout": {"size": 3}})
    state = torch.get_rng_state()
    assert not has_unused_parameters(m, 5, torch.device("cpu"))
    assert torch.equal(state, torch.get_rng_state())
    assert all(p.grad is None for p in m.parameters())  # the probe leaves no gradients behind
    m.unused = torch.nn.Linear(2, 2)
    assert has_unused_parameters(m, 5, torch.device("cpu"))


def test_progress_bars_are_plain_tqdm():
    """tqdm.auto warns ("IProgress not found") in a notebook without ipywidgets."""
    for f in ("spikerec/train/trainer.py", "spikerec/stability/progress.py"):
        assert "tqdm.auto" not in (ROOT / f).read_text(), f

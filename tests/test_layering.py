"""The import direction of the package (the ``layers`` contract in pyproject.toml) holds,
and the contract really fails on an upward import; no import cycle exists between modules, and
the check really finds one."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
        "sys.exit(lint_imports_command())", "--no-cache"]


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(LINT, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_package_keeps_the_layers_contract():
    r = _lint(ROOT)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 kept, 0 broken" in out


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "repo"
    shutil.copytree(ROOT / "spikerec", dst / "spikerec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")
    return dst


@pytest.mark.parametrize("module, line, words", [
    ("layers/base.py", "from ..train import runs as _upward", "spikerec.layers is not allowed to import spikerec.train"),
    ("data/home.py", "from ..models import build_model as _upward", "spikerec.data is not allowed to import spikerec.models"),
    ("stability/radius.py", "import spikerec.cli as _upward", "spikerec.stability is not allowed to import spikerec.cli"),
])
def test_contract_fails_on_an_upward_import(tmp_path, module, line, words):
    repo = _copy(tmp_path)
    assert _lint(repo).returncode == 0  # the untouched copy passes ...
    path = repo / "spikerec" / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately wrong\n")
    r = _lint(repo)  # ... and one upward import breaks it
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out
    assert "BROKEN" in out and words in out, out


def test_every_subpackage_is_placed_in_a_layer(tmp_path):
    """``exhaustive``: a new top-level module must be given a place in the contract."""
    repo = _copy(tmp_path)
    (repo / "spikerec" / "newthing.py").write_text("X = 1\n")
    r = _lint(repo)
    assert r.returncode != 0
    assert "newthing" in r.stdout + r.stderr


CYCLES = ("import grimp\n"
          "g = grimp.build_graph('spikerec', cache_dir=None)\n"
          "seen = set()\n"
          "for m in sorted(g.modules):\n"
          "    for n in sorted(g.find_modules_directly_imported_by(m)):\n"
          "        chain = g.find_shortest_chain(importer=n, imported=m)\n"
          "        if chain and frozenset(chain) not in seen:\n"
          "            seen.add(frozenset(chain))\n"
          "            print(' -> '.join((m,) + chain))\n")


def _module_cycles(root: Path) -> list[str]:
    """The import cycles between modules of the package under ``root``, one per line (module-level and
    function-level imports alike), found by grimp in a fresh process that imports ``root``'s copy."""
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CYCLES], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_no_import_cycle_between_modules():
    assert _module_cycles(ROOT) == []


@pytest.mark.parametrize("module, line, words", [
    ("kernels/scan_numba_kernels.py", "from .scan_numba import available as _cycle",
     "spikerec.kernels.scan_numba -> spikerec.kernels.scan_numba_kernels -> spikerec.kernels.scan_numba"),
    ("kernels/__init__.py", "from . import scan_numba as _cycle",
     "spikerec.kernels -> spikerec.kernels.scan_numba -> spikerec.kernels"),
])
def test_cycle_check_finds_a_cycle(tmp_path, module, line, words):
    """Between two modules of a package, and between a package and one of its modules."""
    repo = _copy(tmp_path)
    path = repo / "spikerec" / module
    path.write_text(path.read_text() + f"\n{line}  # deliberately wrong\n")
    assert words in _module_cycles(repo)

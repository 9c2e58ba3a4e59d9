"""The API reference (``docs/api``, Sphinx autodoc) builds from the docstrings without a warning,
covers the public modules, and a docstring that Sphinx cannot read fails the build."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the API reference needs Sphinx: pip install -e '.[docs]' (also in '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"


def _build(src: Path, out: Path, pythonpath: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
                           "-d", str(out / ".doctrees"), str(src), str(out)],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_api_reference_builds_without_warnings(tmp_path):
    r = _build(API, tmp_path, str(ROOT))
    assert r.returncode == 0, r.stderr
    layers = (tmp_path / "layers.html").read_text()
    assert 'id="spikerec.layers.LIF"' in layers and 'id="spikerec.models.build_model"' in layers
    assert 'id="spikerec.hardware.online.OnlineLearner"' in (tmp_path / "online.html").read_text()


def test_every_public_package_of_the_readme_has_a_page():
    readme_modules = set(re.findall(r"^\| `(spikerec\.[a-z_.]+)`", (ROOT / "README.md").read_text(), re.M))
    readme_modules |= set(re.findall(r"^\| `spikerec\.[a-z_.]+`, `(spikerec\.[a-z_.]+)`", (ROOT / "README.md").read_text(), re.M))
    documented = set(re.findall(r"automodule:: (spikerec[a-z_.]*)", "".join(p.read_text() for p in API.glob("*.rst"))))
    assert readme_modules and readme_modules - {"spikerec.data", "spikerec.train"} <= documented, readme_modules - documented
    assert any(m.startswith("spikerec.data.") for m in documented) and any(m.startswith("spikerec.train.") for m in documented)


def test_a_broken_docstring_fails_the_build(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "broken_doc.py").write_text('"""Title.\n\n    indented\n        more indented\n  back\n"""\n')
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text('extensions = ["sphinx.ext.autodoc"]\n')
    (src / "index.rst").write_text("x\n=\n\n.. automodule:: broken_doc\n")
    r = _build(src, tmp_path / "out", str(tmp_path / "pkg"))
    assert r.returncode != 0 and "broken_doc" in r.stderr, r.stderr

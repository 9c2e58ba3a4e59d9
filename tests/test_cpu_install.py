"""The README's CPU-only install keeps the CPU build of torch: after ``pip install torch torchvision
--index-url .../cpu``, installing spikerec (and its test extra) replaces neither.

Checked with pip's own resolver (``pip install --dry-run --report``) offline: a throw-away
environment holds stand-ins for the CPU builds (``torch 2.13.0+cpu``, ``torchvision 0.28.0+cpu``), and
a local folder offers metadata-only wheels of every distribution the requirements reach (their
versions and dependencies copied from this environment) plus the default builds that would replace
the CPU ones (``torch 2.14.1``, ``torchvision 0.29.1`` needing it). Nothing is downloaded.
"""
import json
import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging")
from importlib import metadata  # noqa: E402

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# the CPU builds the README installs, and the default (CUDA) builds that pip would otherwise pick
CPU = {"torch": ("2.13.0+cpu", []), "torchvision": ("0.28.0+cpu", ["torch==2.13.0"])}
DEFAULT = {"torch": [("2.14.1", []), ("2.13.0", [])],
           "torchvision": [("0.29.1", ["torch==2.14.1"]), ("0.28.0", ["torch==2.13.0"])]}


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A wheel that holds only its metadata."""
    stem = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    path = folder / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def _closure(requirements: list[str]) -> dict[str, tuple[str, list[str]]]:
    """``{name: (installed version, its requirements)}`` of everything the requirements reach here
    (markers evaluated for this interpreter; torch and torchvision are stood in for)."""
    out, todo = {}, [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in out or name in CPU:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{req.name} is not installed here: the stand-in wheels are copied from this environment")
        reqs = [r for r in (dist.requires or []) if "extra ==" not in r.replace("extra==", "extra ==")]
        out[name] = (dist.version, reqs)
        todo += [Requirement(r) for r in reqs]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpu-install")
    wheels, cpu = tmp / "wheels", tmp / "cpu-wheels"
    wheels.mkdir(), cpu.mkdir()
    requirements = PROJECT["dependencies"] + PROJECT["optional-dependencies"]["test"]
    for name, (version, reqs) in _closure(requirements).items():
        _wheel(wheels, name, version, reqs)
    for name, builds in DEFAULT.items():
        for version, reqs in builds:
            _wheel(wheels, name, version, reqs)
    cpu_wheels = {name: _wheel(cpu, name, version, reqs) for name, (version, reqs) in CPU.items()}
    return tmp, wheels, cpu_wheels, requirements


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return subprocess.run([sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check",
                           "--python", str(python), *args], capture_output=True, text=True, env=env, timeout=300)


def _would_install(world, preinstalled: list[str]) -> dict[str, str]:
    tmp, wheels, cpu_wheels, requirements = world
    env_dir = tmp / ("env-" + "-".join(preinstalled))
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    r = _pip(python, "install", "--no-index", "--no-deps", *[str(cpu_wheels[n]) for n in preinstalled])
    assert r.returncode == 0, r.stderr
    report = tmp / f"report-{'-'.join(preinstalled)}.json"
    r = _pip(python, "install", "--dry-run", "--no-index", "--find-links", str(wheels), "--report", str(report),
             *requirements)
    assert r.returncode == 0, r.stderr
    return {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}


def test_readme_installs_torch_and_torchvision_from_the_cpu_index():
    readme = (ROOT / "README.md").read_text()
    lines = [ln for ln in readme.splitlines() if CPU_INDEX in ln and "pip install" in ln]
    assert lines, "README: the CPU-only command is missing"
    words = lines[0].split("pip install", 1)[1].split()
    assert "torch" in words and "torchvision" in words, lines[0]


def test_the_cpu_builds_are_kept(world):
    new = _would_install(world, ["torch", "torchvision"])
    assert "torch" not in new and "torchvision" not in new, new
    assert "norse" in new and "snntorch" in new  # the rest of the requirements is resolved


def test_cpu_torch_alone_would_be_replaced(world):
    """Why the README installs torchvision too: norse requires it, the newest one requires the
    default torch build, and pip replaces the CPU build to satisfy it."""
    new = _would_install(world, ["torch"])
    assert new.get("torch") == "2.14.1" and new.get("torchvision") == "0.29.1", new


def test_no_requirement_excludes_the_cpu_builds():
    for r in PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]:
        req = Requirement(r)
        if canonicalize_name(req.name) in CPU:
            version = CPU[canonicalize_name(req.name)][0]
            assert req.specifier.contains(version, prereleases=True), f"{r} excludes the CPU build {version}"

"""Run notebooks and store them with their outputs (what readers see on the web, without running them).

    python notebooks/_execute.py                    # every notebook, full mode
    python notebooks/_execute.py quickstart.ipynb   # one

Runs each in ``notebooks/`` with nbclient (full mode: ``SPIKEREC_QUICK`` unset), figures inline at a
small resolution, and replaces the file atomically. Files the notebooks write (run folders, PNGs) go
to ``tutorial_out/`` and ``figures/`` here, which git ignores.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def scrub(nb) -> None:
    """Machine-specific paths out of the stored outputs: the repository's folder becomes relative
    (``notebooks/tutorial_out``), the interpreter's prefix ``<python>``."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                out["text"] = out["text"].replace(f"{HERE.parent}{os.sep}", "").replace(sys.prefix, "<python>")


def execute(path: Path, timeout: int = 1800) -> Path:
    nb = nbformat.read(path, as_version=4)
    os.environ.pop("SPIKEREC_QUICK", None)
    os.environ.pop("SPIKEREC_OUT", None)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(HERE)}})
    t0 = time.time()
    client.execute()
    scrub(nb)
    nbformat.validate(nb)
    fd, tmp = tempfile.mkstemp(suffix=".ipynb", dir=HERE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
    print(f"executed {path.name} in {time.time() - t0:.0f} s ({path.stat().st_size // 1024} KiB)", flush=True)
    return path


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb"))
    for name in names:
        execute(HERE / name)

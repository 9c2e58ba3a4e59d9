"""Write a notebook generated with nbformat: stable cell ids, validated, atomic replace."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook


def write_notebook(cells, name: str, folder: Path) -> Path:
    stem = name.split(".")[0]
    for i, c in enumerate(cells):
        c["id"] = f"{stem}-{i}"  # stable ids: regenerating gives the same file
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    nbformat.validate(nb)
    path = Path(folder) / name
    fd, tmp = tempfile.mkstemp(suffix=".ipynb", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
    print("wrote", path)
    return path

"""Execute every ``notebooks/*.ipynb`` in quick mode and fail on any cell error.

Environment of the kernel: ``SPIKEREC_QUICK=1`` (notebooks shrink their sizes),
``SPIKEREC_OUT`` = a temporary folder (notebooks write figures and files there, never into
the repository), ``MPLBACKEND=Agg``, one BLAS/OpenMP thread. The working directory is
``notebooks/``.
"""
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for k, v in {"SPIKEREC_QUICK": "1", "SPIKEREC_OUT": str(tmp_path), "MPLBACKEND": "Agg",
                 "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name}: commit notebooks with outputs cleared"
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # pragma: no cover - the message is the report
        pytest.fail(f"{path.name}: a cell raised\n{e}")

"""Every ``notebooks/*.ipynb`` is stored executed (outputs that readers see without running it,
small figures, no error) and runs again in quick mode with its figures shown inline.

Environment of the kernel: ``SPIKEREC_QUICK=1`` (notebooks shrink their sizes),
``SPIKEREC_OUT`` = a temporary folder (notebooks write figures and files there, never into
the repository), one BLAS/OpenMP thread, matplotlib's default (inline) backend as in Jupyter.
The working directory is ``notebooks/``. ``python notebooks/_execute.py`` re-runs and stores them.
"""
import copy
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
MAX_BYTES = 500_000  # per stored notebook: figures at a small resolution


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_executed(path):
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    cells = _code_cells(nb)
    assert all(c.get("execution_count") for c in cells), f"{path.name}: run it with notebooks/_execute.py"
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"], f"{path.name}: a cell failed"
    assert "full mode" in "".join(o.get("text", "") for o in cells[0].outputs), f"{path.name}: stored from a quick run"
    assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs), f"{path.name}: no figure"
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes; store smaller figures"
    text = "".join(o.get("text", "") for c in cells for o in c.outputs)
    assert "site-packages" not in text, f"{path.name}: a third-party warning in the outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for k, v in {"SPIKEREC_QUICK": "1", "SPIKEREC_OUT": str(tmp_path), "OMP_NUM_THREADS": "1",
                 "MKL_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the inline backend, as in Jupyter
    nb = copy.deepcopy(nbformat.read(path, as_version=4))
    for cell in _code_cells(nb):
        cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:  # pragma: no cover - the message is the report
        pytest.fail(f"{path.name}: a cell raised\n{e}")
    for cell in _code_cells(nb):  # a figure shown is a figure drawn, also after a Trainer wrote its PNGs
        if "plt.show()" in cell.source:
            assert any("image/png" in o.get("data", {}) for o in cell.outputs), \
                f"{path.name}: no inline figure from\n{cell.source[:300]}"

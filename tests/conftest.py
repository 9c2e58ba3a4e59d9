import os

if "PYTEST_XDIST_WORKER" in os.environ:  # the cores are shared among the workers: no oversubscribed thread pools
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest
import torch

os.environ.setdefault("SPIKEREC_QUICK", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

if "PYTEST_XDIST_WORKER" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of many tiny ops (eigen-problems, step loops): on a
    shared 2-core machine, spinning OpenMP workers make them up to 10x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

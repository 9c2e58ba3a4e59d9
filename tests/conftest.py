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
    _slow_first_on_every_worker(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _slow_first_on_every_worker(items) -> None:
    """Under pytest-xdist (``--dist worksteal`` hands each of the ``n`` workers one contiguous block of the
    collection, then moves queued tests from a busy worker's end to an idle one): each block starts with its
    share of the ``slow`` checks, dealt in turn, so that the run ends on short tests that can be moved."""
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = [it for it in items if "slow" in it.keywords]
    if n < 2 or not slow:
        return
    quick = [it for it in items if "slow" not in it.keywords]
    shares = [slow[w::n] for w in range(n)]
    sizes = [len(items) // n + (1 if w < len(items) % n else 0) for w in range(n)]  # the scheduler's blocks
    out, q = [], 0
    for share, size in zip(shares, sizes):
        take = max(0, size - len(share))
        out += share + quick[q:q + take]
        q += take
    out += quick[q:]
    items[:] = out


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

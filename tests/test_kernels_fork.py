"""The compiled (numba, prange) CPU kernels survive a fork: a process that ran them can fork a
child (DataLoader workers, forked servers, the CLI test harness) that runs them again. With GNU
OpenMP, numba's default layer kills such a child ("fork() called from a process already using GNU
OpenMP")."""
import os

import pytest
import torch

from spikerec.kernels import lif_sequence_numba, scan_numba
from spikerec.scan import linear_scan

pytestmark = pytest.mark.skipif(not scan_numba.available(), reason="numba is not installed (extra 'fast')")


def _in_child(fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_parallel_kernels_run_in_a_forked_child():
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(1, 64, generator=g) * 0.9).to(torch.complex64)
    b = torch.randn(300, 4, 64, generator=g, dtype=torch.complex64)
    want = linear_scan(a, b)  # the parent runs the parallel kernel first
    import numba

    assert numba.threading_layer() != "omp" or "NUMBA_THREADING_LAYER" in os.environ

    def child():
        got = linear_scan(a, b)  # the torch path here (see the next test): same values up to rounding
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)

    assert _in_child(child) == 0
    assert lif_sequence_numba.available()


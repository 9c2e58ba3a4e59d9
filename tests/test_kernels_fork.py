"""The compiled (numba) CPU kernels survive a fork: a process that ran them can fork a child
(DataLoader workers, forked servers, the CLI test harness) that runs them again and gets the
same values. They are serial, so numba never starts a thread pool that the child would lack."""
import os

import pytest
import torch

from cli_fork import single_threaded_child, wait_child
from spikerec.kernels import lif_sequence_numba, scan_numba
from spikerec.scan import linear_scan

pytestmark = pytest.mark.skipif(not scan_numba.available(), reason="numba is not installed (extra 'fast')")


def _in_child(fn) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            single_threaded_child()
            fn()
            code = 0
        finally:
            os._exit(code)
    return wait_child(pid, deadline_s=300, what=fn.__name__)


def test_compiled_kernels_run_in_a_forked_child():
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(1, 64, generator=g) * 0.9).to(torch.complex64)
    b = torch.randn(300, 4, 64, generator=g, dtype=torch.complex64)
    assert scan_numba.supported(a, b)
    want = scan_numba.scan_forward(a, b, None)  # the parent runs the compiled kernel first
    I = torch.randn(50, 3, 40, generator=g, dtype=torch.float64)
    want_lif = lif_sequence_numba.lif_forward(I, torch.zeros(3, 40, dtype=torch.float64), None,
                                              torch.full((40,), 0.9, dtype=torch.float64), None,
                                              torch.ones(40, dtype=torch.float64), "subtract")
    import numba

    with pytest.raises(ValueError):  # no parallel kernel ran, so no threading layer was loaded
        numba.threading_layer()

    def child():
        assert scan_numba.supported(a, b)  # the compiled path, not a fallback
        assert torch.equal(scan_numba.scan_forward(a, b, None), want)
        got = lif_sequence_numba.lif_forward(I, torch.zeros(3, 40, dtype=torch.float64), None,
                                             torch.full((40,), 0.9, dtype=torch.float64), None,
                                             torch.ones(40, dtype=torch.float64), "subtract")
        assert all(torch.equal(x, y) for x, y in zip(got, want_lif) if x is not None)
        assert torch.allclose(linear_scan(a, b), want, rtol=1e-5, atol=1e-5)

    assert _in_child(child) == 0


def test_a_forked_child_of_a_multithreaded_parent_does_not_hang():
    """torch's OpenMP pool is not fork-safe; the harness runs children on one thread."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(512, 512)
        (x @ x).sum()  # the parent's thread pool exists now

        def child():
            torch.set_num_threads(2)  # ignored in a harness child
            y = torch.randn(512, 512)
            assert torch.isfinite((y @ y + y * y).sum())

        assert _in_child(child) == 0
    finally:
        torch.set_num_threads(old)

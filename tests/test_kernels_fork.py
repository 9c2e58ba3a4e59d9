"""A process that ran the parallel numba kernels can fork: the child (DataLoader workers, forked
servers, the CLI test harness) takes the torch twins, since numba's thread pool does not survive
the fork (GNU OpenMP kills the child, numba's own pool hangs it), and gets the same values."""
import os
import subprocess
import sys

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


def test_a_forked_child_takes_the_torch_twins_with_the_same_values():
    from spikerec.layers.lif import LIF

    g = torch.Generator().manual_seed(0)
    a = (torch.rand(1, 64, generator=g) * 0.9).to(torch.complex128)
    b = torch.randn(300, 4, 64, generator=g, dtype=torch.complex128)
    assert scan_numba.supported(a, b)
    want = linear_scan(a, b)  # the parent runs the parallel kernel (and starts numba's pool)
    torch.manual_seed(0)
    lif = LIF(20, 40).double()
    x = (torch.rand(50, 3, 20, generator=g) < 0.3).double()
    assert lif_sequence_numba.available()
    want_z = lif(x)[0]

    def child():
        assert not scan_numba.supported(a, b) and not lif_sequence_numba.available()
        assert torch.allclose(linear_scan(a, b), want, rtol=1e-12, atol=1e-12)
        assert torch.equal(lif(x)[0], want_z)

    assert _in_child(child) == 0
    assert scan_numba.supported(a, b) and torch.equal(linear_scan(a, b), want)  # the parent still uses it


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


def test_starting_numbas_pool_leaves_torchs_thread_count_alone():
    """numba's OpenMP layer sets the OpenMP thread count torch shares when its pool starts; a user's
    ``torch.set_num_threads(1)`` must survive the first parallel kernel (a fresh process: one pool start)."""
    code = ("import torch; torch.set_num_threads(1)\n"
            "from spikerec.scan import linear_scan\n"
            "from spikerec.kernels import scan_numba\n"
            "a = torch.full((1, 64), 0.5, dtype=torch.float64); b = torch.randn(50, 4, 64, dtype=torch.float64)\n"
            "assert scan_numba.supported(a, b)\n"
            "linear_scan(a, b)\n"
            "print(torch.get_num_threads())\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "1", out.stdout

"""The fused Triton trace kernel == the torch path and the trace recursion on the step's derived
partials, on the CPU under TRITON_INTERPRET=1.

The interpreter must be switched on before triton is imported, so the checks run in a
fresh interpreter process."""
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    r"""
    import os
    assert os.environ["TRITON_INTERPRET"] == "1"
    import torch
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    from spikerec.kernels.trace_triton import mat_trace_step, mat_trace_step_torch, triton_available
    from spikerec.hardware.online.traces_base import advance_and_contract
    assert triton_available(torch.zeros(1))
    g = torch.Generator().manual_seed(int(os.environ.get("SEED", "0")))
    r = lambda *s: torch.randn(*s, generator=g)
    for k, bcast, ng, B, N, H in [(1, False, 1, 3, 5, 7), (2, False, 1, 2, 17, 33), (2, True, 2, 3, 6, 40), (2, False, 0, 2, 4, 5)]:
        eps = r(N, B, k, H)
        J = r(1 if bcast else B, N, k, k)
        c, x = r(B, N, k), r(B, H)
        gs = [r(B, N, k) for _ in range(ng)] or [None]
        e1, e2 = eps.clone(), eps.clone()
        o1 = mat_trace_step(e1, J, c, x, gs)
        o2 = mat_trace_step_torch(e2, J, c, x, gs)
        e3 = eps.clone()
        o3 = advance_and_contract(e3, J, c, x, gs)
        assert torch.allclose(e3, e2, rtol=1e-12, atol=1e-12)
        assert torch.allclose(e1, e2, rtol=1e-12, atol=1e-12), ("eps", k, bcast)
        for a, b in list(zip(o1, o2)) + list(zip(o3, o2)):
            assert (a is None) == (b is None)
            if a is not None:
                assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), ("G", k, bcast)
    # the whole learner: Triton kernels vs torch path
    from spikerec.hardware.online import OnlineLearner, mse_loss
    from spikerec.layers import ALIF, LIF, LeakyReadout
    from spikerec.models import RecurrentStack
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    cells = [ALIF(3, 5, recurrent=True, tau_mem=5.0, tau_adapt=10.0, b=0.3, beta=0.5), LIF(5, 4, tau_mem=5.0)]
    try:
        from spikerec.layers.lru import LRU
        cells.append(LRU(4, 6))
    except ImportError:
        pass
    model = RecurrentStack(cells, LeakyReadout(cells[-1].output_size, 2))
    x, tgt = torch.rand(9, 2, 3) * 3, torch.randn(9, 2, 2)
    import spikerec.hardware.online.learner as learner_mod
    grads = []
    for use in (True, False):  # the Triton matrix-trace step (interpreted on the CPU), then the torch one
        learner_mod.matrix_trace_kernel = (lambda device: mat_trace_step) if use else (lambda device: None)
        model.zero_grad()
        OnlineLearner(model).backward(x, tgt, mse_loss)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for n in grads[1]:
        assert torch.allclose(grads[0][n], grads[1][n], rtol=1e-10, atol=1e-12), n
    # the stream step with the Triton matrix trace == the trace recursion on the step's torch.func partials
    import sys
    sys.path[:0] = [os.environ["ROOT"], os.path.join(os.environ["ROOT"], "tests")]
    from tests.test_online_partials import MATRIX_TRACE_CASES, matrix_trace_against_derived
    for kind, kw in MATRIX_TRACE_CASES:
        matrix_trace_against_derived(kind, kw, mat_trace_step)
    print("TRITON-OK", len(cells))
    """
)


def test_triton_kernel_matches_torch_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", SEED=str(int(torch.randint(0, 10_000, ()))), ROOT=str(ROOT))
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "TRITON-OK" in res.stdout


@pytest.mark.gpu
def test_triton_kernel_on_cuda_matches_fp64_reference():
    from spikerec.kernels.trace_triton import mat_trace_step, mat_trace_step_torch

    B, N, k, H = 8, 64, 2, 128
    eps = torch.randn(N, B, k, H, device="cuda")
    J, c, x, g = (torch.randn(B, N, k, k, device="cuda"), torch.randn(B, N, k, device="cuda"),
                  torch.randn(B, H, device="cuda"), torch.randn(B, N, k, device="cuda"))
    e64 = eps.double().cpu()
    (G,) = mat_trace_step(eps, J, c, x, [g])
    (G64,) = mat_trace_step_torch(e64, J.double().cpu(), c.double().cpu(), x.double().cpu(), [g.double().cpu()])
    assert torch.allclose(eps.double().cpu(), e64, rtol=1e-4, atol=1e-4)
    assert torch.allclose(G.double().cpu(), G64, rtol=1e-4, atol=1e-3)
